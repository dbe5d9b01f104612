"""Review of d3be84f (an unfair semaphore attempt leaves queued fair waiters their
slots): a queue whose every entry lapsed (its waiters gone without leaving: a
SIGKILLed process) must not refuse an unfair attempt. Guards ``sem_acquire.lua``'s
unfair branch purging by the expiries (the same entries unlapsed refuse it: checked
by hand, so the key names here are the script's)."""

from __future__ import annotations

import pytest

from asyncredlock import AsyncRedlock

from .conftest import Masters

pytestmark = pytest.mark.anyio


async def test_an_unfair_attempt_ignores_a_queue_whose_entries_all_lapsed(
    masters: Masters,
) -> None:
    name = "sem:review-lapsed"
    queue, expiries = f"{{{name}}}:sem:queue", f"{{{name}}}:sem:queue:expiry"
    for client in masters.clients:
        now_ms = int((await client.time())[0]) * 1000
        await client.zadd(queue, {"s:gone:1": 1, "s:gone:2": 2})
        await client.zadd(expiries, {"s:gone:1": now_ms - 1000, "s:gone:2": now_ms - 1})
        await client.pexpire(queue, 60_000)
        await client.pexpire(expiries, 60_000)
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        lease = await redlock.semaphore(name, 1, timeout=0).acquire()
        assert lease.held
        await lease.release()
        await redlock.settle()
    for client in masters.clients:
        await client.delete(queue, expiries)
    assert await masters.keys() == [[] for _ in masters.urls]
