"""Plain masters restarted empty (no persistence) while leases are held and
waiters are in line: a fair lock's waiter, a read-write lock's readers with queued
writers, a semaphore at its limit."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError
from asyncredlock.testing import Waits
from asyncredlock.testing._support import connected_clients
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, library_tasks, polled, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 30
POLLS = HANG_GUARD * 40  # polled() looks every 0.025 s: as long as HANG_GUARD
# The loop marked ASYNC110 polls a key (an await each look): no event tells it changes.


class TestFairWaiterAcrossARestart:
    async def test_a_waiter_in_line_times_out_by_its_own_timeout_and_leaves_no_entry(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(3)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls, ttl=3.0) as holder,
                AsyncRedlock(group.urls, ttl=3.0) as waiter,
            ):
                held = await holder.lock("fair", fair=True).acquire()
                errors: list[BaseException] = []
                with anyio.fail_after(HANG_GUARD), Waits(waiter) as waits:
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            try:
                                await waiter.lock("fair", fair=True, timeout=3).acquire()
                            except LockTimeoutError as exc:
                                errors.append(exc)

                        tg.start_soon(take)
                        await waits.reach(1)
                        group[0].restart(kill=True)
                        await masters.clients[0].connection_pool.disconnect()
                assert len(errors) == 1
                assert held.held
                state = await holder.inspect("fair")
                assert state.holder == held.value
                assert waiter.statistics().timeouts == 1
                await waiter.settle()
                # the waiter's entry is gone from every queue; the holder's own
                # entry may still be listed (it stays until its release)
                left = await queues(masters, "fair")
                assert all(
                    not any(e.startswith(b"w:" + waiter_id(waiter)) for e in q) for q in left
                )
                assert holder.statistics().lost == 0
                await held.release()
                await holder.settle()
            await assert_only_undo_markers_left(masters)
            assert library_tasks() == []
        finally:
            await masters.aclose()
        # the listeners reconnected to the restarted master, and closed with the rest
        assert [connected_clients(server.port) for server in group] == [0, 0, 0]


async def assert_only_undo_markers_left(masters: Masters) -> None:
    """Undo markers of attempts whose connection broke with the restart are
    documented (algorithm.md, failure cleanup: they expire after one TTL); no other
    key may be left, and every marker expires."""
    left = [[k for k in keys if b":undo:" not in k] for keys in await masters.keys()]
    assert left == [[], [], []]
    for client in masters.clients:
        for key in await client.keys("*:undo:*"):
            assert await client.pttl(key) > 0


def waiter_id(redlock: AsyncRedlock) -> bytes:
    from asyncredlock.testing import client_state

    return client_state(redlock).client.encode()


class TestRWLockAcrossARestart:
    async def test_readers_and_queued_writers_when_one_of_three_restarts_empty(
        self, make_servers: MakeServers
    ) -> None:
        """Two readers hold; a fair writer waits (long timeout), another with a short
        one; master 0 restarts empty. The short writer times out (never granted with
        readers), the long one gets the lock once both readers release, and
        ``inspect()`` and the statistics agree."""
        group = make_servers(3)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls, ttl=3.0) as r1,
                AsyncRedlock(group.urls, ttl=3.0) as r2,
                AsyncRedlock(group.urls, ttl=3.0) as w1,
                AsyncRedlock(group.urls, ttl=3.0) as w2,
            ):
                readers = [
                    await r1.rwlock("rw", fair=True).read().acquire(),
                    await r2.rwlock("rw", fair=True).read().acquire(),
                ]
                got: list[Lease] = []
                timed_out: list[BaseException] = []
                short = w2.rwlock("rw", fair=True)
                with anyio.fail_after(HANG_GUARD), Waits(w1, w2) as waits:
                    async with anyio.create_task_group() as tg:

                        async def long() -> None:
                            got.append(await w1.rwlock("rw", fair=True).write(timeout=20).acquire())

                        async def brief() -> None:
                            try:
                                got.append(await short.write(timeout=2).acquire())
                            except LockTimeoutError as exc:
                                timed_out.append(exc)

                        tg.start_soon(long)
                        await waits.reach(1)
                        tg.start_soon(brief)
                        await waits.reach(2)
                        group[0].restart(kill=True)
                        await masters.clients[0].connection_pool.disconnect()
                        assert await polled(lambda: bool(timed_out or got), POLLS)
                        assert got == []  # no writer beside the readers
                        assert len(timed_out) == 1
                        assert all(lease.held for lease in readers)
                        for lease in readers:
                            await lease.release()
                assert len(got) == 1
                writer = got[0]
                assert writer.held
                state = await w1.inspect("rw")
                assert state.holder == writer.value
                assert all(node.readers == () for node in state.nodes)
                assert short.statistics().write.timeouts == 1
                assert short.statistics().write.waiting == 0
                assert r1.statistics().lost == 0
                assert r2.statistics().lost == 0
                await writer.release()
                for client in (r1, r2, w1, w2):
                    await client.settle()
            await assert_only_undo_markers_left(masters)
        finally:
            await masters.aclose()


class TestSemaphoreAcrossARestart:
    async def test_the_limit_holds_when_one_of_three_restarts_empty(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(3)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls, ttl=3.0) as a,
                AsyncRedlock(group.urls, ttl=3.0) as b,
                AsyncRedlock(group.urls, ttl=3.0) as c,
            ):
                sem = [client.semaphore("sem", 2, timeout=0) for client in (a, b, c)]
                held = [await sem[0].acquire(), await sem[1].acquire()]
                for client in (a, b):  # on every master (acquire() returns at a quorum)
                    await client.settle()
                group[0].restart(kill=True)
                await masters.clients[0].connection_pool.disconnect()
                with pytest.raises(LockTimeoutError):
                    await sem[2].acquire()
                waiting = c.semaphore("sem", 2, timeout=1.5)
                with anyio.fail_after(HANG_GUARD), pytest.raises(LockTimeoutError):
                    await waiting.acquire()
                assert all(lease.held for lease in held)
                # no slot key holds two values each on a quorum
                for key in sem[0].slot_keys:
                    values = [await client.get(key) for client in masters.clients]
                    on_quorum = {v for v in values if v is not None and values.count(v) >= 2}
                    assert len(on_quorum) <= 1
                await held[0].release()
                with anyio.fail_after(HANG_GUARD):
                    third = await c.semaphore("sem", 2, timeout=10).acquire()
                assert third.key != held[1].key
                with pytest.raises(LockTimeoutError):
                    await a.semaphore("sem", 2, timeout=0).acquire()
                assert waiting.statistics().timeouts == 1
                assert c.statistics().held == 1
                await third.release()
                await held[1].release()
                for client in (a, b, c):
                    await client.settle()
            await assert_only_undo_markers_left(masters)
        finally:
            await masters.aclose()


class TestHandOverAfterARestart:
    async def test_a_lease_handed_over_by_the_two_masters_left_is_kept(
        self, make_servers: MakeServers
    ) -> None:
        """Master 0 restarted empty mid-queue: the release hands the key to the fair
        waiter on masters 1 and 2 only (exactly a quorum), with the short PX of a
        handed key. The lease must extend those keys before they lapse and stay held
        past that PX (its extensions keep the full TTL there). The TTL is four
        times that PX (an entry's TTL, a second): far apart, and its three
        extensions, a third of a TTL apart, take a few seconds, not seven."""
        ttl = 4.0
        group = make_servers(3)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls, ttl=ttl) as holder,
                AsyncRedlock(group.urls, ttl=ttl) as waiter,
            ):
                held = await holder.lock("handed", fair=True).acquire()
                got: list[Lease] = []
                with anyio.fail_after(HANG_GUARD), Waits(waiter) as waits:
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            got.append(await waiter.lock("handed", fair=True, timeout=20).acquire())

                        tg.start_soon(take)
                        await waits.reach(1)
                        group[0].stop()  # down while the release runs: it hands over on 1, 2
                        await held.release()
                lease = got[0]
                assert lease.statistics().source == "hand-over"
                group[0].start()
                await masters.clients[0].connection_pool.disconnect()
                with anyio.fail_after(HANG_GUARD):
                    assert await polled(lambda: lease.statistics().extensions >= 3, POLLS)
                assert lease.held
                ttls = [await client.pttl("handed") for client in masters.clients[1:]]
                # extended to the lease's TTL, not the handed PX
                assert all(left > ttl * 1000 / 2 for left in ttls), ttls
                assert waiter.statistics().lost == 0
                state = await waiter.inspect("handed")
                assert state.holder == lease.value
                await lease.release()
                await waiter.settle()
                await holder.settle()
            await assert_only_undo_markers_left(masters)
        finally:
            await masters.aclose()


class TestMasterTurnedReplica:
    async def test_a_master_turned_replica_while_held_then_back(
        self, make_servers: MakeServers
    ) -> None:
        """Master 0 is turned into a replica of an empty server (``REPLICAOF``, which
        keeps client connections open): its writes answer ``READONLY``, its data is
        replaced by the empty server's. The lease keeps extending on the two others,
        a rival is refused, a waiter with a short timeout times out; master 0 made a
        master again, the lease is released everywhere, and no connection is left."""
        group = make_servers(4)
        urls = group.urls[:3]
        masters = Masters(urls)
        try:
            # extensions half a second apart: the test waits for three of them
            async with AsyncRedlock(urls, ttl=1.5) as holder, AsyncRedlock(urls) as rival:
                lease = await holder.lock("demoted").acquire()
                await masters.clients[0].execute_command(
                    "REPLICAOF", "127.0.0.1", str(group[3].port)
                )
                with anyio.fail_after(HANG_GUARD):
                    while await masters.clients[0].exists("demoted"):  # noqa: ASYNC110
                        await anyio.sleep(0.05)  # the sync from the empty server
                    extended = lease.statistics().extensions
                    done = extended + 2
                    assert await polled(lambda: lease.statistics().extensions >= done, POLLS)
                assert lease.held
                with pytest.raises(LockTimeoutError):
                    await rival.lock("demoted", timeout=0).acquire()
                with anyio.fail_after(HANG_GUARD), pytest.raises(LockTimeoutError):
                    await rival.lock("demoted", timeout=1, fair=True).acquire()
                await masters.clients[0].execute_command("REPLICAOF", "NO", "ONE")
                extended = lease.statistics().extensions
                with anyio.fail_after(HANG_GUARD):
                    done = extended + 1
                    assert await polled(lambda: lease.statistics().extensions >= done, POLLS)
                assert holder.statistics().lost == 0
                await lease.release()
                after = await rival.lock("demoted", timeout=0).acquire()
                await rival.settle()
                assert await masters.holding("demoted") == 3
                await after.release()
                await holder.settle()
                await rival.settle()
            await assert_only_undo_markers_left(masters)
        finally:
            await masters.aclose()
        assert library_tasks() == []
        assert [connected_clients(server.port) for server in group][:3] == [0, 0, 0]
