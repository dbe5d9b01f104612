"""``aclose()`` leaves no timer of the library armed in the loop, nor does a round
made with a wait of its own once it ended (review: cancellation and shutdown, round
deadlines).

`Waiting` (``_deadline.py``) keeps one deadline timer per ``Timing`` armed for the
oldest round, and a round decided in time only leaves a dict: the timer stays armed
until it fires. After ``aclose()`` it is still there, up to ``max_wait`` later,
keeping the closed client's ``Waiting`` and, through ``_watched``, its nodes.
"""

from __future__ import annotations

import asyncio

import pytest

from asyncredlock import AsyncRedlock
from asyncredlock._deadline import Waiting

from .conftest import Masters

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the loop's scheduled handles are read (``_scheduled``)


def _library_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return [
        handle
        for handle in scheduled
        if not handle.cancelled()
        and isinstance(getattr(handle._callback, "__self__", None), Waiting)  # type: ignore[attr-defined]
    ]


async def test_aclose_leaves_no_round_deadline_timer_armed(masters: Masters) -> None:
    loop = asyncio.get_running_loop()
    before = _library_timers(loop)
    redlock = AsyncRedlock(masters.urls, ttl=5.0)
    async with redlock.lock("review-cancel2-timer") as lease:
        await lease.extend()
    await redlock.aclose()
    left = [handle for handle in _library_timers(loop) if handle not in before]
    assert left == [], f"{len(left)} deadline timers of a closed AsyncRedlock still armed"
    assert await masters.keys() == [[]] * len(masters)


async def test_a_one_round_timings_timer_is_disarmed_when_its_round_ends(
    masters: Masters,
) -> None:
    """An extension waits up to its own bound (a `Timing` made for that round): once
    decided, its timer is not left in the loop (only the shared timings' stay)."""
    loop = asyncio.get_running_loop()
    async with AsyncRedlock(masters.urls, ttl=5.0) as redlock:
        core = redlock._core
        shared = {core.timing.rounds, core.patient.rounds}
        async with redlock.lock("close-timers-one-round") as lease:
            for _ in range(3):
                await lease.extend()
            left = [
                handle
                for handle in _library_timers(loop)
                if handle._callback.__self__ not in shared  # type: ignore[attr-defined]
            ]
            assert left == [], f"{len(left)} timers of ended rounds still armed"
    assert await masters.keys() == [[]] * len(masters)
