"""Sequential vs parallel Redlock: acquire + release latency of one uncontended lock.

Four clients take and release a lock over N masters, each master a real server behind
its own ``FaultProxy`` (hosted in a separate process) that adds a one-way delay:

- **sequential**: the textbook Redlock loop. ``SET key value NX PX ttl`` on each
  master in turn, each awaited (at most ``NODE_TIMEOUT``) before the next; quorum and
  validity check; then a compare-and-delete ``EVAL`` on each master in turn.
- **asyncredlock**: ``await redlock.lock(name, auto_extend=False).acquire()`` then
  ``await lease.release()`` on an ``AsyncRedlock(..., fencing=False)``: plain Redlock,
  like for like with the loop. Both fan out to every master at once and return as soon
  as a quorum answered (the release of the remaining masters goes on in the
  background).
- **asyncredlock fenced**: the same on an ``AsyncRedlock`` with fencing on (the
  default), taking the same lock again and again. Its fence counters stay in step:
  a quorum of masters returns the token itself in the first round, so the commit
  round is skipped (the usual case).
- **asyncredlock fenced, counters apart**: the same, but before each acquisition
  (outside the timed region, over direct connections that bypass the proxies) the
  key's fence counter on master ``i`` is set to ``top + 1 + i`` (``top``: the largest
  of them), so no two masters count the same token and the commit round runs, as after
  contention, on a master that missed rounds, or for a new resource. Not measured with
  one master, whose count is always the token (a quorum of one).

The four alternate in blocks within each case. Each case also records the fencing
cost of each fenced method: its p50 minus the unfenced p50, in ms and in round trips
(the PING p50 measured through one proxy at that RTT). Expected: about none with the
counters in step, about one round trip (the commit round) with them apart. The commit
rounds each fenced method ran are counted and recorded.

Run from the repository root::

    python benchmarks/fanout.py [--quick] [--out benchmarks/results]
                                [--docs docs] [--readme README.md]

It writes ``fanout.json`` (every number and the environment), ``fanout.md`` (the
table) and ``fanout.png`` (the plot) to ``--out``; with ``--docs`` it also copies the
plot to ``DOCS/img/fanout.png`` and writes the results section of
``DOCS/benchmarks.md`` (after its ``<!-- BENCH-TABLE -->`` line); with ``--readme`` it
writes a summary table between the ``<!-- BENCH-SUMMARY -->`` lines of that file.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import random
import secrets
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from lockbench.harness import (
    ProxyHost,
    add_report_option,
    environment,
    machine_line,
    publish_between,
    publish_section,
    pyplot,
    read_report,
    servers_behind_proxies,
    summarize,
    write_json,
    write_text,
)
from lockbench.rtt import make_client, measure_rtt
from redis.asyncio import Redis
from redis.exceptions import RedisError

from asyncredlock import AsyncRedlock
from asyncredlock._keys import aux_key  # the fence counter's key, to set it apart

HERE = Path(__file__).resolve().parent
MARKER = "<!-- BENCH-TABLE -->"
SUMMARY_START = "<!-- BENCH-SUMMARY -->"
SUMMARY_END = "<!-- /BENCH-SUMMARY -->"
SEED = 1729  # seeds `random`, which asyncredlock's retry jitter draws from
TTL = 10.0  # seconds: the lock's time to live, as asyncredlock's default
NODE_TIMEOUT = 0.1  # seconds: per-master timeout of every client
DRIFT_FACTOR = 0.01
NS = (1, 3, 5, 7)
RTTS_MS = (0.0, 2.0, 10.0)
METHODS = ("sequential", "asyncredlock", "asyncredlock_fenced", "asyncredlock_fenced_apart")
LABELS = {
    "sequential": "sequential",
    "asyncredlock": "asyncredlock",
    "asyncredlock_fenced": "asyncredlock fenced",
    "asyncredlock_fenced_apart": "asyncredlock fenced, counters apart",
}
#: The fenced methods, and how many rounds each is expected to add to plain Redlock:
#: none when the fence counters are in step (the commit round is skipped), one when
#: they are apart (the commit round runs).
EXTRA_ROUNDS = {"asyncredlock_fenced": 0, "asyncredlock_fenced_apart": 1}
APART = "asyncredlock_fenced_apart"  # not measured with one master: see APART_NOTE
NOT_MEASURED = "n/a"  # in a table cell
COUNTERS = {"asyncredlock_fenced": "in step", "asyncredlock_fenced_apart": "apart"}
# A fencing cost more than FENCING_TOLERANCE round trips off the expected number of
# extra rounds is reported, as are the cases of the headline.
FENCING_TOLERANCE = 0.5
FENCING_HEADLINE_NS = (3, 5)
FENCING_HEADLINE_RTTS_MS = (2.0, 10.0)
RELEASE_NOTE = (
    "asyncredlock's release() returns once a quorum of masters confirmed; the other "
    "masters are released in the background, so its times do not include them. The "
    "sequential loop waits for every master, as the textbook does."
)
SEQUENTIAL_NOTE = (
    f"sequential: SET NX PX then a compare-and-delete EVAL, one master at a time, each "
    f"under asyncio.wait_for({NODE_TIMEOUT:g} s), redis-py retries off; a blackholed "
    f"master costs that timeout once in acquire and once in release."
)
FENCING_NOTE = (
    "asyncredlock runs with fencing=False (plain Redlock, one round over the masters), "
    "like for like with the sequential loop. asyncredlock fenced is the same client with "
    "fencing on, taking the same lock again and again: its fence counters stay in step, "
    "a quorum of masters returns the token itself in the first round, and the commit "
    "round is skipped. asyncredlock fenced, counters apart is the same, but before each "
    "acquisition (outside the timed region, over direct connections that bypass the "
    "proxies) the key's fence counter on master i is set to top + 1 + i (top: the "
    "largest), so no two masters count the same token and the commit round runs, as "
    "after contention, on a master that missed rounds, or for a new resource. Fencing "
    "cost: a fenced p50 minus asyncredlock p50, in ms and in round trips (RTTs: the "
    "PING p50 measured through one proxy at that RTT); expected about 0 RTT in step, "
    "about 1 RTT (the commit round) apart. The benchmark counts the commit rounds each "
    "fenced acquisition ran."
)
APART_NOTE = (
    "With one master the counters cannot be apart (a quorum of one returns the token "
    "itself every time, so the commit round never runs): the counters-apart method is "
    "not measured at N=1."
)

RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


# --- what to run ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    """One configuration: N masters, a round-trip time, and whether one is blackholed."""

    n: int
    rtt_ms: float
    blackholed: bool = False

    @property
    def name(self) -> str:
        """A short label, e.g. ``N=5, RTT 2 ms, 1 blackholed``."""
        label = f"N={self.n}, RTT {self.rtt_ms:g} ms"
        return f"{label}, 1 blackholed" if self.blackholed else label


CASES = [Case(n, rtt) for rtt in RTTS_MS for n in NS] + [Case(5, 2.0, blackholed=True)]


@dataclass(frozen=True, slots=True)
class Plan:
    """How many iterations to measure per case (by RTT) and how to interleave them.

    Attributes:
        iterations: Measured iterations per method, by RTT in ms.
        blackhole_iterations: Measured iterations per method in the blackhole case.
        warmup: Unmeasured iterations per method before each case.
        block: The methods alternate in blocks of this many iterations, so slow drift
            of the machine (other load, frequency) affects all alike.
        pings: PINGs through one proxy to measure the real round trip per RTT.
    """

    iterations: dict[float, int]
    blackhole_iterations: int
    warmup: int
    block: int
    pings: int

    def iterations_for(self, case: Case) -> int:
        """Measured iterations per method for ``case``."""
        return self.blackhole_iterations if case.blackholed else self.iterations[case.rtt_ms]


# Sized so the full run takes about 5 minutes on 2 cores: one iteration of the four
# methods over N = 1..7 costs ~65 ms at RTT 0, ~245 ms at RTT 2 and ~800 ms at
# RTT 10 (the sequential loop dominates); the blackhole case ~275 ms. (Estimated from
# the three-method run, which took about 4 minutes: the in-step fenced method saves
# a round, the counters-apart one adds about what the fenced method used to cost.)
FULL = Plan({0.0: 1000, 2.0: 300, 10.0: 120}, 80, warmup=20, block=20, pings=100)
QUICK = Plan({0.0: 6, 2.0: 6, 10.0: 4}, 4, warmup=2, block=3, pings=5)


# --- the two clients -------------------------------------------------------------------


class SequentialRedlock:
    """The textbook Redlock client: one master at a time, each under a timeout.

    Args:
        urls: The masters.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self.clients = [make_client(url) for url in urls]
        self.quorum = len(self.clients) // 2 + 1

    async def lock(self, key: str, ttl: float) -> str | None:
        """Take ``key`` on a quorum; the random value, or ``None`` after undoing a failure."""
        value = secrets.token_hex(16)
        start = time.monotonic()
        granted = 0
        for client in self.clients:
            granted += await self._set(client, key, value, ttl)
        validity = ttl - (time.monotonic() - start) - (ttl * DRIFT_FACTOR + 0.002)
        if granted >= self.quorum and validity > 0:
            return value
        await self.unlock(key, value)
        return None

    async def unlock(self, key: str, value: str) -> int:
        """Compare-and-delete on every master in turn; how many deleted the key."""
        deleted = 0
        for client in self.clients:
            deleted += await self._del(client, key, value)
        return deleted

    @staticmethod
    async def _set(client: Redis, key: str, value: str, ttl: float) -> bool:
        call = client.set(key, value, nx=True, px=round(ttl * 1000))
        try:
            return bool(await asyncio.wait_for(call, NODE_TIMEOUT))
        except (RedisError, OSError, TimeoutError):
            return False

    @staticmethod
    async def _del(client: Redis, key: str, value: str) -> int:
        call = client.eval(RELEASE_SCRIPT, 1, key, value)
        try:
            return int(await asyncio.wait_for(call, NODE_TIMEOUT))
        except (RedisError, OSError, TimeoutError):
            return 0

    async def aclose(self) -> None:
        """Close every client."""
        for client in self.clients:
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


