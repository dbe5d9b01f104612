"""The hand-over floor benchmark's report: from its results (``handover.json``) to the
markdown table and the docs section.

``handover.py`` measures and writes the JSON through `write_outputs`; ``python
benchmarks/handover.py --report results/handover.json`` runs this step alone on results
already written. The types here are the JSON's shape, for both.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from .harness import Environment, machine_line, publish_between, write_json, write_text

#: The docs' markers and the files' stem, by kind of hold.
MARKERS = {
    "sleep": ("<!-- HANDOVER-FLOOR -->", "<!-- /HANDOVER-FLOOR -->"),
    "query": ("<!-- HANDOVER-QUERY -->", "<!-- /HANDOVER-QUERY -->"),
}
STEMS = {"sleep": "handover", "query": "handover-query"}
#: How each kind of hold is described in the report.
HOLDS = {
    "sleep": "each hold `asyncio.sleep` of {ms:g} ms",
    "query": "each hold a query to another process answered after {ms:g} ms (as a"
    " database write would be; `lockbench.hold_service`)",
}
BASE = "aioredlock"
FLOOR = "floor model"
TARGET = 1.3  # issue 11: acquisitions/s against aioredlock's

#: One row's run: `peers.contention_result`'s record, the failures, and the CPU per
#: hold; or ``{"status": "failed", "reason": ...}``.
RowRun = dict[str, Any]


class HandoverReport(TypedDict):
    """``handover.json``."""

    environment: Environment
    masters: int
    clients: int
    hold_s: float
    hold: NotRequired[str]  # "sleep" (also when absent: results of older runs) or "query"
    seconds_per_run: float
    repetitions: int
    quick: bool
    rows: dict[str, list[RowRun]]  # by row, one run per repetition


def _ok(run: RowRun) -> bool:
    return run.get("status") == "ok"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratios(report: HandoverReport, row: str) -> list[float]:
    """``row``'s rate over aioredlock's, per repetition (both measured)."""
    base = report["rows"].get(BASE, [])
    return [
        mine["acquisitions_per_s"] / theirs["acquisitions_per_s"]
        for mine, theirs in zip(report["rows"][row], base, strict=False)
        if _ok(mine) and _ok(theirs)
    ]


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _reasons(runs: list[RowRun]) -> str:
    """The distinct reasons the failed ``runs`` give, for a table cell."""
    return "; ".join(sorted({str(run.get("reason")) for run in runs})).replace("|", "\\|")


def _line(report: HandoverReport, row: str) -> str:
    """``row``'s line of the table: medians (and ranges) over its repetitions that
    completed; when some failed, its last cell says how many of all completed, and why
    the others failed."""
    runs = [run for run in report["rows"][row] if _ok(run)]
    failed = [run for run in report["rows"][row] if not _ok(run)]
    if not runs:
        return f"| {row} | failed: {_reasons(failed)} | | | | | | | | | |"
    rates = [run["acquisitions_per_s"] for run in runs]
    ratios = _ratios(report, row)
    ratio = "n/a" if not ratios else f"{statistics.median(ratios):.2f}x"
    if len(ratios) > 1 and min(ratios) != max(ratios):
        ratio += f" ({min(ratios):.2f}-{max(ratios):.2f})"
    rate = f"{statistics.median(rates):.0f}"
    if len(rates) > 1:
        rate += f" ({min(rates):.0f}-{max(rates):.0f})"
    cells = [
        rate,
        ratio,
        _fmt(_median([run["wait"]["p50_ms"] for run in runs]), ".2f"),
        _fmt(_median([run["wait"]["p99_ms"] for run in runs]), ".2f"),
        _fmt(_median([h for run in runs if (h := run.get("hold_p50_ms")) is not None]), ".2f"),
        _fmt(_median([h for run in runs if (h := run.get("handover_p50_ms")) is not None]), ".2f"),
        _percent(_median([a for run in runs if (a := run["same_worker_again"]) is not None])),
        _fmt(_median([run["client_cpu_ms_per_hold"] for run in runs]), ".3f"),
        _fmt(
            _median([s for run in runs if (s := run["servers_cpu_ms_per_hold"]) is not None]), ".3f"
        ),
        str(sum(run["exclusion_violations"] + run["failures"] for run in runs)),
    ]
    if failed:
        total = len(runs) + len(failed)
        cells[-1] += (
            f"; {len(runs)} of {total} repetitions ok, {len(failed)} failed: {_reasons(failed)}"
        )
    return f"| {row} | " + " | ".join(cells) + " |"


def _verdict(report: HandoverReport) -> list[str]:
    """What the floor says of the target, and how far each lock is from the floor."""
    rows = report["rows"]
    if FLOOR not in rows or BASE not in rows:
        return []
    floor = _ratios(report, FLOOR)
    if not floor:
        return []
    spread = f" ({min(floor):.2f}-{max(floor):.2f})" if len(floor) > 1 else ""
    lines = [
        f"- The floor model measured {statistics.median(floor):.2f}x aioredlock's rate"
        f"{spread}. The target of {TARGET}x asks a lock for"
        f" {TARGET / statistics.median(floor):.2f}x the model's rate"
        f" ({TARGET / max(floor):.2f}-{TARGET / min(floor):.2f}), while a lock that costs"
        " anything per message beyond a bare `PING` lands below the model.",
    ]
    for row in rows:
        if row == FLOOR:
            continue
        shares = [
            mine["acquisitions_per_s"] / model["acquisitions_per_s"]
            for mine, model in zip(rows[row], rows[FLOOR], strict=False)
            if _ok(mine) and _ok(model)
        ]
        if shares:
            spread = f" ({min(shares):.2f}-{max(shares):.2f})" if len(shares) > 1 else ""
            lines.append(
                f"- {row}: {statistics.median(shares):.2f}x the floor model's rate{spread}."
            )
    return lines


def table(report: HandoverReport, *, heading: bool = True) -> str:
    """The markdown of the results, under a heading (or, in a page's running text,
    a bold title, so that the text after it stays under the page's own heading)."""
    quick = " (quick smoke run: not a measurement)" if report["quick"] else ""
    hold = report.get("hold", "sleep")
    kind = ", the hold a query" if hold == "query" else ""
    title = f"The floor of a hand-over between clients{kind}{quick}"
    lines = [
        f"### {title}" if heading else f"**{title}.**",
        "",
        f"{report['clients']} clients in one event loop, a worker each, on one key,"
        f" {HOLDS[hold].format(ms=report['hold_s'] * 1000)}; N = {report['masters']} masters on"
        f" loopback. Repetitions: {report['repetitions']}, of {report['seconds_per_run']:g} s"
        " per row, each repetition starting one row later; medians (and ranges) over the"
        " repetitions that completed (the last column names any that failed).",
        "",
        "| Row | acquisitions/s | ÷ aioredlock | wait p50 (ms) | wait p99 (ms) |"
        " hold p50 (ms) | hand-over p50 (ms) | same worker again | client CPU ms / hold |"
        " servers CPU ms / hold | overlaps + failures |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        *(_line(report, row) for row in report["rows"]),
        "",
        "- floor model: not a lock. Each acquire is one round of `PING` to every master"
        " (back at the third reply), then a wait in a queue kept in the process; each"
        " release is one round of `PING`, then it wakes the first in line. It is the"
        " message pattern of an arrival-order hand-over through the masters (the"
        " release's round, the releasing worker's next acquire that queues it again) at"
        " no cost of scripts, keys or library code, the next waiter woken for free (a"
        " real lock's masters must tell it).",
        "- A cycle of the lock is a hold and a hand-over. Hold: from `acquire()` returning"
        " to `release()` called (a sleep lasts as long as the loop makes it). Hand-over:"
        " from `release()` called to the next holder's `acquire()` returning (aioredlock's"
        " mostly to the same worker).",
        "- CPU per hold: the client process's, and the five servers' together (from"
        " `/proc`); both share the host's cores.",
        *_verdict(report),
        "",
        machine_line(report["environment"]),
    ]
    return "\n".join(lines) + "\n"


def write_outputs(report: HandoverReport, out: Path, docs: Path | None) -> None:
    """JSON and markdown into ``out`` (``handover.*``; ``handover-query.*`` for query
    holds); the section into ``docs/peers.md`` (between its ``<!-- HANDOVER-FLOOR -->``
    lines, or ``HANDOVER-QUERY``) if given."""
    hold = report.get("hold", "sleep")
    write_json(out / f"{STEMS[hold]}.json", report)
    write_text(out / f"{STEMS[hold]}.md", table(report))
    if docs is not None:
        start, end = MARKERS[hold]
        publish_between(docs / "peers.md", start, end, table(report, heading=False))
