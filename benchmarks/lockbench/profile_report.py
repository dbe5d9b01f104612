"""The profile benchmark's results and report: the shape of ``profile_throughput.json``
(typed), and from it the markdown tables of ``profile_throughput.md``.

``profile_throughput.py`` measures and writes the JSON, then calls `write_outputs`;
``python benchmarks/profile_throughput.py --report results/profile_throughput.json``
runs this step alone on results already written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NotRequired, TypeAlias, TypedDict, final

from .adapters import LibraryInfo
from .harness import Environment, Spread, write_json, write_text
from .peers_records import FailureCount, Outcome, ThroughputRun

# --- the results -----------------------------------------------------------------------------

POLL = "loop poll (epoll; idle included)"
GC_LAYER = "gc (collector, from gc.callbacks)"
LAYER_ORDER = (
    "redis-py",
    "aioredis",
    "asyncredlock",
    "pottery",
    "aioredlock",
    "asyncio",
    POLL,
    "benchmark harness",
    "other",
    GC_LAYER,
)
"""The layers a profile's time is grouped by, in the order of the JSON and the table."""


class Plan(TypedDict):
    """What one run does (the report's ``"plan"``)."""

    n: int  # masters
    duration: float  # seconds per timed window
    reps: int  # timed windows per configuration
    count_duration: float  # seconds of the counting window
    profile: bool  # whether the profiled windows run
    quick: bool
    # Straight to the servers when False (the default): at RTT 0 a proxy process
    # forwarding every command would cap the rate, and measure itself, not the client.
    via_proxy: bool


class RunSettings(TypedDict):
    """What every configuration got (the report's ``"settings"``)."""

    n: int
    workers: int
    ttl_s: float
    wait_s: float
    pool: int  # connections per master
    settle_s: float  # the pause for background calls after a warm-up or counted window
    silenced_loggers: list[str]


class Throughput(ThroughputRun, FailureCount):
    """One window: the timed run of `lockbench.workloads.throughput_run` and its failed
    operations (as in scenario c of ``peers.json``), then what the window adds."""

    warmup_failures: NotRequired[int]
    attempts_per_cycle: NotRequired[float]  # where the library counts its attempts


#: A window that stopped on an error (`lockbench.workloads.failure`, status "hung" or
#: "failed"): no numbers.
Stopped: TypeAlias = Outcome


class GcRecord(TypedDict):
    """The automatic collections of a timed window, per 1,000 cycles."""

    cpu_s_per_1000: float
    gen0_per_1000: float
    gen1_per_1000: float
    gen2_per_1000: float
    collected_objects_per_1000: float


@final
class TimedWindow(Throughput):
    """A timed window (pass 1)."""

    proxy_cpu_s_per_1000: float | None  # None where /proc cannot tell
    servers_cpu_s_per_1000: float | None
    gc: GcRecord
    tracked_objects: int  # objects the collector tracked before the window


class Counts(TypedDict):
    """What a counting window counted, per cycle (``cycles`` and the harness's tasks
    excepted); None where the library has no such thing or nothing was counted."""

    cycles: int
    tasks: float
    commands: float
    commands_per_master: float
    master_calls: float | None
    commands_per_master_call: float | None
    socket_writes: float
    commands_per_write: float | None
    script_commands: float
    loop_callbacks: float
    loop_iterations: float
    tasks_by_coroutine: dict[str, float]  # "coroutine <- creator"
    harness_tasks_not_counted: int
    commands_by_name: dict[str, float]


@final
class CountWindow(Throughput):
    """A counting window (pass 2)."""

    counts: Counts


class TopFunction(TypedDict):
    """One function of a profile, per cycle."""

    function: str
    calls_per_cycle: float
    own_ms_per_cycle: float
    cumulative_ms_per_cycle: float


class ProfileRecord(TypedDict):
    """A profiled window's time per cycle, by layer and by function."""

    cycles: int
    profiled_ms_per_cycle: float
    cpu_ms_per_cycle_while_profiled: float
    layers_ms_per_cycle: dict[str, float]  # every layer of LAYER_ORDER, in its order
    top_functions: list[TopFunction]


