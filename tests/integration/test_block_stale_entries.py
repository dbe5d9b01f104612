"""A ``Lock`` object reused after one of its blocks was kept for a task that ended
(review: cancellation and shutdown, blocks kept under ``ENDED``).

docs/usage.md: a block entered and exited by hand, exited by another task, raises
RuntimeError, "the lease released first if it is the only such block of that Lock
object, and else left held (which is the one cannot be told)". A block kept under
``ENDED`` (_blocks.py) whose lease has ended since (released by hand, lost, closed by max_hold)
stays in ``Lock._entered`` for good and is still counted as a candidate
(``_exit_elsewhere``, _lock.py), though no lease of it can be left held: the one
open block's exit then releases nothing and its lease stays held, extending itself,
until the ``AsyncRedlock`` closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from asyncredlock import AsyncRedlock

from .conftest import Masters, entered_in_a_task

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome


async def test_an_ended_blocks_released_lease_does_not_keep_the_open_block_held(
    masters: Masters,
) -> None:
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        lock = redlock.lock("review-cancel2-ended")
        # a task enters a block by hand and ends with it open: kept under _ENDED
        earlier = await asyncio.get_running_loop().create_task(lock.__aenter__())
        assert earlier.held
        await earlier.release()  # held across tasks, released by hand (usage.md)
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(lock) as lease:
                with pytest.raises(RuntimeError, match="exited from another task"):
                    await asyncio.create_task(lock.__aexit__(None, None, None))
                still_held = lease.held
                if still_held:
                    await lease.release()  # (clean up for the assertion below)
        assert not still_held, "the only block with a lease held was left held"
    assert await masters.keys() == [[]] * len(masters)


async def test_blocks_of_ended_tasks_whose_lease_ended_are_forgotten(masters: Masters) -> None:
    """Neither a block whose lease ended before its task (moved at the task's end) nor
    one whose lease ended after it (dropped when another task's exit looks) keeps its
    frame and lease in the ``Lock``."""
    loop = asyncio.get_running_loop()
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        lock = redlock.lock("stale-entries-forgotten")

        async def enter_and_release() -> None:
            await (await lock.__aenter__()).release()

        await loop.create_task(enter_and_release())
        await asyncio.sleep(0)
        assert lock._entered == {}, "a block whose lease ended was kept after its task"
        earlier = await loop.create_task(lock.__aenter__())
        assert lock._entered is not None
        assert len(lock._entered) == 1  # kept: its lease held
        await earlier.release()
        with pytest.raises(RuntimeError, match="never entered"):
            await loop.create_task(lock.__aexit__(None, None, None))
        assert lock._entered == {}, "a block whose lease ended is still kept"
    assert await masters.keys() == [[]] * len(masters)


async def test_a_forgotten_generator_blocks_exit_releases_no_other_block(
    masters: Masters,
) -> None:
    """A generator's block kept for its ended task, whose lease ended and which was
    then forgotten, is exited by the generator's close in another task: not found by
    frame, it is not taken for the one other open block (whose lease stays held)."""
    loop = asyncio.get_running_loop()
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        lock = redlock.lock("stale-entries-generator")

        async def rows() -> AsyncIterator[int]:
            async with lock:
                yield 1

        agen = rows()
        await loop.create_task(anext(agen))  # its task ends with the block open
        await asyncio.sleep(0)
        (kept,) = [lease for stack in (lock._entered or {}).values() for _, lease in stack]
        await kept.release()
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(lock) as lease:
                with pytest.raises(RuntimeError, match="exited from another task"):
                    await loop.create_task(lock.__aexit__(None, None, None))  # forgets it
                assert not lease.held  # (the only held block: released, the test above)
            async with entered_in_a_task(lock) as lease:
                with pytest.raises(RuntimeError, match="async generator"):
                    await loop.create_task(agen.aclose())
                still_held = lease.held
                await lease.release()
                with pytest.raises(RuntimeError, match="exited from another task"):
                    await loop.create_task(lock.__aexit__(None, None, None))
        assert still_held, "a generator's exit released another block's lease"
    assert await masters.keys() == [[]] * len(masters)
