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
  of them, kept ahead of the clock floor), so no two masters count the same token and
  the commit round runs, as after contention, on a master that missed rounds, or for a
  new resource. Not measured with one master, whose count is always the token (a
  quorum of one).

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
This script measures and writes the JSON; everything made from it is
`lockbench.fanout_report`, which ``--report fanout.json`` runs alone on results
already written.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, Self, TypeVar

from lockbench.fanout_report import (
    COUNTERS,
    EXTRA_ROUNDS,
    LABELS,
    ApartStatistics,
    CaseRecord,
    ClientStatistics,
    FanoutReport,
    FencingRecord,
    MethodRecord,
    SettingsRecord,
    markdown_table,
    method_notes,
    write_outputs,
)
from lockbench.harness import (
    ProxyHost,
    Summary,
    add_report_option,
    environment,
    read_report,
    redlock_counters,
    servers_behind_proxies,
    summarize,
)
from lockbench.rtt import make_client, measure_rtt
from redis.asyncio import Redis
from redis.exceptions import RedisError

from asyncredlock import AsyncRedlock
from asyncredlock._keys import aux_key  # the fence counter's key, to set it apart

P = ParamSpec("P")  # the arguments of the call CommitRounds counts
R = TypeVar("R")  # and what it returns

HERE = Path(__file__).resolve().parent
SEED = 1729  # seeds `random`, which asyncredlock's retry jitter draws from
TTL = 10.0  # seconds: the lock's time to live, as asyncredlock's default
NODE_TIMEOUT = 0.1  # seconds: per-master timeout of every client
DRIFT_FACTOR = 0.01
NS = (1, 3, 5, 7)
RTTS_MS = (0.0, 2.0, 10.0)
APART = "asyncredlock_fenced_apart"  # not measured with one master: see fanout_report.APART_NOTE
# What every client of the run got: the JSON's settings (the sequential note reads its timeout).
SETTINGS: SettingsRecord = {"ttl_s": TTL, "node_timeout_s": NODE_TIMEOUT, "seed": SEED}

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
        core.commit_round = self._counting(core.commit_round)  # type: ignore[method-assign]

    def _counting(self, start_round: Callable[P, R]) -> Callable[P, R]:
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            self.count += 1
            return start_round(*args, **kwargs)

        return counted


_AHEAD = 3600  # seconds: how far ahead of the clock FenceSkewer puts the counters


