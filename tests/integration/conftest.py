"""Helpers shared by the integration tests: direct clients to each master."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from urllib.parse import urlsplit

import anyio
import pytest
from redis.asyncio import Redis, RedisCluster

from asyncredlock import (
    AsyncRedlock,
    Lease,
    Lock,
    LockNotOwnedError,
    QuorumUnavailableError,
)
from asyncredlock.testing import ServerGroup, ServerProcess, Waits
from asyncredlock.testing._support import resp_call

#: A fence count far above the masters' clocks (microseconds in the year 2223): the
#: clock floor of ``fence.lua`` never lifts a counter set there.
ABOVE_CLOCK = 8 * 10**15


class Masters:
    """Plain redis clients to each master, to look at and tamper with keys directly.

    Made from the masters' URLs (a client for each), or from ``RedisCluster``
    clients (cluster masters), used as they are.
    """

    def __init__(self, masters: Sequence[str | RedisCluster]) -> None:
        #: what an AsyncRedlock is given for these masters (its ``masters``)
        self.given = list(masters)
        self.urls = [master for master in masters if isinstance(master, str)]
        self.clients = [
            Redis.from_url(master) if isinstance(master, str) else master for master in masters
        ]

    def __len__(self) -> int:
        return len(self.clients)

    async def keys(self) -> list[list[bytes]]:
        """Every key on each master but the fence counters.

        Fence counters (``{name}:fence``) stay by design: a resource's tokens must
        keep increasing after its lock is released. Every other key (a lock key,
        an undo marker) left behind is a leak.
        """
        found = []
        for client in self.clients:
            if isinstance(client, RedisCluster):  # every shard (KEYS goes to one node)
                keys = await client.keys("*", target_nodes=RedisCluster.PRIMARIES)
            else:
                keys = await client.keys("*")
            found.append(sorted(key for key in keys if not key.endswith(b":fence")))
        return found

    async def fences(self, name: str) -> list[int | None]:
        """The fence counter of the resource ``name`` on each master."""
        values = [await client.get(f"{{{name}}}:fence") for client in self.clients]
        return [None if value is None else int(value) for value in values]

    async def line_up_fences(self, name: str) -> int:
        """Set the fence counters of ``name`` to one count on every master, above
        any count so far and above the masters' clocks (the clock floor of
        ``fence.lua`` then leaves them alone): the next fenced acquisition gets the
        same count from every master. Returns that count."""
        counts = [count for count in await self.fences(name) if count is not None]
        top = max([*counts, ABOVE_CLOCK])
        for client in self.clients:
            await client.set(f"{{{name}}}:fence", top)
        return top

    async def skew_fences(self, name: str) -> None:
        """Make the fence counters of ``name`` differ on every master (each one
        more than the last, all above any count so far and above the clocks): no
        quorum of them can then return the same count, and a fenced acquisition
        must run its commit round."""
        top = await self.line_up_fences(name)
        for i, client in enumerate(self.clients):
            await client.set(f"{{{name}}}:fence", top + 1 + i)

    async def delete_held(self, redlock: AsyncRedlock, lease: Lease) -> None:
        """Delete ``lease``'s key on every master, behind its back, once sure every
        master holds it: ``acquire()`` returns at a quorum, and a SET still out would
        put the key back after its DELETE. ``inspect()`` reads every master after the
        earlier calls, in order on each connection."""
        state = await redlock.inspect(lease.resource)
        assert [node.holder for node in state.nodes] == [lease.value] * len(self), state
        for client in self.clients:
            await client.delete(lease.key)

    async def holding(self, key: str) -> int:
        """On how many masters ``key`` exists."""
        return sum([await client.exists(key) for client in self.clients])

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


@pytest.fixture
async def masters(servers: ServerGroup) -> AsyncIterator[Masters]:
    """Direct clients to the flushed session group of 5 servers."""
    direct = Masters(servers.urls)
    yield direct
    await direct.aclose()


class Queue:
    """Counts the acquisitions of one redlock that queued behind another task of
    it (for the same key), and lets a test wait for a count."""

    def __init__(self, redlock: AsyncRedlock) -> None:
        self._waits = Waits(redlock)

    @property
    def queued(self) -> int:
        return self._waits.queued

    async def reach(self, count: int) -> None:
        """Return once ``count`` acquisitions have queued."""
        await self._waits.reach(queued=count)


class Waiting:
    """Counts the waits of acquisitions that failed an attempt and listen for a
    release (a fair or read-write waiter is queued on the masters by then: its
    attempts came before) over several redlocks, and lets a test wait for a count."""

    def __init__(self, redlocks: list[AsyncRedlock]) -> None:
        self._waits = Waits(*redlocks)

    @property
    def entered(self) -> int:
        return self._waits.waiting

    @property
    def woken(self) -> int:
        """Waits ended by a wake-up, not by their delay."""
        return self._waits.woken

    async def reach(self, count: int) -> None:
        await self._waits.reach(count)


@asynccontextmanager
async def entered_in_a_task(lock: Lock) -> AsyncIterator[Lease]:
    """Enter ``lock``'s ``async with`` block in a task of its own that lives on (an
    async fixture's setup whose task is kept) until this context exits; the block is
    left to the test to exit. (A task that ends with its block open leaves it held,
    with a WARNING: see test_block_orphaned.py.)"""
    entered: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
    stop = anyio.Event()

    async def hold() -> None:
        entered.set_result(await lock.__aenter__())
        await stop.wait()

    task = asyncio.get_running_loop().create_task(hold())
    try:
        yield await entered
    finally:
        stop.set()
        await asyncio.wait([task])


@asynccontextmanager
async def clients(
    urls: Sequence[str], n: int, **settings: float
) -> AsyncIterator[list[AsyncRedlock]]:
    """``n`` separate clients, as ``n`` processes would have."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(AsyncRedlock(urls, **settings)) for _ in range(n)]


