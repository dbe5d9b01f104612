"""Review (semaphores): what a refused attempt on a full semaphore says.

``sem_acquire.lua``'s fair branch answers ``{0, soonest, 1, 3}`` (code 3: "free, but
an earlier waiter is queued") whenever the waiter's rank is >= the free slots, and
with no slot free that is every waiter, the first in line included. So a fair
semaphore whose slots are all held reports, on every master, "free, but an earlier
waiter is first in the queue" where an unfair one says "held by another holder"."""

from __future__ import annotations

import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError

from .conftest import Masters

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_full_semaphore_is_refused_as_held_not_as_queued(
    masters: Masters, fair: bool
) -> None:
    name = f"sem:review-full-{fair}"
    async with AsyncRedlock(masters.urls) as holder, AsyncRedlock(masters.urls) as other:
        lease = await holder.semaphore(name, 1, fair=fair, timeout=0).acquire()
        await holder.settle()
        with pytest.raises(LockTimeoutError) as caught:
            await other.semaphore(name, 1, fair=fair, timeout=0).acquire()
        details = [
            outcome.detail
            for outcome in caught.value.outcomes
            if not outcome.ok and not outcome.detail.startswith("not answered")
        ]
        assert details  # the masters that answered refused it
        # nobody is queued ahead of it and no slot is free: the slot is held
        assert all(detail.startswith("held by another holder") for detail in details), details
        await lease.release()
        for client in (holder, other):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]
