"""asyncredlock side by side with the other Python Redis lock libraries, in one run.

Libraries (each only if it imports; otherwise the output says why):

- **asyncredlock**: ``AsyncRedlock(urls, ttl=10, timeout=10)`` with its defaults
  (auto-extension on, fencing on), ``await redlock.lock(name, ttl=10,
  timeout=10).acquire()`` then ``await lease.release()``; in the latency scenarios
  (a, b, e) also with ``fencing=False``, in the contention scenario (d) also with
  ``fair=True``. Tasks of one ``AsyncRedlock`` that want the
  same key queue locally, and a released lease goes straight to the next of them
  (its lease auto-extends) without a call to the masters;
- **aioredlock**: ``Aioredlock(urls)``, ``lock(name, lock_timeout=10)``, ``unlock(lock)``;
- **pottery**: ``AIORedlock(key=name, masters=clients, auto_release_time=10)``,
  ``acquire(timeout=10)``, ``release()``;
- **redlock-ng**: ``redlock.AsyncRedlock(urls)``, ``acquire(name, 10000)``,
  ``release(lock)``;
- **redis-py**: ``redis.asyncio.lock.Lock(client, name, timeout=10,
  blocking_timeout=10)`` (one server only);
- **python-redis-lock**: ``redis_lock.Lock(client, name, expire=10)``, synchronous,
  run in a thread pool (one server only).

Every setting, passed or default, is read from the library and written to the JSON.
The scenarios, on real servers each behind a ``FaultProxy`` (hosted in a separate
process, see ``lockbench/harness.py``):

a. uncontended acquire + release latency, N = 1 and 5, RTT 0 and 2 ms;
b. N = 5 at RTT 2 ms with one master blackholed, and with one master's server stopped:
   per-acquire latency, failures, or "hung" when one operation outlasts the guard;
c. throughput: 200 workers on distinct keys for a fixed time: cycles per second and
   client CPU seconds per 1,000 cycles (``time.process_time()``, threads included);
d. contention: 10 workers on one key, each holding it 1 ms then trying again at once:
   acquisitions per second, wait p50/p99 (every acquire() called in the window, to its
   return, its error, or the run's stop), how often the releasing worker took the lock
   again next, and the fraction of the time the lock was held. The workers share one
   client (tasks of one process), or each has its own (as separate processes would),
   or they are OS processes with a client each (4 of 5 tasks each, and 10 of one task
   each, as web workers are), which also count their holds on a separate server (a GET
   as the hold begins, a SET of one more as it ends: two overlapping holds lose an
   update, a mutual-exclusion violation);
e. wake-up: one holder, one waiter blocked in acquire; time from the holder's release()
   call to the waiter's acquire() returning (from the call, not its return: libraries
   return from release() at different points, asyncredlock's at a quorum of masters).

c and d run at N = 5 (the Redlock libraries) and at N = 1 (every library, so the
single-server locks are compared too), RTT 0; e at N = 1 and 5, RTT 0.

Run from the repository root, after ``pip install -e '.[bench]'`` (see
``benchmarks/README.md`` for the one peer the extra cannot install)::

    python benchmarks/peers.py [--quick] [--out benchmarks/results] [--docs docs]
                               [--readme README.md] [--only asyncredlock,pottery]
                               [--scenarios ad] [--loop uvloop]

It writes ``peers.json`` (every number, every setting, the environment, the targets),
``peers.md`` (a table per scenario, the ratio of asyncredlock to the best peer, and
whether each target was met) and ``peers.png`` (a panel per scenario) to ``--out``;
with ``--docs`` it also copies the plot to ``DOCS/img/peers.png`` and rewrites
``DOCS/peers.md`` after its ``<!-- PEERS-TABLE -->`` line; with ``--readme`` it writes
a summary table between the ``<!-- PEERS-SUMMARY -->`` lines of that file. It
installs nothing. With ``--loop uvloop`` every library (the child processes of d
included) runs on uvloop instead of asyncio's default loop, and the files are
``peers-uvloop.*`` (no ``--docs`` or ``--readme``: the published run is asyncio's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import importlib
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from lockbench.adapters import (
    PEERS,
    UNCONTENDED,
    Handle,
    LibraryInfo,
    Mode,
    Peer,
    Session,
    probe,
)
from lockbench.harness import (
    ProxyHost,
    add_report_option,
    environment,
    read_report,
    servers_behind_proxies,
    summarize,
)
from lockbench.peers_records import (
    Acquisitions,
    CaseRecord,
    ChildRecord,
    ChildSpec,
    ChildWindow,
    ContentionResult,
    FaultResult,
    FaultSamples,
    LatencyResult,
    NoAcquisition,
    Outcome,
    PeersReport,
    PlanRecord,
    ProcessesResult,
    Result,
    ResultBase,
    RunSettings,
    ScenarioRecord,
    Statistics,
    ThroughputResult,
    WakeResult,
    WithStatistics,
)
from lockbench.peers_report import (
    cell,
    loop_of,
    ratio_lines,
    scenario_section,
    targets,
    targets_section,
    write_outputs,
)
from lockbench.rtt import MeasuredRtt, measure_quorum_round, measure_rtt
from lockbench.settings import CONTENTION_WORKERS, POOL, SERVERS, THROUGHPUT_WORKERS, TTL, WAIT
from lockbench.workloads import (
    CLOSE_GUARD,
    QUIET_LOGGERS,
    THROUGHPUT_MODE,
    Failures,
    HungError,
    LoopErrors,
    Run,
    bounded,
    cycle,
    failure,
    flush,
    guarded,
    library_statistics,
    outcome,
    quiet_loggers,
    throughput_run,
    warm_all,
)
from redis.asyncio import Redis

from asyncredlock.testing import ServerGroup

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
SEED = 1729
FAULTY = SERVERS - 1  # the master blackholed or stopped in scenario b
CONTENTION_HOLD = 0.001  # seconds each contention worker holds the lock
PROCESSES = 4  # d: OS processes in the first multi-process case…
PROCESS_TASKS = 5  # …and workers (tasks of one client) in each
LONE_PROCESSES = 10  # d: the second, one worker per process (as web workers are)


# --- what to run -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """Iterations, durations and guards of one run.

    Attributes:
        latency_iterations: Measured cycles per library in scenario a, by RTT in ms.
        warmup: Unmeasured cycles per library before a latency, fault or wake-up case.
        block: Scenario a alternates the libraries in blocks of this many cycles.
        fault_iterations: At most this many cycles per library in a scenario b case…
        fault_budget: …and no new cycle after this many seconds.
        duration: Seconds each library runs in a throughput or contention case.
        wake_trials: Measured trials per library in a wake-up case.
        wake_hold: The holder holds for a uniform time in this range (s) before it
            releases, so the release falls at a random point of the waiter's polling.
        op_guard: Seconds one acquire or release may take before it counts as hung.
        pings: PINGs through one proxy to measure the real round trip per RTT.
        stop_after: d: the run stops this long after its deadline (``STOP_AFTER``).
    """

    latency_iterations: dict[float, int]
    warmup: int
    block: int
    fault_iterations: int
    fault_budget: float
    duration: float
    wake_trials: int
    wake_hold: tuple[float, float]
    op_guard: float
    pings: int
    stop_after: float = WAIT


# The guard is above redis-py's default 5 s socket timeout, so a library that waits
# out a silent master is measured, not called hung. A full run takes about 11 minutes.
FULL = Plan({0.0: 1000, 2.0: 300}, 20, 25, 50, 30.0, 10.0, 60, (0.02, 0.12), 8.0, 100)
# A quick run stops d 2 s after its window, not 10 s: a peer's waiters left stranded
# (aioredlock's, in the processes) are cancelled sooner; every peer's longest wait in a
# quick run is about 1 s, and asyncredlock's well under.
QUICK = Plan({0.0: 5, 2.0: 4}, 2, 3, 3, 3.0, 0.3, 3, (0.02, 0.04), 1.0, 5, stop_after=2.0)


@dataclass(frozen=True, slots=True)
class Case:
    """One configuration of a scenario."""

    name: str
    n: int
    rtt_ms: float = 0.0
    fault: str | None = None  # "blackhole" or "down" (scenario b)
    # d: "shared" (one client for every worker), "each" (a client per worker) or
    # "processes" (`processes` OS processes, a client each, `tasks` workers each)
    clients: str = "shared"
    processes: int = 0
    tasks: int = 0


def via_proxy(case: Case) -> bool:
    """Whether a case needs the proxies: to add a round trip, or to inject a fault.

    At RTT 0 every library connects straight to the servers: a proxy process that
    forwards every command would cap the rate at what it can forward, and measure
    itself instead of the libraries.
    """
    return case.rtt_ms > 0 or case.fault is not None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario: its cases, and the metric that decides who is best in each."""

    id: str
    title: str
    cases: tuple[Case, ...]
    metric: str  # the label of the compared value
    better: str  # "lower" or "higher"