async def queues(masters: Masters, name: str) -> list[list[bytes]]:
    """The queue of the lock ``name`` on each master, first waiter first."""
    return [await client.zrange(f"{{{name}}}:queue", 0, -1) for client in masters.clients]


async def end_model_run(
    group: ServerGroup, clients: Sequence[AsyncRedlock], open_leases: Sequence[Lease]
) -> None:
    """The end of a model test's run: every master running again, the leases still
    open released, every call answered."""
    for server in group:
        if not server.running:
            server.start()
    for lease in open_leases:
        with contextlib.suppress(LockNotOwnedError, QuorumUnavailableError):
            await lease.release()
    for client in clients:
        await client.settle()


async def assert_every_key_expires(group: ServerGroup, *, but: tuple[bytes, ...] = ()) -> None:
    """What a stopped master missed (an undo, a release) stays there, and expires:
    every key left has a TTL (keys ending with one of ``but`` excepted)."""
    for server in group:
        client = Redis.from_url(server.url)
        try:
            for key in await client.keys("*"):
                if not key.endswith(but):
                    assert await client.pttl(key) > 0, key
        finally:
            await client.aclose()


async def polled(condition: Callable[[], bool], polls: int = 400) -> bool:
    """Whether ``condition`` holds within ``polls`` looks, 0.025 s apart (a bound on
    a wait, never a measure)."""
    for _ in range(polls):
        if condition():
            return True
        await anyio.sleep(0.025)
    return condition()


def library_tasks() -> list[asyncio.Task[object]]:
    """The running tasks whose coroutine is the library's."""
    return [task for task in asyncio.all_tasks() if _from_library(task)]


def _from_library(task: asyncio.Task[object]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/asyncredlock/" in code.co_filename.replace("\\", "/")


class Heard(logging.Handler):
    """Sets ``event`` when a record whose message starts with ``prefix`` is logged."""

    def __init__(self, prefix: str, event: anyio.Event) -> None:
        super().__init__()
        self.prefix, self.event = prefix, event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()


def cut_off_replica(primary: ServerProcess, replica: ServerProcess) -> None:
    """Freeze ``replica`` and drop its link: ``primary``'s writes from now on reach
    it no more (it cannot reconnect while frozen), so a failover to it loses them."""
    replica.pause()
    resp_call(primary.port, "CLIENT", "KILL", "TYPE", "replica", timeout=2.0)


def masters_in(body: str, urls: list[str]) -> list[str]:
    """The masters (host:port) an error response's body names: none should be."""
    return [url for url in urls if urlsplit(url).netloc in body]


def documented(function: Callable[..., object]) -> str:
    """``function``'s signature as the docs write it: no annotations, its ``/`` and
    ``*`` as the code has them."""
    shown: list[str] = []
    previous = None
    for param in inspect.signature(function).parameters.values():
        if previous is param.POSITIONAL_ONLY and param.kind is not param.POSITIONAL_ONLY:
            shown.append("/")
        if param.kind is param.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        previous = param.kind
        default = "" if param.default is param.empty else f"={param.default!r}"
        shown.append(param.name + default)
    return f"{function.__name__}({', '.join(shown)})"


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records at ERROR or above, less the loop's reports of a client some earlier
    test left unclosed (``Unclosed ...`` from the ``asyncio`` logger, written whenever
    the garbage collector happens to run: during any test)."""
    return [
        record
        for record in caplog.records
        if record.levelno >= logging.ERROR
        and not (record.name == "asyncio" and record.getMessage().startswith("Unclosed "))
    ]
