"""What a read-write lock leaves in its queue keys on the masters: nothing of waiters
that are gone, and nothing that hides a waiter that is still there."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_readers_release_drops_the_terms_of_writers_whose_entries_lapsed(
    servers: ServerGroup, masters: Masters, fair: bool
) -> None:
    name, dead = "lapsed-terms", "w:deadclient:0123"
    async with AsyncRedlock(servers.urls) as rl:
        with anyio.fail_after(HANG_GUARD):
            lease = await rl.rwlock(name, fair=fair).read().acquire()
            # A queued writer whose client died without its dequeue: its entry lapsed
            # (an expiry in the past, in the layout acquire_rw.lua writes), its terms
            # and the holder field naming it are left; a live writer's refreshes keep
            # the terms key alive.
            for client in masters.clients:
                await client.zadd(f"{{{name}}}:queue", {dead: 1})
                await client.zadd(f"{{{name}}}:queue:expiry", {dead: 1})
                await client.hset(f"{{{name}}}:queue:terms", dead, "v 1000 0 a")
                await client.hset(f"{{{name}}}:queue:terms", "=holder", dead)
                await client.expire(f"{{{name}}}:queue:terms", HANG_GUARD)
            await lease.release()
            for client in masters.clients:
                assert await client.zrange(f"{{{name}}}:queue", 0, -1) == []
                assert await client.hgetall(f"{{{name}}}:queue:terms") == {}
        await rl.settle()
    assert await masters.keys() == [[]] * len(masters)
