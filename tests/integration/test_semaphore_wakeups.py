"""Semaphores: wake-ups when several slots are given back."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import Waits, hold_calls, whole_retry_delay

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 10.0  # seconds: a hang fails the test instead of blocking CI
PATIENT = 120.0  # a retry delay (and holder ttl) no test waits out


async def _notifications_reach(redlock: AsyncRedlock, count: int) -> None:
    """Bounded wait until ``redlock`` heard ``count`` announcements in all."""
    for _ in range(1000):
        if redlock.statistics().notifications >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"only {redlock.statistics().notifications} notifications heard")


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_two_slots_given_back_wake_two_waiters_of_one_client(
    masters: Masters, fair: bool
) -> None:
    """Limit 2, both slots held by another client; A and B (one client, retry delay of
    two minutes) wait. Slot 0 is released: A is woken and its attempt goes out. While
    it is out, slot 1 is released too. A takes one slot, and one is free: B must be
    woken by the second release (a waiter that waits before one whose attempt is
    out). Before, the second announcement woke A again (the first ticket of the
    channel not already woken, and A cleared its flag when it woke), A acquired and
    left without passing it on, and B slept with a slot free until its retry delay
    (or the holder's TTL).

    One master (quorum 1): with more, the copies of the first release heard from the
    other masters set A's flag again (``Waker._on_release``) if they come after A
    woke, and the second release then wakes B; the bug shows only when they all came
    before (about one run in two with 5 masters). With one master it always showed."""
    name = "sem:two-freed"
    urls = masters.urls[:1]
    async with (
        AsyncRedlock(urls) as holder,
        AsyncRedlock(urls, retry_delay=PATIENT) as waiter,
    ):
        held = [
            await holder.semaphore(name, 2, ttl=PATIENT, fair=fair, timeout=0).acquire()
            for _ in range(2)
        ]
        await holder.settle()
        semaphore = waiter.semaphore(name, 2, fair=fair, timeout=PATIENT)
        got: list[Lease] = []

        async def take() -> None:
            got.append(await semaphore.acquire())

        with whole_retry_delay(waiter), anyio.fail_after(GUARD):
            with Waits(waiter) as waits:
                a = asyncio.ensure_future(take())
                await waits.reach(1)
                b = asyncio.ensure_future(take())
                await waits.reach(2)  # both parked, A enrolled first
            await waiter.settle()
            heard = waiter.statistics().notifications
            with hold_calls(waiter, "sem_acquire") as calls:
                await held[0].release()
                await calls.reached.wait()  # A woke, its attempt is held back
                await held[1].release()
                await _notifications_reach(waiter, heard + 2)
            await a
            await b  # before the fix, nobody woke B, a slot free: fail_after ended it
        assert len(got) == 2
        for lease in got:
            await lease.release()
        for client in (holder, waiter):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]