LATENCY = Scenario(
    "a",
    "Uncontended acquire + release latency",
    tuple(Case(f"N={n}, RTT {rtt:g} ms", n, rtt) for rtt in (0.0, 2.0) for n in (1, 5)),
    "p50 acquire + release",
    "lower",
)
FAULTS = Scenario(
    "b",
    "One of five masters failing (RTT 2 ms)",
    (
        Case("1 of 5 blackholed", SERVERS, 2.0, "blackhole"),
        Case("1 of 5 down", SERVERS, 2.0, "down"),
    ),
    "p50 acquire",
    "lower",
)
THROUGHPUT = Scenario(
    "c",
    f"Throughput, {THROUGHPUT_WORKERS} workers on distinct keys",
    (Case("N=5", SERVERS), Case("N=1", 1)),
    "cycles per second",
    "higher",
)
CONTENTION = Scenario(
    "d",
    f"Contention, {CONTENTION_WORKERS} workers on one key",
    (
        Case("N=5", SERVERS),
        Case("N=1", 1),
        Case(f"N={SERVERS}, a client per worker", SERVERS, clients="each"),
        Case(
            f"N={SERVERS}, {PROCESSES} processes x {PROCESS_TASKS} tasks",
            SERVERS,
            clients="processes",
            processes=PROCESSES,
            tasks=PROCESS_TASKS,
        ),
        Case(
            f"N={SERVERS}, {LONE_PROCESSES} processes x 1 task",
            SERVERS,
            clients="processes",
            processes=LONE_PROCESSES,
            tasks=1,
        ),
    ),
    "acquisitions per second",
    "higher",
)
WAKEUP = Scenario(
    "e",
    "Wake-up after release",
    (Case("N=1", 1), Case("N=5", SERVERS)),
    "p50 release-to-acquire",
    "lower",
)
SCENARIOS = (LATENCY, FAULTS, THROUGHPUT, CONTENTION, WAKEUP)


def summed_statistics(parts: Iterable[WithStatistics]) -> WithStatistics:
    """The counters of several clients (or processes) of one library, summed."""
    totals: Statistics = {}
    for part in parts:
        for name, count in part.get("library_statistics", {}).items():
            totals[name] = totals.get(name, 0) + count
    return {"library_statistics": totals} if totals else {}


# --- a: uncontended latency --------------------------------------------------------------


@dataclass(slots=True)
class LatencyRunner:
    """One library's handle and samples in a latency case."""

    peer: Peer
    handle: Handle
    acquire: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)
    stopped: Outcome | None = None


