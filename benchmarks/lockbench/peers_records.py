"""The records of the peers benchmark's JSON (``peers.json``), from the whole report
down to one library's result in one case.

``peers.py`` writes them and `lockbench.peers_report` reads them. A library's result
has one record type per kind of scenario (latency, fault, throughput, contention,
processes, wake-up), and `Outcome` where it has no numbers; every one of them holds a
``status`` and, when that is not ``"ok"``, a ``reason`` (`ResultBase`). The result
types are ``@final`` so that a check for one of their keys (``"wake" in result``)
tells them apart.
"""

from __future__ import annotations

from typing import Literal, NotRequired, Required, TypeAlias, TypedDict, final

from .adapters import LibraryInfo
from .harness import Environment, Summary
from .rtt import MeasuredRtt
from .targets import TargetRow

__all__ = [
    "Acquisitions",
    "CaseRecord",
    "ChildRecord",
    "ChildSpec",
    "ChildWindow",
    "ContentionResult",
    "FailureCount",
    "FaultResult",
    "FaultSamples",
    "HoldCount",
    "LatencyResult",
    "NoAcquisition",
    "Outcome",
    "PeersReport",
    "PlanRecord",
    "ProcessesResult",
    "Result",
    "ResultBase",
    "RunSettings",
    "ScenarioRecord",
    "Statistics",
    "Status",
    "ThroughputResult",
    "ThroughputRun",
    "WaitCounts",
    "WakeResult",
    "WithStatistics",
]

#: How a library's run in a case ended: with numbers ("ok"), stopped by a guard
#: ("hung") or an error ("failed"), or not run ("unavailable", "not_applicable").
Status: TypeAlias = Literal["ok", "hung", "failed", "unavailable", "not_applicable"]

#: A library's own counters after a case, by name (asyncredlock's
#: ``AsyncRedlock.statistics()``: acquisitions, hand-offs, wake-ups, ...).
Statistics: TypeAlias = dict[str, int]


# --- what results share ------------------------------------------------------------------


class ResultBase(TypedDict):
    """What every library's result in a case holds: its status and, unless it is
    "ok", why."""

    status: Status
    reason: NotRequired[str]


class FailureCount(TypedDict):
    """Failed operations of a run: how many, and up to three distinct messages."""

    failures: int
    failure_examples: list[str]


class WithStatistics(TypedDict):
    """The library's own counters after a case, where it keeps any (warm-up
    included); absent for the libraries that keep none."""

    library_statistics: NotRequired[Statistics]


# --- one library in one case -------------------------------------------------------------


@final
class Outcome(ResultBase):
    """A result without numbers: the library does not run in the case
    ("not_applicable", "unavailable"), or it stopped ("hung", "failed")."""

    completed: NotRequired[int]  # a: measured cycles done before it stopped


@final
class LatencyResult(ResultBase):
    """a: the latency of uncontended cycles (status "ok")."""

    total: Summary  # acquire + release
    acquire: Summary
    release: Summary


class FaultSamples(TypedDict, total=False):
    """b: the latency summaries of a run under the fault, each where it has samples."""

    acquire: Summary
    release: Summary
    failed_acquire: Summary  # how long an acquire took to fail


@final
class FaultResult(ResultBase, FailureCount, FaultSamples):
    """b: cycles with one master failing; "hung" or "failed" keep the numbers so far."""

    succeeded: int  # acquires that succeeded


class ThroughputRun(ResultBase):
    """c: the timed run of every worker cycling on its own key ("failed" if no cycle
    completed)."""

    workers: int
    cycles: int
    seconds: float
    cycles_per_s: float
    cpu_s: float  # this process's CPU time, threads included
    cpu_s_per_1000: float | None  # None: no cycle


@final
class ThroughputResult(ThroughputRun, FailureCount, WithStatistics):
    """c: the timed run, its failures, and the warm-up's."""

    warmup_failures: int  # warm-up cycles that failed (one per worker, all at once)


class WaitCounts(TypedDict):
    """d: the acquire() calls begun in the window, by how they ended (the wait summary
    counts them all)."""

    acquired: int  # returned in the window
    acquired_after_window: int
    failed: int  # raised: its wait runs to the error
    unfinished: int  # still waiting when the run stopped: its wait runs to the stop


class Acquisitions(ResultBase):
    """d: the acquisitions of the workers on one key that returned in the window
    (status "ok"), and the waits of every acquire() called in it."""

    workers: int
    window_s: float
    acquisitions: int
    acquisitions_per_s: float
    # acquire() called to its end; results written before `waits` existed counted only
    # the acquisitions that returned in the window
    wait: Summary
    waits: NotRequired[WaitCounts]  # absent from results written before it
    same_worker_again: float | None  # share of acquisitions by the last releaser; None: one
    busy_fraction: float  # held time over the window
    exclusion_violations: int  # acquisitions while an earlier holder still held


@final
class ContentionResult(Acquisitions, FailureCount, WithStatistics):
    """d: workers in this process, sharing one client or with one each."""


