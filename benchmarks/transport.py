"""Which transport carries asyncredlock's calls: the measurement behind the choice.

Every candidate runs the same Redlock-shaped cycle against N = 5 local valkey masters
(no proxy): on every master at once, ``EVALSHA`` of an acquire script (``SET NX PX``,
then ``INCR`` of a fence key), decided when 3 of 5 replied; then ``EVALSHA`` of a
compare-and-delete release, decided at 3 of 5 (on each master sent once that master
answered the acquire, so a pool cannot reorder them; and the next cycle's acquire of
that key, once that master has the release). The other replies are still awaited
(in the background, all of them before the window closes) and counted, and the
servers are checked afterwards: no lock key may be left. Candidates:

- **link+redis-py** (what asyncredlock runs): one pipelined connection per master
  (``asyncredlock._transport.Link``), opened and authenticated by redis-py, then an
  ``asyncio.Protocol`` with ``hiredis.Reader`` owns the socket;
- **link+plain**: the same ``Link``, but the socket opened by
  ``loop.create_connection`` with nothing else (it could not do AUTH, TLS options,
  unix sockets or Sentinel without re-implementing them);
- **valkey-glide**: ``glide.GlideClient`` per master (a multiplexing client with a
  Rust core), ``custom_command(["EVALSHA", ...])``;
- **coredis**: ``coredis.Redis`` per master, ``evalsha``;
- **redis-py**: ``redis.asyncio.Redis`` on a ``BlockingConnectionPool`` of 256 per
  master, ``execute_command("EVALSHA", ...)`` (asyncredlock's path before).

A candidate that does not import or fails is reported ``unavailable`` with the
reason. Measured: (1) 200 workers on distinct keys for ``--duration`` s: cycles/s and
client CPU s per 1,000 cycles (``time.process_time()``); (2) one worker: cycle p50 and
p99 in ms; (3) cold start: a fresh client and 200 callers at once, the time until all
200 first cycles are done, and the connections it opened per master (``INFO
clients``). Candidates take turns within each of ``--reps`` reps; medians (min-max).

Run from the repository root::

    pip install -r benchmarks/requirements-transport.txt
    python benchmarks/transport.py [--duration 3] [--reps 3] [--quick] [--out DIR]

It writes ``transport.json`` and ``transport.md`` to ``--out`` (default
``benchmarks/results``; ``transport-uvloop.*`` with ``--loop uvloop``), and with
``--docs`` the table into ``DOCS/transport.md``: that report step is
``lockbench.transport_report``, and ``--report JSON`` runs it alone on results already
written. It asserts no timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from lockbench.harness import Spread, add_report_option, environment, read_report, spread
from lockbench.transport_report import (
    CandidateRecord,
    ColdStart,
    Latency,
    Measured,
    Plan,
    Sample,
    Throughput,
    TransportReport,
    Unavailable,
    markdown,
    write_outputs,
)
from redis.asyncio import BlockingConnectionPool, Redis

from asyncredlock._connect import RedisPyOpener
from asyncredlock._transport import Link
from asyncredlock._wire import Reply, Stream
from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
N, QUORUM, WORKERS, TTL_MS = 5, 3, 200, 10_000
ACQUIRE = (
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then"
    " return redis.call('INCR', KEYS[2]) end return 0"
)
RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)

#: One master's call: (script sha, keys, args) -> an awaitable of the reply.
Call = Callable[[str, Sequence[str], Sequence[str]], Awaitable[object]]


class Client:
    """One candidate's connections to the N masters."""

    calls: list[Call]

    async def close(self) -> None:
        """Close every connection."""
        raise NotImplementedError


class LinkClient(Client):
    """asyncredlock's ``Link`` per master, opened by redis-py or by a plain socket."""

    def __init__(self, urls: Sequence[str], *, plain: bool) -> None:
        self.links = [
            Link(
                url,
                _plain_opener(url) if plain else _redis_py_opener(url),
                node_timeout=_LINK["node_timeout"],
                socket_timeout=_LINK["socket_timeout"],
            )
            for url in urls
        ]
        self.calls = [_link_call(link) for link in self.links]

    async def close(self) -> None:
        for link in self.links:
            await link.aclose()


