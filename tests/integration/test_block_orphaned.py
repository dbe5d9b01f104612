"""An ``async with lock`` block whose entering task ended with the block open.

A block around the ``yield`` of an async generator stays open while the generator
is suspended there. If the task that drove it ends without ``await agen.aclose()``
(a StreamingResponse whose client went away behind an HTTP middleware) and something
keeps the generator (a traceback, a list), nobody ever closes it: the lease extended
itself for as long, and the lock was taken for good. Now the block ends when its
task does: the lease is released in the background, with a WARNING.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, Lock
from asyncredlock.testing import client_state

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome


async def _rows(lock: Lock, leases: list[Lease]) -> AsyncIterator[int]:
    async with lock as lease:
        leases.append(lease)
        yield 1
        yield 2


def _orphan_warnings(caplog: pytest.LogCaptureFixture, resource: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and getattr(record, "resource", None) == resource
        and "ended with the block open" in record.getMessage()
    ]


async def _taken_by_another(masters: Masters, name: str, first: Lease) -> None:
    """Another client gets the lock (no lease of ``first`` left on any master)."""
    async with AsyncRedlock(masters.urls, timeout=math.inf) as other:
        with anyio.fail_after(HANG_GUARD):
            async with other.lock(name) as second:
                values = [await client.get(first.key) for client in masters.clients]
                assert values == [second.value.encode()] * len(masters)
                assert first.value != second.value


async def test_a_generator_left_open_by_a_task_that_returned_frees_the_lock(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=1.0) as redlock:
        leases: list[Lease] = []
        kept = [_rows(redlock.lock("orphan-returned"), leases)]  # never finalised

        async def take_one() -> int:
            return await anext(kept[0])

        assert await asyncio.get_running_loop().create_task(take_one()) == 1
        (lease,) = leases
        await _taken_by_another(masters, "orphan-returned", lease)
        assert not lease.held
        assert len(_orphan_warnings(caplog, "orphan-returned")) == 1
        with pytest.raises(RuntimeError, match="after that task had ended"):
            await kept[0].aclose()
        await redlock.settle()
        assert client_state(redlock).held == 0
        assert redlock.statistics().releases == 1
    assert await masters.keys() == [[]] * len(masters)


async def test_a_generator_left_open_by_a_cancelled_task_frees_the_lock(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=1.0) as redlock:
        leases: list[Lease] = []
        kept = [_rows(redlock.lock("orphan-cancelled"), leases)]
        took = anyio.Event()

        async def take_one_then_wait() -> None:
            await anext(kept[0])
            took.set()
            await anyio.sleep_forever()

        driver = asyncio.get_running_loop().create_task(take_one_then_wait())
        with anyio.fail_after(HANG_GUARD):
            await took.wait()
        (lease,) = leases
        assert lease.held  # the task still lives: its block is open, and held
        driver.cancel()
        await asyncio.wait([driver])
        await _taken_by_another(masters, "orphan-cancelled", lease)
        assert not lease.held
        assert len(_orphan_warnings(caplog, "orphan-cancelled")) == 1
        with pytest.raises(RuntimeError, match="after that task had ended"):
            await kept[0].aclose()
        await redlock.settle()
        assert redlock.statistics().releases == 1
    assert await masters.keys() == [[]] * len(masters)


async def test_the_generator_closed_later_in_another_task_releases_nothing_twice(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        lock = redlock.lock("orphan-closed")
        leases: list[Lease] = []
        agen = _rows(lock, leases)

        async def take_one() -> int:
            return await anext(agen)

        await asyncio.get_running_loop().create_task(take_one())
        (lease,) = leases
        with anyio.fail_after(HANG_GUARD):
            await lease.wait_lost()  # released in the background
            closing = asyncio.get_running_loop().create_task(agen.aclose())
            await asyncio.wait([closing])
            await redlock.settle()
        error = closing.exception()
        assert isinstance(error, RuntimeError)
        assert "exited from another task" in str(error)
        assert "was released when that task ended" in str(error)
        assert error.__cause__ is None  # released, not lost
        assert not lease.held
        assert not lease.lost
        assert redlock.statistics().releases == 1
        assert client_state(redlock).held == 0
        assert await masters.keys() == [[]] * len(masters)
        async with lock as again:  # free, and its blocks work as before
            assert again.held
        assert len(_orphan_warnings(caplog, "orphan-closed")) == 1
    assert await masters.keys() == [[]] * len(masters)


async def test_only_the_ended_tasks_block_of_a_shared_lock_ends(masters: Masters) -> None:
    """Several blocks of one ``Lock`` (a reader's): the block of a task that lives on
    stays held while the ended task's block is released."""
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        reader = redlock.rwlock("orphan-shared").read()
        leases: list[Lease] = []
        agen = _rows(reader, leases)
        async with reader as kept:
            await asyncio.get_running_loop().create_task(anext(agen))
            (orphaned,) = leases
            with anyio.fail_after(HANG_GUARD):
                await orphaned.wait_lost()
            assert kept.held
            # (closed by a task with no block of this Lock: a task's exit is taken to
            # be of its own latest block of the Lock)
            closing = asyncio.get_running_loop().create_task(agen.aclose())
            await asyncio.wait([closing])
            assert isinstance(closing.exception(), RuntimeError)
            assert kept.held  # the later exit ended nothing else
        assert not kept.held
        assert not kept.lost
        await redlock.settle()
        assert redlock.statistics().releases == 2
    assert await masters.keys() == [[]] * len(masters)


async def test_blocks_ended_before_their_task_are_as_before(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    """Nested blocks, one ``Lock`` entered twice, in a task that ends after them: no
    warning, each lease released once, by its block."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
        outer, reader = redlock.lock("normal-outer"), redlock.rwlock("normal-read").read()
        leases: list[Lease] = []

        async def work() -> None:
            async with outer as first, reader as second, reader as third:
                leases.extend((first, second, third))
                async with redlock.lock("normal-inner") as inner:
                    leases.append(inner)
            async with outer as again:  # the same Lock again in the same task
                leases.append(again)

        with anyio.fail_after(HANG_GUARD):
            await asyncio.get_running_loop().create_task(work())
            await redlock.settle()
        assert [lease.held or lease.lost for lease in leases] == [False] * 5
        assert redlock.statistics().releases == 5
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert outer._entered == {}
        assert reader._entered == {}
    assert await masters.keys() == [[]] * len(masters)
