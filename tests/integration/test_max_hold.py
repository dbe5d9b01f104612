"""``max_hold``: the longest a lease is held. Its keys are never set (by the
acquisition or any extension) past the bound; at the bound the lease ends lost,
its block is cancelled with `HoldLimitError`, and its keys are released."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import anyio
import pytest

from asyncredlock import (
    AsyncRedlock,
    HoldLimitError,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LostLeaseError,
)
from asyncredlock.testing import Waits

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 10.0  # seconds: a hang fails the test instead of blocking CI


async def test_the_block_is_cancelled_at_the_bound_and_the_lock_released(
    masters: Masters,
) -> None:
    cancelled = False
    async with AsyncRedlock(masters.urls) as redlock:
        lock = redlock.lock("mh:block", ttl=0.3, max_hold=0.6)
        with anyio.fail_after(GUARD), pytest.raises(HoldLimitError) as caught:
            async with lock as lease:
                try:
                    await anyio.sleep_forever()  # a stuck job
                except anyio.get_cancelled_exc_class():
                    cancelled = True
                    raise
        assert isinstance(caught.value, LockLostError)  # what `except LockLostError` catches
        assert "reached its max_hold" in str(caught.value)
        assert cancelled
        assert lease.lost
        assert not lease.held
        # extended while it lasted, and held until its bound: the last extension
        # reached it, less the drift allowance (0.3 s x 1% + 2 ms at most)
        statistics = lease.statistics()
        assert statistics.extensions >= 1
        assert statistics.held >= 0.6 - 0.005
        await redlock.settle()
        assert redlock.statistics().lost == 1
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_an_explicit_lease_is_lost_at_the_bound(masters: Masters) -> None:
    losses: list[Lease] = []
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("mh:explicit", ttl=0.3, max_hold=0.5).acquire()
        lease.add_lost_callback(losses.append)
        with anyio.fail_after(GUARD):
            assert await lease.wait_lost() is True
            await redlock.settle()
        assert losses == [lease]
        assert await masters.holding(lease.key) == 0
        # the resource is free again for anyone
        again = await redlock.lock("mh:explicit", timeout=0).acquire()
        await again.release()


async def test_no_extension_sets_a_key_past_the_bound(masters: Masters) -> None:
    """A TTL longer than the bound is cut to it, and an explicit extension to the
    time left to the bound."""
    async with AsyncRedlock(masters.urls) as redlock:
        lock = redlock.lock("mh:cap", ttl=60.0, max_hold=2.0, auto_extend=False)
        assert (lock.ttl, lock.max_hold) == (2.0, 2.0)
        lease = await lock.acquire()
        assert lease.validity <= 2.0
        await anyio.sleep(0.5)  # a quarter of the bound used
        await lease.extend(ttl=600.0)
        await redlock.settle()
        pttls = [await client.pttl(lease.key) for client in masters.clients]
        assert all(0 < pttl <= 1_500 for pttl in pttls), pttls
        assert lease.validity <= 1.5
        assert lease.ttl == 2.0  # later extensions are cut to the bound too
        await lease.release()


async def test_an_extension_at_the_bound_ends_the_lease(masters: Masters) -> None:
    """extend() within the drift allowance of the bound (here by the lease's clock,
    moved on) cannot keep it: the lease ends at its bound, and extend() says so."""
    moved = 0.0

    def clock() -> float:
        return time.monotonic() + moved

    async with AsyncRedlock(masters.urls, clock=clock) as redlock:
        lock = redlock.lock("mh:at", ttl=30.0, max_hold=20.0, auto_extend=False)
        lease = await lock.acquire()
        moved = 20.0 - 0.001  # a millisecond before its bound
        with pytest.raises(LockNotOwnedError, match="reached its max_hold"):
            await lease.extend()
        assert lease.lost
        with anyio.fail_after(GUARD):
            assert await lease.wait_lost() is True
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_releasing_a_lease_ended_at_its_bound_says_so(masters: Masters) -> None:
    """An explicit lease that reached its max_hold, then released: the
    `LostLeaseError` said only "the lease is already lost"; it says why."""
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("mh:released-after", ttl=0.3, max_hold=0.5).acquire()
        with anyio.fail_after(GUARD):
            assert await lease.wait_lost() is True
        with pytest.raises(LostLeaseError) as caught:
            await lease.release()
        assert "the lease is already lost: it reached its max_hold" in str(caught.value)
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_an_extension_released_meanwhile_at_the_bound_says_released(
    masters: Masters,
) -> None:
    """extend() whose lease was released while its round ran, the bound come by then
    (the lease's clock moved on): a plain `LockNotOwnedError` that said "it reached
    its max_hold", though the lease was released (not lost); it says so."""
    moved = 0.0

    def clock() -> float:
        return time.monotonic() + moved

    async with AsyncRedlock(masters.urls, clock=clock) as redlock:
        lock = redlock.lock("mh:released-meanwhile", ttl=30.0, max_hold=20.0, auto_extend=False)
        lease = await lock.acquire()
        extending = asyncio.create_task(lease.extend())
        await asyncio.sleep(0)  # its round goes out
        moved = 20.0  # at its bound
        await lease.release()
        with anyio.fail_after(GUARD), pytest.raises(LockNotOwnedError) as caught:
            await extending
        assert not isinstance(caught.value, LockLostError)  # released, not lost
        assert "no longer held by this lease (already released)" in str(caught.value)
        assert "max_hold" not in str(caught.value)
        assert not lease.lost
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_no_lease_is_passed_on_past_the_waiters_bound(masters: Masters) -> None:
    """A task of the same AsyncRedlock with a shorter max_hold is not handed a lease
    whose key lives longer than its bound: it takes the lock from the masters."""
    async with AsyncRedlock(masters.urls) as redlock:
        first = await redlock.lock("mh:hand", ttl=30.0).acquire()
        with Waits(redlock) as waits:
            waiting = asyncio.create_task(redlock.lock("mh:hand", ttl=5.0, max_hold=2.0).acquire())
            with anyio.fail_after(GUARD):
                await waits.reach(queued=1)
        await first.release()
        with anyio.fail_after(GUARD):
            second = await waiting
        assert second.statistics().source == "attempt"  # not "hand-off"
        assert second.validity <= 2.0
        await redlock.settle()
        pttls = [await client.pttl(second.key) for client in masters.clients]
        assert all(0 < pttl <= 2_000 for pttl in pttls), pttls
        await second.release()


async def test_without_auto_extension_the_bound_still_ends_it(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("mh:manual", auto_extend=False, max_hold=0.4).acquire()
        with anyio.fail_after(GUARD):
            assert await lease.wait_lost() is True
        assert lease.statistics().extensions == 0
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_the_redlock_default_applies_and_a_lock_may_lift_it(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls, max_hold=30.0) as redlock:
        assert redlock.lock("mh:default").max_hold == 30.0
        assert redlock.lock("mh:default", max_hold=math.inf).max_hold == math.inf
        assert redlock.lock("mh:default", max_hold=5).max_hold == 5.0
        rw = redlock.rwlock("mh:rw")
        assert (rw.read().max_hold, rw.write(max_hold=2.0).max_hold) == (30.0, 2.0)
        assert AsyncRedlock(masters.urls).lock("x").max_hold == math.inf


async def test_a_reader_is_bounded_too(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        rw = redlock.rwlock("mh:readers")
        with anyio.fail_after(GUARD), pytest.raises(HoldLimitError):
            async with rw.read(ttl=0.3, max_hold=0.5):
                await anyio.sleep_forever()
        # the writer gets it: the reader's entry is gone
        lease = await rw.write(timeout=0).acquire()
        await lease.release()
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_run_singleton_is_not_bounded_by_the_default(masters: Masters) -> None:
    """The leader's job may run forever: the AsyncRedlock's max_hold does not end it."""

    async def job(lease: Lease) -> int:
        await anyio.sleep(0.9)  # three times the default bound
        assert lease.held
        # held past the bound (not ">= 0.9": uvloop's timers, in whole milliseconds of
        # a loop time read at the iteration's start, may end the sleep a little early)
        assert lease.statistics().held > 0.3
        return lease.statistics().extensions

    async with AsyncRedlock(masters.urls, max_hold=0.3) as redlock:
        with anyio.fail_after(GUARD):
            extensions = await redlock.run_singleton("mh:leader", job, ttl=0.3)
        assert extensions >= 1
        assert redlock.statistics().lost == 0


@pytest.mark.parametrize(
    ("value", "error", "pattern"),
    [
        (0, ValueError, r"^max_hold must be > 0"),
        (-1, ValueError, r"^max_hold must be > 0"),
        (math.nan, ValueError, r"^max_hold must be a finite"),
        (-math.inf, ValueError, r"^max_hold must be a finite"),
        (1e20, ValueError, r"^max_hold must be at most 1e\+09 seconds"),
        ("30", TypeError, r"^max_hold must be a number"),
        (True, TypeError, r"^max_hold must be a number"),
    ],
)
async def test_a_bad_max_hold_is_refused_before_any_io(
    masters: Masters, value: Any, error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        AsyncRedlock(masters.urls, max_hold=value)
    async with AsyncRedlock(masters.urls) as redlock:
        rw = redlock.rwlock("mh:bad")
        for make in (
            lambda: redlock.lock("mh:bad", max_hold=value),
            lambda: redlock.locked("mh:bad", max_hold=value),
            lambda: rw.read(max_hold=value),
            lambda: rw.write(max_hold=value),
        ):
            with pytest.raises(error, match=pattern):
                make()
        assert redlock.statistics().attempts == 0
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_short_leases_all_end_at_their_bound(masters: Masters) -> None:
    """Many leases whose extensions come close to the bound: each ends by its
    bound (HoldLimitError), none lost as if a majority no longer held it. (A TTL
    of 0.5 s: with 0.05 s, then 0.1 s, an extension of one of the first leases, due
    while the 40 acquisitions ran, came after its validity on a busy machine.)"""
    errors: list[BaseException] = []

    async def hold(redlock: AsyncRedlock, i: int) -> None:
        try:
            async with redlock.lock(f"mh:short:{i}", ttl=0.5, max_hold=1.6):
                await anyio.sleep_forever()
        except LockLostError as exc:
            errors.append(exc)

    async with AsyncRedlock(masters.urls) as redlock:
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(hold, redlock, i)
        await redlock.settle()
    assert [type(error).__name__ for error in errors] == ["HoldLimitError"] * 40
    assert await masters.keys() == [[] for _ in masters.urls]
