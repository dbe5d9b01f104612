"""force-release and the masters' queue: the first waiter is told; a holder listed in
the queue (a fair lock's, or one handed the key by a release) leaves it first."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.__main__ import main
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

WAIT = 30.0  # a bound on each wait, far above what it takes


async def cli(*argv: str) -> int:
    """``main(argv)`` in a worker thread, as from a shell."""
    return await anyio.to_thread.run_sync(main, list(argv), abandon_on_cancel=True)


def master_args(urls: list[str]) -> list[str]:
    return [arg for url in urls for arg in ("--master", url)]


@pytest.fixture(autouse=True)
def _no_masters_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_MASTERS", raising=False)


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Await ``condition()`` until true (bounded by ``WAIT``, never a measure)."""
    with anyio.fail_after(WAIT):
        while not await condition():  # noqa: ASYNC110 (the masters' state, polled)
            await anyio.sleep(0.025)


async def listed(urls: list[str], name: str) -> list[list[str]]:
    """The ids in ``{name}:queue`` on each master, in order."""
    found = []
    for url in urls:
        async with Redis.from_url(url) as client:
            ids = await client.zrange("{" + name + "}:queue", 0, -1)
            found.append([raw.decode() for raw in ids])
    return found


async def all_listed(urls: list[str], name: str, n: int) -> bool:
    return all(len(ids) >= n for ids in await listed(urls, name))


async def holder_and_waiter(urls: list[str], name: str) -> tuple[str, str]:
    """The holder listed first and the waiter behind it, once every master lists the
    waiter (the holder may be missing where its acquisition's reply came after the
    quorum: the end of its acquire() took it out there)."""
    with anyio.fail_after(WAIT):
        while True:
            found = await listed(urls, name)
            pairs = [ids for ids in found if len(ids) == 2]
            if pairs and all(pairs[0][1] in ids for ids in found):
                return pairs[0][0], pairs[0][1]
            await anyio.sleep(0.025)


def inbox_of(waiter: str) -> str:
    return "asyncredlock:inbox:" + waiter.split(":")[1]


async def force_and_listen(urls: list[str], name: str) -> list[str]:
    """force-release ``name``; the inbox channels told, one per master's message."""
    got: list[str] = []
    clients = [Redis.from_url(url) for url in urls]
    subs = [client.pubsub() for client in clients]
    try:
        for sub in subs:
            await sub.psubscribe("asyncredlock:inbox:*")
            while await sub.get_message(timeout=1.0) is None:  # the psubscribe reply
                pass
        assert await cli("force-release", name, "--yes", *master_args(urls)) == 0
        with anyio.move_on_after(5.0):  # a hang guard: one message per master comes
            while len(got) < len(urls):
                for sub in subs:
                    message = await sub.get_message(ignore_subscribe_messages=True, timeout=0.05)
                    if message is not None:
                        got.append(message["channel"].decode())
    finally:
        for sub in subs:
            await sub.aclose()
        for client in clients:
            await client.aclose()
    return got


async def take_and_release(redlock: AsyncRedlock, name: str, fair: bool) -> None:
    lease = await redlock.lock(name, ttl=30.0, timeout=WAIT, fair=fair).acquire()
    await lease.release()