async def run_block(runner: LatencyRunner, count: int, plan: Plan, *, keep: bool) -> None:
    """``count`` cycles; a hang or an error stops the runner for the rest of the case."""

    async def block() -> list[tuple[float, float]]:
        return [await cycle(runner.handle, plan.op_guard) for _ in range(count)]

    try:
        samples = await bounded(block(), count * 2 * plan.op_guard + 1, "block")
    except Exception as exc:
        runner.stopped = failure(exc)
        runner.stopped["completed"] = len(runner.acquire)
        return
    if keep:
        runner.acquire.extend(s[0] for s in samples)
        runner.release.extend(s[1] for s in samples)


async def latency_case(
    case: Case, peers: Sequence[Peer], infos: dict[str, LibraryInfo], urls: list[str], plan: Plan
) -> dict[str, Result]:
    """Scenario a, one case: every library warmed up, then alternating in blocks."""
    iterations = plan.latency_iterations[case.rtt_ms]
    results: dict[str, Result] = {}
    async with contextlib.AsyncExitStack() as stack:
        runners = []
        for peer in peers:
            try:
                session = await stack.enter_async_context(
                    Run(peer, infos[peer.id], urls, UNCONTENDED)
                )
            except Exception as exc:  # a library that cannot even be set up
                results[peer.id] = failure(exc)
                continue
            runners.append(LatencyRunner(peer, session.handle(f"peers:a:{case.name}:{peer.id}")))
        for runner in runners:
            await run_block(runner, plan.warmup, plan, keep=False)
        while live := [r for r in runners if r.stopped is None and len(r.acquire) < iterations]:
            for runner in live:
                count = min(plan.block, iterations - len(runner.acquire))
                await run_block(runner, count, plan, keep=True)
    return results | {r.peer.id: latency_result(r) for r in runners}


def latency_result(runner: LatencyRunner) -> LatencyResult | Outcome:
    """The JSON record of one library in one latency case."""
    if runner.stopped is not None:
        return runner.stopped
    total = [a + r for a, r in zip(runner.acquire, runner.release, strict=True)]
    return {
        "status": "ok",
        "total": summarize(total),
        "acquire": summarize(runner.acquire),
        "release": summarize(runner.release),
    }


# --- b: one master failing -----------------------------------------------------------------


@contextlib.contextmanager
def fault(case: Case, servers: ServerGroup, proxies: ProxyHost) -> Iterator[None]:
    """Blackhole the last master's proxy, or stop its server; undo it at exit."""
    if case.fault == "blackhole":
        proxies.set_blackhole(FAULTY, True)
    else:
        servers[FAULTY].stop()
    try:
        yield
    finally:
        if case.fault == "blackhole":
            proxies.set_blackhole(FAULTY, False)
        else:
            servers[FAULTY].start()


async def under_fault(handle: Handle, plan: Plan) -> FaultResult:
    """Cycles under the fault until the iterations or the time budget are spent."""
    acquired, released, failed_after = [], [], []
    failures = Failures()
    started = time.perf_counter()
    hung: str | None = None
    for _ in range(plan.fault_iterations):
        if time.perf_counter() - started > plan.fault_budget:
            break
        t0 = time.perf_counter()
        try:
            await guarded(handle.acquire(), plan.op_guard, "acquire")
        except HungError as exc:
            hung = str(exc)
            break
        except Exception as exc:
            failed_after.append(time.perf_counter() - t0)
            failures.add("acquire", exc)
            continue
        t1 = time.perf_counter()
        acquired.append(t1 - t0)
        try:
            await guarded(handle.release(), plan.op_guard, "release")
        except HungError as exc:
            hung = str(exc)
            break
        except Exception as exc:
            failures.add("release", exc)
            continue
        released.append(time.perf_counter() - t1)
    return fault_result(acquired, released, failed_after, failures, hung)


def fault_result(
    acquired: list[float],
    released: list[float],
    failed_after: list[float],
    failures: Failures,
    hung: str | None,
) -> FaultResult:
    """The JSON record of one library in one fault case."""
    head: ResultBase = {"status": "ok"}
    if hung is not None:
        head = outcome("hung", hung)
    elif not acquired:
        head = outcome("failed", "no acquire succeeded; " + "; ".join(failures.examples))
    samples: FaultSamples = {}
    if acquired:
        samples["acquire"] = summarize(acquired)
    if released:
        samples["release"] = summarize(released)
    if failed_after:
        samples["failed_acquire"] = summarize(failed_after)
    return {**head, "succeeded": len(acquired), **failures.counts(), **samples}


async def fault_case(
    case: Case,
    peer: Peer,
    info: LibraryInfo,
    servers: ServerGroup,
    proxies: ProxyHost,
    plan: Plan,
) -> FaultResult | Outcome:
    """Scenario b, one library: warm up on healthy masters, then measure under the fault."""
    key = f"peers:b:{case.name}:{peer.id}"
    try:
        async with Run(peer, info, proxies.urls(case.n), UNCONTENDED) as session:
            handle = session.handle(key)
            guard = plan.warmup * 2 * plan.op_guard + 1
            await bounded(cycles(handle, plan.warmup, plan.op_guard), guard, "warm-up")
            with fault(case, servers, proxies):
                guard = plan.fault_budget + 3 * plan.op_guard
                return await bounded(under_fault(handle, plan), guard, "fault case")
    except Exception as exc:
        return failure(exc)


async def cycles(handle: Handle, count: int, guard: float) -> None:
    """``count`` cycles, unmeasured."""
    for _ in range(count):
        await cycle(handle, guard)


# --- c: throughput ---------------------------------------------------------------------------


