"""The scale benchmark's report: from its results (``scale.json``) to the markdown
tables, the sizing lines, the plot and the docs page.

``scale.py`` measures and writes the JSON through `write_outputs`; ``python
benchmarks/scale.py --report results/scale.json`` runs this step alone on results
already written. The types here are the JSON's shape, for both.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict

from .harness import (
    Environment,
    Summary,
    machine_line,
    publish_between,
    pyplot,
    write_json,
    write_text,
)

START = "<!-- SCALE-BENCH -->"
END = "<!-- /SCALE-BENCH -->"
#: The per-master bytes figures of a `ResourcesResult`.
BytesField = Literal["bytes_per_held_lock", "bytes_left_per_resource"]


class Settings(TypedDict):
    """What a run measured: the masters, and the size of each case."""

    masters: list[int]  # N of each group of cases, fresh servers for each
    lockers: int  # concurrent tasks looping acquire + release, each on its own key
    clients: int  # the AsyncRedlock clients they are spread over in the second case
    window_s: float  # seconds each lockers case runs
    resources: int  # distinct locks taken and held at once
    takers: int  # concurrent tasks taking (and releasing) them
    hold_ttl_s: float  # the held locks' TTL (no auto-extension)
    client_leases: int  # leases held under tracemalloc for the client's memory per lease


class LockersResult(TypedDict):
    """``lockers`` tasks of ``clients`` clients, each looping acquire + release of its
    own key for a fixed window."""

    masters: int
    clients: int
    lockers: int
    seconds: float
    cycles: int
    cycles_per_s: float
    client_cpu_s_per_1000: float
    cycle: Summary | None  # acquire + release, per cycle; None: no cycle completed
    server_cpu_s_per_1000: float  # used_cpu_sys + used_cpu_user, summed over the masters
    server_cpu_s_per_1000_by_master: list[float]
    server_commands_per_cycle: float  # total_commands_processed, summed over the masters
    connections_by_master: list[int]  # connected_clients at the end, less the probe's
    bytes_per_connection: list[float]  # mem_clients_normal / connected_clients, at the end
    failures: dict[str, int]  # by exception type
    counters: dict[str, int]  # the clients' statistics(), added up


class MemoryProbe(TypedDict):
    """Each master's ``used_memory`` (once it stopped moving) and ``DBSIZE``."""

    used_memory: list[int]
    dbsize: list[int]
    settled: list[bool]  # False: used_memory still moved when the probe gave up


class ResourcesResult(TypedDict):
    """``resources`` distinct locks taken by ``takers`` tasks of one client, held
    together, then released."""

    masters: int
    fencing: bool
    resources: int
    takers: int
    held: int  # locks held at once (resources less failures)
    take_seconds: float
    takes_per_s: float
    take_client_cpu_s_per_1000: float
    release_seconds: float
    releases_per_s: float
    release_client_cpu_s_per_1000: float
    failures: dict[str, int]  # by exception type, taking or releasing
    empty: MemoryProbe  # after the warm-up and FLUSHALL SYNC
    holding: MemoryProbe
    released: MemoryProbe
    bytes_per_held_lock: list[float]  # per master: (holding - empty) / held
    bytes_left_per_resource: list[float]  # per master: (released - empty) / resources
    memory_usage: dict[str, int]  # MEMORY USAGE of one lock key / fence counter, master 0
    fence_keys_left: list[int]  # per master, after release
    other_keys_left: list[int]  # per master, after release: keys that are no fence counter
    other_keys_sample: list[str]
    client_bytes_per_held_lock: float  # tracemalloc, over settings.client_leases leases


class ScaleReport(TypedDict):
    """``scale.json``."""

    environment: Environment
    quick: bool
    settings: Settings
    lockers: list[LockersResult]
    resources: list[ResourcesResult]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _span(values: Sequence[float], digits: int = 0) -> str:
    """The median of per-master values, with their range when they differ."""
    low, mid, high = min(values), _median(values), max(values)
    text = f"{mid:,.{digits}f}"
    if round(low, digits) != round(high, digits):
        text += f" ({low:,.{digits}f}-{high:,.{digits}f})"
    return text


