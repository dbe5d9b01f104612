"""Review of 8373045 (a task that ended with an ``async with`` block open released
its lease in the background).

The block's task is not always the generator's driver for good: in Python 3.11,
``asyncio.wait_for(anext(agen), t)`` runs each step of the generator in a task of its
own (as do ``asyncio.gather``/``shield``/``create_task`` around ``anext``). The first
step enters the block and yields; its task ends; the lease was released while the
generator was *not* finished: its next step ran inside the ``async with`` block
without the lock (a rival held it). Now the lease is kept until the block exits (its
exit, in another task, raises RuntimeError), and each exit is matched to its block by
the frame of the ``async with``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, Lock, LockTimeoutError

from .conftest import Masters, entered_in_a_task

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome


async def _steps(lock: Lock, leases: list[Lease], inside: list[bool]) -> AsyncIterator[int]:
    async with lock as lease:
        leases.append(lease)
        yield 1
        inside.append(lease.held)  # still within the block: must still hold the lock
        yield 2


async def test_a_generator_stepped_by_wait_for_keeps_its_lock_between_steps(
    masters: Masters,
) -> None:
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        leases: list[Lease] = []
        inside: list[bool] = []
        agen = _steps(redlock.lock("review-wait-for"), leases, inside)
        assert await asyncio.wait_for(anext(agen), HANG_GUARD) == 1
        assert len(leases) == 1
        await redlock.settle()  # whatever ran in the background has run
        async with AsyncRedlock(masters.urls, timeout=0) as rival:
            try:
                rival_lease = await rival.lock("review-wait-for").acquire()
            except LockTimeoutError:
                rival_got = False
            else:
                rival_got = True
                await rival_lease.release()
        assert await asyncio.wait_for(anext(agen), HANG_GUARD) == 2
        held_inside = list(inside)
        # its exit is in another task than the first step's: a RuntimeError, as before
        with anyio.fail_after(HANG_GUARD), pytest.raises(RuntimeError, match="another task"):
            await agen.aclose()
        await redlock.settle()
        assert not rival_got, "a rival took the lock while the generator was in its block"
        assert held_inside == [True]
    assert await masters.keys() == [[]] * len(masters)


async def _rows(lock: Lock, leases: list[Lease]) -> AsyncIterator[int]:
    async with lock as lease:
        leases.append(lease)
        yield 1


async def test_an_earlier_orphan_does_not_keep_the_only_open_block_held(
    masters: Masters,
) -> None:
    """docs/usage.md: a block entered and exited by hand in two tasks raises
    RuntimeError, its lease released if it is the only such block of that Lock
    object. A generator of the same ``Lock`` orphaned earlier (its task ended, the
    generator kept unclosed: its block is exited from its own frame) was taken for
    the block exited: the exit of the one open block (an async fixture's teardown)
    released nothing, said its lease "was released when that task ended" (it was
    not), and the lease stayed held, extending itself until the AsyncRedlock closed."""
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        # (a reader's: the orphan's lease is kept, and both blocks are held at once)
        lock = redlock.rwlock("review-orphan-then-fixture").read()
        orphaned: list[Lease] = []
        kept = [_rows(lock, orphaned)]  # never closed
        await asyncio.get_running_loop().create_task(anext(kept[0]))
        assert orphaned[0].held  # kept while the generator lives
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(lock) as lease:
                with pytest.raises(RuntimeError, match="exited from another task") as refused:
                    await asyncio.create_task(lock.__aexit__(None, None, None))
                still_held = lease.held
                if still_held:
                    await lease.release()  # (clean up for the assertions below)
        assert not still_held, "the only open block's lease was left held"
        assert "after that task had ended" not in str(refused.value)
        assert orphaned[0].held  # (not taken for the block exited)
        with pytest.raises(RuntimeError, match="its lease was released"):
            await kept[0].aclose()
        assert not orphaned[0].held
    assert await masters.keys() == [[]] * len(masters)
