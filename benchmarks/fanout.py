"""Sequential vs parallel Redlock: acquire + release latency of one uncontended lock.

Three clients take and release a lock over N masters, each master a real server behind
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
  default): a second round commits the lease's fencing token on the masters that
  granted the first.

The three alternate in blocks within each case. Each case also records the fencing
cost: fenced p50 minus unfenced p50, in ms and in round trips (the PING p50 measured
through one proxy at that RTT). Expected: about one round trip, nothing else.

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
from urllib.parse import urlsplit

from _common import (
    ProxyHost,
    environment,
    publish_between,
    publish_section,
    pyplot,
    servers_behind_proxies,
    summarize,
    write_json,
    write_text,
)
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from asyncredlock import AsyncRedlock

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
METHODS = ("sequential", "asyncredlock", "asyncredlock_fenced")
LABELS = {
    "sequential": "sequential",
    "asyncredlock": "asyncredlock",
    "asyncredlock_fenced": "asyncredlock fenced",
}
# The fencing cost is expected to be one round trip (the commit round); a case outside
# 1 ± FENCING_TOLERANCE round trips is reported, as are the cases of the headline.
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
    "like for like with the sequential loop; asyncredlock fenced is the same client "
    "with fencing on, whose second round commits the fencing token. Fencing cost: "
    "fenced p50 minus asyncredlock p50, in ms and in round trips (the PING p50 "
    "measured through one proxy at that RTT)."
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


# Sized so the full run takes about 4 minutes on 2 cores: one iteration of the three
# methods over N = 1..7 costs ~55 ms at RTT 0, ~205 ms at RTT 2 and ~690 ms at
# RTT 10 (the sequential loop dominates); the blackhole case ~265 ms.
FULL = Plan({0.0: 1000, 2.0: 300, 10.0: 120}, 80, warmup=20, block=20, pings=100)
QUICK = Plan({0.0: 6, 2.0: 6, 10.0: 4}, 4, warmup=2, block=3, pings=5)


# --- the two clients -------------------------------------------------------------------


def make_client(url: str) -> Redis:
    """A ``redis.asyncio`` client with retries off and socket timeouts set."""
    parts = urlsplit(url)
    return Redis(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 6379,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )


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


#: One measured iteration: (acquire seconds, release seconds).
Runner = Callable[[], Awaitable[tuple[float, float]]]


def sequential_runner(client: SequentialRedlock, key: str) -> Runner:
    """Acquire and release ``key`` with the textbook loop."""

    async def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        value = await client.lock(key, TTL)
        t1 = time.perf_counter()
        if value is None:
            raise RuntimeError(f"sequential client failed to lock the uncontended {key!r}")
        await client.unlock(key, value)
        return t1 - t0, time.perf_counter() - t1

    return once


def asyncredlock_runner(redlock: AsyncRedlock, key: str) -> Runner:
    """Acquire and release ``key`` with asyncredlock, fenced or not as ``redlock`` is."""

    async def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        lease = await redlock.lock(key, auto_extend=False).acquire()
        t1 = time.perf_counter()
        await lease.release()
        return t1 - t0, time.perf_counter() - t1

    return once


# --- measuring -----------------------------------------------------------------------


@dataclass(slots=True)
class Samples:
    """Latencies of one method in one case, in seconds."""

    acquire: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)

    def add(self, sample: tuple[float, float]) -> None:
        """Record one iteration."""
        self.acquire.append(sample[0])
        self.release.append(sample[1])

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


async def run_case(case: Case, proxies: ProxyHost, plan: Plan, rtt_p50_ms: float) -> dict[str, Any]:
    """Measure the three methods in ``case``; the proxies' delay is already set.

    ``rtt_p50_ms`` is the PING p50 measured at this RTT, the unit of the fencing cost.
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
        ):
            runners = {
                "sequential": sequential_runner(seq, f"fanout:{case.name}:seq"),
                "asyncredlock": asyncredlock_runner(plain, f"fanout:{case.name}:arl"),
                "asyncredlock_fenced": asyncredlock_runner(fenced, f"fanout:{case.name}:arlf"),
            }
            samples = await measure(runners, plan, plan.iterations_for(case))
            stats = {
                "asyncredlock": dataclasses.asdict(plain.statistics()),
                "asyncredlock_fenced": dataclasses.asdict(fenced.statistics()),
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
    seq, par, fenced = (methods[m]["total"]["p50_ms"] for m in METHODS)
    cost = fenced - par
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
        "speedup_p50": round(seq / par, 2),
        # fenced p50 - unfenced p50, and that in round trips of this RTT (PING p50)
        "fencing_cost_p50_ms": round(cost, 4),
        "fencing_cost_rtts": round(cost / rtt_p50_ms, 2),
        "measured_rtt_p50_ms": rtt_p50_ms,
        # fenced acquire p50 / unfenced acquire p50: 2 is exactly one more round
        "fencing_acquire_ratio": round(
            methods["asyncredlock_fenced"]["acquire"]["p50_ms"]
            / methods["asyncredlock"]["acquire"]["p50_ms"],
            2,
        ),
        "seconds": round(time.perf_counter() - started, 1),
    }