#: One measured iteration: (acquire seconds, release seconds, commit rounds it ran).
Sample = tuple[float, float, int]
Runner = Callable[[], Awaitable[Sample]]


def sequential_runner(client: SequentialRedlock, key: str) -> Runner:
    """Acquire and release ``key`` with the textbook loop."""

    async def once() -> Sample:
        t0 = time.perf_counter()
        value = await client.lock(key, TTL)
        t1 = time.perf_counter()
        if value is None:
            raise RuntimeError(f"sequential client failed to lock the uncontended {key!r}")
        await client.unlock(key, value)
        return t1 - t0, time.perf_counter() - t1, 0

    return once


class CommitRounds:
    """Counts the commit rounds (second rounds of fenced acquisitions) an
    ``AsyncRedlock`` starts.

    No public API tells whether an acquisition ran its commit round or skipped it, so
    this wraps the client's internal ``commit_round`` on that one instance. The wrapper
    runs only when a commit round starts: an acquisition that skips it pays nothing.

    Args:
        redlock: The client to count for.
    """

    def __init__(self, redlock: AsyncRedlock) -> None:
        self.count = 0
        core = redlock._core
        start_round = core.commit_round

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return start_round(*args, **kwargs)

        core.commit_round = counted  # type: ignore[method-assign]