async def throughput_case(
    case: Case, peer: Peer, info: LibraryInfo, urls: list[str], plan: Plan
) -> ThroughputResult | Outcome:
    """Scenario c, one library: one warm-up cycle per worker, then the timed run."""
    failures = Failures()
    try:
        async with Run(peer, info, urls, THROUGHPUT_MODE) as session:
            keys = [f"peers:c:{case.name}:{peer.id}:{i}" for i in range(THROUGHPUT_WORKERS)]
            handles = [session.handle(key) for key in keys]
            warm = await warm_all(handles)
            guard = plan.duration + 2 * plan.op_guard + 5
            timed = throughput_run(handles, plan.duration, failures)
            run = await bounded(timed, guard, "throughput run")
            statistics = library_statistics(session)
    except Exception as exc:
        return failure(exc)
    result: ThroughputResult = {
        **run,
        **failures.counts(),
        **statistics,
        "warmup_failures": warm.count,
    }
    if result["status"] != "ok":
        result["reason"] = "no cycle completed; " + "; ".join(result["failure_examples"])
    return result


# --- d: contention -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """One acquisition in the contention run (``time.monotonic()`` seconds)."""

    worker: int
    asked: float  # acquire() called
    got: float  # acquire() returned
    releasing: float  # release() called
    released: float  # release() returned


@dataclass(frozen=True, slots=True)
class Miss:
    """An acquire() of the contention run that got no lock (``time.monotonic()``
    seconds): it failed, or it was still waiting when the run stopped."""

    worker: int
    asked: float  # acquire() called
    ended: float  # acquire() raised, or the run stopped
    failed: bool  # False: still waiting at the stop, cancelled then


#: d: the run stops this long after its deadline; an acquire() still waiting then is
#: cancelled, and its wait counts as (at least) the time from its call to the stop.
STOP_AFTER = WAIT


async def contention_holds(
    handles: Sequence[Handle],
    deadline: float,
    failures: Failures,
    *,
    counter: Redis | None = None,
    first: int = 0,
    hold: Callable[[int], Awaitable[object]] | None = None,
    stop_after: float | None = None,
) -> tuple[list[Hold], list[Miss]]:
    """Every handle takes the one key, holds it ``CONTENTION_HOLD``, releases, and asks
    again at once, until ``deadline`` (``time.monotonic()``, the same clock in every
    process of the host); acquisitions that began earlier finish, up to
    ``stop_after`` (by default ``STOP_AFTER``) past the deadline (an acquire() still
    waiting then is cancelled).
    With ``counter``, each holder also reads the counter as its hold begins and writes
    it back plus one as it ends: two holds that overlap at all lose an update. Workers
    are numbered from ``first``. The hold is ``asyncio.sleep(CONTENTION_HOLD)``, or
    ``await hold(worker)`` if given. The holds, and the acquires that got no lock."""
    holds: list[Hold] = []
    misses: list[Miss] = []
    stop = deadline + (STOP_AFTER if stop_after is None else stop_after)

    async def worker(index: int, handle: Handle) -> None:
        while (asked := time.monotonic()) < deadline:
            try:
                async with asyncio.timeout(stop - asked) as limit:
                    await handle.acquire()
            except Exception as exc:
                misses.append(Miss(index, asked, time.monotonic(), not limit.expired()))
                if limit.expired():
                    return
                failures.add("acquire", exc)
                continue
            got = time.monotonic()
            seen = await read_count(counter, failures)
            await (asyncio.sleep(CONTENTION_HOLD) if hold is None else hold(index))
            await write_count(counter, seen, failures)
            releasing = time.monotonic()
            try:
                await handle.release()
            except Exception as exc:
                failures.add("release", exc)
            holds.append(Hold(index, asked, got, releasing, time.monotonic()))

    await asyncio.gather(*(worker(first + i, h) for i, h in enumerate(handles)))
    return holds, misses


async def read_count(counter: Redis | None, failures: Failures) -> int | None:
    """The holds counted so far, read as a hold begins (None: no counter, or it failed)."""
    if counter is None:
        return None
    try:
        return int(await counter.get(COUNTER_KEY) or 0)
    except Exception as exc:
        failures.add("counter", exc)
        return None


async def write_count(counter: Redis | None, seen: int | None, failures: Failures) -> None:
    """Write ``seen`` plus one as the hold ends: a hold that overlapped another one
    read the same count, so one of the two is lost."""
    if counter is None or seen is None:
        return
    try:
        await counter.set(COUNTER_KEY, seen + 1)
    except Exception as exc:
        failures.add("counter", exc)


async def contention(
    handles: Sequence[Handle], duration: float, sessions: Sequence[Session], stop_after: float
) -> ContentionResult | NoAcquisition:
    """Scenario d's run in this process, for ``duration`` seconds (stopped
    ``stop_after`` past it); then the counters of the library's clients (``sessions``)."""
    failures = Failures()
    gc.collect()
    start = time.monotonic()
    deadline = start + duration
    holds, misses = await contention_holds(handles, deadline, failures, stop_after=stop_after)
    acquired = contention_result(holds, start, deadline, len(handles), misses)
    statistics = summed_statistics(library_statistics(session) for session in sessions)
    if acquired is None:
        return {**no_acquisition(start, deadline), **failures.counts(), **statistics}
    return {**acquired, **failures.counts(), **statistics}


