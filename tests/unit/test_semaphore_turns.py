"""The turns a semaphore's tasks of one AsyncRedlock take to ask the masters."""

from __future__ import annotations

import asyncio

import pytest

from asyncredlock._turns import Turns

pytestmark = pytest.mark.anyio


async def test_turns_pass_on_in_arrival_order() -> None:
    turns = Turns()
    await turns.take("k", 2)
    await turns.take("k", 2)
    assert turns.busy("k", 2)
    order: list[int] = []

    async def wait(i: int) -> None:
        await turns.take("k", 2)
        order.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)  # each runs until it waits (take has no other await)
    assert len(turns.waiting["k"]) == 3
    for _ in range(2):
        turns.give("k")
    await asyncio.gather(*tasks[:2])
    assert order == [0, 1]
    assert not tasks[2].done()
    turns.give("k")
    await tasks[2]
    for _ in range(2):
        turns.give("k")
    assert (turns.taken, turns.waiting) == ({}, {})


async def test_a_waiter_cancelled_as_its_turn_is_given_raises_cancelled() -> None:
    """Cancelled while waiting, and the turn ends before it resumes: it raises
    CancelledError (not KeyError), and the next waiter gets the turn."""
    turns = Turns()
    await turns.take("k", 1)
    first = asyncio.create_task(turns.take("k", 1))
    second = asyncio.create_task(turns.take("k", 1))
    await asyncio.sleep(0)
    assert len(turns.waiting["k"]) == 2
    first.cancel()
    turns.give("k")  # skips the cancelled one: on to the second
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert turns.taken == {"k": 1}
    turns.give("k")
    assert (turns.taken, turns.waiting) == ({}, {})


async def test_the_only_waiter_cancelled_as_its_turn_ends_leaves_nothing() -> None:
    turns = Turns()
    await turns.take("k", 1)
    waiter = asyncio.create_task(turns.take("k", 1))
    await asyncio.sleep(0)
    assert len(turns.waiting["k"]) == 1
    waiter.cancel()
    turns.give("k")
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (turns.taken, turns.waiting) == ({}, {})
    assert not turns.busy("k", 1)
