"""The head of a lock's queue cancelled after k event-loop steps of
the release that hands it the key (k = 0..N): the next waiter, in line behind it,
must get the lock although the head's entry and a key handed to it would live a
minute, and nothing is left on the masters."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease

from .conftest import Masters, Waiting, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 10
PATIENT = 60.0
SLOW = 20.0  # entries and handed keys live 3 x (retry_delay + 20) s


@pytest.mark.parametrize("fencing", [False, True])
async def test_the_head_cancelled_at_each_step_of_its_hand_over(
    fencing: bool, servers, masters: Masters
) -> None:
    name = f"rfair:cancel:{int(fencing)}"
    async with (
        AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
        AsyncRedlock(servers.urls, node_timeout=SLOW) as b,
        AsyncRedlock(servers.urls, node_timeout=SLOW) as c,
    ):
        outcomes = []
        for k in range(0, 25):
            held = await holder.lock(name, fencing=fencing).acquire()
            with anyio.fail_after(HANG_GUARD):
                wb, wc = Waiting([b]), Waiting([c])
                head = asyncio.ensure_future(
                    b.lock(name, ttl=PATIENT, timeout=PATIENT, fencing=fencing).acquire()
                )
                await wb.reach(1)
                nxt = asyncio.ensure_future(
                    c.lock(name, ttl=PATIENT, timeout=PATIENT, fencing=fencing).acquire()
                )
                await wc.reach(1)
                assert [len(q) for q in await queues(masters, name)] == [2] * 5
                releasing = asyncio.ensure_future(held.release())
                for _ in range(k):
                    await asyncio.sleep(0)
                head.cancel()
                try:
                    lease_b = await head
                except asyncio.CancelledError:
                    lease_b = None
                await releasing
                if lease_b is not None:
                    await lease_b.release()
            try:
                with anyio.fail_after(HANG_GUARD):
                    lease_c = await nxt
            except TimeoutError:
                nxt.cancel()
                left = f"queues {await queues(masters, name)}, keys {await masters.keys()}"
                pytest.fail(f"step {k}: the next waiter stuck; {left}")
            assert isinstance(lease_c, Lease)
            outcomes.append((k, lease_b is not None, lease_c.statistics().source))
            await lease_c.release()
            await b.settle()
            await c.settle()
            await holder.settle()
            assert await masters.keys() == [[]] * 5, (k, outcomes)


@pytest.mark.parametrize("fair", [True, False])
async def test_a_waiter_cancelled_at_each_step_of_getting_in_line(
    fair: bool, servers, masters: Masters
) -> None:
    """B (entries of a minute) cancelled k/2 ms into its acquire() while the
    lock is held (k = 0..60: its attempts, enrolment, pauses); then C waits and the
    holder releases. No entry of B is left on any master, and C gets the lock."""
    name = f"rfair:inline:{int(fair)}"
    async with (
        AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
        AsyncRedlock(servers.urls, node_timeout=SLOW) as b,
        AsyncRedlock(servers.urls, node_timeout=SLOW) as c,
    ):
        for k in range(0, 50):
            held = await holder.lock(name).acquire()
            task = asyncio.ensure_future(
                b.lock(name, ttl=PATIENT, timeout=PATIENT, fair=fair).acquire()
            )
            # cancellation points spread over its first attempt, enrolment and
            # retry (0 to 25 ms in): not a synchronisation, any point must do
            await asyncio.sleep(0.0005 * k)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await b.settle()
            left = await queues(masters, name)
            assert left == [[]] * 5, (k, left)
            with anyio.fail_after(HANG_GUARD):
                wc = Waiting([c])
                nxt = asyncio.ensure_future(
                    c.lock(name, ttl=PATIENT, timeout=PATIENT, fair=fair).acquire()
                )
                await wc.reach(1)
                await held.release()
                lease = await nxt
            await lease.release()
            await c.settle()
            await holder.settle()
            assert await masters.keys() == [[]] * 5, k