def contention_result(
    holds: Sequence[Hold],
    start: float,
    end: float,
    workers: int = CONTENTION_WORKERS,
    misses: Sequence[Miss] = (),
) -> Acquisitions | None:
    """Rates over the window ``start``-``end``: acquisitions that returned in it (None
    if none did). The wait counts every acquire() called in the window, however it
    ended: acquired in the window or after it, failed (until it raised), or still
    waiting when the run stopped (until the stop: a lower bound)."""
    window = end - start
    inside = sorted((h for h in holds if h.got < end), key=lambda h: h.got)
    if not inside:
        return None
    pairs = list(itertools.pairwise(inside))
    waits = [h.got - h.asked for h in holds] + [m.ended - m.asked for m in misses]
    failed = sum(m.failed for m in misses)
    return {
        "status": "ok",
        "workers": workers,
        "window_s": round(window, 3),
        "acquisitions": len(inside),
        "acquisitions_per_s": round(len(inside) / window, 1),
        "wait": summarize(waits),
        "waits": {
            "acquired": len(inside),
            "acquired_after_window": len(holds) - len(inside),
            "failed": failed,
            "unfinished": len(misses) - failed,
        },
        "same_worker_again": round(sum(a.worker == b.worker for a, b in pairs) / len(pairs), 4)
        if pairs
        else None,
        "busy_fraction": round(sum(min(h.released, end) - h.got for h in inside) / window, 4),
        "exclusion_violations": overlapping(inside),
    }


def overlapping(holds: Sequence[Hold]) -> int:
    """The holds (sorted by ``got``) that began while an earlier one still held: their
    acquire() returned before some earlier holder began to release, two holders at once
    (expected 0). Against the latest release of every earlier hold, not only of the
    one before: one long hold overlapping two later ones counts 2."""
    count = 0
    held_until = -math.inf
    for hold in holds:
        count += hold.got < held_until
        held_until = max(held_until, hold.releasing)
    return count


def no_acquisition(start: float, end: float) -> NoAcquisition:
    """The record of a contention run in which no acquisition returned."""
    return {"status": "failed", "reason": "no acquisition in the window", "window_s": end - start}


async def contention_case(
    case: Case, peer: Peer, info: LibraryInfo, urls: list[str], plan: Plan
) -> ContentionResult | ProcessesResult | NoAcquisition | Outcome:
    """Scenario d, one library: the workers share one client, or have one each, or
    are OS processes (`processes_case`)."""
    if case.clients == "processes":
        return await processes_case(case, peer, urls, plan)
    mode = Mode("contended", waiting=True, workers=CONTENTION_WORKERS)
    key = f"peers:d:{case.name}:{peer.id}"
    sessions = 1 if case.clients == "shared" else CONTENTION_WORKERS
    try:
        async with contextlib.AsyncExitStack() as stack:
            runs = [
                await stack.enter_async_context(Run(peer, info, urls, mode))
                for _ in range(sessions)
            ]
            handles = [runs[i % sessions].handle(key) for i in range(CONTENTION_WORKERS)]
            for handle in handles[:sessions]:  # each client connected, scripts loaded
                await bounded(cycle(handle, plan.op_guard), 2 * plan.op_guard + 1, "warm-up")
            guard = plan.duration + WAIT + 2 * plan.op_guard + 5
            timed = contention(handles, plan.duration, runs, plan.stop_after)
            return await bounded(timed, guard, "contention run")
    except Exception as exc:
        return failure(exc)


#: The key of the counter the processes of scenario d count their holds on.
COUNTER_KEY = "peers:d:counter"


async def processes_case(
    case: Case, peer: Peer, urls: list[str], plan: Plan
) -> ProcessesResult | NoAcquisition | Outcome:
    """Scenario d with ``case.processes`` OS processes of ``case.tasks`` workers each
    (one client per process), started together; every hold is also counted on a
    separate server. A child that fails, or outlasts its guard, fails the case."""
    guard = plan.duration + WAIT + 4 * plan.op_guard + 30
    with ServerGroup(1) as counter_server:
        counter = counter_server.urls[0]
        specs = [
            ChildSpec(
                peer=peer.id,
                urls=urls,
                key=f"peers:d:{case.name}:{peer.id}",
                counter=counter,
                op_guard=plan.op_guard,
                first=i * case.tasks,
                tasks=case.tasks,
                loop=loop_name(),
                stop_after=plan.stop_after,
            )
            for i in range(case.processes)
        ]
        children = [await start_child(spec) for spec in specs]
        try:
            ran = await guarded(run_children(children, plan.duration), guard, "processes")
        except Exception as exc:
            return failure(exc)
        finally:
            for child in children:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
        start, deadline, outputs = ran
        records = child_records(children, outputs)
        if not isinstance(records, list):
            return records
        found = await count_of(counter)
    return processes_result(records, start, deadline, found, case.tasks)


async def start_child(spec: ChildSpec) -> asyncio.subprocess.Process:
    """One process of `processes_case`, its pipes open (see `child_run`)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / "peers.py"),
        "--child",
        json.dumps(spec),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def child_records(
    children: Sequence[asyncio.subprocess.Process], outputs: Sequence[tuple[bytes, bytes]]
) -> list[ChildRecord] | Outcome:
    """What each child printed last; the failure of the first that failed, if any."""
    records: list[ChildRecord] = []
    for child, (out, err) in zip(children, outputs, strict=True):
        if child.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return outcome("failed", f"a child process exited {child.returncode}: {tail[0]}")
        record: ChildRecord | Outcome = json.loads(out.strip().splitlines()[-1])
        if "holds" not in record:  # the child's run failed
            return record
        records.append(record)
    return records


async def count_of(url: str) -> int:
    """The holds counted on the counter's server at ``url``."""
    client = Redis.from_url(url)
    try:
        return int(await client.get(COUNTER_KEY) or 0)
    finally:
        await client.aclose()


