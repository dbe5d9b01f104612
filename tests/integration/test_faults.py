"""Outages, a paused master, cancellation at any point, and interop with redis-py's Lock."""

from __future__ import annotations

import asyncio
import random

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.lock import Lock as RedisPyLock

from asyncredlock import AsyncRedlock, LockTimeoutError, QuorumUnavailableError
from asyncredlock.testing import FaultProxy, ServerGroup, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters

pytestmark = pytest.mark.anyio


async def _keys_everywhere(group: ServerGroup) -> list[list[bytes]]:
    direct = Masters(group.urls)
    try:
        return await direct.keys()
    finally:
        await direct.aclose()


class TestOutages:
    async def test_two_of_five_stopped_still_acquires(self, make_servers: MakeServers) -> None:
        group = make_servers(5)
        group[3].stop()
        group[4].stop()
        async with AsyncRedlock(group.urls) as redlock:
            lease = await redlock.lock("outage", timeout=0).acquire()
            await lease.release()
            assert redlock.statistics().acquisitions == 1

    async def test_three_of_five_stopped_is_an_outage_not_contention(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        for i in (2, 3, 4):
            group[i].stop()
        async with AsyncRedlock(group.urls) as redlock:
            with anyio.fail_after(10), pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock("outage", timeout=0.3).acquire()
            failed = [o for o in caught.value.outcomes if not o.ok]
            assert len(failed) >= 3
            assert all("Error" in o.detail for o in caught.value.outcomes[2:])
            assert redlock.statistics().unavailable == 1
            await redlock.settle()
        assert await _keys_everywhere_running(group) == [[], []]


async def _keys_everywhere_running(group: ServerGroup) -> list[list[bytes]]:
    direct = Masters([server.url for server in group if server.running])
    try:
        return await direct.keys()
    finally:
        await direct.aclose()


class TestPausedMaster:
    async def test_late_grant_of_a_paused_master_is_released(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        async with AsyncRedlock(group.urls) as redlock:
            group[4].pause()
            lease = await redlock.lock("paused", timeout=0).acquire()
            assert redlock.statistics().in_flight >= 1  # the paused master's SET
            await lease.release()
            group[4].resume()
            await redlock.settle()
            assert redlock.statistics().in_flight == 0
        assert await _keys_everywhere(group) == [[], [], [], [], []]

    async def test_set_outliving_its_socket_timeout_cannot_orphan_a_key(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        async with AsyncRedlock(group.urls, socket_timeout=0.3) as redlock:
            group[4].pause()
            lease = await redlock.lock("stale", timeout=0).acquire()
            await lease.release()
            # The paused master's SET times out on the client side; its undo (with
            # a marker) is sent too. Both wait in the paused server's buffers.
            await redlock.settle()
            group[4].resume()
        # Buffered commands of a resumed server run before a new connection's, so
        # once it answers a fresh client, the stale SET has landed or been refused.
        assert group[4].ping(timeout=5)
        late = Redis.from_url(group[4].url)
        assert await late.get("stale") is None
        await late.aclose()


class TestCancellation:
    async def test_cancellation_storm_leaves_nothing_behind(self, servers: ServerGroup) -> None:
        rng = random.Random(20261123)
        names = [f"storm:{i}" for i in range(64)]
        # Two clients, as two processes would be: tasks of one client queue for a
        # name locally, so only between clients do attempts meet a held lock on
        # the masters and waiters subscribe.
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as first,
            AsyncRedlock(servers.urls, retry_delay=0.02) as second,
        ):
            redlocks = (first, second)
            for redlock in redlocks:
                await _warm_up(redlock, 50)

            async def one(i: int) -> None:
                # A third unfenced: one round per attempt, so that even on a loaded
                # machine some acquisitions finish and their leases get cancelled.
                redlock = redlocks[i % 2]
                lock = redlock.lock(rng.choice(names), ttl=2.0, timeout=5.0, fencing=i % 3 != 0)
                with anyio.move_on_after(rng.uniform(0, 0.3)):
                    if i % 3 == 0:
                        lease = await lock.acquire()
                        try:
                            await anyio.sleep(rng.uniform(0, 0.01))
                        finally:
                            await lease.release()  # cancel-safe: goes on shielded
                    else:
                        async with lock:
                            await anyio.sleep(rng.uniform(0, 0.01))

            # Five waves of 100: a wave of 500 would spend its first 0.5 s of
            # client CPU sending, and every cancellation would land in round one.
            for wave in range(5):
                async with anyio.create_task_group() as tg:
                    for i in range(100):
                        tg.start_soon(one, wave * 100 + i)
            for redlock in redlocks:
                await redlock.settle()
            stats = [redlock.statistics() for redlock in redlocks]
            # one command connection per master, opened once for the whole storm
            opened = [list(client_state(r).connections) for r in redlocks]
            # the one standing subscription per master that waiters listen through
            listening = [[int(up) for up in client_state(r).subscribed] for r in redlocks]
            gates = [client_state(r).slots for r in redlocks]
            library_tasks = [
                t for t in asyncio.all_tasks() if _from_library(t) and not _is_listener(t)
            ]
        assert [t for t in asyncio.all_tasks() if _from_library(t)] == []  # after aclose()
        assert [1] * 5 in listening  # contention between the clients: waiters subscribed
        assert sum(s.attempts for s in stats) > 100  # the warm-up, then first in line
        assert sum(s.acquisitions + s.handoffs for s in stats) > 100  # leases cancelled
        assert sum(s.failed_attempts for s in stats) > 0  # and contended attempts
        assert [s.timeouts for s in stats] == [0, 0]  # each acquire() cancelled or leased
        assert gates == [{}, {}]  # no task left queued or holding a slot
        assert [(s.held, s.in_flight, s.background_tasks) for s in stats] == [(0, 0, 0)] * 2
        assert opened == [[1] * 5] * 2
        assert library_tasks == []
        assert await _keys_everywhere(servers) == [[], [], [], [], []]

    @pytest.mark.parametrize("how", ["asyncio.timeout", "anyio.fail_after"])
    async def test_timeout_from_outside_cleans_up_like_the_timeout_argument(
        self, servers: ServerGroup, how: str
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as waiter:
            lease = await holder.lock("outside").acquire()
            with pytest.raises(TimeoutError):
                if how == "asyncio.timeout":
                    async with asyncio.timeout(0.3):
                        await waiter.lock("outside", timeout=30).acquire()
                else:
                    with anyio.fail_after(0.3):
                        await waiter.lock("outside", timeout=30).acquire()
            await waiter.settle()
            assert waiter.statistics().attempts >= 1
            assert waiter.statistics().held == 0
            keys = await _keys_everywhere(servers)
            assert keys == [[b"outside"]] * 5
            await lease.release()

    async def test_cancelled_block_releases_its_lease(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            entered = anyio.Event()

            async def hold() -> None:
                async with redlock.lock("cancelled"):
                    entered.set()
                    await anyio.sleep_forever()

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await entered.wait()
                tg.cancel_scope.cancel()
            await redlock.settle()
            assert redlock.statistics().held == 0
        assert await _keys_everywhere(servers) == [[], [], [], [], []]


class TestInterop:
    async def test_redis_py_lock_blocks_asyncredlock(self, servers: ServerGroup) -> None:
        clients = [Redis.from_url(url) for url in servers.urls]
        theirs = [RedisPyLock(c, "shared", timeout=10) for c in clients]
        for lock in theirs:
            assert await lock.acquire(blocking=False)
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(LockTimeoutError):
                await redlock.lock("shared", timeout=0).acquire()
            for lock in theirs:
                await lock.release()
            lease = await redlock.lock("shared", timeout=0).acquire()
            await lease.release()
        for c in clients:
            await c.aclose()

    async def test_asyncredlock_blocks_redis_py_lock(self, servers: ServerGroup) -> None:
        clients = [Redis.from_url(url) for url in servers.urls]
        async with AsyncRedlock(servers.urls) as redlock:
            lease = await redlock.lock("shared", timeout=0).acquire()
            await redlock.settle()
            for c in clients:
                assert not await RedisPyLock(c, "shared", timeout=10).acquire(blocking=False)
            await lease.release()
            await redlock.settle()
            for c in clients:
                lock = RedisPyLock(c, "shared", timeout=10)
                assert await lock.acquire(blocking=False)
                await lock.release()
        for c in clients:
            await c.aclose()


def _is_listener(task: asyncio.Task[object]) -> bool:
    return getattr(task.get_coro(), "__qualname__", "") == "_Listener._run"


def _from_library(task: asyncio.Task[object]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/asyncredlock/" in code.co_filename.replace("\\", "/")


async def _warm_up(redlock: AsyncRedlock, n: int) -> None:
    """Open connections first, so the storm is not all spent connecting."""

    async def cycle(i: int) -> None:
        lease = await redlock.lock(f"warm:{i}", auto_extend=False).acquire()
        await lease.release()

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(cycle, i)


def test_runs_on_uvloop(servers: ServerGroup) -> None:
    async def main() -> int:
        async with AsyncRedlock(servers.urls) as redlock:
            async with redlock.lock("uv", ttl=1.0) as lease:
                assert lease.held
            with anyio.CancelScope() as scope:
                async with redlock.lock("uv"):
                    scope.cancel()  # cancelled inside the block: released on the way out
                    await anyio.sleep_forever()
            await redlock.settle()
            return redlock.statistics().acquisitions

    assert anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True}) == 2
    assert anyio.run(_count_keys, servers.urls, backend="asyncio") == 0


async def _count_keys(urls: list[str]) -> int:
    direct = Masters(urls)
    try:
        return sum(len(k) for k in await direct.keys())
    finally:
        await direct.aclose()


class TestHungMaster:
    async def test_a_blackholed_master_gets_no_new_calls_once_silent(
        self, servers: ServerGroup
    ) -> None:
        async with FaultProxy("127.0.0.1", servers[4].port) as proxy:
            proxy.blackhole = True
            urls = [*servers.urls[:4], proxy.url]
            async with AsyncRedlock(urls) as redlock:
                with anyio.fail_after(20):
                    i = 0
                    while not client_state(redlock).silent[4]:  # each cycle is real work
                        await _cycle(redlock, f"hung:{i}")
                        i += 1
                    out = client_state(redlock).in_flight[4]
                    for j in range(50):
                        await _cycle(redlock, f"hung:more:{j}")
                # nothing new sent to the hung master
                assert client_state(redlock).in_flight[4] <= out
                assert redlock.statistics().acquisitions == i + 50

    async def test_retries_do_not_wait_on_a_hung_masters_undo(self, servers: ServerGroup) -> None:
        async with FaultProxy("127.0.0.1", servers[4].port) as proxy:
            proxy.blackhole = True
            urls = [*servers.urls[:4], proxy.url]
            async with (
                AsyncRedlock(urls) as holder,
                AsyncRedlock(urls, retry_delay=0, socket_timeout=30) as waiter,
            ):
                lease = await holder.lock("hung:contended").acquire()

                async def release_soon() -> None:
                    await anyio.sleep(0.5)  # the holder's work
                    await lease.release()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(release_soon)
                    got = await waiter.lock("hung:contended", timeout=3.0).acquire()
                # The hung master's calls end only at socket_timeout (30 s). A retry
                # that waited for their undo would sit out the whole timeout after
                # its first failure and try once more at the end; retries that skip
                # the silent master keep trying while the holder works.
                assert waiter.statistics().failed_attempts >= 2
                await got.release()


async def _cycle(redlock: AsyncRedlock, name: str) -> None:
    lease = await redlock.lock(name, auto_extend=False, timeout=0).acquire()
    await lease.release()
