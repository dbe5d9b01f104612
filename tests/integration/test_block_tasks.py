"""A lock's ``async with`` block exited by another task than the one that entered it.

pytest-asyncio runs an async fixture's setup and teardown in two tasks, and an
``AsyncExitStack`` may be closed by a shutdown task. ``Lock.__aexit__`` found no
block of the exiting task: a bare ``KeyError`` of a Task, and the lease stayed held,
extending itself, until the ``AsyncRedlock`` closed. (Here the block is entered and
exited by hand from two frames, the entering task living on: an ``async with`` exit is
matched to its block by frame, see test_block_orphaned.py.)
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from asyncredlock import AsyncRedlock

from .conftest import Masters, entered_in_a_task

pytestmark = pytest.mark.anyio

HANG_GUARD = 10


async def test_the_one_block_exited_by_another_task_is_released_with_a_runtime_error(
    masters: Masters,
) -> None:
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        lock = redlock.lock("exit-elsewhere")
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(lock) as lease:
                with pytest.raises(RuntimeError, match="exited from another task") as refused:
                    await asyncio.create_task(lock.__aexit__(None, None, None))
            assert "lease was released" in str(refused.value)
            assert "acquire() and lease.release()" in str(refused.value)
            assert not lease.held
            assert not lease.lost
            assert await masters.keys() == [[]] * len(masters)
            async with lock as again:  # free, and its blocks work as before
                assert again.held
            assert not again.held


async def test_one_of_several_blocks_exited_by_another_task_is_left_held(
    masters: Masters,
) -> None:
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        reader = redlock.rwlock("shared").read()
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(reader) as one, entered_in_a_task(reader) as two:
                with pytest.raises(RuntimeError, match="exited from another task") as refused:
                    await asyncio.create_task(reader.__aexit__(None, None, None))
                assert "one of 2" in str(refused.value)
                assert [one.held, two.held] == [True, True]
                for lease in (one, two):
                    await lease.release()
            await redlock.settle()
    assert await masters.keys() == [[]] * len(masters)


async def test_a_block_never_entered_is_a_runtime_error(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        with pytest.raises(RuntimeError, match="never entered"):
            await redlock.lock("never").__aexit__(None, None, None)
