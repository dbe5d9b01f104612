"""Which transport carries asyncredlock's calls: the measurement behind the choice.

Every candidate runs the same Redlock-shaped cycle against N = 5 local valkey masters
(no proxy): on every master at once, ``EVALSHA`` of an acquire script (``SET NX PX``,
then ``INCR`` of a fence key), decided when 3 of 5 replied; then ``EVALSHA`` of a
compare-and-delete release, decided at 3 of 5 (on each master sent once that master
answered the acquire, so a pool cannot reorder them). The other replies are still awaited
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
``benchmarks/results``). It asserts no timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from lockbench.harness import (
    add_report_option,
    environment,
    publish_between,
    read_report,
    write_json,
    write_text,
)
from redis.asyncio import BlockingConnectionPool, Redis

from asyncredlock._connect import RedisPyOpener
from asyncredlock._transport import Link, Reply, Stream
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
Call = Callable[[str, Sequence[str], Sequence[str]], Awaitable[Any]]


class Client:
    """One candidate's connections to the N masters."""

    calls: list[Call]

    async def close(self) -> None:
        raise NotImplementedError


class LinkClient(Client):
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
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[Any]:
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


def _execute(execute: Callable[..., Awaitable[Any]]) -> Call:
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[Any]:
        return execute("EVALSHA", sha, len(keys), *keys, *args)

    return call


class CoredisClient(Client):
    def __init__(self, urls: Sequence[str]) -> None:
        coredis = importlib.import_module("coredis")
        self.clients = [coredis.Redis.from_url(url, max_connections=256) for url in urls]
        self.calls = [_coredis_call(client) for client in self.clients]
        self.stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        for client in self.clients:  # coredis 6 opens its pool in the context
            await self.stack.enter_async_context(client)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stack.aclose()


def _coredis_call(client: Any) -> Call:
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[Any]:
        reply: Awaitable[Any] = client.evalsha(sha, keys=list(keys), args=list(args))
        return reply

    return call


class GlideClient(Client):
    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = urls
        self.clients: list[Any] = []
        self.calls = []

    async def start(self) -> None:
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
    def call(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[Any]:
        reply: Awaitable[Any] = client.custom_command(
            ["EVALSHA", sha, str(len(keys)), *keys, *args]
        )
        return reply

    return call


@dataclass(frozen=True)
class Candidate:
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
        self.pending: set[asyncio.Future[Any]] = set()
        self.errors = 0

    def keep(self, future: asyncio.Future[Any]) -> None:
        if not future.done():
            self.pending.add(future)
            future.add_done_callback(self.pending.discard)

    async def drain(self, seconds: float) -> None:
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=seconds)


async def quorum_of(
    calls: list[Awaitable[Any]], background: Background
) -> tuple[list[Any], list[asyncio.Future[Any]]]:
    """Wait until QUORUM replies are in; the rest go on in ``background``. Returns the
    replies in and every call's future (in the order of ``calls``)."""
    futures: list[asyncio.Future[Any]] = [asyncio.ensure_future(call) for call in calls]
    done: list[Any] = []
    enough = asyncio.get_running_loop().create_future()

    def arrived(future: asyncio.Future[Any]) -> None:
        done.append(_value(future))
        if len(done) >= QUORUM and not enough.done():
            enough.set_result(None)

    for future in futures:
        future.add_done_callback(arrived)
    await asyncio.wait_for(enough, 10)
    for future in futures:
        background.keep(future)
    return done, futures


def _value(future: asyncio.Future[Any]) -> Any:
    if future.cancelled():
        return None
    if future.exception() is not None:
        return future.exception()
    result = future.result()
    return result.value if isinstance(result, Reply) else result


async def _after(first: asyncio.Future[Any], then: Callable[[], Awaitable[Any]]) -> Any:
    await asyncio.wait([first])
    return await then()


