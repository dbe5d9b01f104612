"""Review (semaphores): a fair semaphore's release must reach the waiter first in the
masters' queue, also in a process where another waiter of the same semaphore waits.

Fair, limit 2, both slots held by H. U1 (client Y) waits first, then T1 and T2 (both
client X), in that order. H gives back slot 0, then at once slot 1. U1 takes slot 0;
T1, woken in X, is refused (U1 is ahead); when the release of slot 1 is heard while
T1's next attempt is out (it reached the masters before that release), X wakes T2,
which is waiting: T2 is refused (T1 is ahead) and T1, refused too, sleeps until the
soonest slot TTL (``free_in``) with slot 1 free. Every TTL here is two minutes, so
that sleep is past the guard; the race is won about one round in three, so the test
runs several rounds (each with its own name)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import Waits, whole_retry_delay

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 10.0
PATIENT = 120.0  # retry delay and TTL of every client: no round waits them out
ROUNDS = 20


async def test_the_first_in_line_gets_the_second_slot_given_back(masters: Masters) -> None:
    async with (
        AsyncRedlock(masters.urls, ttl=PATIENT) as holder,
        AsyncRedlock(masters.urls, ttl=PATIENT, retry_delay=PATIENT) as y,
        AsyncRedlock(masters.urls, ttl=PATIENT, retry_delay=PATIENT) as x,
    ):
        for round_ in range(ROUNDS):
            name = f"sem:review-fair-wake:{round_}"
            held = [
                await holder.semaphore(name, 2, fair=True, timeout=0).acquire() for _ in range(2)
            ]
            await holder.settle()
            took: asyncio.Queue[tuple[str, Lease]] = asyncio.Queue()

            async def wait(
                label: str,
                client: AsyncRedlock,
                name: str = name,
                took: asyncio.Queue[tuple[str, Lease]] = took,
            ) -> None:
                semaphore = client.semaphore(name, 2, fair=True, timeout=PATIENT)
                await took.put((label, await semaphore.acquire()))

            tasks = []
            got: dict[str, Lease] = {}
            with whole_retry_delay(x, y):
                for label, client in (("U1", y), ("T1", x), ("T2", x)):
                    with Waits(client) as waits:
                        tasks.append(asyncio.create_task(wait(label, client)))
                        with anyio.fail_after(GUARD):
                            await waits.reach(waiting=1)  # queued on the masters, parked
                    await client.settle()
                with anyio.fail_after(GUARD):
                    await held[0].release()
                    label, lease = await took.get()
                    got[label] = lease
                    assert label == "U1"
                    await held[1].release()
                    label, lease = await took.get()  # T1, first in line
                    got[label] = lease
                assert label == "T1", f"round {round_}"
                await got.pop("U1").release()
                with anyio.fail_after(GUARD):
                    label, lease = await took.get()
                    got[label] = lease
                assert label == "T2"
            await asyncio.gather(*tasks)
            for lease in got.values():
                await lease.release()
            for client in (holder, x, y):
                await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]