def processes_result(
    records: Sequence[ChildRecord], start: float, deadline: float, found: int, tasks: int
) -> ProcessesResult | NoAcquisition:
    """The children's holds over the window (``tasks`` workers in each), with the
    count ``found`` on the counter."""
    holds = [Hold(*each) for record in records for each in record["holds"]]
    misses = [Miss(*each) for record in records for each in record["misses"]]
    failures = Failures()
    for record in records:
        failures.count += record["failures"]
        failures.examples.extend(record["failure_examples"][: 3 - len(failures.examples)])
    acquired = contention_result(holds, start, deadline, len(records) * tasks, misses)
    if acquired is None:
        return no_acquisition(start, deadline)
    return {
        **acquired,
        "processes": len(records),
        "counter": {"holds": len(holds), "counted": found},
        **failures.counts(),
        **summed_statistics(records),
    }


async def run_children(
    children: Sequence[asyncio.subprocess.Process], duration: float
) -> tuple[float, float, list[tuple[bytes, bytes]]]:
    """Wait until every child is connected and warmed up (it says ``ready``), start
    them all together, and collect what each printed: the start, the deadline, and
    each child's output and errors."""

    async def ready(child: asyncio.subprocess.Process) -> None:
        assert child.stdout is not None
        line = await child.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"a child process did not start: {line[:200]!r}")

    async def finish(child: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
        assert child.stdout is not None
        assert child.stderr is not None
        out, err = await asyncio.gather(child.stdout.read(), child.stderr.read())
        await child.wait()
        return out, err

    await asyncio.gather(*(ready(child) for child in children))
    start = time.monotonic() + 0.05
    deadline = start + duration
    for child in children:
        assert child.stdin is not None
        window = ChildWindow(start=start, deadline=deadline)
        child.stdin.write(json.dumps(window).encode() + b"\n")
        await child.stdin.drain()
        child.stdin.close()
    return start, deadline, list(await asyncio.gather(*(finish(c) for c in children)))


async def child_run(spec: ChildSpec) -> ChildRecord | Outcome:
    """One process of `processes_case`: its client, warmed up; ``ready`` printed; then
    its workers from the start to the deadline the parent sends. Holds and failures,
    for the parent (as the last line printed)."""
    quiet_loggers()
    if loop_name() != spec["loop"]:
        return outcome("failed", f"a child process ran on {loop_name()}, not {spec['loop']}")
    peer = next(p for p in PEERS if p.id == spec["peer"])
    mode = Mode("contended", waiting=True, workers=spec["tasks"])
    info = probe(peer)  # what Run records the settings into
    failures = Failures()
    counter = Redis.from_url(spec["counter"])
    try:
        async with Run(peer, info, spec["urls"], mode) as session:
            handles = [session.handle(spec["key"]) for _ in range(spec["tasks"])]
            await guarded(cycle(handles[0], spec["op_guard"]), 2 * spec["op_guard"] + 1, "warm-up")
            await counter.ping()
            print("ready", flush=True)
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            window: ChildWindow = json.loads(line)
            await asyncio.sleep(max(0.0, window["start"] - time.monotonic()))
            holds, misses = await contention_holds(
                handles,
                window["deadline"],
                failures,
                counter=counter,
                first=spec["first"],
                stop_after=spec["stop_after"],
            )
            return {
                "status": "ok",
                "holds": [dataclasses.astuple(h) for h in holds],
                "misses": [dataclasses.astuple(m) for m in misses],
                **failures.counts(),
                **library_statistics(session),
            }
    except Exception as exc:
        return failure(exc)
    finally:
        await counter.aclose()


# --- e: wake-up ------------------------------------------------------------------------------


async def timed_acquire(handle: Handle) -> float:
    """Acquire; the perf_counter time at which acquire() returned."""
    await handle.acquire()
    return time.perf_counter()


async def wake_trial(
    holder: Handle, waiter: Handle, hold: float, guard: float
) -> tuple[float, float]:
    """The holder holds, the waiter asks, the holder releases after ``hold`` seconds:
    from the holder's release() call to the waiter's acquire() returning, and to the
    holder's release() returning, in seconds."""
    await guarded(holder.acquire(), guard, "holder acquire")
    task = asyncio.create_task(timed_acquire(waiter))
    try:
        await asyncio.sleep(hold)
        if task.done():
            task.result()  # raises the waiter's error, if it failed
            raise RuntimeError("the waiter acquired while the holder held the lock")
        releasing = time.perf_counter()
        await guarded(holder.release(), guard, "holder release")
        released = time.perf_counter()
        acquired = await guarded(task, guard, "waiter acquire after the release")
    finally:
        task.cancel()  # a no-op once it is done
    await guarded(waiter.release(), guard, "waiter release")
    return acquired - releasing, released - releasing


async def wakeup(holder: Handle, waiter: Handle, plan: Plan) -> WakeResult:
    """Warm-up trials, then the measured ones."""
    rng = random.Random(SEED)
    wakes, releases = [], []
    for trial in range(plan.warmup + plan.wake_trials):
        wake, release = await wake_trial(
            holder, waiter, rng.uniform(*plan.wake_hold), plan.op_guard
        )
        if trial >= plan.warmup:
            wakes.append(wake)
            releases.append(release)
    return {"status": "ok", "wake": summarize(wakes), "release": summarize(releases)}


async def wakeup_case(
    case: Case, peer: Peer, info: LibraryInfo, urls: list[str], plan: Plan
) -> WakeResult | Outcome:
    """Scenario e, one library."""
    mode = Mode("contended", waiting=True, workers=2)
    key = f"peers:e:{case.name}:{peer.id}"
    trials = plan.warmup + plan.wake_trials
    guard = trials * (plan.wake_hold[1] + 4 * plan.op_guard) + 5
    try:
        # Holder and waiter are separate clients, as two processes would be: a
        # waiter in the holder's own client could be handed the lock in-process.
        async with Run(peer, info, urls, mode) as owner, Run(peer, info, urls, mode) as other:
            holder, waiter = owner.handle(key), other.handle(key)
            result = await bounded(wakeup(holder, waiter, plan), guard, "wake-up trials")
            return {**result, **library_statistics(other)}
    except Exception as exc:
        return failure(exc)


# --- running -------------------------------------------------------------------------------


def skip_reason(peer: Peer, info: LibraryInfo, scenario: Scenario, case: Case) -> Outcome | None:
    """Why ``peer`` does not run in ``case``, as a result record; None if it runs.

    A case the library does not apply to says so whether or not it is installed.
    """
    if peer.scenarios is not None and scenario.id not in peer.scenarios:
        where = ", ".join(sorted(peer.scenarios))
        return outcome("not_applicable", f"{peer.label} is measured in scenarios {where} only")
    if peer.single_server and case.n > 1:
        return outcome("not_applicable", "a single-server lock: runs with N = 1 only")
    if not info["available"]:
        return outcome("unavailable", info["reason"] or "does not import")
    return None


def progress(scenario: Scenario, case: Case, label: str, result: Result) -> None:
    """One line per library and case on stderr."""
    print(
        f"{scenario.id}  {case.name:<20} {label:<28} {headline(result)}",
        file=sys.stderr,
        flush=True,
    )


def headline(result: Result) -> str:
    """The result in a few words."""
    status = result["status"]
    if status != "ok":
        return f"{status}: {result.get('reason', '')}"[:110]
    return cell(result)


class Runner:
    """Runs the scenarios for the selected libraries on one set of servers."""

    def __init__(
        self,
        peers: Sequence[Peer],
        infos: dict[str, LibraryInfo],
        servers: ServerGroup,
        proxies: ProxyHost,
        plan: Plan,
    ) -> None:
        self.peers, self.infos = peers, infos
        self.servers, self.proxies, self.plan = servers, proxies, plan
        self.rtts: dict[str, MeasuredRtt] = {}
        self.loop_errors = LoopErrors(idle="between libraries")

    async def set_rtt(self, rtt_ms: float) -> None:
        """Set the proxies' delay; measure it once per RTT."""
        self.proxies.set_delay(rtt_ms / 2 / 1000)
        if f"{rtt_ms:g}" not in self.rtts:
            proxy = await measure_rtt(self.proxies, self.plan.pings)
            quorum = await measure_quorum_round(
                self.proxies.urls(SERVERS), SERVERS // 2 + 1, self.plan.pings
            )
            self.rtts[f"{rtt_ms:g}"] = MeasuredRtt(**proxy, quorum_round=quorum)

    def skipped(self, scenario: Scenario, case: Case) -> dict[str, Result]:
        """The records of the libraries that do not run in ``case``."""
        out: dict[str, Result] = {}
        for peer in self.peers:
            reason = skip_reason(peer, self.infos[peer.id], scenario, case)
            if reason is not None:
                out[peer.id] = reason
        return out

    async def scenario(self, scenario: Scenario) -> ScenarioRecord:
        """Every case of ``scenario``."""
        cases: list[CaseRecord] = []
        for case in scenario.cases:
            await self.set_rtt(case.rtt_ms)
            flush(self.servers)
            random.seed(SEED)
            started = time.perf_counter()
            results = await self.case(scenario, case)
            ordered = {p.id: results[p.id] for p in self.peers}
            cases.append(
                CaseRecord(
                    name=case.name,
                    n=case.n,
                    rtt_ms=case.rtt_ms,
                    fault=case.fault,
                    clients=case.clients,
                    via="proxy" if via_proxy(case) else "direct",
                    results=ordered,
                    seconds=round(time.perf_counter() - started, 1),
                )
            )
        flush(self.servers)
        return ScenarioRecord(
            id=scenario.id,
            title=scenario.title,
            metric=scenario.metric,
            better=scenario.better,
            cases=cases,
        )

    async def case(self, scenario: Scenario, case: Case) -> dict[str, Result]:
        """Every library in one case (all together in a, one after the other else)."""
        results = self.skipped(scenario, case)
        runnable = [p for p in self.peers if p.id not in results]
        urls = self.proxies.urls(case.n) if via_proxy(case) else self.servers.urls[: case.n]
        if scenario is LATENCY:
            with self.loop_errors.charged_to("a (all libraries at once)"):
                measured = await latency_case(case, runnable, self.infos, urls, self.plan)
            for peer in runnable:
                progress(scenario, case, peer.label, measured[peer.id])
            return results | measured
        for peer in runnable:
            random.seed(SEED)
            with self.loop_errors.charged_to(peer.id):
                results[peer.id] = await self.one(scenario, case, peer, urls)
            progress(scenario, case, peer.label, results[peer.id])
            flush(self.servers)
        return results

    async def one(self, scenario: Scenario, case: Case, peer: Peer, urls: list[str]) -> Result:
        """One library in one case of b, c, d or e."""
        info, plan = self.infos[peer.id], self.plan
        if scenario is FAULTS:
            return await fault_case(case, peer, info, self.servers, self.proxies, plan)
        if scenario is THROUGHPUT:
            return await throughput_case(case, peer, info, urls, plan)
        if scenario is CONTENTION:
            return await contention_case(case, peer, info, urls, plan)
        return await wakeup_case(case, peer, info, urls, plan)


async def run_all(runner: Runner, scenarios: Sequence[Scenario]) -> list[ScenarioRecord]:
    """The scenarios, in order."""
    random.seed(SEED)
    asyncio.get_running_loop().set_exception_handler(runner.loop_errors.handler)
    return [await runner.scenario(scenario) for scenario in scenarios]


def run(
    peers: Sequence[Peer],
    plan: Plan,
    scenarios: Sequence[Scenario] = SCENARIOS,
    loop: str = "asyncio",
) -> PeersReport:
    """Start servers and proxies, run everything on ``loop`` (``asyncio`` or
    ``uvloop``), stop everything (also on error)."""
    quiet_loggers()
    infos = {peer.id: probe(peer) for peer in peers}
    started = time.perf_counter()
    with servers_behind_proxies(SERVERS) as (servers, proxies):
        runner = Runner(peers, infos, servers, proxies, plan)
        measured = run_on(loop, run_all(runner, scenarios))
    report = PeersReport(
        benchmark="peers",
        unit="ms unless stated",
        settings=settings_record(plan),
        plan=plan_record(plan),
        environment=environment() | {"event_loop": loop},
        libraries=infos,
        measured_rtt=runner.rtts,
        scenarios=measured,
        loop_errors=runner.loop_errors.counts(),
        seconds=round(time.perf_counter() - started, 1),
    )
    report["ratios"] = {s["id"]: ratio_lines(s, infos) for s in measured}
    report["targets"] = targets(report)
    return report


def run_on(loop: str, main: Coroutine[Any, Any, T]) -> T:
    """``main`` run to the end on a new event loop: asyncio's, or uvloop's."""
    if loop == "uvloop":
        return cast(T, importlib.import_module("uvloop").run(main))
    return asyncio.run(main)


def loop_name() -> str:
    """``uvloop`` when the running loop is uvloop's, else ``asyncio``."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def settings_record(plan: Plan) -> RunSettings:
    """What every library gets, and the guards, for the JSON."""
    return {
        "ttl_s": TTL,
        "wait_s": WAIT,
        "op_guard_s": plan.op_guard,
        "close_guard_s": CLOSE_GUARD,
        "throughput_workers": THROUGHPUT_WORKERS,
        "contention_workers": CONTENTION_WORKERS,
        "contention_hold_s": CONTENTION_HOLD,
        "contention_stop_after_s": plan.stop_after,
        "hold_counter": "read as a hold begins, written as it ends",
        "process_cases": [[PROCESSES, PROCESS_TASKS], [LONE_PROCESSES, 1]],
        "wake_hold_s": list(plan.wake_hold),
        "wake_timed_from": "release() called",
        "faulty_master": FAULTY,
        "pool": POOL,
        "seed": SEED,
        "silenced_loggers": list(QUIET_LOGGERS),
    }


def plan_record(plan: Plan) -> PlanRecord:
    """The plan, for the JSON."""
    return {
        "quick": plan is QUICK,
        "latency_iterations_by_rtt_ms": {f"{k:g}": v for k, v in plan.latency_iterations.items()},
        "warmup": plan.warmup,
        "block": plan.block,
        "fault_iterations": plan.fault_iterations,
        "fault_budget_s": plan.fault_budget,
        "duration_s": plan.duration,
        "wake_trials": plan.wake_trials,
    }


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    parser.add_argument(
        "--docs", type=Path, help="also publish to this mkdocs dir (img/, peers.md)"
    )
    parser.add_argument("--readme", type=Path, help="also write the summary table into this README")
    add_report_option(parser, "peers.json")
    parser.add_argument(
        "--scenarios",
        type=pick_scenarios,
        default=SCENARIOS,
        help="scenarios to run, e.g. 'de' (default: all of "
        + "".join(s.id for s in SCENARIOS)
        + ")",
    )
    parser.add_argument(
        "--only",
        type=select,
        default=PEERS,
        help="comma-separated libraries: " + ",".join(p.id for p in PEERS),
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop every library runs on (uvloop: files peers-uvloop.*)",
    )
    args = parser.parse_args(argv)
    if args.loop != "asyncio" and (args.docs or args.readme):
        parser.error("--docs and --readme publish the asyncio run: not with --loop uvloop")
    return args


def pick_scenarios(ids: str) -> tuple[Scenario, ...]:
    """The scenarios named in ``--scenarios`` (their letters), in the usual order."""
    unknown = set(ids) - {s.id for s in SCENARIOS}
    if unknown or not ids:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(sorted(unknown)) or 'empty list'}; "
            f"choose letters from {''.join(s.id for s in SCENARIOS)}"
        )
    return tuple(s for s in SCENARIOS if s.id in ids)


def select(names: str) -> tuple[Peer, ...]:
    """The libraries named in ``--only`` (``_`` and ``-`` alike), in the usual order."""
    wanted = {n.strip().lower().replace("_", "-") for n in names.split(",") if n.strip()}
    unknown = wanted - {p.id for p in PEERS}
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(sorted(unknown)) or 'empty list'}; "
            f"choose from {', '.join(p.id for p in PEERS)}"
        )
    return tuple(p for p in PEERS if p.id in wanted)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:  # one process of scenario d (see processes_case)
        spec: ChildSpec = json.loads(argv[1])
        print(json.dumps(run_on(spec["loop"], child_run(spec))))
        return 0
    args = parse_args(argv)
    if args.report is not None:
        report = read_report(args.report)
        # what is computed from the results, computed again by the code of today
        report["ratios"] = {
            s["id"]: ratio_lines(s, report["libraries"]) for s in report["scenarios"]
        }
        report["targets"] = targets(report)
        loop = loop_of(report)
        if loop != "asyncio" and (args.docs or args.readme):
            refused = f"peers.py: a run on {loop} is not published: no --docs or --readme"
            print(refused, file=sys.stderr)
            return 2
    else:
        try:
            report = run(args.only, QUICK if args.quick else FULL, args.scenarios, args.loop)
        except KeyboardInterrupt:
            print("interrupted; servers and proxies stopped", file=sys.stderr)
            return 130
    write_outputs(report, args.out, args.docs, args.readme)
    for scenario in report["scenarios"]:
        print(scenario_section(scenario, report["libraries"], "##"))
    print(targets_section(report))
    took = "" if args.report is not None else f" in {report['seconds']:g} s"
    print(f"written to {args.out}{took}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