async def one_cycle(client: Client, shas: tuple[str, str], key: str, bg: Background) -> None:
    value = f"v{time.monotonic_ns()}"
    keys = (key, f"{{{key}}}:fence")
    replies, acquired = await quorum_of(
        [call(shas[0], keys, (value, str(TTL_MS))) for call in client.calls], bg
    )
    if sum(1 for r in replies if isinstance(r, int) and r > 0) < QUORUM:
        bg.errors += 1
    # On each master the release goes after that master answered the acquire: a client
    # whose calls to one master can travel on different connections (a pool) could
    # otherwise have the release overtake the acquire and leave the key behind.
    releases: list[Awaitable[Any]] = []
    for call, first in zip(client.calls, acquired, strict=True):
        release = functools.partial(call, shas[1], (key,), (value,))
        releases.append(release() if first.done() else _after(first, release))
    await quorum_of(releases, bg)


# --- the measures ------------------------------------------------------------------------


async def open_client(candidate: Candidate, urls: Sequence[str]) -> Client:
    client = candidate.make(urls)
    if isinstance(client, GlideClient | CoredisClient):
        await client.start()
    return client


async def load_scripts(urls: Sequence[str]) -> tuple[str, str]:
    shas = []
    for source in (ACQUIRE, RELEASE):
        for url in urls:
            async with Redis.from_url(url) as direct:
                sha = await direct.script_load(source)
        shas.append(sha)
    return shas[0], shas[1]


async def throughput(
    candidate: Candidate, urls: Sequence[str], shas: tuple[str, str], duration: float
) -> dict[str, Any]:
    client = await open_client(candidate, urls)
    bg = Background()
    stop = False
    count = warm = 0
    warmed = asyncio.Event()

    async def worker(i: int) -> None:
        nonlocal count, warm
        key = f"transport:{candidate.id}:{i}"
        await one_cycle(client, shas, key, bg)  # warm-up: every connection is open
        warm += 1
        if warm == WORKERS:
            warmed.set()
        await warmed.wait()
        while not stop:
            await one_cycle(client, shas, key, bg)
            count += 1

    try:
        tasks = [asyncio.create_task(worker(i)) for i in range(WORKERS)]
        await asyncio.wait_for(warmed.wait(), 60)
        await asyncio.sleep(min(0.5, duration / 4))
        start_count, cpu, wall = count, time.process_time(), time.perf_counter()
        await asyncio.sleep(duration)
        # a window with no cycle in it measures nothing (a loaded machine can stall a
        # short one): it lasts until one cycle ends, for at most 30 s more
        for _ in range(3000):
            if count > start_count:
                break
            await asyncio.sleep(0.01)
        cycles = count - start_count
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
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


