"""Fair locks: waiters served in arrival order through a queue on the masters."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import ServerGroup

from .conftest import Masters, Waiting

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class TestArrivalOrder:
    """Fair waiters of separate processes take the lock in arrival order."""

    async def test_waiters_of_two_processes_acquire_in_arrival_order(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        order: list[int] = []
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=0.05) as one,
            AsyncRedlock(servers.urls, retry_delay=0.05) as two,
        ):
            held = await holder.lock("fair").acquire()
            waiting = Waiting([one, two])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for i in range(8):

                        async def take(i: int = i) -> None:
                            redlock = (one, two)[i % 2]
                            async with redlock.lock("fair", timeout=HANG_GUARD, fair=True):
                                order.append(i)
                                await anyio.sleep(0.001)

                        tg.start_soon(take)
                        await waiting.reach(waiting.entered + 1)  # queued before the next comes
                    await held.release()
            stats = [redlock.statistics() for redlock in (one, two)]
            await one.settle()
            await two.settle()
        assert order == list(range(8))
        assert sum(s.handoffs for s in stats) == 0  # fair locks are not passed on in-process
        assert await masters.keys() == [[]] * 5  # no queue left


class TestDeadWaiter:
    """A dead fair waiter leaves the queue within its entry's TTL."""

    async def test_a_dead_waiter_leaves_the_queue_within_its_entry_ttl(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A waiter that died first in line (its entry written as acquire_fair.lua
        writes it, lapsing in one second) holds the lock up until its entry lapses."""
        for client in masters.clients:
            seconds, micros = await client.time()
            now_ms = seconds * 1000 + micros // 1000
            await client.zadd("{ghosted}:queue", {"ghost": 0})
            await client.zadd("{ghosted}:queue:expiry", {"ghost": now_ms + 1000})
        async with AsyncRedlock(servers.urls, retry_delay=0.05) as redlock:
            lock = redlock.lock("ghosted", fair=True)
            with pytest.raises(LockTimeoutError) as caught:
                await redlock.lock("ghosted", timeout=0, fair=True).acquire()
            details = [outcome.detail for outcome in caught.value.outcomes]
            assert sum("earlier waiter is first in the queue" in d for d in details) >= 3
            with anyio.fail_after(HANG_GUARD):
                lease = await lock.acquire()
            await lease.release()
            await redlock.settle()
        # The waiter was dequeued everywhere. Where the ghost's entry is still listed
        # (its master ran no fair script after it lapsed), the queue goes by itself.
        queue_keys = [b"{ghosted}:queue", b"{ghosted}:queue:expiry"]
        for client, keys in zip(masters.clients, await masters.keys(), strict=True):
            assert keys in ([], queue_keys)
            assert await client.zrange("{ghosted}:queue", 0, -1) == [b"ghost"][: len(keys)]
            for key in keys:
                assert await client.pttl(key) > 0


class TestValidation:
    """fair takes one resource, and a bool."""

    async def test_fair_is_one_resource_and_a_bool(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(ValueError, match="one resource"):
                redlock.lock(["a", "b"], fair=True)
            with pytest.raises(TypeError, match="fair must be a bool"):
                redlock.lock("a", fair=1)  # type: ignore[arg-type]
            assert redlock.lock("a", fair=True).fair
