"""Review (semaphores): the largest limit, 1024, end to end (guard: the existing tests
use limits up to 50). Every slot is taken by another holder on every master; a
waiter enrolls on the 1024 slot channels; one slot is freed and its release
announced (as release.lua does: the holder's value on the slot's channel): the
waiter takes that slot, woken, not after its (two minute) retry delay."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock.testing import Waits, whole_retry_delay

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 20.0
PATIENT = 120.0


async def test_a_waiter_of_a_1024_slot_semaphore_is_woken(masters: Masters) -> None:
    name, limit = "sem:review-1024", 1024
    keys = [f"{{{name}}}:sem:{i}" for i in range(limit)]
    for client in masters.clients:
        async with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, "someone-else", px=int(PATIENT * 1000))
            await pipe.execute()
    try:
        async with AsyncRedlock(masters.urls, retry_delay=PATIENT) as redlock:
            semaphore = redlock.semaphore(name, limit, timeout=PATIENT)
            assert semaphore.slot_keys == tuple(keys)
            with whole_retry_delay(redlock), Waits(redlock) as waits:
                waiting = asyncio.ensure_future(semaphore.acquire())
                with anyio.fail_after(GUARD):
                    await waits.reach(waiting=1)  # enrolled on every slot's channel
                for client in masters.clients:
                    await client.delete(keys[777])
                    await client.publish(f"{keys[777]}:released", "someone-else")
                with anyio.fail_after(GUARD):
                    lease = await waiting
            assert lease.key == keys[777]
            await lease.release()
            await redlock.settle()
    finally:
        for client in masters.clients:
            await client.delete(*keys)
    assert await masters.keys() == [[] for _ in masters.urls]