async def latency(
    candidate: Candidate, urls: Sequence[str], shas: tuple[str, str], count: int
) -> dict[str, Any]:
    client = await open_client(candidate, urls)
    bg = Background()
    times = []
    try:
        key = f"transport:{candidate.id}:solo"
        for _ in range(20):
            await one_cycle(client, shas, key, bg)
        for _ in range(count):
            start = time.perf_counter()
            await one_cycle(client, shas, key, bg)
            times.append(time.perf_counter() - start)
        await bg.drain(10)
    finally:
        await client.close()
    times.sort()
    return {"p50_ms": 1000 * times[len(times) // 2], "p99_ms": 1000 * times[int(len(times) * 0.99)]}


async def cold_start(
    candidate: Candidate, urls: Sequence[str], shas: tuple[str, str]
) -> dict[str, Any]:
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
    async with Redis.from_url(url) as direct:
        info = await direct.info("clients")
    return int(info["connected_clients"]) - 1  # less this one


async def leftover(urls: Sequence[str]) -> int:
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


async def measure(plan: argparse.Namespace, urls: Sequence[str]) -> dict[str, Any]:
    shas = await load_scripts(urls)
    results: dict[str, dict[str, Any]] = {c.id: {"label": c.label, "reps": []} for c in CANDIDATES}
    for rep in range(plan.reps):
        for candidate in CANDIDATES:
            record = results[candidate.id]
            if record.get("status") == "unavailable":
                continue
            try:
                sample = {
                    **await asyncio.wait_for(
                        throughput(candidate, urls, shas, plan.duration), plan.duration + 60
                    ),
                    **await asyncio.wait_for(latency(candidate, urls, shas, plan.count), 60),
                    **await asyncio.wait_for(cold_start(candidate, urls, shas), 60),
                }
            except Exception as exc:
                record.update(status="unavailable", reason=f"{type(exc).__name__}: {exc}")
                continue
            record["reps"].append(sample)
            print(f"rep {rep + 1} {candidate.id}: {_line(sample)}", file=sys.stderr, flush=True)
    for record in results.values():
        if record.get("status") != "unavailable":
            record["status"] = "ok"
            record["summary"] = {
                k: _spread([r[k] for r in record["reps"]]) for k in record["reps"][0]
            }
    return {"candidates": results, "keys_left": await leftover(urls)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _line(sample: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in sample.items())


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    rows = []
    for record in report["candidates"].values():
        if record["status"] != "ok":
            rows.append(f"| {record['label']} | unavailable: {record['reason']} |||||||")
            continue
        s = record["summary"]

        def cell(key: str, digits: int = 0, s: dict[str, Any] = s) -> str:
            m = s[key]
            return f"{m['median']:,.{digits}f} ({m['min']:,.{digits}f}-{m['max']:,.{digits}f})"

        rows.append(
            f"| {record['label']} | {cell('cycles_per_s')} | {cell('cpu_s_per_1000', 3)} "
            f"| {cell('p50_ms', 3)} | {cell('p99_ms', 3)} | {cell('first_200_ms', 1)} "
            f"| {s['connections_per_master']['median']:g} |"
        )
    quick = "\n**Quick run: too short to mean anything.**\n" if report["plan"]["quick"] else ""
    return (
        f"# The transport: candidates side by side (N = 5, loopback, no proxy, "
        f"{report['plan'].get('loop', 'asyncio')})\n\n"
        f"Each candidate runs the same cycle (acquire script on 5 masters decided at 3, "
        f"then release decided at 3; the other replies awaited too). {report['plan']['reps']} "
        f"reps, candidates taking turns; 200 workers for {report['plan']['duration']:g} s; "
        f"one worker for {report['plan']['count']} cycles; a cold burst of 200. "
        f"Median (min-max). Keys left on the servers afterwards: {report['keys_left']}.\n"
        + quick
        + "\n| candidate | cycles/s, 200 workers | client CPU s/1000 | 1 worker p50 (ms) "
        "| 1 worker p99 (ms) | cold burst of 200 (ms) | connections per master |\n"
        "|---|--:|--:|--:|--:|--:|--:|\n"
        + "\n".join(rows)
        + f"\n\nPython {env['python']}, redis-py {env['redis_py']}, hiredis {env['hiredis']}, "
        f"{env['server']}, {env['cpu_count']} CPUs ({env['cpu_model']}), {env['date']}. "
        f"Command: `{report['command']}`.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
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
    plan = parser.parse_args(argv)
    if plan.report is not None:
        return write_report(read_report(plan.report), plan.out, plan.docs)
    plan.duration = plan.duration or (0.3 if plan.quick else 3.0)
    plan.reps = plan.reps or (1 if plan.quick else 3)
    plan.count = 50 if plan.quick else 2000
    with ServerGroup(N) as servers:
        if plan.loop == "uvloop":
            measured = importlib.import_module("uvloop").run(measure(plan, servers.urls))
        else:
            measured = asyncio.run(measure(plan, servers.urls))
    report = {
        "benchmark": "transport",
        "command": "python benchmarks/transport.py " + " ".join(argv or sys.argv[1:]),
        "plan": {
            "duration": plan.duration,
            "reps": plan.reps,
            "count": plan.count,
            "quick": plan.quick,
            "loop": plan.loop,
        },
        "environment": environment(),
        **measured,
    }
    return write_report(report, plan.out, plan.docs)


def write_report(report: dict[str, Any], out: Path, docs: Path | None) -> int:
    """JSON and markdown into ``out``, the table into ``docs``' transport page if given
    (the files of the report's event loop: ``transport-uvloop.*`` under uvloop)."""
    loop = report["plan"].get("loop", "asyncio")  # results from before --loop: asyncio
    out.mkdir(parents=True, exist_ok=True)
    name = "transport" if loop == "asyncio" else f"transport-{loop}"
    write_json(out / f"{name}.json", report)
    write_text(out / f"{name}.md", markdown(report))
    if docs is not None:
        marker = "TRANSPORT-TABLE" if loop == "asyncio" else f"TRANSPORT-TABLE-{loop}"
        table = markdown(report).split("\n\n", 2)[2]  # after the title and the prose
        publish_between(docs / "transport.md", f"<!-- {marker} -->", f"<!-- /{marker} -->", table)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