@final
class ProfiledWindow(Throughput):
    """A profiled window (pass 3)."""

    profile: ProfileRecord


class RepSummary(TypedDict):
    """Every timed metric over the windows that completed; None where none has it."""

    reps_ok: int
    cycles_per_s: Spread | None
    cpu_s_per_1000: Spread | None
    gc_cpu_s_per_1000: Spread | None
    gc_share: Spread | None  # GC CPU over client CPU
    gen0_per_1000: Spread | None
    gen1_per_1000: Spread | None
    gen2_per_1000: Spread | None
    proxy_cpu_s_per_1000: Spread | None
    servers_cpu_s_per_1000: Spread | None
    attempts_per_cycle: Spread | None
    failures: Spread | None


class Configuration(TypedDict):
    """What every configuration's record starts with."""

    label: str
    note: str
    available: bool
    status: str  # "ok", "failed" (no timed window completed) or "unavailable"


@final
class Unavailable(Configuration):
    """A configuration whose library does not import here."""

    reason: str | None  # why (the library's ``LibraryInfo``)


@final
class Measured(Configuration):
    """A configuration that ran: its windows of every pass."""

    summary: RepSummary
    reps: list[TimedWindow | Stopped]
    counting: CountWindow | Stopped
    profile: ProfiledWindow | Stopped | None  # None when not profiled
    reason: NotRequired[str]  # when no timed window completed


class ProfileReport(TypedDict):
    """``profile_throughput.json``: what was run, on what, and what came out."""

    benchmark: str
    command: str
    settings: RunSettings
    plan: Plan
    environment: Environment
    libraries: dict[str, LibraryInfo]
    configs: dict[str, Measured | Unavailable]  # per configuration id
    loop_errors: dict[str, FailureCount]  # per configuration running at the time
    seconds: float


# --- the markdown ------------------------------------------------------------------------------

TOP_SHOWN = 10  # top functions per profile in the markdown

TIMED_HEADER = """\
Timed windows, one fresh session each after a warm-up cycle per worker; the
configurations take turns within each rep. Columns:

- **cycles/s**: completed acquire + release cycles per second, median (min-max) over
  the reps;
- **client CPU**: CPU seconds of the benchmark process (`time.process_time()`, all
  threads) per 1,000 cycles, median (min-max); **Δ vs defaults**: its median minus
  that of asyncredlock with its defaults;
- **GC CPU**: the part of the client CPU spent inside the garbage collector
  (`gc.callbacks`), s per 1,000 cycles, median (min-max); **GC share**: GC CPU over
  client CPU, median;
- **gen-0 / gen-1 / gen-2**: automatic collections per 1,000 cycles, median;
- **proxy**, **servers**: CPU seconds of the proxy process and of the N servers per
  1,000 cycles, median (`/proc`; "-" where unavailable);
- **attempts/cycle**: asyncredlock's acquisition rounds per cycle in the window
  (above 1: rounds that failed and were retried);
- **failures**: failed acquires or releases in the window, median.
"""

COUNT_HEADER = """\
One counting window per configuration (the counting hooks slow the client, so no rate
is reported from it). Per acquire + release cycle:

- **tasks**: asyncio tasks created (the loop's task factory);
- **commands**: commands sent to all masters (redis-py `Redis.execute_command`,
  aioredis `RedisConnection.execute`); **per master**: commands ÷ N;
- **master calls**: asyncredlock's calls to one master (`Node.call`); **per call**:
  commands ÷ master calls;
- **writes**: socket writes (`socket.send`) of the client, all masters together;
  **per write**: commands ÷ writes (above 1: commands joined into one write);
- **scripts**: the script commands among them (`EVAL`, `EVALSHA`, `FCALL`);
- **callbacks**: event-loop callbacks run (`Handle._run`); **iterations**: loop
  iterations (`_run_once`);
- **attempts/cycle**: asyncredlock's acquisition rounds per cycle in this window;
- **by name**: commands per cycle by command name.

The tasks exclude the timed loop's own worker tasks (one per worker and window).
"""

