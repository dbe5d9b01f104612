"""What a read-write lock leaves in its queue keys on the masters: nothing of waiters
that are gone, and nothing that hides a waiter that is still there."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock._keys import channel, queue_keys, terms_key
from asyncredlock._scripts import DEQUEUE, evalsha
from asyncredlock.testing import ServerGroup

from .conftest import Masters, Waiting, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
# A waiter that must not try again on its own within a test: only a wake-up moves it.
PATIENT = 60.0
PATIENT_MS = int(PATIENT * 1000)
#: node_timeout of a client that must be handed the key (it sends hand-over terms once
#: its inbox subscription is confirmed, waited for up to node_timeout)
CONFIRM = 5.0


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


async def test_a_waiter_that_gave_a_handed_key_back_is_shown_waiting(
    servers: ServerGroup, masters: Masters
) -> None:
    """A writer's release hands the key to the next writer on masters 3 and 4 only: on
    0, 1 and 2 an earlier waiter (an entry of a client that never attempts again) is
    first. The handed writer, seeing it ahead, gives its two keys back and goes on
    waiting, first in line on 3 and 4: there it is a waiter, no longer the holder, and
    inspect() lists it (the masters noted it as the holder, and so hid it, until the
    next grant there)."""
    name, ghost = "gave-back", "w:0badc0ffee00:0"
    async with (
        AsyncRedlock(servers.urls) as holder,
        AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
    ):
        held = await holder.rwlock(name, patience=0).write(ttl=HANG_GUARD).acquire()
        waiting = Waiting([waiter])
        got: list[Lease] = []
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def write() -> None:
                    lock = waiter.rwlock(name, patience=0).write(timeout=HANG_GUARD)
                    got.append(await lock.acquire())

                tg.start_soon(write)
                await waiting.reach(1)
                queued = (await queues(masters, name))[3][-1]  # the holder is listed first
                for client in masters.clients[:3]:
                    seconds, micros = await client.time()
                    now_ms = seconds * 1000 + micros // 1000
                    await client.zadd(f"{{{name}}}:queue", {ghost: 0})
                    await client.zadd(f"{{{name}}}:queue:expiry", {ghost: now_ms + PATIENT_MS})
                await held.release()
                # handed the key on 3 and 4, it gives both back
                assert await polled_async(lambda: given_back(masters, name))
                state = await holder.inspect(name)
                assert [node.queue for node in state.nodes[3:]] == [(queued.decode(),)] * 2
                assert [node.holder for node in state.nodes] == [None] * 5
                # the earlier waiter leaves: the writer goes
                keys = (*queue_keys(name), name, terms_key(name))
                for client in masters.clients[:3]:
                    await evalsha(client, DEQUEUE, keys, (ghost, channel(name), "", "0"))
        await got[0].release()
        await waiter.settle()
    assert await masters.keys() == [[]] * len(masters)


async def given_back(masters: Masters, name: str) -> bool:
    """Whether the lock key is gone from masters 3 and 4."""
    return not any([await client.exists(name) for client in masters.clients[3:]])


async def polled_async(condition: Callable[[], Awaitable[bool]], polls: int = 400) -> bool:
    """`polled`, for a condition that must be awaited."""
    for _ in range(polls):
        if await condition():
            return True
        await anyio.sleep(0.025)
    return await condition()
