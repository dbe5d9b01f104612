"""Validity measured by the injected clock, against real servers.

A fake clock stands in for ``time.monotonic``: the test decides how much time each
read says has passed, so an attempt can "take" longer than its TTL without any wait.
"""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds: a bug fails the test instead of hanging it


class FakeClock:
    """Returns ``now``; every read after the first advances it by ``step`` first."""

    def __init__(self, now: float = 1000.0, step: float = 0.0) -> None:
        self.now = now
        self.step = step
        self.reads = 0

    def __call__(self) -> float:
        if self.reads:
            self.now += self.step
        self.reads += 1
        return self.now


class TestValidityUsedUp:
    async def test_a_round_slower_than_the_ttl_fails_and_leaves_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        ttl = 2.0
        clock = FakeClock(step=2 * ttl)  # each read: two TTLs later
        async with AsyncRedlock(servers.urls, clock=clock, auto_extend=False) as redlock:
            with anyio.fail_after(HANG_GUARD):
                with pytest.raises(LockTimeoutError) as caught:
                    await redlock.lock("slow", ttl=ttl, timeout=0).acquire()
                await redlock.settle()
            error = caught.value
            assert "the masters answered too slowly for the TTL" in str(error)
            assert error.resource == "slow"
            assert len(error.outcomes) == 5
            assert not any(o.ok for o in error.outcomes)
            used_up = [o for o in error.outcomes if "validity was used up" in o.detail]
            assert len(used_up) >= 3  # a quorum did grant it, too late
            stats = redlock.statistics()
            assert (stats.attempts, stats.acquisitions, stats.failed_attempts) == (1, 0, 1)
            assert (stats.timeouts, stats.unavailable, stats.held) == (1, 0, 0)
            assert stats.background_tasks == 0
            assert await masters.keys() == [[]] * 5  # no lock key, no undo marker

    async def test_the_masters_are_free_again_after_a_failed_attempt(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        clock = FakeClock(step=20.0)
        async with (
            AsyncRedlock(servers.urls, clock=clock) as slow,
            AsyncRedlock(servers.urls) as other,
        ):
            with anyio.fail_after(HANG_GUARD):
                with pytest.raises(LockTimeoutError, match="too slowly"):
                    await slow.lock("freed", ttl=10.0, timeout=0).acquire()
                await slow.settle()
                lease = await other.lock("freed", timeout=0).acquire()
                await other.settle()  # on every master (acquire() returns at a quorum)
                assert await masters.holding("freed") == 5
                await lease.release()

    async def test_drift_uses_up_what_a_round_shorter_than_the_ttl_left(
        self, servers: ServerGroup
    ) -> None:
        # ttl 1 s, drift 10 ms + 2 ms: a round of 0.99 s (or more, if the clock is read
        # more than once in between) leaves no validity, though it took less than the TTL
        clock = FakeClock(step=0.99)
        async with AsyncRedlock(servers.urls, clock=clock, drift_factor=0.01) as redlock:
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockTimeoutError, match="too slowly"):
                await redlock.lock("drift", ttl=1.0, timeout=0).acquire()


class TestValidityOfALease:
    async def test_validity_is_ttl_minus_drift_then_follows_the_clock(
        self, servers: ServerGroup
    ) -> None:
        clock = FakeClock()  # frozen until the test moves it
        ttl = 10.0
        async with AsyncRedlock(servers.urls, clock=clock, drift_factor=0.01) as redlock:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("valid", ttl=ttl, auto_extend=False).acquire()
            assert lease.validity == pytest.approx(ttl - (ttl * 0.01 + 0.002))
            clock.now += 4.0
            assert lease.validity == pytest.approx(ttl - 0.102 - 4.0)
            clock.now += 6.0
            assert lease.validity == 0
            assert lease.held  # validity ran out; nobody has said it was lost yet
            with anyio.fail_after(HANG_GUARD):
                await lease.release()

    async def test_an_extension_restarts_validity_from_its_own_start(
        self, servers: ServerGroup
    ) -> None:
        clock = FakeClock()
        async with AsyncRedlock(servers.urls, clock=clock, drift_factor=0.0) as redlock:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("ext", ttl=5.0, auto_extend=False).acquire()
                clock.now += 3.0
                assert lease.validity == pytest.approx(5.0 - 0.002 - 3.0)
                await lease.extend()
                assert lease.validity == pytest.approx(5.0 - 0.002)
                await lease.extend(ttl=8.0)
                assert lease.validity == pytest.approx(8.0 - 0.002)
                await lease.release()
