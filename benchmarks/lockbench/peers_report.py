"""The peers benchmark's report: from its results (``peers.json``) to the markdown
tables, the plot, the docs page, the README summary and the targets table.

``peers.py`` measures and writes the JSON, then calls `write_outputs`; ``python
benchmarks/peers.py --report results/peers.json`` runs this step alone on results
already written. The JSON's records are typed in `lockbench.peers_records`.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .adapters import LibraryInfo
from .harness import (
    P99_MIN_SAMPLES,
    machine_line,
    p99_text,
    publish_between,
    publish_section,
    pyplot,
    write_json,
    write_text,
)
from .peers_records import CaseRecord, PeersReport, Result, ScenarioRecord
from .rtt import MeasuredRtt
from .settings import CONTENTION_WORKERS, SERVERS, THROUGHPUT_WORKERS
from .targets import TARGETS, TargetRow

MARKER = "<!-- PEERS-TABLE -->"
SUMMARY_START = "<!-- PEERS-SUMMARY -->"
SUMMARY_END = "<!-- /PEERS-SUMMARY -->"


STATUS_TEXT = {
    "hung": "hung",
    "failed": "failed",
    "unavailable": "unavailable",
    "not_applicable": "n/a",
}


def value(result: Result) -> float | None:
    """The compared value of a result (the metric of its scenario, which the kind of
    record tells), or None; None too for a b result with a failed acquire (the p50 of
    its successes alone would flatter it)."""
    if result["status"] != "ok":
        return None
    if "total" in result:  # a
        return result["total"]["p50_ms"]
    if "succeeded" in result:  # b
        return None if failed_acquires(result) else result["acquire"]["p50_ms"]
    if "cycles_per_s" in result:  # c
        return result["cycles_per_s"]
    if "acquisitions_per_s" in result:  # d
        return result["acquisitions_per_s"]
    return result["wake"]["p50_ms"] if "wake" in result else None  # e


def failed_acquires(result: Result) -> int:
    """b: the acquires of a run under the fault that failed (0 for other scenarios)."""
    return result["failed_acquire"]["iterations"] if "failed_acquire" in result else 0


def failed_text(result: Result) -> str:
    """b: ``49 of 50 acquires failed`` (with the failures' messages where it has them)."""
    failed = tried = failed_acquires(result)
    if "succeeded" in result:
        tried += result["succeeded"]
    text = f"{failed} of {tried} acquires failed"
    if "failure_examples" in result and (examples := result["failure_examples"]):
        text += f" ({'; '.join(examples)})"
    return text


def cell(result: Result) -> str:
    """A table cell for one library in one case (the columns of its scenario)."""
    if result["status"] != "ok":
        text = STATUS_TEXT[result["status"]]
        succeeded = result.get("succeeded")  # b: stopped after some acquires
        return f"{text} ({succeeded} ok)" if succeeded else text
    if "total" in result:  # a
        return f"{result['total']['p50_ms']:.2f} / {p99_text(result['total'])}"
    if "succeeded" in result:  # b
        acquire = result["acquire"]
        failed = f", {result['failures']} failed" if result["failures"] else ""
        counts = f"({acquire['iterations']} ok{failed})"
        return f"{acquire['p50_ms']:.2f} / {p99_text(acquire, counted=True)} {counts}"
    if "cycles_per_s" in result:  # c
        return f"{result['cycles_per_s']:,.0f} / {result['cpu_s_per_1000']:.3f}"
    if "acquisitions_per_s" in result:  # d
        return f"{result['acquisitions_per_s']:,.0f}"
    if "wake" in result:  # e
        return f"{result['wake']['p50_ms']:.2f} / {p99_text(result['wake'])}"
    raise ValueError(f"a result of no known kind: {sorted(result)}")


CELL_UNITS = {
    "a": "p50 / p99 (ms)",
    "b": "acquire p50 / p99 (ms)",
    "c": "cycles/s / CPU s per 1,000",
    "e": "p50 / p99 (ms)",
}


def table(scenario: ScenarioRecord, infos: dict[str, LibraryInfo]) -> str:
    """Rows = libraries, one column per case (scenario d has its own)."""
    if scenario["id"] == "d":
        return "\n".join(contention_table(c, infos) for c in scenario["cases"])
    unit = CELL_UNITS[scenario["id"]]
    head = "| Library | " + " | ".join(f"{c['name']}: {unit}" for c in scenario["cases"]) + " |\n"
    head += "|---|" + "--:|" * len(scenario["cases"]) + "\n"
    rows = [
        f"| {info['label']} | "
        + " | ".join(cell(c["results"][lib]) for c in scenario["cases"])
        + " |"
        for lib, info in infos.items()
    ]
    return head + "\n".join(rows) + "\n"


def contention_table(case: CaseRecord, infos: dict[str, LibraryInfo]) -> str:
    """Scenario d, one case: one row per library; the failed operations and the
    unfinished waits beside the waits ("-": results from before they were counted),
    and the overlapping holds (two holders at once)."""
    head = (
        f"{case['name']}:\n\n| Library | acquisitions/s | wait p50 (ms) | wait p99 (ms) "
        "| failed | unfinished | overlaps | same worker again | lock busy |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for lib, info in infos.items():
        r = case["results"][lib]
        if r["status"] != "ok" or "acquisitions_per_s" not in r:
            rows.append(f"| {info['label']} | {STATUS_TEXT[r['status']]} | | | | | | | |")
            continue
        again = "-" if r["same_worker_again"] is None else f"{r['same_worker_again']:.0%}"
        unfinished = str(r["waits"]["unfinished"]) if "waits" in r else "-"
        rows.append(
            f"| {info['label']} | {r['acquisitions_per_s']:,.0f} | {r['wait']['p50_ms']:.2f} "
            f"| {p99_text(r['wait'])} | {r['failures']} | {unfinished} "
            f"| {r['exclusion_violations']} | {again} | {r['busy_fraction']:.0%} |"
        )
    return head + "\n".join(rows) + "\n"


def overlaps(result: Result) -> int:
    """d: the holds of ``result`` that were not exclusive: those that began before an
    earlier holder began to release, and, with OS processes, those the separate
    counter lost; 0 for a result of another scenario."""
    if "exclusion_violations" not in result:
        return 0
    seen = result["exclusion_violations"]
    if "counter" in result:
        seen += abs(result["counter"]["holds"] - result["counter"]["counted"])
    return seen


def eligible(result: Result) -> bool:
    """Whether a peer's result may be the best peer's: it has numbers and no
    overlapping hold (a lock that let two holders in is not a faster lock)."""
    return result["status"] == "ok" and overlaps(result) == 0


def every_wait_counted(report: PeersReport) -> bool:
    """Whether scenario d's waits count every acquire() called in the window (results
    written since), not only the acquisitions that returned in it."""
    return any(
        "waits" in result
        for scenario in report["scenarios"]
        if scenario["id"] == "d"
        for case in scenario["cases"]
        for result in case["results"].values()
    )


def wake_note(report: PeersReport) -> str:
    """From when scenario e's wake-up is timed, in this report's results."""
    if report["settings"].get("wake_timed_from") is None:
        return (
            "the wake-up is timed from the holder's release() returning (these results "
            "were written before it was timed from the call): asyncredlock's release() "
            "returns once a quorum of masters released, the hand-over to the waiter "
            "under way, while aioredlock's, pottery's and redlock-ng's wait for every "
            "master, so each library's time starts at a different point of the release"
        )
    return (
        "the wake-up is timed from the holder's release() call, the same point for every "
        "library (asyncredlock's release() returns at a quorum of masters, the others' "
        "Redlock releases after every master: the JSON has each release() too)"
    )


def counter_note(report: PeersReport) -> str:
    """How scenario d's processes counted their holds, in this report's results."""
    how = report["settings"].get("hold_counter")
    if how is None:
        return (
            "the processes count each hold on a separate server, a GET and a SET back to "
            "back after the hold (these results were written before the count moved "
            "around the hold: it sees two holds at once only if those two short "
            "read-modify-writes interleave; the overlap of the timestamps is checked too)"
        )
    return (
        f"the processes count each hold on a separate server, {how}: two holds that "
        "overlap at all lose an update (and the overlap of the timestamps is checked too)"
    )


def wait_note(report: PeersReport) -> str:
    """What scenario d's wait columns count, in this report's results."""
    if not every_wait_counted(report):
        return (
            "wait is from the call of acquire() to its return, for the acquisitions that "
            "returned in the window only (these results were written before every wait "
            "counted: an acquisition that returned after the window and a failed acquire "
            "are left out, so the longest waits are missing; unfinished was not counted)"
        )
    stop = report["settings"].get("contention_stop_after_s", 0.0)
    return (
        "wait is from the call of acquire() to its end, for every acquire() called in "
        "the window: one that returned after the window with its whole wait, a failed "
        "one until it raised, and one still waiting when the run stopped "
        f"({stop:g} s after the window; unfinished) until the stop, a lower bound"
    )


def reasons(scenario: ScenarioRecord, infos: dict[str, LibraryInfo]) -> list[str]:
    """Why some cells hold no numbers, and which had failures, one line each."""
    lines: dict[str, list[str]] = {}
    for case in scenario["cases"]:
        for lib, r in case["results"].items():
            if r["status"] == "ok" and (seen := overlaps(r)):
                text = f"{infos[lib]['label']}: {seen} overlapping holds (two holders at once)"
                if not lib.startswith(OURS):
                    text += ", not eligible as the best peer"
                lines.setdefault(text, []).append(case["name"])
            if r["status"] == "ok" and not r.get("failures"):
                continue
            why = r.get("reason") or ""
            if not why and "failure_examples" in r:
                why = "; ".join(r["failure_examples"])
            text = (
                f"{infos[lib]['label']}: {STATUS_TEXT.get(r['status'], 'ok, with failures')}, {why}"
            )
            lines.setdefault(text, []).append(case["name"])
    return [f"{text} ({', '.join(cases)})" for text, cases in lines.items()]


def ratio_lines(scenario: ScenarioRecord, infos: dict[str, LibraryInfo]) -> list[str]:
    """asyncredlock's value over the best peer's, per case, computed from the results."""
    lower = scenario["better"] == "lower"
    out = []
    for case in scenario["cases"]:
        results = case["results"]
        peers = {
            lib: v
            for lib, r in results.items()
            if not lib.startswith("asyncredlock") and eligible(r) and (v := value(r)) is not None
        }
        ours: dict[str, float] = {
            lib: v
            for lib in ("asyncredlock", "asyncredlock-unfenced", "asyncredlock-nopoll")
            if lib in results and (v := value(results[lib])) is not None
        }
        mine = results.get("asyncredlock")
        if not ours and mine is not None and mine["status"] == "ok" and failed_acquires(mine):
            out.append(f"{case['name']}: asyncredlock {failed_text(mine)}, no value compared")
            continue
        out.append(ratio_line(case["name"], ours, peers, infos, lower))
    return out


def ratio_line(
    case: str,
    ours: dict[str, float],
    peers: dict[str, float],
    infos: dict[str, LibraryInfo],
    lower: bool,
) -> str:
    """``N=1: asyncredlock 0.52 (1.40x) vs the best peer, redis-py Lock 0.37``."""
    if not peers:
        return f"{case}: no peer completed"
    if not ours:
        return f"{case}: asyncredlock not run or did not complete"
    best = (min if lower else max)(peers, key=peers.__getitem__)
    parts = [
        f"{infos[lib]['label']} {number(v)} ({times(v / peers[best])})" for lib, v in ours.items()
    ]
    return (
        f"{case}: {', '.join(parts)} vs the best peer, {infos[best]['label']} {number(peers[best])}"
    )


def scenario_section(scenario: ScenarioRecord, infos: dict[str, LibraryInfo], level: str) -> str:
    """Title, table, ratio line and reasons of one scenario."""
    better = "lower" if scenario["better"] == "lower" else "higher"
    ratios = "; ".join(ratio_lines(scenario, infos))
    notes = "".join(f"- {line}\n" for line in reasons(scenario, infos))
    return (
        f"{level} {scenario['id']}. {scenario['title']}\n\n"
        + table(scenario, infos)
        + f"\n**asyncredlock ÷ best peer**, {scenario['metric']} ({better} is better): "
        + ratios
        + ".\n\n"
        + notes
    )


def library_table(report: PeersReport) -> str:
    """Which libraries ran, their versions, and how each was set up."""
    rows = []
    for info in report["libraries"].values():
        versions = ", ".join(f"{d} {v or 'not installed'}" for d, v in info["versions"].items())
        state = "yes" if info["available"] else f"no: {info['reason']}"
        rows.append(f"| {info['label']} | {versions} | {state} | {info['note']} |")
    return (
        "| Library | Version | Runs here | Set up |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def notes(report: PeersReport) -> str:
    """What was measured and how, under the tables."""
    s, env = report["settings"], report["environment"]
    rtt = ", ".join(
        f"{k} ms → {v['p50_ms']:.2f} ms"
        + (
            f" (a quorum round, a bare PING to all {SERVERS} proxies until "
            f"{SERVERS // 2 + 1} replies: {v['quorum_round']['p50_ms']:.2f} ms)"
            if "quorum_round" in v
            else ""
        )
        for k, v in report["measured_rtt"].items()
    )
    return (
        f"- Every lock has a TTL of {s['ttl_s']:g} s; an acquire that waits for a holder "
        f"waits up to {s['wait_s']:g} s where the library takes a bound. The JSON has "
        "every setting of every library, passed or default.\n"
        "- asyncredlock reaches each master over one connection, which carries every "
        "call (its `max_connections` is deprecated and ignored: the JSON records null). "
        f"Every peer gets a pool of up to {s['pool']} connections per master (aioredlock: "
        "aioredis's maxsize; redlock-ng: set on the pools it builds); redis-py's default "
        "pool of 100 fails 200 workers with MaxConnectionsError. python-redis-lock's "
        "client has no socket timeout, as its BLPOP waits up to the lock's expiry.\n"
        f"- A p99 is shown from {P99_MIN_SAMPLES} samples up, and n/a below (from fewer "
        "it is about the largest sample; the JSON has it, and the max); the p50 is "
        f"shown from any number. b takes at most {report['plan']['fault_iterations']} "
        f"cycles per library and case, e {report['plan']['wake_trials']} trials.\n"
        f"- An operation that takes longer than {s['op_guard_s']:g} s counts as hung and "
        "that library stops for the case; a whole case has a wall-clock guard too.\n"
        f"- b: master {s['faulty_master'] + 1} of 5 is blackholed (its proxy swallows "
        "everything) or its server is stopped (its proxy then resets each connection), "
        "after a warm-up on healthy masters.\n"
        "- asyncredlock runs with its defaults: leases auto-extend and carry fencing "
        "tokens; the `fencing=False` row (a, b, e) differs in that only, and so does "
        "the `busy_poll=0` row (a, d: no poll for a reply before the loop sleeps, see "
        "docs/configuration.md). In d's first two cases (N=5, N=1) every "
        "worker of a library uses one client object (one `AsyncRedlock` for "
        "asyncredlock), so asyncredlock's waiting tasks queue in the process and a "
        "released lease is handed to the next of them without a call to the masters "
        "(its `library_statistics` in the JSON count the hand-offs); the peers' "
        "waiters go through the servers. In e the holder and the waiter are separate "
        "clients, as two processes would be: every library's waiter learns of the "
        "release through the servers.\n"
        "- c: each cycle is acquire + release; CPU is this process's "
        "(`time.process_time()`, threads included), not the servers'.\n"
        f"- d: each worker holds {s['contention_hold_s'] * 1000:g} ms; {wait_note(report)}; "
        "failed counts the failed operations (acquire, release, the processes' "
        f"counter), their messages under the tables; {counter_note(report)}; "
        "overlaps counts, in every case, the acquisitions that returned before an "
        "earlier holder began to release (two holders at once; expected 0): a peer "
        "with an overlap (or a hold its processes' counter lost) is not eligible as the "
        "best peer of that case, and asyncredlock's are a target; "
        "same worker again is how often the next "
        "acquisition went to the worker that released last; lock busy is the held time "
        "(acquire() returned to release() returned) over the wall time.\n"
        f"- e: the holder holds {s['wake_hold_s'][0] * 1000:g}-{s['wake_hold_s'][1] * 1000:g} "
        "ms (uniform) before releasing, so the release falls anywhere in a waiter's "
        f"retry pause; {wake_note(report)}.\n"
        "- RTT 0 cases connect straight to the servers; RTT 2 ms cases and scenario b go"
        " through the proxies.\n"
        f"- RTT is the delay the proxies add (nominal → PING p50 through one proxy): {rtt}.\n"
        f"- Everything runs on one machine ({env['cpu_count']} CPUs): client, proxy "
        "process and servers share it; compare ratios, not absolute numbers.\n"
        + loop_error_line(report)
    )


def loop_error_line(report: PeersReport) -> str:
    """Which libraries left task errors nobody retrieved (asyncio reports them)."""
    errors = report["loop_errors"]
    if not errors:
        return ""
    labels = {lib: info["label"] for lib, info in report["libraries"].items()}
    counts = ", ".join(f"{labels.get(who, who)}: {e['failures']}" for who, e in errors.items())
    return (
        "- Task errors nobody retrieved, or tasks destroyed while pending, as asyncio "
        f"reported them while each library ran (examples in the JSON): {counts}.\n"
    )


def body(report: PeersReport, level: str) -> str:
    """Libraries, one section per scenario, notes, machine."""
    infos = report["libraries"]
    quick = (
        " **Quick run: too few iterations to mean anything.**" if report["plan"]["quick"] else ""
    )
    return (
        f"{level} Libraries\n\n"
        + library_table(report)
        + "\n"
        + "".join(scenario_section(s, infos, level) + "\n" for s in report["scenarios"])
        + f"{level} Targets\n\n"
        + targets_section(report)
        + "\n"
        + f"{level} Notes\n\n"
        + notes(report)
        + "\n"
        + machine_line(report["environment"])
        + quick
        + "\n"
    )


def markdown(report: PeersReport) -> str:
    """``peers.md``."""
    return f"# asyncredlock and its peers{on_loop(report)}\n\n" + body(report, "##")


def docs_section(report: PeersReport) -> str:
    """The generated part of ``docs/peers.md``."""
    return (
        body(report, "###")
        + "\n![asyncredlock and its peers](img/peers.png)\n\n"
        + f"To rerun (about {FULL_MINUTES} minutes on a quiet machine; `--quick` for a "
        + "smoke run), from the repository root:\n\n"
        + "```bash\n"
        + RERUN_INSTALL
        + RERUN
        + "\n```\n"
    )


FULL_MINUTES = 11
RERUN = "python benchmarks/peers.py --docs docs --readme README.md"
RERUN_INSTALL = (
    "pip install -e '.[bench]'\n"
    "pip install --no-deps 'redlock-ng>=2.0,<3'  # its pins would downgrade redis-py\n"
)


# --- targets and the README summary ----------------------------------------------------------

# The targets (limits in benchmarks/targets.toml), for asyncredlock with its defaults.
OURS = "asyncredlock"


def targets(report: PeersReport) -> list[TargetRow]:
    """Each target of the issue checked against the results: the value, whether it was
    met, and by how much it was missed; "not measured" (with why) where the results
    lack a quantity."""
    infos = report["libraries"]
    by_id = {s["id"]: s for s in report["scenarios"]}
    redlock_peers = [
        lib for lib, info in infos.items() if not lib.startswith(OURS) and not info["single_server"]
    ]
    rows: list[TargetRow] = []
    for case in cases_of(by_id, "e"):
        rows.append(wake_speedup_target(case, redlock_peers, infos))
    rows.append(wake_p50_target([c for c in cases_of(by_id, "e") if c["n"] == SERVERS]))
    for case in cases_of(by_id, "d"):
        match case.get("clients", "shared"):
            case "shared":
                rows.extend(contention_targets(case, infos))
            case "each":
                rows.extend(separate_targets(case, infos))
        rows.extend(exclusion_targets(case, infos))
    rows.append(blackhole_target(by_id))
    for case in cases_of(by_id, "c"):
        rows.extend(throughput_targets(case, infos))
    rows.extend(latency_targets(by_id, infos, report.get("measured_rtt", {})))
    return rows


def latency_targets(
    by_id: dict[str, ScenarioRecord], infos: dict[str, LibraryInfo], rtts: dict[str, MeasuredRtt]
) -> list[TargetRow]:
    """a: uncontended p50 against aioredlock (N = 5), the fastest peer (N = 1), both at
    RTT 0, and against two measured round trips at RTT 2 ms (N = 5)."""
    cases = {(c["n"], c["rtt_ms"]): c for c in cases_of(by_id, "a")}
    rows = []
    for n, limit, against in (
        (SERVERS, TARGETS.latency_n5_vs_aioredlock, "aioredlock"),
        (1, TARGETS.latency_n1_vs_fastest, None),
    ):
        case = cases.get((n, 0.0))
        who = "aioredlock's" if against else "the fastest peer's"
        target = f"a. N={n}, RTT 0 ms: p50 ≤ {limit:g}x {who}"
        args = (target, f"N={n}, RTT 0 ms", "<=", limit, "x")
        ours = None if case is None else ok_result(case, OURS)
        best = None
        if case is not None:
            best = best_of(case, [against] if against else peers_in(case), lower=True)
        if ours is None or best is None:
            rows.append(check(*args, None, "not in the results"))
            continue
        lib, theirs = best
        mine = value(ours) or 0.0
        text = f"{number(mine)} ms vs {infos[lib]['label']} {number(theirs)} ms"
        rows.append(check(*args, mine / theirs, f"{text}: {times(mine / theirs)}"))
    return [*rows, round_trip_target(cases.get((SERVERS, 2.0)), rtts.get("2"))]


def round_trip_target(case: CaseRecord | None, measured: MeasuredRtt | None) -> TargetRow:
    """a: the N = 5, RTT 2 ms p50 against two round trips (``measured`` at RTT 2 ms)."""
    target = f"a. N={SERVERS}, RTT 2 ms: p50 ≤ {TARGETS.latency_rtt2_vs_floor:g}x two round trips"
    args = (target, f"N={SERVERS}, RTT 2 ms", "<=", TARGETS.latency_rtt2_vs_floor, "x")
    ours = None if case is None else ok_result(case, OURS)
    rtt = measured["p50_ms"] if measured else None
    quorum = measured.get("quorum_round") if measured else None
    quorum_rtt = quorum["p50_ms"] if quorum else None
    if ours is None or not rtt:
        return check(*args, None, "not in the results")
    mine = value(ours) or 0.0
    if not quorum_rtt:  # results from before the quorum round was measured
        floor = 2 * float(rtt)
        text = f"{number(mine)} ms vs 2 x {number(float(rtt))} ms (PING p50 through a proxy)"
    else:
        floor = 2 * float(quorum_rtt)
        text = (
            f"{number(mine)} ms vs 2 x {number(float(quorum_rtt))} ms (a bare PING to the "
            f"{SERVERS} proxies at once, until {SERVERS // 2 + 1} replies: one quorum round); "
            f"{times(mine / (2 * float(rtt)))} two single-proxy PINGs"
        )
    return check(*args, mine / floor, f"{text}: {times(mine / floor)}")


def cases_of(by_id: dict[str, ScenarioRecord], sid: str) -> list[CaseRecord]:
    """The cases of scenario ``sid``, none if it did not run."""
    return list(by_id[sid]["cases"]) if sid in by_id else []


def check(
    target: str,
    case: str,
    bound: str,
    limit: float,
    unit: str,
    value: float | None,
    measured: str,
) -> TargetRow:
    """One row of the targets table: ``value`` against ``limit`` by ``bound`` (">=",
    "<=" or "<")."""

    def row(met: bool | None, shortfall: float | None, result: str) -> TargetRow:
        kept = None if value is None else round(value, 4)
        return TargetRow(
            target=target,
            case=case,
            bound=bound,
            limit=limit,
            unit=unit,
            value=kept,
            measured=measured,
            met=met,
            shortfall=shortfall,
            result=result,
        )

    if value is None:
        return row(None, None, "not measured")
    met = {">=": value >= limit, "<=": value <= limit, "<": value < limit}[bound]
    if met:
        return row(True, None, "met")
    gap = abs(value - limit)
    text = f"{gap * 100:.0f} points" if unit == "share" else amount(gap, unit)
    if bound == ">=":
        result = f"missed: {text} short ({value / limit:.0%} of the target)"
    elif limit == 0:  # a count that must be 0: no ratio to give
        result = f"missed: {text} over"
    else:
        result = f"missed: {text} over ({value / limit:.2f}x the limit)"
    return row(False, round(gap, 4), result)


def amount(v: float, unit: str) -> str:
    """``v`` in ``unit``: "x" (a ratio), "ms" or "share" (a fraction)."""
    if unit == "share":
        return f"{v:.0%}"
    if unit == "ms":
        return f"{number(v)} ms"
    if unit == "count":
        return f"{v:,.0f}"
    return times(v)


def number(v: float) -> str:
    """Two decimals, three below 0.1."""
    return f"{v:,.2f}" if abs(v) >= 0.1 else f"{v:.3f}"


def times(x: float) -> str:
    """A ratio: ``0.0021x``, ``0.029x``, ``1.52x``, ``12.3x``, ``1,650x`` (two
    significant digits below 0.1, so that no real ratio reads 0.00x)."""
    if x >= 100:
        return f"{x:,.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x" if x >= 0.1 or x == 0 else f"{x:.2g}x"


def ok_result(case: CaseRecord, lib: str) -> Result | None:
    """``lib``'s result in ``case`` if it has numbers."""
    result = case["results"].get(lib)
    return result if result is not None and result["status"] == "ok" else None


def status_text(case: CaseRecord, lib: str, infos: dict[str, LibraryInfo]) -> str:
    """``pottery AIORedlock: hung`` for a result without numbers."""
    result = case["results"].get(lib)
    label = infos[lib]["label"] if lib in infos else lib
    if result is None:
        return f"{label}: not run"
    return f"{label}: {STATUS_TEXT.get(result['status'], result['status'])}"


def best_of(case: CaseRecord, libs: Sequence[str], lower: bool) -> tuple[str, float] | None:
    """The library of ``libs`` with the best value in ``case``."""
    found = {
        lib: v
        for lib in libs
        if (r := ok_result(case, lib)) is not None and eligible(r) and (v := value(r)) is not None
    }
    if not found:
        return None
    best = (min if lower else max)(found, key=found.__getitem__)
    return best, found[best]


def missing(case: CaseRecord, libs: Sequence[str], infos: dict[str, LibraryInfo], who: str) -> str:
    """Why a comparison has no numbers: ``not in the results: no peer completed (...)``."""
    if not libs:
        return f"not in the results: no {who} in this run"
    states = "; ".join(status_text(case, lib, infos) for lib in libs)
    return f"not in the results: no {who} completed ({states})"


def peers_in(case: CaseRecord) -> list[str]:
    """The other libraries of ``case`` (not asyncredlock, fenced or not)."""
    return [lib for lib in case["results"] if not lib.startswith(OURS)]


def wake_speedup_target(
    case: CaseRecord, redlock_peers: list[str], infos: dict[str, LibraryInfo]
) -> TargetRow:
    """e: the best Redlock peer's wake-up p50 over asyncredlock's."""
    speedup = TARGETS.wakeup_speedup_vs_redlock_peers
    target = f"e. wake-up p50 ≥ {speedup:g}x faster than the best Redlock peer"
    args = (target, case["name"], ">=", speedup, "x")
    ours = ok_result(case, OURS)
    best = best_of(case, redlock_peers, lower=True)
    if ours is None:
        return check(*args, None, "not in the results: " + status_text(case, OURS, infos))
    if best is None:
        return check(*args, None, missing(case, redlock_peers, infos, "Redlock peer"))
    mine, (lib, theirs) = value(ours) or 0.0, best
    text = f"{OURS} {number(mine)} ms vs {infos[lib]['label']} {number(theirs)} ms"
    if mine <= 0:
        return check(*args, None, text + ": no ratio (asyncredlock's p50 is not above 0)")
    return check(*args, theirs / mine, f"{text}: {times(theirs / mine)}")


def wake_p50_target(cases: list[CaseRecord]) -> TargetRow:
    """e: asyncredlock's wake-up p50 at N = 5."""
    target = f"e. wake-up p50 < {TARGETS.wakeup_p50_ms:g} ms at N={SERVERS}"
    if not cases:
        return check(
            target, f"N={SERVERS}", "<", TARGETS.wakeup_p50_ms, "ms", None, "not in the results"
        )
    case = cases[0]
    ours = ok_result(case, OURS)
    p50 = None if ours is None else value(ours)
    if p50 is None:
        return check(
            target,
            case["name"],
            "<",
            TARGETS.wakeup_p50_ms,
            "ms",
            None,
            "not in the results: " + status_text(case, OURS, {}),
        )
    return check(target, case["name"], "<", TARGETS.wakeup_p50_ms, "ms", p50, f"{number(p50)} ms")


def contention_targets(case: CaseRecord, infos: dict[str, LibraryInfo]) -> list[TargetRow]:
    """d: acquisitions/s over the best peer's, lock busy, wait p99."""
    name = case["name"]
    limit, busy_limit = TARGETS.contention_shared_rate_vs_best, TARGETS.contention_shared_busy
    p99_limit = TARGETS.contention_shared_p99_ms
    rate = (f"d. acquisitions/s ≥ {limit:g}x the best peer's", name, ">=", limit, "x")
    busy = (f"d. lock busy ≥ {busy_limit:.0%} of the time", name, ">=", busy_limit, "share")
    p99 = (f"d. wait p99 < {p99_limit:g} ms", name, "<", p99_limit, "ms")
    ours = ok_result(case, OURS)
    if ours is None or "acquisitions_per_s" not in ours:
        why = "not in the results: " + status_text(case, OURS, infos)
        return [check(*rate, None, why), check(*busy, None, why), check(*p99, None, why)]
    mine, peers = ours["acquisitions_per_s"], peers_in(case)
    best = best_of(case, peers, lower=False)
    if best is None:
        rate_row = check(*rate, None, missing(case, peers, infos, "peer"))
    else:
        lib, theirs = best
        text = f"{OURS} {mine:,.0f}/s vs {infos[lib]['label']} {theirs:,.0f}/s"
        ratio = mine / theirs if theirs > 0 else None
        suffix = f": {times(ratio)}" if ratio is not None else ": the peer's rate is 0"
        rate_row = check(*rate, ratio, text + suffix)
    fraction, wait = ours["busy_fraction"], ours["wait"]["p99_ms"]
    return [
        rate_row,
        check(*busy, fraction, f"{fraction:.0%}"),
        check(*p99, wait, f"{number(wait)} ms"),
    ]


def separate_targets(case: CaseRecord, infos: dict[str, LibraryInfo]) -> list[TargetRow]:
    """d, a client per worker: asyncredlock (defaults, and fair=True) against
    aioredlock's acquisitions/s, and its wait p99."""
    name = case["name"]
    theirs = ok_result(case, "aioredlock")
    limit = TARGETS.contention_separate_rate_vs_aioredlock
    p99_limit = TARGETS.contention_separate_p99_ms
    rows = []
    for lib in (OURS, f"{OURS}-fair"):
        if lib not in case["results"]:
            continue
        label = infos[lib]["label"]
        rate = (f"d. {label}: acquisitions/s ≥ {limit:g}x aioredlock's", name, ">=", limit, "x")
        p99 = (f"d. {label}: wait p99 ≤ {p99_limit:g} ms", name, "<=", p99_limit, "ms")
        ours = ok_result(case, lib)
        if ours is None or "acquisitions_per_s" not in ours:
            why = "not in the results: " + status_text(case, lib, infos)
            rows += [check(*rate, None, why), check(*p99, None, why)]
            continue
        mine = ours["acquisitions_per_s"]
        if theirs is None or "acquisitions_per_s" not in theirs:
            why = "not in the results: " + status_text(case, "aioredlock", infos)
            rows.append(check(*rate, None, why))
        else:
            other = theirs["acquisitions_per_s"]
            ratio = mine / other if other > 0 else None
            text = f"{mine:,.0f}/s vs aioredlock {other:,.0f}/s"
            text += f": {times(ratio)}" if ratio is not None else ": the peer's rate is 0"
            rows.append(check(*rate, ratio, text))
        wait = ours["wait"]["p99_ms"]
        rows.append(check(*p99, wait, f"{number(wait)} ms"))
    return rows


def exclusion_targets(case: CaseRecord, infos: dict[str, LibraryInfo]) -> list[TargetRow]:
    """d, every case: no mutual-exclusion violation for asyncredlock (defaults and
    fair=True): no two holds overlapping, and with OS processes every hold counted on
    the separate server."""
    name = case["name"]
    rows = []
    for lib in (OURS, f"{OURS}-fair"):
        if lib not in case["results"]:
            continue
        target = f"d. {infos[lib]['label']}: no mutual-exclusion violation"
        ours = ok_result(case, lib)
        if ours is None or "acquisitions_per_s" not in ours:
            why = "not in the results: " + status_text(case, lib, infos)
            rows.append(check(target, name, "<=", 0, "count", None, why))
            continue
        overlapping = ours["exclusion_violations"]
        if "counter" in ours:
            counter = ours["counter"]
            holds = f"{counter['holds']:,} holds, {counter['counted']:,} counted"
        else:
            holds = f"{ours['acquisitions']:,} holds"
        text = (
            f"{holds}, {overlapping} overlapping; "
            f"{ours['acquisitions_per_s']:,.0f}/s, wait p99 {number(ours['wait']['p99_ms'])} ms"
        )
        rows.append(check(target, name, "<=", 0, "count", float(overlaps(ours)), text))
    return rows


def blackhole_target(by_id: dict[str, ScenarioRecord]) -> TargetRow:
    """b over a: asyncredlock's N = 5 acquire p50 with one master blackholed, over the
    healthy case at the same RTT, with no acquire failing: a run with a failed acquire
    misses it whatever the p50 of its successes (its failures named)."""
    faulty = [c for c in cases_of(by_id, "b") if c["fault"] == "blackhole"]
    rtt = faulty[0]["rtt_ms"] if faulty else 2.0
    healthy = [c for c in cases_of(by_id, "a") if c["n"] == SERVERS and c["rtt_ms"] == rtt]
    target = (
        f"b. N={SERVERS} acquire p50 with one master blackholed ≤ "
        f"{TARGETS.faults_blackholed_vs_healthy:g}x "
        f"the healthy one (a, N={SERVERS}, RTT {rtt:g} ms), no acquire failing"
    )
    case = f"N={SERVERS}, RTT {rtt:g} ms"
    args = (target, case, "<=", TARGETS.faults_blackholed_vs_healthy, "x")
    if not faulty or not healthy:
        return check(*args, None, "not in the results: scenario a or b did not run")
    bad, good = ok_result(faulty[0], OURS), ok_result(healthy[0], OURS)
    if bad is None or good is None or "acquire" not in bad or "acquire" not in good:
        why = [
            f"{where} {status_text(c, OURS, {})}"
            for where, c, r in (("b", faulty[0], bad), ("a", healthy[0], good))
            if r is None
        ]
        return check(*args, None, "not in the results: " + "; ".join(why))
    slow, fast = bad["acquire"]["p50_ms"], good["acquire"]["p50_ms"]
    text = f"{number(slow)} ms vs {number(fast)} ms healthy"
    ratio = slow / fast if fast > 0 else None
    text += f": {times(ratio)}" if ratio is not None else ": no ratio"
    if failed_acquires(bad):
        row = check(*args, ratio, f"{text} (of the successes only); {failed_text(bad)}")
        return {**row, "met": False, "result": "missed: " + failed_text(bad)}
    return check(*args, ratio, text)


def throughput_targets(case: CaseRecord, infos: dict[str, LibraryInfo]) -> list[TargetRow]:
    """c: cycles/s over the best peer's, and CPU per cycle over that peer's."""
    name = case["name"]
    limit, cpu_limit = TARGETS.throughput_rate_vs_best, TARGETS.throughput_cpu_vs_best
    rate = (f"c. cycles/s ≥ {limit:g}x the best peer's", name, ">=", limit, "x")
    cpu = (f"c. CPU per cycle ≤ {cpu_limit:g}x that peer's", name, "<=", cpu_limit, "x")
    ours = ok_result(case, OURS)
    peers = peers_in(case)
    best = best_of(case, peers, lower=False)
    if ours is None or best is None or "cycles_per_s" not in ours:
        why = (
            "not in the results: " + status_text(case, OURS, infos)
            if ours is None
            else missing(case, peers, infos, "peer")
        )
        return [check(*rate, None, why), check(*cpu, None, why)]
    lib, theirs = best
    label = infos[lib]["label"]
    mine = ours["cycles_per_s"]
    text = f"{OURS} {mine:,.0f}/s vs {label} {theirs:,.0f}/s"
    ratio = mine / theirs if theirs > 0 else None
    rows = [check(*rate, ratio, text + (f": {times(ratio)}" if ratio is not None else ""))]
    my_cpu, their_cpu = cpu_per_cycle(ours), cpu_per_cycle(case["results"][lib])
    if my_cpu is None or not their_cpu:
        return [*rows, check(*cpu, None, "not in the results: no CPU per cycle")]
    text = (
        f"{OURS} {my_cpu:.3f} vs {label} {their_cpu:.3f} CPU s per 1,000 cycles: "
        f"{times(my_cpu / their_cpu)}"
    )
    return [*rows, check(*cpu, my_cpu / their_cpu, text)]


def cpu_per_cycle(result: Result) -> float | None:
    """c: the CPU seconds per 1,000 cycles of a result, if it has them."""
    if "cpu_s_per_1000" not in result:
        return None
    return result["cpu_s_per_1000"]


def targets_section(report: PeersReport) -> str:
    """The targets table, computed from the results, with a count."""
    rows = report["targets"]
    lines = [
        f"| {r['target']} | {r['case']} | {r['measured']} | "
        + ("met" if r["met"] else f"**{r['result']}**" if r["met"] is False else r["result"])
        + " |"
        for r in rows
    ]
    return (
        "The targets set for this benchmark, checked against this run for asyncredlock "
        'with its defaults (auto-extension and fencing on); "best peer" is the best of '
        "the other libraries in that case (in d, of those without an overlapping hold), "
        'a "Redlock peer" one that runs on N > 1 '
        "masters (aioredlock, pottery, redlock-ng). A missed target gives its shortfall "
        "in the target's unit, and the measured value against the target.\n\n"
        "| Target | Case | Measured | Result |\n|---|---|---|---|\n"
        + "\n".join(lines)
        + "\n\n"
        + target_count(rows)
        + "\n"
    )


def target_count(rows: Sequence[TargetRow]) -> str:
    """``Met 7 of 13 targets; missed 4; not measured 2.``"""
    met = sum(r["met"] is True for r in rows)
    missed = sum(r["met"] is False for r in rows)
    unknown = len(rows) - met - missed
    text = f"Met {met} of {len(rows)} targets; missed {missed}"
    return text + (f"; not measured {unknown}." if unknown else ".")


SUMMARY_METRICS = {
    "a": "a. uncontended acquire + release, p50 (ms)",
    "b": "b. 1 of 5 masters failing, acquire p50 (ms)",
    "c": f"c. throughput, {THROUGHPUT_WORKERS} workers: cycles/s",
    "d": f"d. contention, {CONTENTION_WORKERS} workers on one key: acquisitions/s",
    "e": "e. wake-up after release, p50 (ms)",
}


def summary_table(report: PeersReport) -> str:
    """The README summary: per scenario and case, asyncredlock's headline value, the
    best peer's, and how they compare; the targets met; how to rerun."""
    infos = report["libraries"]
    rows = []
    for scenario in report["scenarios"]:
        sid, lower = scenario["id"], scenario["better"] == "lower"
        for i, case in enumerate(scenario["cases"]):
            title = SUMMARY_METRICS[sid] if i == 0 else ""
            rows.append(
                f"| {title} | {case['name']} | " + summary_cells(sid, case, infos, lower) + " |"
            )
    quick = (
        " **Quick run: too few iterations to mean anything.**" if report["plan"]["quick"] else ""
    )
    return (
        "| Scenario, metric | Case | asyncredlock | Best peer | asyncredlock vs best peer |\n"
        "|---|---|--:|--:|--:|\n"
        + "\n".join(rows)
        + "\n\nasyncredlock with its defaults (auto-extension and fencing on) against the "
        "best of the other libraries in each case (latency: lower is better; rates: "
        "higher is better). The full tables (p99, CPU per cycle, contention fairness, "
        "`fencing=False`), the targets and the notes: [docs/peers.md](docs/peers.md). "
        + target_count(report["targets"])
        + " "
        + machine_line(report["environment"])
        + quick
        + f"\n\nRerun (about {FULL_MINUTES} minutes, on a quiet machine): `{RERUN}`.\n"
    )


def summary_cells(sid: str, case: CaseRecord, infos: dict[str, LibraryInfo], lower: bool) -> str:
    """asyncredlock's value | the best peer's | the comparison, for one case."""
    ours = ok_result(case, OURS)
    mine = value(ours) if ours is not None else None
    best = best_of(case, peers_in(case), lower)
    if mine is not None:
        left = show(sid, mine)
    elif ours is not None and failed_acquires(ours):
        left = f"{failed_acquires(ours)} acquires failed"
    else:
        left = status_text(case, OURS, infos).split(": ", 1)[1]
    if best is None:
        return f"{left} | no peer completed | -"
    lib, theirs = best
    right = f"{infos[lib]['label']} {show(sid, theirs)}"
    if mine is None:
        return f"{left} | {right} | -"
    if show(sid, mine) == show(sid, theirs):  # as shown, neither is ahead
        versus = "equal at this precision"
    elif not lower:
        versus = f"{times(mine / theirs)} the peer's" if theirs > 0 else "-"
    elif mine <= 0:
        versus = "-"
    elif mine <= theirs:
        versus = f"{times(theirs / mine)} faster"
    else:
        versus = f"{times(mine / theirs)} slower"
    return f"{left} | {right} | {versus}"


def show(sid: str, v: float) -> str:
    """A headline value: a rate without decimals, a latency in ms."""
    return f"{v:,.0f}" if sid in "cd" else number(v)


COLORS = {
    "asyncredlock": "tab:blue",
    "asyncredlock-unfenced": "lightskyblue",
    "asyncredlock-fair": "navy",
    "asyncredlock-nopoll": "slategray",
    "aioredlock": "tab:orange",
    "pottery": "tab:green",
    "redlock-ng": "tab:red",
    "redis-py": "tab:purple",
    "python-redis-lock": "tab:brown",
}
PANEL_LABELS = {
    "a": ("p50 acquire + release (ms, log)", True),
    "b": ("p50 acquire (ms, log)", True),
    "c": ("cycles per second", False),
    "d": ("acquisitions per second", False),
    "e": ("p50 release() → acquire() (ms, log)", True),
}


def loop_of(report: PeersReport) -> str:
    """The event loop the run measured on: ``asyncio`` (the published run) or ``uvloop``."""
    return report["environment"].get("event_loop", "asyncio")


def on_loop(report: PeersReport) -> str:
    """`` on uvloop`` for a run on uvloop; nothing on asyncio's loop."""
    loop = loop_of(report)
    return "" if loop == "asyncio" else f" on {loop}"


def plot(report: PeersReport, path: Path) -> None:
    """One panel per scenario, grouped bars (cases by libraries); hangs marked."""
    plt = pyplot()
    fig, grid = plt.subplots(2, 3, figsize=(15, 8.5), dpi=100)
    axes = list(grid.flat)
    infos = report["libraries"]
    for ax, scenario in zip(axes, report["scenarios"], strict=False):
        bars(ax, scenario, infos, report["settings"]["op_guard_s"] * 1000)
    legend_panel(axes[-1], infos)
    fig.suptitle(
        "asyncredlock and other Python Redis locks"
        + on_loop(report)
        + " (bars: ok; hatched: hung at the guard; "
        "'failed' or 'hung' written where no bar; missing: n/a or unavailable)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def bars(ax: Any, scenario: ScenarioRecord, infos: dict[str, LibraryInfo], guard_ms: float) -> None:
    """Grouped bars of one scenario's metric."""
    ylabel, log = PANEL_LABELS[scenario["id"]]
    libs = list(infos)
    width = 0.8 / len(libs)
    for i, case in enumerate(scenario["cases"]):
        for j, lib in enumerate(libs):
            x = i - 0.4 + width * (j + 0.5)
            bar(ax, x, width, case["results"][lib], COLORS[lib], guard_ms, log)
    ax.set_xticks(range(len(scenario["cases"])))
    # wrapped: d's five case names would run into each other on one line
    ax.set_xticklabels([textwrap.fill(c["name"], 14) for c in scenario["cases"]], fontsize=8)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(f"{scenario['id']}. {scenario['title']}", fontsize=10)
    if log:
        from matplotlib.ticker import FormatStrFormatter, LogLocator

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
    ax.grid(True, axis="y", alpha=0.3)


def bar(
    ax: Any,
    x: float,
    width: float,
    result: Result,
    color: str,
    guard: float,
    log: bool,
) -> None:
    """One bar, or the mark of a hang or failure."""
    y = value(result)
    if y is not None:
        ax.bar(x, y, width, color=color)
    elif result["status"] == "hung" and log:
        ax.bar(x, guard, width, color="white", edgecolor=color, hatch="//")
        ax.annotate(
            "hung", (x, guard * 0.8), ha="center", va="top", rotation=90, color=color, fontsize=8
        )
    elif result["status"] in ("hung", "failed") or failed_acquires(result):
        ax.annotate(
            "failed" if result["status"] == "ok" else result["status"],
            (x, 0.02),
            ha="center",
            va="bottom",
            rotation=90,
            color=color,
            fontsize=8,
            xycoords=("data", "axes fraction"),
        )


def legend_panel(ax: Any, infos: dict[str, LibraryInfo]) -> None:
    """The last panel: the legend."""
    from matplotlib.patches import Patch

    handles = [Patch(color=COLORS[lib], label=info["label"]) for lib, info in infos.items()]
    ax.legend(handles=handles, loc="center", fontsize=10, frameon=False)
    ax.axis("off")


def write_outputs(
    report: PeersReport, out: Path, docs: Path | None, readme: Path | None = None
) -> None:
    """JSON, markdown and PNG into ``out`` (``peers-uvloop.*`` for a run on uvloop);
    the plot and section into ``docs`` and the summary into ``readme``, if given (the
    caller publishes only a run on asyncio)."""
    loop = loop_of(report)
    stem = "peers" if loop == "asyncio" else f"peers-{loop}"
    write_json(out / f"{stem}.json", report)
    write_text(out / f"{stem}.md", markdown(report))
    plot(report, out / f"{stem}.png")
    if docs is not None:
        (docs / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "peers.png", docs / "img" / "peers.png")
        publish_section(docs / "peers.md", MARKER, docs_section(report))
    if readme is not None:
        publish_between(readme, SUMMARY_START, SUMMARY_END, summary_table(report))