async def test_a_fair_holder_leaves_the_queue_and_the_next_waiter_is_told(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fair lock's holder stays listed first (granted while queued); forced free,
    it leaves the queue and the waiter behind it is told on its inbox."""
    urls = servers.urls
    async with (
        AsyncRedlock(urls, identity="a", retry_delay=2.0) as a,
        AsyncRedlock(urls, identity="c") as c,
    ):
        lease = await a.lock("fq:fair", ttl=30.0, fair=True).acquire()
        with Waits(c) as waits:
            async with anyio.create_task_group() as tg:
                tg.start_soon(take_and_release, c, "fq:fair", True)
                await waits.reach(1)
                holder, waiter = await holder_and_waiter(urls, "fq:fair")
                got = await force_and_listen(urls, "fq:fair")
                after = await listed(urls, "fq:fair")
                tg.cancel_scope.cancel()
        del lease
    capsys.readouterr()
    assert got, "nothing was announced on any inbox"
    assert set(got) == {inbox_of(waiter)}, got
    assert [holder not in ids for ids in after] == [True] * 5, after


async def test_a_handed_holder_leaves_the_queue_and_the_next_waiter_is_told(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain lock's holder B, handed the key by a release, stays listed first;
    forced free, it leaves the queue and C, next in line, is told."""
    urls = servers.urls
    async with (
        AsyncRedlock(urls, identity="a") as a,
        AsyncRedlock(urls, identity="b", retry_delay=2.0) as b,
        AsyncRedlock(urls, identity="c") as c,
    ):
        held = await a.lock("fq:handed", ttl=30.0).acquire()
        got_b: list[Lease] = []
        with Waits(b, c) as waits:
            async with anyio.create_task_group() as tg:

                async def wait_b() -> None:
                    got_b.append(await b.lock("fq:handed", ttl=30.0, timeout=WAIT).acquire())

                tg.start_soon(wait_b)
                await waits.reach(1)
                await until(lambda: all_listed(urls, "fq:handed", 1))
                tg.start_soon(take_and_release, c, "fq:handed", False)
                await waits.reach(2)
                await until(lambda: all_listed(urls, "fq:handed", 2))
                await held.release()
                with anyio.fail_after(WAIT):
                    while not got_b:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                assert got_b[0].statistics().source == "hand-over"
                handed, waiter = await holder_and_waiter(urls, "fq:handed")
                got = await force_and_listen(urls, "fq:handed")
                after = await listed(urls, "fq:handed")
                tg.cancel_scope.cancel()
    capsys.readouterr()
    assert set(got) == {inbox_of(waiter)}, got
    assert [handed not in ids for ids in after] == [True] * 5, after


async def test_the_first_waiter_of_a_holder_that_never_queued_is_told(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain holder (never queued): the forced release is announced on the first
    waiter's inbox, and once the waiter is done only the fence counter is left."""
    urls = servers.urls
    async with (
        AsyncRedlock(urls, identity="dead") as dead,
        AsyncRedlock(urls, identity="b") as b,
    ):
        await dead.lock("fq:plain", ttl=60.0, auto_extend=False).acquire()
        with Waits(b) as waits:
            async with anyio.create_task_group() as tg:
                tg.start_soon(take_and_release, b, "fq:plain", False)
                await waits.reach(1)
                await until(lambda: all_listed(urls, "fq:plain", 1))
                (waiter,) = (await listed(urls, "fq:plain"))[0]
                got = await force_and_listen(urls, "fq:plain")
        await b.settle()
    capsys.readouterr()
    assert set(got) == {inbox_of(waiter)}, got
    for url in urls:
        async with Redis.from_url(url) as client:
            assert await client.keys("*") == [b"{fq:plain}:fence"]


async def test_readers_forced_out_let_the_queued_writer_in(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Readers that keep their entries, a writer queued behind them: force-release
    deletes the readers and the writer takes the lock."""
    urls = servers.urls
    async with (
        AsyncRedlock(urls, identity="r") as r,
        AsyncRedlock(urls, identity="w") as w,
    ):
        await r.rwlock("fq:rw", patience=0.0).read().acquire()
        await r.settle()
        got: list[Lease] = []
        async with anyio.create_task_group() as tg:

            async def writer() -> None:
                got.append(await w.rwlock("fq:rw", patience=0.0).write(timeout=WAIT).acquire())

            tg.start_soon(writer)
            await until(lambda: all_listed(urls, "fq:rw", 1))
            assert await cli("force-release", "fq:rw", "--yes", *master_args(urls)) == 0
        (lease,) = got  # the writer is in
        await lease.release()
    capsys.readouterr()


async def test_a_cancelled_force_release_still_ends_this_client_s_leases(
    make_servers: MakeServers,
) -> None:
    """force_release() cancelled while its DELETEs are on their way (masters 0.3 s away
    each way): they arrive all the same, so this client's own lease on the name is
    ended lost at once, its block cancelled, rather than held on (its keys deleted
    under it) until an extension finds them gone a third of its TTL later."""
    group = make_servers(3)
    async with AsyncExitStack() as stack:
        proxies = [
            await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
            for server in group
        ]
        redlock = await stack.enter_async_context(AsyncRedlock([p.url for p in proxies]))
        with anyio.fail_after(WAIT):
            lease = await redlock.lock("forced", ttl=30.0).acquire()
            await redlock.settle()
            for proxy in proxies:
                proxy.delay = 0.3
            forcing = asyncio.ensure_future(redlock.force_release("forced"))
            await asyncio.sleep(0)  # one turn: it sends its DELETEs before its first await
            assert all(client_state(redlock).in_flight)
            forcing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await forcing
            assert lease.lost
            await redlock.settle()  # the DELETEs landed
    for server in group:
        async with Redis(port=server.port) as client:
            assert await client.exists("forced") == 0