_LINK = {"node_timeout": 0.1, "socket_timeout": 5.0}


def _link_call(link: Link) -> Call:
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[object]:
        return link.call(("EVALSHA", sha, len(keys), *keys, *args))

    return call


def _redis_py_opener(url: str) -> RedisPyOpener:
    pool = BlockingConnectionPool.from_url(url)
    kwargs = {**pool.connection_kwargs, "protocol": 2}
    return RedisPyOpener(pool.connection_class, kwargs)


def _plain_opener(url: str) -> Callable[[Stream], Awaitable[None]]:
    parts = urlsplit(url)

    async def opener(protocol: Stream) -> None:
        loop = asyncio.get_running_loop()
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
        await loop.create_connection(lambda: protocol, host, port)

    return opener


class RedisPyClient(Client):
    """redis-py's ``Redis`` on a ``BlockingConnectionPool`` of 256 per master."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.clients = [
            Redis(connection_pool=BlockingConnectionPool.from_url(url, max_connections=256))
            for url in urls
        ]
        self.calls = [_execute(client.execute_command) for client in self.clients]

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
            await client.connection_pool.disconnect()  # a pool passed in is not closed


def _execute(execute: Callable[..., Awaitable[object]]) -> Call:
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[object]:
        return execute("EVALSHA", sha, len(keys), *keys, *args)

    return call


class CoredisClient(Client):
    """coredis's ``Redis`` per master (imported only when the candidate runs)."""

    def __init__(self, urls: Sequence[str]) -> None:
        coredis = importlib.import_module("coredis")
        self.clients = [coredis.Redis.from_url(url, max_connections=256) for url in urls]
        self.calls = [_coredis_call(client) for client in self.clients]
        self.stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        """Open the pools."""
        for client in self.clients:  # coredis 6 opens its pool in the context
            await self.stack.enter_async_context(client)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stack.aclose()


def _coredis_call(client: Any) -> Call:
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[object]:
        reply: Awaitable[object] = client.evalsha(sha, keys=list(keys), args=list(args))
        return reply

    return call


class GlideClient(Client):
    """valkey-glide's ``GlideClient`` per master (imported only when the candidate runs)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = urls
        self.clients: list[Any] = []
        self.calls = []

    async def start(self) -> None:
        """Create the clients (glide connects as it creates them)."""
        glide = importlib.import_module("glide")
        for url in self.urls:
            parts = urlsplit(url)
            config = glide.GlideClientConfiguration(
                [glide.NodeAddress(parts.hostname, parts.port)], request_timeout=5000
            )
            client = await glide.GlideClient.create(config)
            self.clients.append(client)
            self.calls.append(_glide_call(client))

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.close()


def _glide_call(client: Any) -> Call:
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[object]:
        reply: Awaitable[object] = client.custom_command(
            ["EVALSHA", sha, str(len(keys)), *keys, *args]
        )
        return reply

    return call


@dataclass(frozen=True)
class Candidate:
    """A transport under test: its id in the JSON, its label, and its client."""

    id: str
    label: str
    make: Callable[[Sequence[str]], Client]


CANDIDATES = (
    Candidate(
        "link-redispy",
        "Link, opened by redis-py (asyncredlock)",
        lambda u: LinkClient(u, plain=False),
    ),
    Candidate("link-plain", "Link, plain create_connection", lambda u: LinkClient(u, plain=True)),
    Candidate("redis-py", "redis-py Redis + BlockingConnectionPool", RedisPyClient),
    Candidate("glide", "valkey-glide GlideClient", GlideClient),
    # last: its pool's connections linger after close, which would blur the next
    # candidate's count of connections opened
    Candidate("coredis", "coredis Redis", CoredisClient),
)


# --- the cycle ---------------------------------------------------------------------------


class Background:
    """Replies not waited for by the cycle that sent them, awaited before the end."""

    def __init__(self) -> None:
        self.pending: set[asyncio.Future[object]] = set()
        self.errors = 0

    def keep(self, future: asyncio.Future[object]) -> None:
        """Await ``future`` later if it is not done yet."""
        if not future.done():
            self.pending.add(future)
            future.add_done_callback(self.pending.discard)

    async def drain(self, seconds: float) -> None:
        """Wait (at most ``seconds``) until every kept reply is in."""
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=seconds)


async def quorum_of(
    calls: list[Awaitable[object]], background: Background
) -> tuple[list[object], list[asyncio.Future[object]]]:
    """Wait until QUORUM replies are in; the rest go on in ``background``. Returns the
    replies in and every call's future (in the order of ``calls``)."""
    futures: list[asyncio.Future[object]] = [asyncio.ensure_future(call) for call in calls]
    done: list[object] = []
    enough = asyncio.get_running_loop().create_future()

    def arrived(future: asyncio.Future[object]) -> None:
        done.append(_value(future))
        if len(done) >= QUORUM and not enough.done():
            enough.set_result(None)

    for future in futures:
        future.add_done_callback(arrived)
    await asyncio.wait_for(enough, 10)
    for future in futures:
        background.keep(future)
    return done, futures


