"""Outages, a paused master, and interop with redis-py's Lock (cancellation:
``test_cancellation.py``)."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.lock import Lock as RedisPyLock

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError, QuorumUnavailableError
from asyncredlock.testing import FaultProxy, ServerGroup, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, Waiting

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome

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


async def _evalsha_calls(master: Redis) -> int:
    stats = await master.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


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

    async def test_a_set_whose_script_was_flushed_cannot_overtake_its_release(
        self, make_servers: MakeServers
    ) -> None:
        """The same late grant, on a master whose scripts were flushed (``SCRIPT
        FLUSH``) and where another client's release has loaded ``release.lua`` again
        since, but not ``acquire.lua``: the SET (an ``EVALSHA``) gets ``NOSCRIPT`` and
        the release behind it runs. Sent again then, the SET would take the key after
        its release, and nobody would release it; it fails instead, unrun."""
        group = make_servers(3)
        async with AsyncRedlock(group.urls) as redlock, AsyncRedlock(group.urls) as other:
            held = await other.lock("other").acquire()
            await (await redlock.lock("warm").acquire()).release()  # its links are open
            operator = Redis.from_url(group[2].url)
            await operator.script_flush()
            await operator.aclose()
            await held.release()  # release.lua, NOSCRIPT, sent again as EVAL: cached
            await other.settle()
            group[2].pause()
            lease = await redlock.lock("flushed", timeout=0).acquire()  # masters 0, 1
            assert client_state(redlock).in_flight[2] >= 1  # master 2's SET
            await lease.release()  # behind the SET on master 2's connection
            group[2].resume()
            await redlock.settle()
            assert redlock.statistics().in_flight == 0
        assert await _keys_everywhere(group) == [[], [], []]

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


class TestUndoOfAFailedAttempt:
    """A failed attempt is undone at once on a master whose reply is still out,
    behind the ``SET`` on the same connection: a late grant there is undone as soon
    as the master runs it, before the client's next attempt, and also when
    ``aclose()`` cuts its wait short (docs/algorithm.md, failure cleanup)."""

    async def test_a_late_grant_is_undone(self, make_servers: MakeServers) -> None:
        group = make_servers(5)
        async with AsyncRedlock(group.urls[:3]) as holder, AsyncRedlock(group.urls) as other:
            lease = await holder.lock("undo:late").acquire()  # held on masters 0-2 only
            group[4].pause()
            with pytest.raises(LockTimeoutError):
                await other.lock("undo:late", timeout=0).acquire()
            assert client_state(other).in_flight[4] == 2  # the SET, the undo behind it
            group[4].resume()  # its SET lands on a free key: granted, then undone
            await other.settle()
            assert (await _keys_everywhere(group))[3:] == [[], []]
            await lease.release()
        assert await _keys_everywhere(group) == [[]] * 5

    async def test_the_next_attempt_finds_the_undo_ahead_of_it(self, servers: ServerGroup) -> None:
        async with FaultProxy("127.0.0.1", servers[4].port) as proxy:
            urls = [*servers.urls[:4], proxy.url]
            masters = Masters(servers.urls)
            async with (
                AsyncRedlock(servers.urls[:3]) as holder,
                AsyncRedlock(urls, node_timeout=30) as other,  # master 4 slow, not silent
            ):
                held = await holder.lock("undo:next").acquire()  # on masters 0-2
                await other.settle()  # connected, scripts loaded
                proxy.delay = 0.3
                try:
                    with pytest.raises(LockTimeoutError):
                        await other.lock("undo:next", timeout=0).acquire()
                    assert client_state(other).in_flight[4] == 2  # the SET, the undo
                    await masters.clients[2].delete("undo:next")
                    # Masters 0-1 refuse, 2-3 grant: master 4 decides. The first SET
                    # grants there; an undo sent only on its reply would come after
                    # this SET, which master 4 would refuse, held by the first.
                    lease = await other.lock("undo:next", timeout=0).acquire()
                    await lease.release()
                    await held.release()
                finally:
                    await masters.aclose()

    @pytest.mark.parametrize(
        ("held_on", "calls"), [(3, 4), (5, 3)], ids=["late-grant", "late-refusal"]
    )
    async def test_a_waiting_acquisition_undoes_its_attempt_once_the_reply_comes(
        self, make_servers: MakeServers, held_on: int, calls: int
    ) -> None:
        """An acquisition that goes on waiting sends the undo of its failed attempt, to a
        master whose reply is still out, when the reply comes and only if it holds a key
        there: a late grant is undone, a late refusal gets no call. Its next attempt goes
        out behind the undo all the same (docs/algorithm.md, failure cleanup)."""
        group = make_servers(5)
        async with (
            AsyncRedlock(group.urls[:held_on]) as holder,
            # master 4 slow, not silent, nor dropped
            AsyncRedlock(group.urls, node_timeout=30, socket_timeout=60) as other,
        ):
            await (await other.lock("undo:warm").acquire()).release()
            await other.settle()  # connected, nothing out
            lease = await holder.lock("undo:waiting").acquire()
            await holder.settle()  # held on every master it has: none grants the waiter
            master = Redis.from_url(group[4].url)
            before = await _evalsha_calls(master)
            waiting = Waiting([other])
            taken: list[Lease] = []
            group[4].pause()
            try:
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            lock = other.lock("undo:waiting", auto_extend=False, timeout=60)
                            taken.append(await lock.acquire())

                        tg.start_soon(take)
                        await waiting.reach(1)  # two attempts failed, it waits in line
                        # the first SET, its undo (sent before the second attempt went out
                        # behind it), the second SET: its undo waits for the reply
                        assert client_state(other).in_flight[4] == 3
                        group[4].resume()  # granted: both SETs land on a free key
                        await other.settle()
                        # refused: the second SET needs no undo
                        assert await _evalsha_calls(master) - before == calls
                        assert (await master.get("undo:waiting")) == (
                            None if held_on == 3 else lease.value.encode()
                        )
                        await lease.release()
            finally:
                group[4].resume()
                await master.aclose()
            await taken[0].release()
        assert await _keys_everywhere(group) == [[]] * 5

    async def test_aclose_waits_for_the_reply_and_undoes_a_late_grant(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        holder = AsyncRedlock(group.urls[:3])
        other = AsyncRedlock(group.urls, node_timeout=30)  # aclose() waits up to 30 s
        try:
            lease = await holder.lock("undo:closing").acquire()
            group[4].pause()
            with pytest.raises(LockTimeoutError):
                await other.lock("undo:closing", timeout=0).acquire()
            closing = asyncio.ensure_future(other.aclose())
            await anyio.wait_all_tasks_blocked()  # aclose() waits for the calls still out
            assert not closing.done()
            group[4].resume()
            await closing
            assert (await _keys_everywhere(group))[3:] == [[], []]
            await lease.release()
        finally:
            group[4].resume()
            await other.aclose()
            await holder.aclose()
        assert await _keys_everywhere(group) == [[]] * 5

    async def test_aclose_past_its_bound_still_sends_the_undo(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        async with AsyncRedlock(group.urls[:3]) as holder:
            other = AsyncRedlock(group.urls, node_timeout=0.2)
            # Connected first: what the master reads after it resumes is the attempt's
            # SET and its undo, not also the scripts loaded on a new connection (it
            # stops reading once its replies meet the closed connection: how far it
            # got would depend on the scripts' sizes).
            await (await other.lock("undo:warm").acquire()).release()
            await other.settle()
            lease = await holder.lock("undo:cut").acquire()
            group[4].pause()
            try:
                with pytest.raises(LockTimeoutError):
                    await other.lock("undo:cut", timeout=0).acquire()
                await other.aclose()  # returns, the master still paused
                assert client_state(other).in_flight == (0,) * 5
            finally:
                group[4].resume()
            # The undo went out behind the SET before the connection closed: the
            # master runs both (a fresh client's command comes after them).
            assert group[4].ping(timeout=5)
            assert (await _keys_everywhere(group))[3:] == [[], []]
            await lease.release()
        assert await _keys_everywhere(group) == [[]] * 5


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