class FenceSkewer:
    """Sets a key's fence counters apart on every master, over direct connections.

    Master ``i``'s counter becomes ``top + 1 + i``, ``top`` being the largest counter
    there, and at least an hour ahead of the first server's clock (in microseconds):
    the clock floor of ``fence.lua``, which lifts a count below the clock's second,
    would set them in step again. The counters only go up, so tokens still increase;
    and after the next first round (which adds the same block to each) no two masters
    return the same count, so no quorum returned the token itself and the commit
    round runs.

    Args:
        urls: The servers themselves, not the proxies in front of them.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self.clients = [make_client(url) for url in urls]

    async def set_apart(self, key: str) -> None:
        """Set the fence counters of the lock key ``key`` apart."""
        fence = aux_key(key, "fence")
        counts = await asyncio.gather(*(client.get(fence) for client in self.clients))
        seconds, micros = await self.clients[0].time()
        ahead = (seconds + _AHEAD) * 1_000_000 + micros
        top = max([ahead, *(int(count) for count in counts if count is not None)])
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

    def summary(self) -> MethodRecord:
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
) -> CaseRecord:
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
        samples, stats = await measure_case(case, servers[: case.n], urls, plan)
    finally:
        if case.blackholed:
            proxies.set_blackhole(case.n - 1, False)
    return case_result(case, samples, stats, rtt_p50_ms, started)


async def measure_case(
    case: Case, servers: Sequence[str], urls: Sequence[str], plan: Plan
) -> tuple[dict[str, Samples], dict[str, ClientStatistics]]:
    """The samples of each method measured in ``case`` over ``urls``, and the
    statistics of each asyncredlock client measured, taken before it closes."""
    async with (
        SequentialRedlock(urls) as seq,
        AsyncRedlock(urls, ttl=TTL, fencing=False) as plain,
        AsyncRedlock(urls, ttl=TTL, fencing=True) as fenced,
        AsyncRedlock(urls, ttl=TTL, fencing=True) as apart,
        FenceSkewer(servers) as skewer,
    ):
        key = f"fanout:{case.name}"
        runners = {
            "sequential": sequential_runner(seq, f"{key}:seq"),
            "asyncredlock": asyncredlock_runner(plain, f"{key}:arl"),
            "asyncredlock_fenced": asyncredlock_runner(fenced, f"{key}:arlf", CommitRounds(fenced)),
        }
        if case.n > 1:  # one master's count is always the token: see fanout_report.APART_NOTE
            runners[APART] = asyncredlock_runner(
                apart, f"{key}:arlf-apart", CommitRounds(apart), skewer
            )
        samples = await measure(runners, plan, plan.iterations_for(case))
        clients = {"asyncredlock": plain, "asyncredlock_fenced": fenced, APART: apart}
        stats = {
            name: redlock_counters(client) for name, client in clients.items() if name in runners
        }
    return samples, stats


def case_result(
    case: Case,
    samples: dict[str, Samples],
    stats: dict[str, ClientStatistics],
    rtt_p50_ms: float,
    started: float,
) -> CaseRecord:
    """The JSON record of one case."""
    methods = {name: s.summary() for name, s in samples.items()}
    seq, par = (methods[m]["total"]["p50_ms"] for m in ("sequential", "asyncredlock"))
    apart: ApartStatistics = (
        {"asyncredlock_fenced_apart_statistics": stats[APART]} if APART in stats else {}
    )
    return {
        "name": case.name,
        "n": case.n,
        "rtt_ms": case.rtt_ms,
        "blackholed": case.blackholed,
        "iterations": len(samples["sequential"].acquire),
        "methods": methods,
        # counters include warm-up; gauges (in_flight, background_tasks) are taken
        # right after the last iteration, before the client is closed
        "asyncredlock_statistics": stats["asyncredlock"],
        "asyncredlock_fenced_statistics": stats["asyncredlock_fenced"],
        **apart,
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
    methods: dict[str, MethodRecord], samples: Samples, method: str, rtt_p50_ms: float
) -> FencingRecord:
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
) -> tuple[list[CaseRecord], dict[str, Summary]]:
    """Every case, grouped by RTT; plus the measured PING round trip per RTT."""
    results: list[CaseRecord] = []
    rtts: dict[str, Summary] = {}
    for rtt in RTTS_MS:
        proxies.set_delay(rtt / 2 / 1000)
        rtts[f"{rtt:g}"] = await measure_rtt(proxies, plan.pings)
        for case in (c for c in CASES if c.rtt_ms == rtt):
            rtt_p50 = rtts[f"{rtt:g}"]["p50_ms"]
            results.append(await run_case(case, servers, proxies, plan, rtt_p50))
            print(progress(results[-1]), file=sys.stderr, flush=True)
    results.sort(key=lambda r: CASES.index(Case(r["n"], r["rtt_ms"], r["blackholed"])))
    return results, rtts


def progress(result: CaseRecord) -> str:
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


def run(plan: Plan) -> FanoutReport:
    """Start servers and proxies, run every case, stop everything (also on error)."""
    started = time.perf_counter()
    with servers_behind_proxies(max(NS)) as (servers, proxies):
        cases, rtts = asyncio.run(run_all(servers.urls, proxies, plan))
    return {
        "benchmark": "fanout",
        "unit": "ms",
        "measures": "acquire + release latency of one uncontended lock",
        "methods": LABELS,
        "notes": method_notes(SETTINGS),
        "settings": SETTINGS,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs."""
    args = parse_args(argv)
    report: FanoutReport
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