PROFILE_HEADER = """\
A cProfile of one timed window per profiled configuration: own time per cycle
(wall-clock, ms), grouped by the layer of the code; a C function's time is charged to
the layer of its caller. The profiler's clock stops while the garbage collector runs,
and the collector's time (`gc.callbacks`) is its own row. "loop poll" is the time in
`epoll` (waiting for I/O included). Profiling inflates Python-level time: compare the
rows with each other, and the total with the unprofiled client CPU below it. In the
top functions, the calls of a coroutine count its resumptions.
"""


def fmt(value: float | None, digits: int = 3) -> str:
    """A number with ``digits`` decimals (thousands separated), or a dash."""
    return "-" if value is None else f"{value:,.{digits}f}"


def ranged(stats: Spread | None, digits: int = 3) -> str:
    """``median (min-max)``."""
    if stats is None:
        return "-"
    median, low, high = (fmt(stats[k], digits) for k in ("median", "min", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def median_of(stats: Spread | None) -> float | None:
    """The median of a spread, if there is one."""
    return None if stats is None else float(stats["median"])


def ok_configs(report: ProfileReport) -> list[tuple[str, Measured]]:
    """The configurations with a completed timed window, by id, in the report's order."""
    return [(k, c) for k, c in report["configs"].items() if "summary" in c and c["status"] == "ok"]


def counted(config: Measured) -> CountWindow | None:
    """The configuration's counting window, if it completed."""
    window = config["counting"]
    return window if "counts" in window and window["status"] == "ok" else None


def profiled(config: Measured) -> ProfiledWindow | None:
    """The configuration's profiled window, if it was profiled and completed."""
    window = config["profile"]
    if window is None or "profile" not in window or window["status"] != "ok":
        return None
    return window


def versus_defaults(config_id: str, delta: float | None) -> str:
    """The Δ vs defaults cell."""
    if config_id == "asyncredlock":
        return "baseline"
    return "-" if delta is None else f"{delta:+.3f}"


def timed_row(config_id: str, config: Measured, base_cpu: float | None) -> str:
    """One configuration's row of the timed table."""
    s = config["summary"]
    cpu = median_of(s["cpu_s_per_1000"])
    delta = None if cpu is None or base_cpu is None else cpu - base_cpu
    share = median_of(s["gc_share"])
    cells = [
        config["label"],
        ranged(s["cycles_per_s"], 0),
        ranged(s["cpu_s_per_1000"]),
        versus_defaults(config_id, delta),
        ranged(s["gc_cpu_s_per_1000"]),
        "-" if share is None else f"{share:.0%}",
        fmt(median_of(s["gen0_per_1000"]), 0),
        fmt(median_of(s["gen1_per_1000"]), 0),
        fmt(median_of(s["gen2_per_1000"]), 0),
        fmt(median_of(s["proxy_cpu_s_per_1000"])),
        fmt(median_of(s["servers_cpu_s_per_1000"])),
        fmt(median_of(s["attempts_per_cycle"])),
        fmt(median_of(s["failures"]), 0),
    ]
    return "| " + " | ".join(cells) + " |"


def timed_section(report: ProfileReport) -> str:
    """Throughput, client CPU and garbage collection: one row per configuration."""
    base = report["configs"].get("asyncredlock")
    base_cpu = (
        median_of(base["summary"]["cpu_s_per_1000"])
        if base is not None and "summary" in base
        else None
    )
    rows = [timed_row(config_id, config, base_cpu) for config_id, config in ok_configs(report)]
    return (
        "## Throughput, client CPU and garbage collection\n\n"
        + TIMED_HEADER
        + "\n| configuration | cycles/s | client CPU s/1000 | Δ vs defaults | GC CPU s/1000 "
        "| GC share | gen-0/1000 | gen-1/1000 | gen-2/1000 | proxy CPU s/1000 "
        "| servers CPU s/1000 | attempts/cycle | failures |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n" + "\n".join(rows) + "\n"
    )


def count_row(config: Measured) -> str:
    """One configuration's row of the counts table, or why it has none."""
    window = counted(config)
    if window is None:
        counting = config["counting"]
        return f"| {config['label']} | {counting['status']}: {counting['reason']} |"
    c = window["counts"]
    names = ", ".join(f"{k} {v:g}" for k, v in c["commands_by_name"].items())
    cells = [
        config["label"],
        str(c["cycles"]),
        fmt(c["tasks"], 2),
        fmt(c["commands"], 2),
        fmt(c["commands_per_master"], 2),
        fmt(c["master_calls"], 2),
        fmt(c["commands_per_master_call"], 2),
        fmt(c.get("socket_writes"), 2),
        fmt(c.get("commands_per_write"), 2),
        fmt(c["script_commands"], 2),
        fmt(c["loop_callbacks"], 1),
        fmt(c["loop_iterations"], 2),
        fmt(window.get("attempts_per_cycle")),
        names,
    ]
    return "| " + " | ".join(cells) + " |"


def tasks_table(report: ProfileReport, tasks: dict[str, dict[str, float]]) -> str:
    """Tasks per cycle by coroutine and creator: one column per configuration counted."""
    keys = sorted(
        {k for t in tasks.values() for k in t},
        key=lambda k: (-max(t.get(k, 0.0) for t in tasks.values()), k),
    )
    rows = [
        f"| `{key}` | " + " | ".join(fmt(t.get(key), 2) for t in tasks.values()) + " |"
        for key in keys
        if max(t.get(key, 0.0) for t in tasks.values()) >= 0.01
    ]
    heads = " | ".join(report["configs"][c]["label"] for c in tasks)
    return (
        "### Tasks per cycle by coroutine\n\n"
        "Each row: the task's coroutine `<-` the first function outside asyncio that "
        "created it (rows under 0.01 per cycle left out).\n\n"
        f"| coroutine <- created by | {heads} |\n|---|"
        + "--:|" * len(tasks)
        + "\n"
        + "\n".join(rows)
        + "\n"
    )


def counts_section(report: ProfileReport) -> str:
    """Per-cycle counts: one row per configuration, then the tasks by coroutine."""
    measured = ok_configs(report)
    tasks = {
        config_id: window["counts"]["tasks_by_coroutine"]
        for config_id, config in measured
        if (window := counted(config)) is not None
    }
    return (
        "## Per-cycle counts\n\n"
        + COUNT_HEADER
        + "\n| configuration | cycles counted | tasks | commands | per master | master calls "
        "| per call | writes | per write | scripts | callbacks | iterations | attempts/cycle "
        "| by name |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n"
        + "\n".join(count_row(config) for _, config in measured)
        + "\n\n"
        + tasks_table(report, tasks)
    )


Profiled = Sequence[tuple[Measured, ProfiledWindow]]  # the profiled configurations, in order


def layer_rows(windows: Profiled) -> str:
    """ms per cycle and share of each layer that took any time, then the totals."""
    layers = [
        layer
        for layer in LAYER_ORDER
        if any(w["profile"]["layers_ms_per_cycle"][layer] >= 0.0005 for _, w in windows)
    ]
    rows = []
    for layer in layers:
        cells = []
        for _, w in windows:
            value = w["profile"]["layers_ms_per_cycle"][layer]
            total = w["profile"]["profiled_ms_per_cycle"] or 1.0
            cells += [fmt(value), f"{value / total:.0%}"]
        rows.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n" + total_rows(windows)


def total_rows(windows: Profiled) -> str:
    """The totals under the layers, against the client CPU with and without profiler."""

    def row(name: str, values: Sequence[float | None], digits: int = 3) -> str:
        cells = [c for value in values for c in (fmt(value, digits), "")]
        return f"| {name} | " + " | ".join(cells) + " |\n"

    records = [w["profile"] for _, w in windows]
    return (
        row("**total profiled**", [p["profiled_ms_per_cycle"] for p in records])
        + row("client CPU while profiled", [p["cpu_ms_per_cycle_while_profiled"] for p in records])
        + row(
            "client CPU unprofiled (timed median)",
            [median_of(c["summary"]["cpu_s_per_1000"]) for c, _ in windows],
        )
        + row("attempts/cycle while profiled", [w.get("attempts_per_cycle") for _, w in windows])
        + row("cycles profiled", [p["cycles"] for p in records], 0)
    )


def top_table(label: str, profile: ProfileRecord) -> str:
    """A profiled configuration's top functions by own time."""
    lines = [
        f"| `{f['function']}` | {f['calls_per_cycle']:.2f} | {f['own_ms_per_cycle']:.3f} "
        f"| {f['cumulative_ms_per_cycle']:.3f} |"
        for f in profile["top_functions"][:TOP_SHOWN]
    ]
    return (
        f"### {label}: top functions by own time\n\n"
        "| function | calls/cycle | own ms/cycle | cumulative ms/cycle |\n"
        "|---|--:|--:|--:|\n" + "\n".join(lines) + "\n"
    )


def profile_section(report: ProfileReport) -> str:
    """Profile by layer: a column pair per profiled configuration, then its top functions."""
    windows = [(c, w) for _, c in ok_configs(report) if (w := profiled(c)) is not None]
    if not windows:
        return "## Profile by layer\n\nNot run (`--profile`).\n"
    heads = " | ".join(f"{c['label']} ms/cycle | share" for c, _ in windows)
    return (
        "## Profile by layer\n\n"
        + PROFILE_HEADER
        + f"\n| layer | {heads} |\n|---|"
        + "--:|--:|" * len(windows)
        + "\n"
        + layer_rows(windows)
        + "\n"
        + "\n".join(top_table(c["label"], w["profile"]) for c, w in windows)
    )


def introduction(report: ProfileReport) -> str:
    """The title, what was run and on what, and the command."""
    plan, env = report["plan"], report["environment"]
    route = (
        "each behind a proxy in a separate process"
        if plan.get("via_proxy")
        else "straight to the servers, no proxy"
    )
    return (
        f"# Scenario c dissected: where the client CPU goes (N = {plan['n']})\n\n"
        f"{report['settings']['workers']} workers, each on its own key, run acquire + "
        f"release cycles over N = {plan['n']} masters ({route}), as in scenario c of "
        f"`peers.py`: {plan['reps']} timed windows of {plan['duration']:g} s per "
        f"configuration, one counting window of {plan['count_duration']:g} s"
        + (", one profiled window" if plan["profile"] else "")
        + ". asyncredlock's defaults: fencing and auto-extension on. "
        f"Python {env['python']}, redis-py {env['redis_py']}, {env['server']}, "
        f"{env['cpu_count']} CPUs ({env['cpu_model']}), {env['date']}.\n"
        + ("\n**Quick run: too short to mean anything.**\n" if plan["quick"] else "")
        + f"\nCommand: `{report['command']}` ({report['seconds']:g} s).\n\n"
    )


def markdown(report: ProfileReport) -> str:
    """``profile_throughput.md``: the tables, each under a short header saying what its
    columns are."""
    skipped = [
        f"- {c['label']}: not run ({c['status']}): {c.get('reason', '')}"
        for c in report["configs"].values()
        if c["status"] != "ok"
    ]
    errors = [
        f"- {who}: {record['failures']} ({'; '.join(record['failure_examples'])})"
        for who, record in report["loop_errors"].items()
    ]
    return (
        introduction(report)
        + ("Not measured:\n\n" + "\n".join(skipped) + "\n\n" if skipped else "")
        + ("Unretrieved task errors:\n\n" + "\n".join(errors) + "\n\n" if errors else "")
        + timed_section(report)
        + "\n"
        + counts_section(report)
        + "\n"
        + profile_section(report)
    )


def write_outputs(report: ProfileReport, out: Path) -> str:
    """``profile_throughput.json`` and ``profile_throughput.md`` into ``out``.

    Returns:
        The markdown written.
    """
    write_json(out / "profile_throughput.json", report)
    text = markdown(report)
    write_text(out / "profile_throughput.md", text)
    return text
