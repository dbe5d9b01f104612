"""``statistics()`` of a lease, a lock and a read-write lock."""

from __future__ import annotations

import socket

import anyio
import pytest

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LeaseStatistics,
    LockStatistics,
    LockTimeoutError,
    QuorumUnavailableError,
    RWLockStatistics,
)
from asyncredlock.testing import ServerGroup, Waits, whole_retry_delay

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class TestLeaseStatistics:
    """How a lease was taken and kept."""

    async def test_a_lease_taken_by_its_own_attempt_counts_its_extensions(
        self,
        servers: ServerGroup,
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lease = await redlock.lock("stats").acquire()
            taken = lease.statistics()
            assert isinstance(taken, LeaseStatistics)
            assert (taken.source, taken.attempts, taken.extensions) == ("attempt", 1, 0)
            assert taken.waited >= 0
            assert taken.held >= 0
            await lease.extend()
            await lease.extend()
            extended = lease.statistics()
            assert (extended.extensions, extended.failed_extensions) == (2, 0)
            assert extended.held >= taken.held  # still held: up to now
            await lease.release()
            ended = lease.statistics()
            assert ended.held == lease.statistics().held  # ended: up to the release
            assert ended.waited == taken.waited

    async def test_a_lease_passed_on_in_the_process_made_no_attempt(
        self, servers: ServerGroup
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lock = redlock.lock("passed")
            first = await lock.acquire()
            got: list[Lease] = []

            async def wait() -> None:
                got.append(await lock.acquire())

            with Waits(redlock) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await waits.reach(queued=1)
                    await first.release()  # passed straight to the queued task
            passed = got[0].statistics()
            assert (passed.source, passed.attempts) == ("hand-off", 0)
            assert first.statistics().source == "attempt"
            stats = lock.statistics()
            assert (stats.acquisitions, stats.attempts) == (2, 1)
            await got[0].release()


class TestLockStatistics:
    """The acquire() calls of one lock, and of one read-write lock's sides."""

    async def test_a_lock_counts_the_calls_made_through_it(self, servers: ServerGroup) -> None:
        # (node_timeout: the waiter's inbox subscription confirmed before it queues, so
        # that it leaves hand-over terms even on a loaded machine; waited until confirmed)
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD, node_timeout=5.0) as waiter,
        ):
            held = await holder.lock("stats").acquire()
            lock = waiter.lock("stats", timeout=HANG_GUARD)
            assert lock.statistics() == LockStatistics(0, 0, 0, 0, 0, 0.0)
            once = waiter.lock("stats", timeout=0)
            with pytest.raises(LockTimeoutError):
                await once.acquire()
            assert once.statistics() == LockStatistics(0, 1, 1, 0, 0, 0.0)
            assert lock.statistics().attempts == 0  # each Lock counts its own calls
            got: list[Lease] = []

            async def wait() -> None:
                got.append(await lock.acquire())

            with Waits(waiter) as waits, whole_retry_delay(waiter), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await waits.reach(1)
                    assert lock.statistics().waiting == 1
                    await held.release()  # hands the key to the queued waiter
            stats, lease = lock.statistics(), got[0].statistics()
            assert (stats.acquisitions, stats.timeouts, stats.waiting) == (1, 0, 0)
            assert lease.source == "hand-over"
            assert stats.attempts == lease.attempts >= 1  # refused (and queued) first
            assert stats.waited >= lease.waited > 0  # the call returns after the lease is made
            await got[0].release()

    async def test_an_outage_is_counted_as_unavailable(
        self,
    ) -> None:
        with socket.create_server(("127.0.0.1", 0)) as gone:
            port = gone.getsockname()[1]
        # nothing listens there any more: every connection is refused
        async with AsyncRedlock([f"redis://127.0.0.1:{port}"]) as redlock:
            lock = redlock.lock("down", timeout=0)
            with pytest.raises(QuorumUnavailableError):
                await lock.acquire()
            stats = lock.statistics()
            assert (stats.unavailable, stats.timeouts, stats.attempts) == (1, 0, 1)

    async def test_a_rwlock_counts_its_readers_and_writers_apart(
        self, servers: ServerGroup
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            rw = redlock.rwlock("doc")
            readers = [await rw.read().acquire() for _ in range(2)]
            for lease in readers:
                await lease.release()
            async with rw.write():
                pass
            stats = rw.statistics()
            assert isinstance(stats, RWLockStatistics)
            assert (stats.read.acquisitions, stats.write.acquisitions) == (2, 1)
            assert (stats.read.attempts, stats.write.attempts) == (2, 1)
            # a Lock made by the AsyncRedlock, not the RWLock, is not counted there
            async with redlock.lock("doc"):
                pass
            assert rw.statistics().write.acquisitions == 1


class TestWaitAndHoldTimes:
    """``statistics().wait`` / ``.hold`` and ``resource_statistics()``."""

    async def test_every_acquisition_and_every_lease_is_timed(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            for _ in range(3):
                async with redlock.lock("timed"):
                    pass
            held = await redlock.lock("other").acquire()
            stats = redlock.statistics()
            assert (stats.wait.count, stats.hold.count) == (4, 3)  # "other" still held
            assert 0 < stats.wait.p50 <= stats.wait.p99 <= stats.wait.max
            assert stats.wait.mean == pytest.approx(stats.wait.total / 4)
            await held.release()
            assert redlock.statistics().hold.count == 4
            per = redlock.resource_statistics()
            assert list(per) == ["timed", "other"]
            assert (per["timed"].acquisitions, per["timed"].hold.count) == (3, 3)
            assert (per["other"].acquisitions, per["other"].hold.count) == (1, 1)

    async def test_timeouts_and_losses_count_per_resource(self, servers: ServerGroup) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls) as redlock,
        ):
            async with holder.lock("busy"):
                with pytest.raises(LockTimeoutError):
                    await redlock.lock("busy", timeout=0).acquire()
            lease = await redlock.lock("gone").acquire()
            await redlock.force_release("gone")
            assert lease.lost
            per = redlock.resource_statistics()
            assert (per["busy"].timeouts, per["busy"].acquisitions) == (1, 0)
            assert (per["gone"].lost, per["gone"].hold.count) == (1, 1)
            assert redlock.statistics().lost == 1