class FenceSkewer:
    """Sets a key's fence counters apart on every master, over direct connections.

    Master ``i``'s counter becomes ``top + 1 + i``, ``top`` being the largest counter
    there (or the first server's clock in microseconds if there is none yet, as a new
    counter starts). The counters only go up, so tokens still increase; and after the
    next first round (which adds the same block to each) no two masters return the
    same count, so no quorum returned the token itself and the commit round runs.

    Args:
        urls: The servers themselves, not the proxies in front of them.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self.clients = [make_client(url) for url in urls]

    async def set_apart(self, key: str) -> None:
        """Set the fence counters of the lock key ``key`` apart."""
        fence = aux_key(key, "fence")
        counts = await asyncio.gather(*(client.get(fence) for client in self.clients))
        known = [int(count) for count in counts if count is not None]
        if known:
            top = max(known)
        else:
            seconds, micros = await self.clients[0].time()
            top = seconds * 1_000_000 + micros
        await asyncio.gather(
            *(client.set(fence, top + 1 + i) for i, client in enumerate(self.clients))
        )

    async def aclose(self) -> None:
        """Close every client."""
        for client in self.clients:
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def asyncredlock_runner(
    redlock: AsyncRedlock,
    key: str,
    commits: CommitRounds | None = None,
    skewer: FenceSkewer | None = None,
) -> Runner:
    """Acquire and release ``key`` with asyncredlock, fenced or not as ``redlock`` is.

    With ``commits``, each iteration reports the commit rounds its acquisition ran;
    with ``skewer``, the fence counters are set apart before each (untimed).
    """

    async def once() -> Sample:
        if skewer is not None:
            await skewer.set_apart(key)
        before = 0 if commits is None else commits.count
        t0 = time.perf_counter()
        lease = await redlock.lock(key, auto_extend=False).acquire()
        t1 = time.perf_counter()
        ran = 0 if commits is None else commits.count - before
        await lease.release()
        return t1 - t0, time.perf_counter() - t1, ran

    return once


# --- measuring -----------------------------------------------------------------------


@dataclass(slots=True)
class Samples:
    """Latencies of one method in one case, in seconds, and the commit rounds run."""

    acquire: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)
    commit_rounds: int = 0

    def add(self, sample: Sample) -> None:
        """Record one iteration."""
        self.acquire.append(sample[0])
        self.release.append(sample[1])
        self.commit_rounds += sample[2]

    def summary(self) -> dict[str, Any]:
        """Stats of acquire + release (``total``) and of each phase, in ms."""
        total = [a + r for a, r in zip(self.acquire, self.release, strict=True)]
        return {
            "total": summarize(total),
            "acquire": summarize(self.acquire),
            "release": summarize(self.release),
        }


async def measure(runners: dict[str, Runner], plan: Plan, iterations: int) -> dict[str, Samples]:
    """Warm each runner up, then run them in alternating blocks until each has
    ``iterations`` samples."""
    for run in runners.values():
        for _ in range(plan.warmup):
            await run()
    samples = {name: Samples() for name in runners}
    while (done := len(next(iter(samples.values())).acquire)) < iterations:
        for name, run in runners.items():
            for _ in range(min(plan.block, iterations - done)):
                samples[name].add(await run())
    return samples


async def run_case(
    case: Case, servers: Sequence[str], proxies: ProxyHost, plan: Plan, rtt_p50_ms: float
) -> dict[str, Any]:
    """Measure the four methods in ``case``; the proxies' delay is already set.

    ``servers`` are the servers' own URLs (for setting fence counters apart, outside
    the measurement); the clients measured go through ``proxies``. ``rtt_p50_ms`` is
    the PING p50 measured at this RTT, the unit of the fencing cost.
    """
    random.seed(SEED)
    gc.collect()
    urls = proxies.urls(case.n)
    if case.blackholed:
        proxies.set_blackhole(case.n - 1, True)
    started = time.perf_counter()
    try:
        async with (
            SequentialRedlock(urls) as seq,
            AsyncRedlock(urls, ttl=TTL, fencing=False) as plain,
            AsyncRedlock(urls, ttl=TTL, fencing=True) as fenced,
            AsyncRedlock(urls, ttl=TTL, fencing=True) as apart,
            FenceSkewer(servers[: case.n]) as skewer,
        ):
            key = f"fanout:{case.name}"
            runners = {
                "sequential": sequential_runner(seq, f"{key}:seq"),
                "asyncredlock": asyncredlock_runner(plain, f"{key}:arl"),
                "asyncredlock_fenced": asyncredlock_runner(
                    fenced, f"{key}:arlf", CommitRounds(fenced)
                ),
            }
            if case.n > 1:  # one master's count is always the token: see APART_NOTE
                runners[APART] = asyncredlock_runner(
                    apart, f"{key}:arlf-apart", CommitRounds(apart), skewer
                )
            samples = await measure(runners, plan, plan.iterations_for(case))
            clients = {"asyncredlock": plain, "asyncredlock_fenced": fenced, APART: apart}
            stats = {
                name: dataclasses.asdict(client.statistics())
                for name, client in clients.items()
                if name in runners
            }
    finally:
        if case.blackholed:
            proxies.set_blackhole(case.n - 1, False)
    return case_result(case, samples, stats, rtt_p50_ms, started)


def case_result(
    case: Case,
    samples: dict[str, Samples],
    stats: dict[str, dict[str, int]],
    rtt_p50_ms: float,
    started: float,
) -> dict[str, Any]:
    """The JSON record of one case."""
    methods = {name: s.summary() for name, s in samples.items()}
    seq, par = (methods[m]["total"]["p50_ms"] for m in ("sequential", "asyncredlock"))
    return {
        "name": case.name,
        "n": case.n,
        "rtt_ms": case.rtt_ms,
        "blackholed": case.blackholed,
        "iterations": len(samples["sequential"].acquire),
        "methods": methods,
        # counters include warm-up; gauges (in_flight, background_tasks) are taken
        # right after the last iteration, before the client is closed
        **{f"{name}_statistics": stat for name, stat in stats.items()},
        "speedup_p50": round(seq / par, 2),
        "measured_rtt_p50_ms": rtt_p50_ms,
        "fencing": {
            method: fencing_record(methods, samples[method], method, rtt_p50_ms)
            for method in EXTRA_ROUNDS
            if method in samples
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


def fencing_record(
    methods: dict[str, dict[str, Any]], samples: Samples, method: str, rtt_p50_ms: float
) -> dict[str, Any]:
    """What fencing cost ``method`` over plain asyncredlock in one case, and the
    commit rounds it ran in the measured iterations."""
    fenced, plain = methods[method], methods["asyncredlock"]
    cost = fenced["total"]["p50_ms"] - plain["total"]["p50_ms"]
    return {
        "counters": COUNTERS[method],
        # rounds this method should add to plain Redlock: 0 (commit skipped) or 1
        "extra_rounds_expected": EXTRA_ROUNDS[method],
        # commit rounds run by the measured acquisitions (not the warm-up)
        "commit_rounds": samples.commit_rounds,
        "acquisitions": len(samples.acquire),
        # fenced p50 - unfenced p50, and that in round trips of this RTT (PING p50)
        "cost_p50_ms": round(cost, 4),
        "cost_rtts": round(cost / rtt_p50_ms, 2),
        # fenced acquire p50 / unfenced acquire p50: 1 is no more round, 2 one more
        "acquire_ratio": round(fenced["acquire"]["p50_ms"] / plain["acquire"]["p50_ms"], 2),
        # fenced release p50 - unfenced release p50 (fencing should add nothing)
        "release_cost_p50_ms": round(fenced["release"]["p50_ms"] - plain["release"]["p50_ms"], 4),
    }


async def run_all(
    servers: Sequence[str], proxies: ProxyHost, plan: Plan
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every case, grouped by RTT; plus the measured PING round trip per RTT."""
    results, rtts = [], {}
    for rtt in RTTS_MS:
        proxies.set_delay(rtt / 2 / 1000)
        rtts[f"{rtt:g}"] = await measure_rtt(proxies, plan.pings)
        for case in (c for c in CASES if c.rtt_ms == rtt):
            rtt_p50 = rtts[f"{rtt:g}"]["p50_ms"]
            results.append(await run_case(case, servers, proxies, plan, rtt_p50))
            print(progress(results[-1]), file=sys.stderr, flush=True)
    results.sort(key=lambda r: CASES.index(Case(r["n"], r["rtt_ms"], r["blackholed"])))
    return results, rtts