async def measure_rtt(proxies: ProxyHost, pings: int) -> dict[str, Any]:
    """PING through the first proxy: the round trip it really adds, in ms."""
    client = make_client(proxies.urls(1)[0])
    try:
        for _ in range(3):
            await client.ping()
        times = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await client.ping()
            times.append(time.perf_counter() - t0)
    finally:
        await client.aclose()
    return summarize(times)


async def run_all(proxies: ProxyHost, plan: Plan) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every case, grouped by RTT; plus the measured PING round trip per RTT."""
    results, rtts = [], {}
    for rtt in RTTS_MS:
        proxies.set_delay(rtt / 2 / 1000)
        rtts[f"{rtt:g}"] = await measure_rtt(proxies, plan.pings)
        for case in (c for c in CASES if c.rtt_ms == rtt):
            results.append(await run_case(case, proxies, plan, rtts[f"{rtt:g}"]["p50_ms"]))
            print(progress(results[-1]), file=sys.stderr, flush=True)
    results.sort(key=lambda r: CASES.index(Case(r["n"], r["rtt_ms"], r["blackholed"])))
    return results, rtts


def progress(result: dict[str, Any]) -> str:
    """One line per finished case for the terminal."""
    seq, par, fenced = (result["methods"][m]["total"] for m in METHODS)
    return (
        f"{result['name']:<28} sequential p50 {seq['p50_ms']:8.2f} ms  "
        f"asyncredlock p50 {par['p50_ms']:7.2f} ms  x{result['speedup_p50']:<6g} "
        f"fenced p50 {fenced['p50_ms']:7.2f} ms "
        f"({result['fencing_cost_p50_ms']:+.2f} ms, {result['fencing_cost_rtts']:+.2f} RTT)  "
        f"({result['seconds']:g} s)"
    )


# --- reporting -------------------------------------------------------------------------


def markdown_table(cases: Sequence[dict[str, Any]]) -> str:
    """Rows = cases; acquire + release latency of the three methods, the p50 speed-up
    (sequential / asyncredlock) and the fencing cost (fenced - asyncredlock p50)."""
    head = (
        "| Case | N | RTT (ms) | sequential p50 (ms) | sequential p99 (ms) "
        "| asyncredlock p50 (ms) | asyncredlock p99 (ms) | speed-up (p50) "
        "| asyncredlock fenced p50 (ms) | asyncredlock fenced p99 (ms) "
        "| fencing cost p50 (ms) | fencing cost (RTTs) |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for c in cases:
        seq, par, fenced = (c["methods"][m]["total"] for m in METHODS)
        rtt = f"{c['rtt_ms']:g}"
        case = "1 of 5 blackholed" if c["blackholed"] else "all up"
        rows.append(
            f"| {case} | {c['n']} | {rtt} | {seq['p50_ms']:.2f} | {seq['p99_ms']:.2f} "
            f"| {par['p50_ms']:.2f} | {par['p99_ms']:.2f} | {c['speedup_p50']:.2f}x "
            f"| {fenced['p50_ms']:.2f} | {fenced['p99_ms']:.2f} "
            f"| {c['fencing_cost_p50_ms']:+.2f} | {c['fencing_cost_rtts']:+.2f} |"
        )
    return head + "\n".join(rows) + "\n"


def summary_table(report: dict[str, Any]) -> str:
    """The README's excerpt: p50 of the three methods for N = 3 and 5 and the blackhole
    case, with where and when it was measured."""
    head = (
        "| Case | N | RTT (ms) | sequential p50 (ms) | asyncredlock p50 (ms) "
        "| speed-up (p50) | asyncredlock fenced p50 (ms) |\n"
        "|---|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for c in report["cases"]:
        if c["n"] not in (3, 5):
            continue
        seq, par, fenced = (c["methods"][m]["total"]["p50_ms"] for m in METHODS)
        case = "1 of 5 blackholed" if c["blackholed"] else "all up"
        rows.append(
            f"| {case} | {c['n']} | {c['rtt_ms']:g} | {seq:.2f} | {par:.2f} "
            f"| {c['speedup_p50']:.2f}x | {fenced:.2f} |"
        )
    return (
        head
        + "\n".join(rows)
        + "\n\nAcquire + release, p50 in milliseconds; every case, p99 and the notes: "
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
        f"- {FENCING_NOTE}\n"
        f"- RTT is the delay the proxies add (nominal → PING p50 measured through one "
        f"proxy): {rtt}.\n" + "".join(f"- {line}\n" for line in findings(report["cases"]))
    )


def findings(cases: Sequence[dict[str, Any]]) -> list[str]:
    """Observations computed from the results: where the fan-out lost, what fencing
    cost, what the blackhole left."""
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
        lines.append(fencing_finding(cases))
    for c in (c for c in cases if c["blackholed"]):
        plain, fenced = c["asyncredlock_statistics"], c["asyncredlock_fenced_statistics"]
        lines.append(
            f"At the end of the blackhole case asyncredlock had {plain['in_flight']} calls "
            f"in flight and {plain['background_tasks']} background tasks (fenced: "
            f"{fenced['in_flight']} and {fenced['background_tasks']}), mostly waiting on "
            "the silent master (each ends at the socket timeout, 5 s by default)."
        )
    return lines


def fencing_finding(cases: Sequence[dict[str, Any]]) -> str:
    """What fencing cost in the headline cases, and every case off one round trip."""

    def cost(c: dict[str, Any]) -> str:
        return f"{c['fencing_cost_p50_ms']:+.2f} ms ({c['fencing_cost_rtts']:+.2f} RTT)"

    headline = []
    for n in FENCING_HEADLINE_NS:
        row = [
            f"{cost(c)} at RTT {c['rtt_ms']:g} ms"
            for c in cases
            if c["n"] == n and c["rtt_ms"] in FENCING_HEADLINE_RTTS_MS and not c["blackholed"]
        ]
        if row:
            headline.append(f"N={n}: {', '.join(row)}")
    lo, hi = 1 - FENCING_TOLERANCE, 1 + FENCING_TOLERANCE
    off = [c for c in cases if not lo <= c["fencing_cost_rtts"] <= hi]
    line = (
        "Fencing cost (asyncredlock fenced p50 - asyncredlock p50; one RTT is the PING "
        f"p50 at that RTT): {'; '.join(headline) or 'no headline case measured'}. "
    )
    if not off:
        return line + (
            f"Every case is within {lo:g} to {hi:g} RTT: fencing costs about the one "
            "round trip of its commit round, nothing else."
        )
    where = "; ".join(
        f"{c['name']}: {cost(c)}, {abs(c['fencing_cost_rtts'] - 1):.2f} RTT "
        f"{'more' if c['fencing_cost_rtts'] > 1 else 'less'} than the one expected"
        for c in off
    )
    return line + f"Outside {lo:g} to {hi:g} RTT: {where}. {rounds_finding(off)}"


def rounds_finding(cases: Sequence[dict[str, Any]]) -> str:
    """Whether ``cases`` paid one more acquisition round for fencing, and nothing on
    release, or more than that."""
    ratios = [c["fencing_acquire_ratio"] for c in cases]
    more = [c for c in cases if not abs(c["fencing_acquire_ratio"] - 2) <= FENCING_TOLERANCE]
    slower = [
        c for c in cases if abs(release_cost(c)) > FENCING_TOLERANCE * c["measured_rtt_p50_ms"]
    ]
    if not more and not slower:
        top = max(abs(release_cost(c)) for c in cases)
        return (
            f"In each, the fenced acquire p50 was {min(ratios):.2f} to {max(ratios):.2f} "
            f"times the unfenced one and the release p50 within {top:.2f} ms of it: one "
            "more acquisition round, nothing else. A round over N masters waits for the "
            "quorum-th answer (plus the client's and the servers' work), so it takes "
            "longer than one PING through one proxy."
        )
    parts = []
    if more:
        where = "; ".join(f"{c['name']} ({c['fencing_acquire_ratio']:.2f}x)" for c in more)
        parts.append(
            "Fenced acquire p50 over the unfenced one, where it is not about 2 (one more "
            f"acquisition round): {where}."
        )
    if slower:
        where = "; ".join(
            f"{c['name']} ({release_cost(c):+.2f} ms, "
            f"{release_cost(c) / c['measured_rtt_p50_ms']:+.2f} RTT)"
            for c in slower
        )
        parts.append(
            f"Fenced release p50 minus the unfenced one, beyond {FENCING_TOLERANCE:g} RTT: {where}."
        )
    return " ".join(parts)


def release_cost(case: dict[str, Any]) -> float:
    """Fenced release p50 minus unfenced release p50, in ms (fencing should add none)."""
    methods = case["methods"]
    return float(
        methods["asyncredlock_fenced"]["release"]["p50_ms"]
        - methods["asyncredlock"]["release"]["p50_ms"]
    )


def machine_line(env: dict[str, Any]) -> str:
    """Where and when the numbers were measured."""
    return (
        f"Measured {env['date']} on {env['cpu_count']} CPUs ({env['cpu_model']}), "
        f"{env['platform']}; Python {env['python']}, redis-py {env['redis_py']} "
        f"(hiredis {env['hiredis']}), {env['server']}, asyncredlock {env['asyncredlock']}."
    )


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
        + "\n\nTo rerun (about 4 minutes; `--quick` for a smoke run of a few seconds):\n\n"
        + "```bash\npip install -e '.[bench]'\n"
        + "python benchmarks/fanout.py --out benchmarks/results \\\n"
        + "    --docs docs --readme README.md\n```\n"
    )


COLORS = {"sequential": "tab:gray", "asyncredlock": "tab:blue", "asyncredlock_fenced": "tab:red"}
STYLES: dict[str, dict[str, Any]] = {
    "sequential": {"linestyle": "--", "marker": "o", "markerfacecolor": "white"},
    "asyncredlock": {"linestyle": "-", "marker": "o"},
    "asyncredlock_fenced": {"linestyle": "-", "marker": "s", "markersize": 5},
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
    """One method at one RTT across N."""
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
        ys = {method: c["methods"][method]["total"]["p50_ms"] for method in METHODS}
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
    return parser.parse_args(argv)


def run(plan: Plan) -> dict[str, Any]:
    """Start servers and proxies, run every case, stop everything (also on error)."""
    started = time.perf_counter()
    with servers_behind_proxies(max(NS)) as (_, proxies):
        cases, rtts = asyncio.run(run_all(proxies, plan))
    return {
        "benchmark": "fanout",
        "unit": "ms",
        "measures": "acquire + release latency of one uncontended lock",
        "methods": LABELS,
        "notes": [RELEASE_NOTE, SEQUENTIAL_NOTE, FENCING_NOTE],
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
    try:
        report = run(QUICK if args.quick else FULL)
    except KeyboardInterrupt:
        print("interrupted; servers and proxies stopped", file=sys.stderr)
        return 130
    write_outputs(report, args.out, args.docs, args.readme)
    print(markdown_table(report["cases"]))
    print(f"written to {args.out} in {report['seconds']:g} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
