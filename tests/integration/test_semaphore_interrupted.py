"""A semaphore attempt interrupted (cancelled, or its client closing) after a master
granted it a slot gives that slot back announced, as a release: a waiter of another
client refused for that slot meanwhile is woken and takes it at once, instead of
sleeping its retry delay (bounded only by the interrupted attempt's slot TTL) with
the slot free (docs/algorithm.md, "Failure cleanup", "Counting semaphores")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock._node import Node
from asyncredlock._scripts import SEM_ACQUIRE, SEM_DEQUEUE, SEM_UNDO
from asyncredlock.testing import Waits, hold_calls, whole_retry_delay

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 10.0  # seconds: far below PATIENT; a waiter not woken fails the test here
PATIENT = 120.0  # a retry delay, and a holder's TTL, that no test waits out
CONFIRM = 2.0  # node_timeout: only bounds the wait for subscriptions to confirm


@contextlib.contextmanager
def _wrap(redlock: AsyncRedlock, wrapper: Callable[[Node, Any], Any]) -> Iterator[None]:
    """Shadow each node's ``call`` with ``wrapper(node, send)`` (``send``: the call
    in place before, another wrapper or the method) for the block."""
    nodes = redlock._core.nodes
    before = [vars(node).get("call") for node in nodes]
    for node, inner in zip(nodes, before, strict=True):
        send = inner if inner is not None else (lambda *a, n=node: Node.call(n, *a))
        vars(node)["call"] = wrapper(node, send)
    try:
        yield
    finally:
        for node, inner in zip(nodes, before, strict=True):
            if inner is None:
                del vars(node)["call"]
            else:
                vars(node)["call"] = inner


@contextlib.contextmanager
def on_attempt(
    redlock: AsyncRedlock, act: Callable[[], object], *, granted: bool
) -> Iterator[None]:
    """Run ``act()`` once: as soon as a ``sem_acquire.lua`` reply of ``redlock``
    comes back granted (before the acquisition's task runs again), or, not
    ``granted``, once such an attempt is sent."""
    done: list[None] = []

    def wrapper(node: Node, send: Any) -> Any:
        def call(script: Any, keys: Any, args: Any) -> Any:
            future = send(script, keys, args)
            if script is SEM_ACQUIRE and not granted and not done:
                done.append(None)
                act()
            elif script is SEM_ACQUIRE:

                def check(reply_of: asyncio.Future[Any]) -> None:
                    reply = reply_of.result()
                    if reply.error is None and int(reply.value[0]) == 1 and not done:
                        done.append(None)
                        act()

                future.add_done_callback(check)
            return future

        return call

    with _wrap(redlock, wrapper):
        yield


@contextlib.contextmanager
def hold_scripts(redlock: AsyncRedlock, *scripts: Any) -> Iterator[asyncio.Event]:
    """Hold back the calls of ``scripts``, in order, until the event yielded is set
    (at the latest when the block ends). They count as the client's background
    work meanwhile: ``settle()``, and ``aclose()`` up to ``node_timeout``, wait."""
    gate = asyncio.Event()
    tracker = redlock._core.tracker

    def wrapper(node: Node, send: Any) -> Any:
        async def later(script: Any, keys: Any, args: Any) -> Any:
            await gate.wait()
            return await send(script, keys, args)

        def call(script: Any, keys: Any, args: Any) -> Any:
            if script in scripts and not gate.is_set():
                return tracker.follow(asyncio.ensure_future(later(script, keys, args)))
            return send(script, keys, args)

        return call

    try:
        with _wrap(redlock, wrapper):
            yield gate
    finally:
        gate.set()


class TestAttemptInterruptedAfterTheGrant:
    """Limit 1, held by H; one master (the order of the calls is the test's). A
    (client X) and B (client Y, patient) wait. H gives the slot back: A's attempt is
    granted the slot and A is then cancelled, or its client starts closing; B's
    attempt, held back until then, is refused for A's slot (the client's closing
    begins once A's attempt is sent: the attempt goes on, and is refused its lease).
    A's give-back frees it: B must be woken and take it at once. Before the fix an
    unfair semaphore gave the slot back silently, and B slept (TimeoutError); a fair
    one's leaving is announced (``sem_dequeue.lua``) and passed before too."""

    @pytest.mark.parametrize("how", ["cancelled", "closed"])
    @pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
    async def test_a_waiter_refused_for_its_slot_is_woken(
        self, masters: Masters, fair: bool, how: str
    ) -> None:
        name = "sem:interrupted"
        urls = masters.urls[:1]
        first = AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=GUARD)
        closing: list[asyncio.Future[None]] = []
        try:
            async with (
                AsyncRedlock(urls) as holder,
                AsyncRedlock(urls, retry_delay=PATIENT) as second,
            ):
                held = await holder.semaphore(name, 1, ttl=PATIENT, fair=fair).acquire()
                await holder.settle()
                with (
                    whole_retry_delay(first, second),
                    anyio.fail_after(GUARD),
                    Waits(first, second) as waits,
                ):
                    a = asyncio.ensure_future(
                        first.semaphore(name, 1, ttl=PATIENT, fair=fair, timeout=PATIENT).acquire()
                    )
                    await waits.reach(1)
                    b = asyncio.ensure_future(
                        second.semaphore(name, 1, fair=fair, timeout=PATIENT).acquire()
                    )
                    await waits.reach(2)  # both parked, A first
                    for client in (first, second):
                        await client.settle()

                    def interrupt() -> None:
                        if how == "cancelled":
                            a.cancel()
                        else:
                            closing.append(asyncio.ensure_future(first.aclose()))

                    with (
                        hold_calls(second, "sem_acquire") as b_calls,
                        hold_scripts(first, SEM_UNDO, SEM_DEQUEUE) as a_undo,
                        on_attempt(first, interrupt, granted=how == "cancelled"),
                    ):
                        await held.release()
                        await b_calls.reached.wait()  # B woken, its attempt held back
                        with pytest.raises(
                            asyncio.CancelledError if how == "cancelled" else RuntimeError
                        ):
                            await a  # interrupted once the master granted it the slot
                        # A's attempt holds the slot; its give-back is held back
                        assert await masters.clients[0].exists(f"{{{name}}}:sem:0") == 1
                        b_calls.let_go()  # B's attempt: refused, A's attempt holds the slot
                        await second.settle()
                        assert not b.done()
                        a_undo.set()  # A's give-back (then, fair, its dequeue), in order
                        await first.settle()
                        if closing:
                            await closing[0]
                    async with asyncio.timeout(3.0):  # << PATIENT (and A's slot TTL)
                        lease: Lease = await b  # not woken, B sleeps: TimeoutError
                await lease.release()
                for client in (holder, second):
                    await client.settle()
        finally:
            await first.aclose()
        assert await masters.keys() == [[] for _ in masters.clients]


class TestWaiterCancelledAtEachStep:
    """The natural form of the above, nothing held back: limit 1, held by H on one
    master; W (client X) and N (client Y), both patient, wait; H gives the slot back
    (one waiter of each client is woken) and W is cancelled after k loop steps. N
    must get the slot at once, never sleep its retry delay because W's interrupted
    attempt held the slot for a moment. Before the fix, unfair: N stranded at some
    k (4 or 5, once 11, in each of 6 runs)."""

    STEPS = range(0, 20)

    async def test_the_other_waiter_gets_the_slot_at_once(self, masters: Masters) -> None:
        name = "sem:steps"
        stranded: list[int] = []
        urls = masters.urls[:1]
        async with (
            AsyncRedlock(urls) as holder,
            AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=CONFIRM) as first,
            AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=CONFIRM) as second,
        ):
            for steps in self.STEPS:
                held = await holder.semaphore(name, 1, ttl=PATIENT).acquire()
                await holder.settle()
                with whole_retry_delay(first, second), Waits(first, second) as waits:
                    async with asyncio.timeout(GUARD):
                        w = asyncio.ensure_future(
                            first.semaphore(name, 1, ttl=PATIENT, timeout=PATIENT).acquire()
                        )
                        await waits.reach(1)
                        n = asyncio.ensure_future(
                            second.semaphore(name, 1, timeout=PATIENT).acquire()
                        )
                        await waits.reach(2)
                        await first.settle()
                        await second.settle()
                    release = asyncio.ensure_future(held.release())
                    for _ in range(steps):
                        await asyncio.sleep(0)
                    w.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await (await w).release()  # W took the lease first: given back
                    await release
                    try:
                        async with asyncio.timeout(3.0):  # << PATIENT, >> a hand-over
                            lease = await n
                    except TimeoutError:
                        stranded.append(steps)
                        n.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await n
                    else:
                        await lease.release()
                for client in (holder, first, second):
                    await client.settle()
                assert await masters.keys() == [[] for _ in masters.clients], steps
        assert stranded == []
