"""Review of 8373045: the ``AsyncRedlock`` closed right after a task ended with a
block open.

The task that drove a generator into a block ends, and the ``AsyncRedlock`` is
closed right away (the awaiting task resumes before the ``Lock``'s done callback
runs, which finds the lease released by the close). Nothing may go to the loop's
exception handler, nothing is logged at ERROR, and no key may stay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from asyncredlock import AsyncRedlock, Lease, Lock

from .conftest import Masters, errors_logged

pytestmark = pytest.mark.anyio


async def _rows(lock: Lock, leases: list[Lease]) -> AsyncIterator[int]:
    async with lock as lease:
        leases.append(lease)
        yield 1


async def test_aclose_right_after_the_task_ended_leaves_no_error_nor_key(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        redlock = AsyncRedlock(masters.urls, ttl=1.0, timeout=0)
        leases: list[Lease] = []
        kept = [_rows(redlock.lock("review-orphan-close"), leases)]
        await loop.create_task(anext(kept[0]))
        await redlock.aclose()  # before the Lock's done callback has run
        await redlock.settle()
    finally:
        loop.set_exception_handler(previous)
    assert errors == []
    assert not leases[0].held
    bad = [r.getMessage() for r in errors_logged(caplog)]
    assert bad == []
    assert await masters.keys() == [[]] * len(masters)
