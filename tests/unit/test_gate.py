"""`_gate.Gates`: the in-process queue of one client's tasks per key, on its own (no
servers: it never talks to them)."""

from __future__ import annotations

import asyncio
import math

import anyio
import pytest

from asyncredlock._config import LockSpec
from asyncredlock._gate import Gates, LocalTimeoutError, Waiter
from asyncredlock._keys import Resources

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome

SPEC = LockSpec(Resources(("k",), ("k",)), ttl=10.0, timeout=10.0, auto_extend=True, fencing=True)


class FakeLease:
    """What the gates need of a lease: its validity, and `_pass_on` when its task
    gave up after it was handed over."""

    def __init__(self, validity: float = 10.0) -> None:
        self.validity = validity
        self.passed_on = 0

    def _pass_on(self) -> None:
        self.passed_on += 1


def make() -> Gates:
    return Gates(asyncio.get_running_loop().time)


async def test_waiters_get_the_slot_in_arrival_order() -> None:
    gates = make()
    gates.claim("k")
    order: list[int] = []

    async def wait(i: int) -> None:
        got = await gates.wait("k", Waiter(SPEC, 0.0), math.inf)
        assert got is None  # the slot, not a lease
        order.append(i)
        gates.exit("k")

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await anyio.wait_all_tasks_blocked()  # all three queued
    assert gates.slots() == {"k": 3}
    gates.exit("k")
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert gates.slots() == {}  # the last exit freed the key


async def test_a_lease_is_handed_to_the_successor_with_the_slot() -> None:
    gates = make()
    gates.claim("k")
    holder = FakeLease()
    gates.hold("k", holder)
    waiter = Waiter(SPEC, 0.0)
    task = asyncio.create_task(gates.wait("k", waiter, math.inf))
    await anyio.wait_all_tasks_blocked()  # queued
    assert gates.successor("k", holder) is waiter
    assert gates.successor("k", FakeLease()) is None  # only the holder passes it on
    passed = FakeLease()
    gates.hand("k", waiter, passed)
    assert await task is passed
    gates.exit("k", holder)  # the old holder holds nothing any more: no effect
    assert gates.slots() == {"k": 0}
    gates.exit("k", passed)
    assert gates.slots() == {}


async def test_a_holder_whose_validity_ran_out_frees_the_slot() -> None:
    gates = make()
    gates.claim("k")
    gates.hold("k", FakeLease(validity=0.0))  # never told it ended
    assert await gates.wait("k", Waiter(SPEC, 0.0), math.inf) is None


async def test_a_holder_whose_validity_ran_out_leaves_the_slot_free_to_claim() -> None:
    """Nobody queued behind it: the next task asking finds the slot free (one
    attempt with timeout=0 is not refused)."""
    gates = make()
    gates.claim("k")
    holder = FakeLease()
    gates.hold("k", holder)
    assert gates.busy("k")
    holder.validity = 0.0  # never told it ended
    assert not gates.busy("k")
    assert gates.slots() == {}
    gates.claim("k")  # the slot is the caller's
    gates.exit("k", holder)  # the old holder holds nothing any more: no effect
    assert gates.slots() == {"k": 0}


async def test_a_waiter_queued_while_the_slot_was_acquiring_waits_for_the_holder() -> None:
    """The waiter slept with no limit (no holder yet); the lease the slot's task
    then holds wakes it, to wait for that lease's validity."""
    gates = make()
    gates.claim("k")
    with anyio.fail_after(HANG_GUARD):
        task = asyncio.create_task(gates.wait("k", Waiter(SPEC, 0.0), math.inf))
        await anyio.wait_all_tasks_blocked()  # queued, holder None
        gates.hold("k", FakeLease(validity=0.0))  # ran out at once, never told
        assert await task is None  # the slot


async def test_the_waiters_behind_the_next_slot_holder_wait_for_its_lease() -> None:
    """The slot passed to the first waiter; the second, asleep until the old
    holder's validity would end, waits for the new holder's lease instead."""
    gates = make()
    gates.claim("k")
    holder = FakeLease(validity=HANG_GUARD * 10)
    gates.hold("k", holder)
    with anyio.fail_after(HANG_GUARD):
        first = asyncio.create_task(gates.wait("k", Waiter(SPEC, 0.0), math.inf))
        second = asyncio.create_task(gates.wait("k", Waiter(SPEC, 0.0), math.inf))
        await anyio.wait_all_tasks_blocked()  # both queued
        gates.exit("k", holder)
        assert await first is None  # the slot: its task acquires ...
        gates.hold("k", FakeLease(validity=0.0))  # ... a lease that ran out at once
        assert await second is None


async def test_a_waiter_that_times_out_leaves_the_queue() -> None:
    gates = make()
    gates.claim("k")
    with pytest.raises(LocalTimeoutError):
        await gates.wait("k", Waiter(SPEC, 0.0), 0.0)
    assert gates.slots() == {"k": 0}


async def test_a_cancelled_waiter_passes_on_what_it_was_given() -> None:
    gates = make()
    gates.claim("k")
    holder = FakeLease()
    gates.hold("k", holder)
    doomed, nxt = Waiter(SPEC, 0.0), Waiter(SPEC, 0.0)
    cancelled = asyncio.create_task(gates.wait("k", doomed, math.inf))
    waiting = asyncio.create_task(gates.wait("k", nxt, math.inf))
    await anyio.wait_all_tasks_blocked()  # queued
    passed = FakeLease()
    gates.hand("k", doomed, passed)  # handed over ...
    cancelled.cancel()  # ... as its task is cancelled, before it ran again
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert passed.passed_on == 1  # the lease goes on to the next task (or is released)
    assert not waiting.done()
    gates.exit("k", passed)  # the lease gives the slot up: the next one gets it
    assert await waiting is None


async def test_closed_gates_pass_no_lease_on() -> None:
    gates = make()
    gates.claim("k")
    holder = FakeLease()
    gates.hold("k", holder)
    task = asyncio.create_task(gates.wait("k", Waiter(SPEC, 0.0), math.inf))
    await anyio.wait_all_tasks_blocked()  # queued
    gates.close()
    assert gates.successor("k", holder) is None
    gates.exit("k", holder)
    assert await task is None