def progress(result: dict[str, Any]) -> str:
    """One line per finished case for the terminal."""
    seq, par = (result["methods"][m]["total"] for m in ("sequential", "asyncredlock"))
    fenced = "  ".join(
        f"{COUNTERS[m].replace(' ', '-')} p50 {result['methods'][m]['total']['p50_ms']:7.2f} ms "
        f"({f['cost_rtts']:+.2f} RTT, commits {f['commit_rounds']}/{f['acquisitions']})"
        for m, f in result["fencing"].items()
    )
    return (
        f"{result['name']:<28} sequential p50 {seq['p50_ms']:8.2f} ms  "
        f"asyncredlock p50 {par['p50_ms']:7.2f} ms  x{result['speedup_p50']:<6g} "
        f"fenced {fenced}  ({result['seconds']:g} s)"
    )


# --- reporting -------------------------------------------------------------------------


def markdown_table(cases: Sequence[dict[str, Any]]) -> str:
    """Rows = cases; acquire + release latency of the four methods, the p50 speed-up
    (sequential / asyncredlock) and the fencing cost of each fenced method (its p50 -
    asyncredlock p50, in round trips)."""
    head = (
        "| Case | N | RTT (ms) | sequential p50 (ms) | sequential p99 (ms) "
        "| asyncredlock p50 (ms) | asyncredlock p99 (ms) | speed-up (p50) "
        "| asyncredlock fenced p50 (ms) | asyncredlock fenced p99 (ms) "
        "| fencing cost, in step (RTTs) "
        "| fenced, counters apart p50 (ms) | fenced, counters apart p99 (ms) "
        "| fencing cost, apart (RTTs) |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for c in cases:
        seq, par = (c["methods"][m]["total"] for m in ("sequential", "asyncredlock"))
        fenced = " | ".join(
            fenced_cells(c, m) if m in c["methods"] else " | ".join([NOT_MEASURED] * 3)
            for m in EXTRA_ROUNDS
        )
        rtt = f"{c['rtt_ms']:g}"
        case = "1 of 5 blackholed" if c["blackholed"] else "all up"
        rows.append(
            f"| {case} | {c['n']} | {rtt} | {seq['p50_ms']:.2f} | {seq['p99_ms']:.2f} "
            f"| {par['p50_ms']:.2f} | {par['p99_ms']:.2f} | {c['speedup_p50']:.2f}x "
            f"| {fenced} |"
        )
    return head + "\n".join(rows) + "\n"


def fenced_cells(case: dict[str, Any], method: str) -> str:
    """p50, p99 and fencing cost in RTTs of one fenced method in one case."""
    total = case["methods"][method]["total"]
    cost = case["fencing"][method]["cost_rtts"]
    return f"{total['p50_ms']:.2f} | {total['p99_ms']:.2f} | {cost:+.2f}"


def summary_table(report: dict[str, Any]) -> str:
    """The README's excerpt: p50 of the four methods for N = 3 and 5 and the blackhole
    case, with where and when it was measured."""
    head = (
        "| Case | N | RTT (ms) | sequential p50 (ms) | asyncredlock p50 (ms) "
        "| speed-up (p50) | asyncredlock fenced p50 (ms) | fenced, counters apart p50 (ms) |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for c in report["cases"]:
        if c["n"] not in (3, 5):
            continue
        seq, par, fenced, apart = (
            f"{c['methods'][m]['total']['p50_ms']:.2f}" if m in c["methods"] else NOT_MEASURED
            for m in METHODS
        )
        case = "1 of 5 blackholed" if c["blackholed"] else "all up"
        rows.append(
            f"| {case} | {c['n']} | {c['rtt_ms']:g} | {seq} | {par} "
            f"| {c['speedup_p50']:.2f}x | {fenced} | {apart} |"
        )
    return (
        head
        + "\n".join(rows)
        + "\n\nAcquire + release, p50 in milliseconds. asyncredlock fenced: fence counters "
        + "in step, the usual case, so the commit round is skipped; counters apart (after "
        + "contention, a master that missed rounds, a new resource): the commit round "
        + "runs. Every case, p99 and the notes: "
        + "[docs/benchmarks.md](docs/benchmarks.md). "
        + machine_line(report["environment"])
        + "\n"
    )


def notes(report: dict[str, Any]) -> str:
    """What the table measured, under it."""
    rtt = ", ".join(f"{k} ms → {v['p50_ms']:.2f} ms" for k, v in report["measured_rtt"].items())
    iters = sorted({c["iterations"] for c in report["cases"]}, reverse=True)
    return (
        "Acquire + release of one uncontended lock, in milliseconds. "
        f"Iterations per method and case: {', '.join(map(str, iters))} "
        f"(after {report['plan']['warmup']} warm-up iterations).\n\n"
        f"- {RELEASE_NOTE}\n"
        f"- {SEQUENTIAL_NOTE}\n"
        f"- {FENCING_NOTE} {APART_NOTE}\n"
        f"- RTT is the delay the proxies add (nominal → PING p50 measured through one "
        f"proxy): {rtt}.\n" + "".join(f"- {line}\n" for line in findings(report["cases"]))
    )


def findings(cases: Sequence[dict[str, Any]]) -> list[str]:
    """Observations computed from the results: where the fan-out lost, which commit
    rounds ran, what fencing cost, what the blackhole left."""
    lines = []
    slower = [c for c in cases if c["speedup_p50"] < 1]
    if slower:
        where = "; ".join(f"{c['name']} ({c['speedup_p50']:.2f}x)" for c in slower)
        why = (
            " With one master there is nothing to overlap, so only the fan-out's own "
            "per-call work (a task per master, quorum bookkeeping, a Lua script instead "
            "of a bare SET) shows."
            if all(c["n"] == 1 for c in slower)
            else ""
        )
        lines.append(f"asyncredlock's p50 was higher than the sequential loop's in: {where}.{why}")
    if cases:
        lines.append(commits_finding(cases))
        lines.extend(fencing_finding(cases, method) for method in EXTRA_ROUNDS)
    for c in (c for c in cases if c["blackholed"]):
        plain = c["asyncredlock_statistics"]
        fenced = "; ".join(
            f"{LABELS[m]}: {g['in_flight']} and {g['background_tasks']}"
            for m in EXTRA_ROUNDS
            if (g := c.get(f"{m}_statistics")) is not None
        )
        lines.append(
            f"At the end of the blackhole case asyncredlock had {plain['in_flight']} calls "
            f"in flight and {plain['background_tasks']} background tasks ({fenced}), "
            "mostly waiting on the silent master (each ends at the socket timeout, 5 s by "
            "default)."
        )
    return lines


def commits_finding(cases: Sequence[dict[str, Any]]) -> str:
    """How many commit rounds each fenced method ran, against none with the counters
    in step and one per acquisition with them apart; every case that differs."""
    parts, odd = [], []
    for method, extra in EXTRA_ROUNDS.items():
        records = [(c, c["fencing"][method]) for c in cases if method in c["fencing"]]
        if not records:
            continue
        ran = sum(f["commit_rounds"] for _, f in records)
        total = sum(f["acquisitions"] for _, f in records)
        expected = "one per acquisition" if extra else "none"
        parts.append(f"{LABELS[method]} {ran} of {total} (expected: {expected})")
        odd += [
            (method, f"{c['name']}: {LABELS[method]} {f['commit_rounds']} of {f['acquisitions']}")
            for c, f in records
            if f["commit_rounds"] != extra * f["acquisitions"]
        ]
    line = (
        "Commit rounds run by the measured acquisitions (counted in the client), over all "
        f"cases: {'; '.join(parts)}. "
    )
    if not odd:
        return line + (
            "So in every case the counters-in-step acquisitions skipped their commit "
            "round and the counters-apart ones ran it."
        )
    why = (
        " With the counters in step a commit round still runs when a master that "
        "answered early had missed a round: one whose release of the previous lease was "
        "still on its way when the next acquisition, sent right after the release "
        "returned at quorum, reached it refuses that acquisition and does not count its "
        "fence up."
        if any(EXTRA_ROUNDS[method] == 0 for method, _ in odd)
        else ""
    )
    return line + f"Cases that differ: {'; '.join(where for _, where in odd)}.{why}"


def fencing_finding(cases: Sequence[dict[str, Any]], method: str) -> str:
    """What fencing cost ``method`` in the headline cases, and every case more than
    the tolerance off its expected number of extra rounds."""
    extra = EXTRA_ROUNDS[method]
    cases = [c for c in cases if method in c["fencing"]]

    def cost(c: dict[str, Any]) -> str:
        f = c["fencing"][method]
        return f"{f['cost_p50_ms']:+.2f} ms ({f['cost_rtts']:+.2f} RTT)"

    headline = []
    for n in FENCING_HEADLINE_NS:
        row = [
            f"{cost(c)} at RTT {c['rtt_ms']:g} ms"
            for c in cases
            if c["n"] == n and c["rtt_ms"] in FENCING_HEADLINE_RTTS_MS and not c["blackholed"]
        ]
        if row:
            headline.append(f"N={n}: {', '.join(row)}")
    lo, hi = extra - FENCING_TOLERANCE, extra + FENCING_TOLERANCE
    off = [c for c in cases if not lo <= c["fencing"][method]["cost_rtts"] <= hi]
    line = (
        f"Fencing cost, counters {COUNTERS[method]} ({LABELS[method]} p50 - asyncredlock "
        f"p50; one RTT is the PING p50 at that RTT; expected about {extra} RTT): "
        f"{'; '.join(headline) or 'no headline case measured'}. "
    )
    if not off:
        what = (
            "costs about the one round trip of its commit round, nothing else"
            if extra
            else "costs no extra round trip: its commit round is skipped"
        )
        return line + f"Every case is within {lo:g} to {hi:g} RTT: fencing {what}."

    def gap(c: dict[str, Any]) -> str:
        diff = c["fencing"][method]["cost_rtts"] - extra
        return f"{abs(diff):.2f} RTT {'more' if diff > 0 else 'less'} than the {extra} expected"

    where = "; ".join(f"{c['name']}: {cost(c)}, {gap(c)}" for c in off)
    return line + f"Outside {lo:g} to {hi:g} RTT: {where}. {rounds_finding(off, method)}"


def rounds_finding(cases: Sequence[dict[str, Any]], method: str) -> str:
    """How ``method``'s acquire p50 compares with the unfenced one in ``cases``
    (``1 + extra`` times is exactly the expected extra rounds), and whether its
    release p50 differs by more than the tolerance (fencing adds nothing there)."""
    extra = EXTRA_ROUNDS[method]
    records = [(c, c["fencing"][method]) for c in cases]
    ratios = [f["acquire_ratio"] for _, f in records]
    other = [(c, f) for c, f in records if abs(f["acquire_ratio"] - 1 - extra) > FENCING_TOLERANCE]
    slower = [
        (c, f)
        for c, f in records
        if abs(f["release_cost_p50_ms"]) > FENCING_TOLERANCE * c["measured_rtt_p50_ms"]
    ]
    rounds = "one more acquisition round" if extra else "no more acquisition rounds"
    line = (
        f"In these, the {LABELS[method]} acquire p50 was {min(ratios):.2f} to "
        f"{max(ratios):.2f} times the unfenced one"
    )
    if not other and not slower:
        top = max(abs(f["release_cost_p50_ms"]) for _, f in records)
        why = (
            " A round over N masters waits for the quorum-th answer (plus the client's "
            "and the servers' work), so it takes longer than one PING through one proxy."
            if extra
            else " The difference lies within the one round (or is noise), not in a round "
            "of its own."
        )
        return f"{line} and the release p50 within {top:.2f} ms of it: {rounds}, nothing else.{why}"
    parts = [f"{line} (about {1 + extra} would be {rounds})."]
    if other:
        where = "; ".join(f"{c['name']} ({f['acquire_ratio']:.2f}x)" for c, f in other)
        parts.append(f"Not about {1 + extra} in: {where}.")
    if slower:
        where = "; ".join(
            f"{c['name']} ({f['release_cost_p50_ms']:+.2f} ms, "
            f"{f['release_cost_p50_ms'] / c['measured_rtt_p50_ms']:+.2f} RTT)"
            for c, f in slower
        )
        parts.append(
            f"{LABELS[method]} release p50 minus the unfenced one, beyond "
            f"{FENCING_TOLERANCE:g} RTT: {where}."
        )
    return " ".join(parts)


def markdown(report: dict[str, Any]) -> str:
    """``fanout.md``: the table, what it measured, and where."""
    return (
        "# Sequential vs parallel acquisition\n\n"
        + markdown_table(report["cases"])
        + "\n"
        + notes(report)
        + "\n"
        + machine_line(report["environment"])
        + "\n"
    )


def docs_section(report: dict[str, Any]) -> str:
    """The generated part of ``docs/benchmarks.md``."""
    return (
        markdown_table(report["cases"])
        + "\n"
        + notes(report)
        + "\n![Sequential vs parallel acquisition](img/fanout.png)\n\n"
        + machine_line(report["environment"])
        + "\n\nTo rerun (about 5 minutes; `--quick` for a smoke run of a few seconds):\n\n"
        + "```bash\npip install -e '.[bench]'\n"
        + "python benchmarks/fanout.py --out benchmarks/results \\\n"
        + "    --docs docs --readme README.md\n```\n"
    )


COLORS = {
    "sequential": "tab:gray",
    "asyncredlock": "tab:blue",
    "asyncredlock_fenced": "tab:red",
    "asyncredlock_fenced_apart": "tab:purple",
}
STYLES: dict[str, dict[str, Any]] = {
    "sequential": {"linestyle": "--", "marker": "o", "markerfacecolor": "white"},
    "asyncredlock": {"linestyle": "-", "marker": "o"},
    "asyncredlock_fenced": {"linestyle": "-", "marker": "s", "markersize": 5},
    "asyncredlock_fenced_apart": {"linestyle": ":", "marker": "^", "markersize": 6},
}


def plot(cases: Sequence[dict[str, Any]], path: Path) -> None:
    """p50 acquire + release vs N: one panel per RTT, one line per method in each; the
    blackhole case starred in its RTT's panel; one legend for all."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(RTTS_MS), figsize=(13.5, 5.2), dpi=110)
    for ax, rtt in zip(axes, RTTS_MS, strict=True):
        row = [c for c in cases if c["rtt_ms"] == rtt and not c["blackholed"]]
        for method in METHODS:
            plot_line(ax, row, method)
        mark_blackhole(ax, [c for c in cases if c["rtt_ms"] == rtt and c["blackholed"]])
        style_axes(ax, rtt)
    axes[0].set_ylabel("acquire + release, p50 (ms, log scale)")
    fig.suptitle(
        "Sequential vs parallel Redlock acquisition, one uncontended lock "
        "(RTT: delay added by a proxy per master; lower is better)",
        fontsize=11,
    )
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:  # the blackhole star is only in its own panel
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_line(ax: Any, row: Sequence[dict[str, Any]], method: str) -> None:
    """One method at one RTT across N (where it was measured)."""
    row = [c for c in row if method in c["methods"]]
    if not row:
        return
    ax.plot(
        [c["n"] for c in row],
        [c["methods"][method]["total"]["p50_ms"] for c in row],
        color=COLORS[method],
        linewidth=1.8,
        label=LABELS[method],
        **STYLES[method],
    )


def mark_blackhole(ax: Any, cases: Sequence[dict[str, Any]]) -> None:
    """Stars for the blackhole case (one master silent), labelled with their p50; the
    lowest label goes under its star, the others above theirs."""
    for c in cases:
        ys = {m: c["methods"][m]["total"]["p50_ms"] for m in METHODS if m in c["methods"]}
        lowest = min(ys, key=ys.__getitem__)
        for method, y in ys.items():
            face = "white" if method == "sequential" else COLORS[method]
            ax.plot(
                [c["n"]],
                [y],
                marker="*",
                markersize=15,
                color=COLORS[method],
                markerfacecolor=face,
                linestyle="none",
                label=f"1 of {c['n']} masters blackholed" if method == METHODS[0] else None,
            )
            below = method == lowest
            ax.annotate(
                f"{'1 blackholed: ' if method == 'sequential' else ''}{y:.1f} ms",
                (c["n"], y),
                xytext=(-10, -5 if below else 5),
                textcoords="offset points",
                horizontalalignment="right",
                verticalalignment="top" if below else "bottom",
                fontsize=8,
                color=COLORS[method],
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
            )


def style_axes(ax: Any, rtt: float) -> None:
    """Log-y with plain millisecond labels, N on x, the RTT as title, grid."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low / 1.3, high * 1.3)  # room for the blackhole labels
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
    ax.set_xticks(NS)
    ax.set_xlim(0.6, 7.4)
    ax.set_xlabel("masters (N)")
    ax.set_title(f"RTT {rtt:g} ms", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


# --- main ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few iterations (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    parser.add_argument(
        "--docs", type=Path, help="also publish to this mkdocs dir (img/, benchmarks.md)"
    )
    parser.add_argument("--readme", type=Path, help="also write the summary table into this README")
    add_report_option(parser, "fanout.json")
    return parser.parse_args(argv)


def run(plan: Plan) -> dict[str, Any]:
    """Start servers and proxies, run every case, stop everything (also on error)."""
    started = time.perf_counter()
    with servers_behind_proxies(max(NS)) as (servers, proxies):
        cases, rtts = asyncio.run(run_all(servers.urls, proxies, plan))
    return {
        "benchmark": "fanout",
        "unit": "ms",
        "measures": "acquire + release latency of one uncontended lock",
        "methods": LABELS,
        "notes": [RELEASE_NOTE, SEQUENTIAL_NOTE, FENCING_NOTE, APART_NOTE],
        "settings": {"ttl_s": TTL, "node_timeout_s": NODE_TIMEOUT, "seed": SEED},
        "plan": {
            "quick": plan is QUICK,
            "iterations_by_rtt_ms": {f"{k:g}": v for k, v in plan.iterations.items()},
            "blackhole_iterations": plan.blackhole_iterations,
            "warmup": plan.warmup,
            "block": plan.block,
        },
        "environment": environment(),
        "measured_rtt": rtts,
        "cases": cases,
        "seconds": round(time.perf_counter() - started, 1),
    }


def write_outputs(
    report: dict[str, Any], out: Path, docs: Path | None, readme: Path | None = None
) -> None:
    """JSON, markdown and PNG into ``out``; the plot and section into ``docs`` and the
    summary into ``readme``, if given."""
    write_json(out / "fanout.json", report)
    write_text(out / "fanout.md", markdown(report))
    plot(report["cases"], out / "fanout.png")
    if docs is not None:
        (docs / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "fanout.png", docs / "img" / "fanout.png")
        publish_section(docs / "benchmarks.md", MARKER, docs_section(report))
    if readme is not None:
        publish_between(readme, SUMMARY_START, SUMMARY_END, summary_table(report))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs."""
    args = parse_args(argv)
    if args.report is not None:
        report = read_report(args.report)
    else:
        try:
            report = run(QUICK if args.quick else FULL)
        except KeyboardInterrupt:
            print("interrupted; servers and proxies stopped", file=sys.stderr)
            return 130
    write_outputs(report, args.out, args.docs, args.readme)
    print(markdown_table(report["cases"]))
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