def _value(future: asyncio.Future[object]) -> object:
    if future.cancelled():
        return None
    if future.exception() is not None:
        return future.exception()
    result = future.result()
    return result.value if isinstance(result, Reply) else result


async def _after(first: asyncio.Future[object], then: Callable[[], Awaitable[object]]) -> object:
    await asyncio.wait([first])
    return await then()


Released = Sequence[asyncio.Future[object]]


async def one_cycle(
    client: Client, shas: tuple[str, str], key: str, bg: Background, after: Released = ()
) -> Released:
    """Acquire ``key`` on every master, decided at QUORUM, then release it likewise; an
    acquisition short of its quorum counts in ``bg.errors``. ``after``: the previous
    cycle's releases of ``key``; on each master this acquisition goes after that
    master's release (else, on a slow master, it could overtake a release still
    waiting for its acquire's reply and be refused). Returns this cycle's releases."""
    value = f"v{time.monotonic_ns()}"
    keys = (key, f"{{{key}}}:fence")
    acquires = [
        functools.partial(call, shas[0], keys, (value, str(TTL_MS))) for call in client.calls
    ]
    replies, acquired = await quorum_of(_each_after(acquires, after), bg)
    if sum(1 for r in replies if isinstance(r, int) and r > 0) < QUORUM:
        bg.errors += 1
    # On each master the release goes after that master answered the acquire: a client
    # whose calls to one master can travel on different connections (a pool) could
    # otherwise have the release overtake the acquire and leave the key behind.
    releases = [functools.partial(call, shas[1], (key,), (value,)) for call in client.calls]
    _, released = await quorum_of(_each_after(releases, acquired), bg)
    return released


def _each_after(
    calls: Sequence[Callable[[], Awaitable[object]]], before: Released
) -> list[Awaitable[object]]:
    """Each call, sent once its master's ``before`` future is done (at once if none)."""
    return [
        call() if i >= len(before) or before[i].done() else _after(before[i], call)
        for i, call in enumerate(calls)
    ]


# --- the measures ------------------------------------------------------------------------


async def open_client(candidate: Candidate, urls: Sequence[str]) -> Client:
    """A new client of ``candidate`` to the masters at ``urls``, started."""
    client = candidate.make(urls)
    if isinstance(client, GlideClient | CoredisClient):
        await client.start()
    return client


async def load_scripts(urls: Sequence[str]) -> tuple[str, str]:
    """Load the acquire and release scripts on every master; their shas."""
    shas = []
    for source in (ACQUIRE, RELEASE):
        for url in urls:
            async with Redis.from_url(url) as direct:
                sha = await direct.script_load(source)
        shas.append(sha)
    return shas[0], shas[1]