def _failures(counts: dict[str, int]) -> str:
    if not counts:
        return "0"
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def lockers_table(report: ScaleReport) -> list[str]:
    """The lines of the concurrent-lockers section."""
    s = report["settings"]
    lines = [
        f"### {s['lockers']:,} concurrent lockers",
        "",
        f"{s['lockers']:,} tasks, each looping acquire + release of its own key for"
        f" {s['window_s']:g} s, on one `AsyncRedlock` or spread over {s['clients']} of them"
        " (defaults: fencing and auto-extension on). Server CPU is `used_cpu_sys +"
        " used_cpu_user` of `INFO cpu`, and commands `total_commands_processed`, both"
        " summed over the N masters; connections are those open on each master at the end.",
        "",
        "| N | clients | cycles/s | client CPU s / 1,000 cycles | cycle p50 (ms) | cycle p99 (ms)"
        " | server CPU s / 1,000 cycles (all masters) | server commands / cycle (all masters,"
        " with those scripts call)"
        " | connections per master | failures |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in report["lockers"]:
        cycle = r["cycle"]
        p50 = "-" if cycle is None else f"{cycle['p50_ms']:.1f}"
        p99 = "-" if cycle is None else f"{cycle['p99_ms']:.1f}"
        lines.append(
            f"| {r['masters']} | {r['clients']} | {r['cycles_per_s']:,.0f}"
            f" | {r['client_cpu_s_per_1000']:.3f} | {p50} | {p99}"
            f" | {r['server_cpu_s_per_1000']:.3f} | {r['server_commands_per_cycle']:.1f}"
            f" | {_span(r['connections_by_master'])} | {_failures(r['failures'])} |"
        )
    return lines


def resources_table(report: ScaleReport) -> list[str]:
    """The lines of the held-locks section."""
    s = report["settings"]
    lines = [
        f"### {s['resources']:,} distinct resources",
        "",
        f"One `AsyncRedlock` takes {s['resources']:,} distinct locks with {s['takers']}"
        f" concurrent tasks (TTL {s['hold_ttl_s']:g} s, no auto-extension), holds them all,"
        " then releases them. Memory is each master's `INFO memory` `used_memory` once it"
        " stopped moving (no `MEMORY PURGE`), less the same on the emptied server before;"
        " per master, median (range over the masters).",
        "",
        "| N | fencing | takes/s | client CPU s / 1,000 takes | releases/s"
        " | bytes per held lock, per master | keys per master while held"
        " | bytes left per resource after release | keys left per master (fence counters"
        " / other) | client bytes per held lease | failures |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in report["resources"]:
        lines.append(
            f"| {r['masters']} | {'on' if r['fencing'] else 'off'} | {r['takes_per_s']:,.0f}"
            f" | {r['take_client_cpu_s_per_1000']:.3f} | {r['releases_per_s']:,.0f}"
            f" | {_span(r['bytes_per_held_lock'])} | {_span(r['holding']['dbsize'])}"
            f" | {_span(r['bytes_left_per_resource'])}"
            f" | {_span(r['fence_keys_left'])} / {_span(r['other_keys_left'])}"
            f" | {r['client_bytes_per_held_lock']:,.0f} | {_failures(r['failures'])} |"
        )
    return lines


def _bytes(rows: list[ResourcesResult], fencing: bool, field: BytesField) -> float | None:
    """The median over N and masters of a per-master bytes figure, or None if unmeasured."""
    values = [v for r in rows if r["fencing"] is fencing for v in r[field]]
    return _median(values) if values else None


def sizing(report: ScaleReport) -> list[str]:
    """What a lock, a fence counter, a connection and a cycle cost each master, from
    the measured numbers (medians over every N and master)."""
    lines = [
        "### Sizing",
        "",
        "Medians over every N and master (what one master holds or does per lock does not"
        " depend on N; 1 MB here is 10^6 bytes):",
        "",
    ]
    return lines + _memory_lines(report["resources"]) + _work_lines(report["lockers"])


def _memory_lines(rows: list[ResourcesResult]) -> list[str]:
    fenced = _bytes(rows, True, "bytes_per_held_lock")
    plain = _bytes(rows, False, "bytes_per_held_lock")
    counter = _bytes(rows, True, "bytes_left_per_resource")
    if fenced is None or plain is None or counter is None:
        return ["- memory: both fencing cases are needed for these lines;"]
    client = [r["client_bytes_per_held_lock"] for r in rows]
    return [
        f"- a held lock takes **{fenced:,.0f} bytes** on every master with fencing (its"
        f" key and its fence counter), **{plain:,.0f} bytes** without: 1 million locks"
        f" held at once need about {fenced:,.0f} MB (fenced) or {plain:,.0f} MB on each"
        " master;",
        f"- a fence counter left after release takes **{counter:,.0f} bytes**: every"
        f" million resource names ever locked with fencing keep about {counter:,.0f} MB"
        " on each master (they never expire);",
        f"- a held lease (with its lock object) keeps {min(client):,.0f} to {max(client):,.0f}"
        " bytes of Python memory in its client (`tracemalloc`; more with more masters);",
    ]


def _work_lines(rows: list[LockersResult]) -> list[str]:
    if not rows:
        return []
    cpu_us = _median([r["server_cpu_s_per_1000"] * 1000 / r["masters"] for r in rows])
    commands = _median([r["server_commands_per_cycle"] / r["masters"] for r in rows])
    connection = _median([v for r in rows for v in r["bytes_per_connection"]])
    return [
        f"- an open connection takes about **{connection:,.0f} bytes** on a master"
        " (`mem_clients_normal` per connected client, idle at the end of a case);",
        f"- an acquire + release cycle costs each master about **{cpu_us:.1f} µs** of CPU"
        f" and {commands:.1f} commands (counting those its scripts call): a master"
        f" serves at most about {1e6 / cpu_us:,.0f} cycles/s per core it gets, whatever N.",
    ]


def section(report: ScaleReport) -> str:
    """The results page, which is also the docs section: both tables, the sizing
    lines, the machine, the plot and how to rerun."""
    lines = [
        *lockers_table(report),
        "",
        *resources_table(report),
        "",
        *sizing(report),
        "",
        machine_line(report["environment"])
        + (" Quick run: too small to size anything by." if report["quick"] else ""),
        "",
        "![scale benchmark](img/scale.png)",
        "",
        "Rerun (about 10 minutes): `python benchmarks/scale.py --docs docs`.",
    ]
    return "\n".join(lines) + "\n"


def plot(report: ScaleReport, path: Path) -> None:
    """Cycles/s, CPU per 1,000 cycles and bytes per lock, each against N."""
    plt = pyplot()
    fig, (rate, cpu, memory) = plt.subplots(1, 3, figsize=(14, 4))
    for clients in sorted({r["clients"] for r in report["lockers"]}):
        rows = [r for r in report["lockers"] if r["clients"] == clients]
        ns = [r["masters"] for r in rows]
        label = "1 client" if clients == 1 else f"{clients} clients"
        rate.plot(ns, [r["cycles_per_s"] for r in rows], marker="o", label=label)
        # one client: solid lines, filled markers; several: dashed, hollow
        look = {"linestyle": "-" if clients == 1 else "--"}
        look["fillstyle"] = "full" if clients == 1 else "none"
        client = [r["client_cpu_s_per_1000"] for r in rows]
        servers = [r["server_cpu_s_per_1000"] for r in rows]
        cpu.plot(ns, client, color="C0", marker="o", label=f"client, {label}", **look)
        cpu.plot(ns, servers, color="C1", marker="s", label=f"servers (sum), {label}", **look)
    lockers = report["settings"]["lockers"]
    rate.set(title=f"{lockers:,} lockers: cycles/s", xlabel="masters (N)", ylabel="cycles/s")
    cpu.set(title="CPU per 1,000 cycles", xlabel="masters (N)", ylabel="CPU s")
    _memory_panel(memory, report["resources"])
    for ax in (rate, cpu, memory):
        ax.set_xticks(report["settings"]["masters"])
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _memory_panel(ax: Any, rows: list[ResourcesResult]) -> None:
    """Bytes per held lock (fenced, unfenced) and per fence counter left, against N."""
    series: list[tuple[str, bool, BytesField]] = [
        ("held lock, fencing on", True, "bytes_per_held_lock"),
        ("held lock, fencing off", False, "bytes_per_held_lock"),
        ("fence counter left", True, "bytes_left_per_resource"),
    ]
    for label, fencing, field in series:
        picked = [r for r in rows if r["fencing"] is fencing]
        values = [_median(r[field]) for r in picked]
        ax.plot([r["masters"] for r in picked], values, marker="o", label=label)
    ax.set(title="memory per master", xlabel="masters (N)", ylabel="bytes")


def write_outputs(report: ScaleReport, out: Path, docs: Path | None) -> None:
    """JSON, markdown and PNG into ``out``; the plot and the section into ``docs``
    (``img/scale.png``, ``scale.md`` between its ``<!-- SCALE-BENCH -->`` lines) if given."""
    text = section(report)
    write_json(out / "scale.json", report)
    write_text(out / "scale.md", "# Scale\n\n" + text)
    plot(report, out / "scale.png")
    if docs is not None:
        (docs / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "scale.png", docs / "img" / "scale.png")
        publish_between(docs / "scale.md", START, END, text)
