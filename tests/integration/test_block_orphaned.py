"""An ``async with lock`` block whose entering task ended with the block open.

A block around the ``yield`` of an async generator stays open while the generator
is suspended there, and the task that drove it there may end first: a
StreamingResponse whose client went away behind an HTTP middleware, or, on every step,
``asyncio.wait_for(anext(agen), t)`` (test_block_orphan_review.py). The block can no
longer be cancelled on a lost lease (a WARNING says so), but its lease is kept: the
generator may go on inside the block. It ends when the block exits: the generator
closed (in another task: RuntimeError) or finalised once dropped.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, Lock, LockTimeoutError
from asyncredlock.testing import client_state

from .conftest import Heard, Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome
OBSERVE = 1.0  # seconds of watching a rival fail (2 TTLs); any length gives the same


async def _rows(
    lock: Lock, leases: list[Lease], closed: anyio.Event | None = None
) -> AsyncIterator[int]:
    try:
        async with lock as lease:
            leases.append(lease)
            yield 1
            yield 2
    finally:
        if closed is not None:
            closed.set()


def _orphan_warnings(caplog: pytest.LogCaptureFixture, resource: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and getattr(record, "resource", None) == resource
        and "open (e.g. an async generator suspended inside it)" in record.getMessage()
    ]


async def _kept_from_a_rival(masters: Masters, name: str, lease: Lease) -> None:
    """While the observation lasts, another client never gets the lock."""
    attempts = taken = 0
    async with AsyncRedlock(masters.urls, timeout=0) as rival:
        with anyio.move_on_after(OBSERVE):
            while True:
                try:
                    other = await rival.lock(name).acquire()
                except LockTimeoutError:
                    attempts += 1
                else:
                    taken += 1
                    await other.release()
                await anyio.sleep(OBSERVE / 10)  # (paces the attempts)
    assert taken == 0, "a rival took the lock while the generator was in its block"
    assert attempts > 0
    assert lease.held


async def _taken_by_another(masters: Masters, name: str, first: Lease) -> None:
    """Another client gets the lock (no lease of ``first`` left on any master)."""
    async with AsyncRedlock(masters.urls, timeout=math.inf) as other:
        with anyio.fail_after(HANG_GUARD):
            async with other.lock(name) as second:
                values = [await client.get(first.key) for client in masters.clients]
                assert values == [second.value.encode()] * len(masters)
                assert first.value != second.value


async def test_a_generator_left_open_by_a_task_that_returned_keeps_the_lock(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=0.5) as redlock:
        leases: list[Lease] = []
        agen = _rows(redlock.lock("orphan-returned"), leases)

        async def take_one() -> int:
            return await anext(agen)

        assert await asyncio.get_running_loop().create_task(take_one()) == 1
        (lease,) = leases
        await _kept_from_a_rival(masters, "orphan-returned", lease)
        assert len(_orphan_warnings(caplog, "orphan-returned")) == 1
        closing = asyncio.get_running_loop().create_task(agen.aclose())
        with anyio.fail_after(HANG_GUARD):
            await asyncio.wait([closing])
        error = closing.exception()
        assert isinstance(error, RuntimeError)
        assert "exited from another task" in str(error)
        assert "its lease was released" in str(error)
        assert error.__cause__ is None  # released, not lost
        assert not lease.held
        assert not lease.lost
        await _taken_by_another(masters, "orphan-returned", lease)
        await redlock.settle()
        assert client_state(redlock).held == 0
        assert redlock.statistics().releases == 1
        assert len(_orphan_warnings(caplog, "orphan-returned")) == 1
    assert await masters.keys() == [[]] * len(masters)


async def test_a_generator_left_open_by_a_cancelled_task_keeps_the_lock(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=0.5) as redlock:
        leases: list[Lease] = []
        agen = _rows(redlock.lock("orphan-cancelled"), leases)
        took = anyio.Event()

        async def take_one_then_wait() -> None:
            await anext(agen)
            took.set()
            await anyio.sleep_forever()

        driver = asyncio.get_running_loop().create_task(take_one_then_wait())
        with anyio.fail_after(HANG_GUARD):
            await took.wait()
        (lease,) = leases
        driver.cancel()
        await asyncio.wait([driver])
        await _kept_from_a_rival(masters, "orphan-cancelled", lease)
        assert len(_orphan_warnings(caplog, "orphan-cancelled")) == 1
        assert await anext(agen) == 2  # (the generator goes on inside its block)
        assert lease.held
        with anyio.fail_after(HANG_GUARD), pytest.raises(RuntimeError, match="another task"):
            await agen.aclose()  # (by this task: not the one that entered the block)
        assert not lease.held
        await redlock.settle()
        assert redlock.statistics().releases == 1
    assert await masters.keys() == [[]] * len(masters)


async def test_a_dropped_generator_is_finalised_and_releases_the_lock(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    """Dropped unclosed, the generator is finalised: asyncio's hook closes it in a new
    task, where the block exits. That task's RuntimeError, which nobody awaits, goes
    to the loop's exception handler (caught here). (The ended task is kept by anyio,
    its block's cancel scope never exited: a task whose coroutine is the ``anext()``
    itself keeps the generator: see the test after this one.)"""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with AsyncRedlock(masters.urls, ttl=0.5) as redlock:
            leases: list[Lease] = []
            closed = anyio.Event()
            kept = [_rows(redlock.lock("orphan-dropped"), leases, closed)]

            async def take_one() -> int:
                return await anext(kept[0])

            await loop.create_task(take_one())
            (lease,) = leases
            await _kept_from_a_rival(masters, "orphan-dropped", lease)
            kept.clear()
            gc.collect()
            with anyio.fail_after(HANG_GUARD):
                await closed.wait()  # the finaliser's task ran the block's exit
                await redlock.settle()
            assert not lease.held
            assert not lease.lost
            assert client_state(redlock).held == 0
            assert redlock.statistics().releases == 1
            assert len(_orphan_warnings(caplog, "orphan-dropped")) == 1
        gc.collect()  # the finaliser's task, ended: its exception is reported now
    finally:
        loop.set_exception_handler(previous)
    assert [type(context.get("exception")) for context in reported] == [RuntimeError]
    assert await masters.keys() == [[]] * len(masters)


async def test_a_dropped_generator_stepped_by_wait_for_stays_held_until_the_close(
    masters: Masters,
) -> None:
    """A known limit, documented (usage.md): a generator stepped by ``wait_for`` (each
    step a task of its own) and dropped is not finalised on the asyncio backend of
    anyio, which keeps the state of a task that ended inside a cancel scope (the
    block's) it never exited, and that task's coroutine, the ``anext()``, keeps the
    generator. Safe, not live: the lock stays held (no rival gets it) until the
    ``AsyncRedlock`` closes (or ``max_hold`` ends the lease), and nothing is left."""
    async with AsyncRedlock(masters.urls, ttl=0.5) as redlock:
        leases: list[Lease] = []
        kept = [_rows(redlock.lock("orphan-dropped-wait-for"), leases)]
        assert await asyncio.wait_for(anext(kept[0]), HANG_GUARD) == 1
        dropped = weakref.ref(kept[0])
        kept.clear()
        gc.collect()
        assert dropped() is not None  # kept alive: not finalised
        (lease,) = leases
        await _kept_from_a_rival(masters, "orphan-dropped-wait-for", lease)
    assert not lease.held
    assert await masters.keys() == [[]] * len(masters)


async def test_only_the_ended_tasks_block_of_a_shared_lock_ends(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    """Several blocks of one ``Lock`` (a reader's): the ended task's block, exited
    later by a task with a block of its own, releases its own lease (found by its
    frame), not that task's. The WARNING names the lock as a read lock."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    warned = anyio.Event()
    heard = Heard("keeping 'orphan-shared'", warned)
    logging.getLogger("asyncredlock").addHandler(heard)
    try:
        async with AsyncRedlock(masters.urls, ttl=1.0, timeout=0) as redlock:
            reader = redlock.rwlock("orphan-shared").read()
            leases: list[Lease] = []
            agen = _rows(reader, leases)
            async with reader as kept:
                await asyncio.get_running_loop().create_task(anext(agen))
                (orphaned,) = leases
                assert orphaned.held
                with anyio.fail_after(HANG_GUARD):
                    await warned.wait()  # (logged by the ended task's done callback)
                (warning,) = _orphan_warnings(caplog, "orphan-shared")
                assert "of <Lock 'orphan-shared' shared ttl=1s timeout=0s> open" in warning
                with anyio.fail_after(HANG_GUARD), pytest.raises(RuntimeError, match="released"):
                    await agen.aclose()  # by this task, which has a block of its own
                assert not orphaned.held
                assert kept.held  # the exit ended nothing else
            assert not kept.held
            assert not kept.lost
            await redlock.settle()
            assert redlock.statistics().releases == 2
    finally:
        logging.getLogger("asyncredlock").removeHandler(heard)
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