async def throughput(
    candidate: Candidate, urls: Sequence[str], shas: tuple[str, str], duration: float
) -> Throughput:
    """``WORKERS`` workers on distinct keys, each warmed up by one cycle: cycles/s and
    client CPU over a window of ``duration`` s."""
    client = await open_client(candidate, urls)
    bg = Background()
    stop = False
    count = warm = 0
    warmed = asyncio.Event()

    async def worker(i: int) -> None:
        nonlocal count, warm
        key = f"transport:{candidate.id}:{i}"
        released = await one_cycle(client, shas, key, bg)  # warm-up: every connection open
        warm += 1
        if warm == WORKERS:
            warmed.set()
        await warmed.wait()
        while not stop:
            released = await one_cycle(client, shas, key, bg, released)
            count += 1

    try:
        tasks = [asyncio.create_task(worker(i)) for i in range(WORKERS)]
        await asyncio.wait_for(warmed.wait(), 60)
        await asyncio.sleep(min(0.5, duration / 4))
        cycles, cpu, wall = await window(lambda: count, duration)
        stop = True
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await bg.drain(10)
    finally:
        await client.close()
    return {
        "cycles_per_s": cycles / wall,
        "cpu_s_per_1000": 1000 * cpu / max(1, cycles),
        "refused": bg.errors,
    }


async def window(counted: Callable[[], int], duration: float) -> tuple[int, float, float]:
    """The cycles ``counted`` over ``duration`` s, and the client CPU and wall seconds
    they took. A window with no cycle in it measures nothing (a loaded machine can stall
    a short one): it lasts until one cycle ends, for at most 30 s more."""
    start, cpu, wall = counted(), time.process_time(), time.perf_counter()
    await asyncio.sleep(duration)
    for _ in range(3000):
        if counted() > start:
            break
        await asyncio.sleep(0.01)
    return counted() - start, time.process_time() - cpu, time.perf_counter() - wall