class HoldCount(TypedDict):
    """d, processes: the holds the workers made, and those the counter counted (fewer
    means a lost update: two holders at once)."""

    holds: int
    counted: int


@final
class ProcessesResult(Acquisitions, FailureCount, WithStatistics):
    """d: workers in several OS processes, a client each, counting their holds."""

    processes: int
    counter: HoldCount


@final
class NoAcquisition(ResultBase, WithStatistics, total=False):
    """d: no acquisition returned in the window (status "failed"). A run in this
    process adds its failed operations and the library's counters; the processes
    case does not."""

    window_s: Required[float]
    failures: int
    failure_examples: list[str]


@final
class WakeResult(ResultBase, WithStatistics):
    """e: the holder's release() called to the waiter's acquire() returning (status
    "ok"; results without ``release`` were timed from release() returning)."""

    wake: Summary
    release: NotRequired[Summary]  # the holder's release(), called to returning


#: One library's result in one case: the record of its scenario, or an `Outcome`.
Result: TypeAlias = (
    Outcome
    | LatencyResult
    | FaultResult
    | ThroughputResult
    | ContentionResult
    | ProcessesResult
    | NoAcquisition
    | WakeResult
)


# --- the processes of scenario d ---------------------------------------------------------


class ChildSpec(TypedDict):
    """What the parent passes one child process of scenario d (``--child JSON``)."""

    peer: str  # the library's id
    urls: list[str]  # the masters
    key: str
    counter: str  # the URL of the server the holds are counted on
    op_guard: float  # seconds the warm-up cycle may take per operation
    first: int  # the number of its first worker
    tasks: int  # its workers (tasks of its one client)
    loop: str  # the event loop it runs on: "asyncio" or "uvloop"
    stop_after: float  # seconds past the deadline its run stops (the plan's)


class ChildWindow(TypedDict):
    """What the parent sends every child once all are ready (``time.monotonic()``)."""

    start: float
    deadline: float


@final
class ChildRecord(FailureCount, WithStatistics):
    """What a child process prints last when its run is over (else an `Outcome`)."""

    status: Literal["ok"]
    holds: list[tuple[int, float, float, float, float]]  # the fields of each Hold
    misses: list[tuple[int, float, float, bool]]  # the fields of each Miss


# --- the report ----------------------------------------------------------------------------


class RunSettings(TypedDict):
    """What every library gets, and the run's guards (the report's ``"settings"``)."""

    ttl_s: float
    wait_s: float  # the longest a contended acquire waits, where a library takes a bound
    op_guard_s: float  # an operation that takes longer counts as hung
    close_guard_s: float
    throughput_workers: int
    contention_workers: int
    contention_hold_s: float
    contention_stop_after_s: NotRequired[float]  # d: the run stops this long after its window
    hold_counter: NotRequired[str]  # d, processes: when a hold reads and writes the counter
    process_cases: list[list[int]]  # d: [OS processes, workers in each] per case
    wake_hold_s: list[float]  # [low, high] of the holder's uniform hold
    wake_timed_from: NotRequired[str]  # e: "release() called"; absent: release() returning
    faulty_master: int  # the index of the master failing in b
    pool: int  # connections per master in each peer's pool (asyncredlock: one, no pool)
    seed: int
    silenced_loggers: list[str]


class PlanRecord(TypedDict):
    """The iterations and durations of a run (the report's ``"plan"``)."""

    quick: bool  # a smoke run: too few iterations to mean anything
    latency_iterations_by_rtt_ms: dict[str, int]
    warmup: int
    block: int
    fault_iterations: int
    fault_budget_s: float
    duration_s: float
    wake_trials: int


class CaseRecord(TypedDict):
    """One case of a scenario in the report: its setup and every library's result."""

    name: str
    n: int  # masters
    rtt_ms: float  # delay the proxies add
    fault: str | None  # b: "blackhole" or "down"
    clients: str  # d: "shared", "each" or "processes"
    via: str  # "proxy" or "direct"
    results: dict[str, Result]  # per library id
    seconds: float


class ScenarioRecord(TypedDict):
    """One scenario of the report (a to e)."""

    id: str
    title: str
    metric: str
    better: str  # "lower" or "higher"
    cases: list[CaseRecord]


class PeersReport(TypedDict):
    """``peers.json``: what was run, on what, and what came out."""

    benchmark: str
    unit: str
    settings: RunSettings
    plan: PlanRecord
    environment: Environment
    libraries: dict[str, LibraryInfo]
    measured_rtt: dict[str, MeasuredRtt]  # per nominal RTT
    scenarios: list[ScenarioRecord]
    loop_errors: dict[str, FailureCount]  # per library id (or phase) running at the time
    seconds: float
    ratios: NotRequired[dict[str, list[str]]]  # per scenario: asyncredlock vs the best peer
    targets: NotRequired[list[TargetRow]]  # added once the rest is known
