"""Review (semaphores): an unfair acquisition of a semaphore whose fair waiters are
queued on the masters. A fair lock's queue is kept by unfair attempts too ("while
anyone is queued, an attempt without a waiter's id is refused", acquire.lua); the
semaphore docs say its fair queue works "as a fair lock's", but ``sem_acquire.lua``
reads the queue only for a fair attempt: an unfair one takes the slot the first
waiter in line was about to get."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import Waits, deafened, whole_retry_delay

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 10.0
PATIENT = 120.0


async def test_an_unfair_acquisition_does_not_overtake_a_queued_fair_waiter(
    masters: Masters,
) -> None:
    name = "sem:review-mixed"
    async with (
        AsyncRedlock(masters.urls) as holder,
        AsyncRedlock(masters.urls, retry_delay=PATIENT) as fair_client,
        AsyncRedlock(masters.urls) as unfair_client,
    ):
        lease = await holder.semaphore(name, 1, fair=True, timeout=0).acquire()
        await holder.settle()
        with whole_retry_delay(fair_client), deafened(fair_client):
            with Waits(fair_client) as waits:
                waiting = asyncio.ensure_future(
                    fair_client.semaphore(name, 1, fair=True, timeout=PATIENT).acquire()
                )
                with anyio.fail_after(GUARD):
                    await waits.reach(waiting=1)  # first in the masters' queue, parked
            await fair_client.settle()
            await lease.release()
            await holder.settle()
            # the fair waiter (deaf) has not tried again yet: it is first in line
            overtaken = None
            with contextlib.suppress(LockTimeoutError):
                overtaken = await unfair_client.semaphore(name, 1, timeout=0).acquire()
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        if overtaken is not None:
            await overtaken.release()
        for client in (holder, fair_client, unfair_client):
            await client.settle()
        assert overtaken is None, "an unfair acquire() took the slot of the first in line"
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_an_unfair_waiter_refused_for_a_queued_fair_one_goes_when_it_leaves(
    masters: Masters,
) -> None:
    """An unfair waiter refused because a fair waiter is due the free slot tries
    again when that fair waiter leaves without it (its leaving is announced), not
    after its retry delay."""
    name = "sem:mixed-leaves"
    async with (
        AsyncRedlock(masters.urls) as holder,
        AsyncRedlock(masters.urls, retry_delay=PATIENT) as fair_client,
        AsyncRedlock(masters.urls, retry_delay=PATIENT) as unfair_client,
    ):
        lease = await holder.semaphore(name, 1, fair=True, timeout=0).acquire()
        await holder.settle()
        with whole_retry_delay(fair_client, unfair_client), deafened(fair_client):
            with Waits(fair_client) as waits:
                fair = asyncio.ensure_future(
                    fair_client.semaphore(name, 1, fair=True, timeout=PATIENT).acquire()
                )
                with anyio.fail_after(GUARD):
                    await waits.reach(waiting=1)  # first in the masters' queue, parked
            await fair_client.settle()
            with Waits(unfair_client) as waits:
                unfair = asyncio.ensure_future(
                    unfair_client.semaphore(name, 1, timeout=PATIENT).acquire()
                )
                with anyio.fail_after(GUARD):
                    await waits.reach(waiting=1)  # refused: the slot is held
                    await lease.release()
                    # woken by the release, refused: the fair waiter is due the slot
                    await waits.reach(waiting=2)
            assert not unfair.done()
            fair.cancel()  # it leaves the queue: the unfair waiter may go
            with pytest.raises(asyncio.CancelledError):
                await fair
            with anyio.fail_after(GUARD):
                got = await unfair
        await got.release()
        for client in (holder, fair_client, unfair_client):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]