async def latency(
    candidate: Candidate, urls: Sequence[str], shas: tuple[str, str], count: int
) -> Latency:
    """One worker: p50 and p99 of ``count`` cycles, after 20 to warm up."""
    client = await open_client(candidate, urls)
    bg = Background()
    times = []
    try:
        key = f"transport:{candidate.id}:solo"
        released: Released = ()
        for _ in range(20):
            released = await one_cycle(client, shas, key, bg, released)
        for _ in range(count):
            start = time.perf_counter()
            released = await one_cycle(client, shas, key, bg, released)
            times.append(time.perf_counter() - start)
        await bg.drain(10)
    finally:
        await client.close()
    times.sort()
    return {"p50_ms": 1000 * times[len(times) // 2], "p99_ms": 1000 * times[int(len(times) * 0.99)]}


async def cold_start(candidate: Candidate, urls: Sequence[str], shas: tuple[str, str]) -> ColdStart:
    """A fresh client and ``WORKERS`` callers at once: the time until every first cycle
    is done, and the connections the client opened to the first master."""
    await settled(urls[0], 0)
    before = await connected(urls[0])
    start = time.perf_counter()
    client = await open_client(candidate, urls)
    bg = Background()
    try:
        await asyncio.gather(
            *(
                one_cycle(client, shas, f"transport:cold:{candidate.id}:{i}", bg)
                for i in range(WORKERS)
            )
        )
        seconds = time.perf_counter() - start
        opened = await connected(urls[0]) - before
        await bg.drain(10)
    finally:
        await client.close()
        await settled(urls[0], before)
    return {"first_200_ms": 1000 * seconds, "connections_per_master": opened}


async def settled(url: str, baseline: int) -> None:
    """Wait (at most 15 s) until a closed client's connections are gone."""
    for _ in range(300):
        if await connected(url) <= baseline:
            return
        await asyncio.sleep(0.05)


async def connected(url: str) -> int:
    """The clients connected to the server at ``url``, less the one asking."""
    async with Redis.from_url(url) as direct:
        info = await direct.info("clients")
    return int(info["connected_clients"]) - 1  # less this one


async def leftover(urls: Sequence[str]) -> int:
    """Lock keys left on the servers (fence counters aside), each shown on stderr."""
    total = 0
    for url in urls:
        async with Redis.from_url(url) as direct:
            keys = cast(list[bytes], await direct.keys("transport:*"))  # not decoded
            left = [k for k in keys if not k.endswith(b":fence")]
            if left:
                print(f"left on {url}: {left[:5]}", file=sys.stderr)
            total += len(left)
    return total


# --- the run -----------------------------------------------------------------------------


async def one_rep(
    candidate: Candidate, urls: Sequence[str], shas: tuple[str, str], plan: Plan
) -> Sample:
    """Every measure of ``candidate``, once, each within a time limit."""
    duration = plan["duration"]
    many = await asyncio.wait_for(throughput(candidate, urls, shas, duration), duration + 60)
    one = await asyncio.wait_for(latency(candidate, urls, shas, plan["count"]), 60)
    cold = await asyncio.wait_for(cold_start(candidate, urls, shas), 60)
    return {**many, **one, **cold}


async def measure(plan: Plan, urls: Sequence[str]) -> tuple[dict[str, CandidateRecord], int]:
    """The candidates taking turns within each rep (one that fails runs no more), and
    the lock keys left on the servers afterwards."""
    shas = await load_scripts(urls)
    reps: dict[str, list[Sample]] = {c.id: [] for c in CANDIDATES}
    failed: dict[str, str] = {}  # candidate id -> why it is unavailable
    for rep in range(plan["reps"]):
        for candidate in (c for c in CANDIDATES if c.id not in failed):
            try:
                sample = await one_rep(candidate, urls, shas, plan)
            except Exception as exc:
                failed[candidate.id] = f"{type(exc).__name__}: {exc}"
                continue
            reps[candidate.id].append(sample)
            print(f"rep {rep + 1} {candidate.id}: {_line(sample)}", file=sys.stderr, flush=True)
    records = {c.id: record(c, reps[c.id], failed.get(c.id)) for c in CANDIDATES}
    return records, await leftover(urls)


def record(candidate: Candidate, reps: list[Sample], failure: str | None) -> CandidateRecord:
    """``candidate``'s record: its reps and their spread, or why it is unavailable."""
    if failure is not None:
        return Unavailable(label=candidate.label, reps=reps, status="unavailable", reason=failure)
    return Measured(label=candidate.label, reps=reps, status="ok", summary=spreads(reps))


def spreads(reps: Sequence[Sample]) -> dict[str, Spread]:
    """Each measure's median, min and max over ``reps``."""
    rows = [cast(Mapping[str, float], rep) for rep in reps]  # every measure is a number
    return {key: spread([row[key] for row in rows]) for key in rows[0]}


def _line(sample: Sample) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in sample.items())


def run(plan: Plan, argv: Sequence[str]) -> TransportReport:
    """Start the servers, measure on the plan's event loop, and stamp the results."""
    with ServerGroup(N) as servers:
        measuring = measure(plan, servers.urls)
        if plan.get("loop") == "uvloop":
            candidates, keys_left = importlib.import_module("uvloop").run(measuring)
        else:
            candidates, keys_left = asyncio.run(measuring)
    return {
        "benchmark": "transport",
        "command": "python benchmarks/transport.py " + " ".join(argv),
        "plan": plan,
        "environment": environment(),
        "candidates": candidates,
        "keys_left": keys_left,
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=None, help="seconds per window (3)")
    parser.add_argument("--reps", type=int, default=None, help="reps (3)")
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio", help="event loop"
    )
    parser.add_argument(
        "--docs", type=Path, help="docs directory: publish the table into transport.md there"
    )
    add_report_option(parser, "transport.json")
    return parser.parse_args(argv)


def plan_of(args: argparse.Namespace) -> Plan:
    """The run the command line asks for (``--quick``: tiny)."""
    return {
        "duration": args.duration or (0.3 if args.quick else 3.0),
        "reps": args.reps or (1 if args.quick else 3),
        "count": 50 if args.quick else 2000,
        "quick": args.quick,
        "loop": args.loop,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Measure (or, with ``--report``, read results already written) and write the
    outputs; the table goes to stdout too."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.report is not None:
        report: TransportReport = read_report(args.report)
    else:
        report = run(plan_of(args), argv)
    write_outputs(report, args.out, args.docs)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
