"""The tasks of one ``AsyncRedlock`` that want the same key, served in arrival order.

Without this, every task of a process that wants a contended key sends its own
attempts to the masters: they split the masters' votes between them, and the task
that just released usually takes the lock again before the woken waiters do. With
it, one task per key and ``AsyncRedlock`` (the one holding the *slot*) talks to the
masters; the others queue here. When the holder releases and the next task in the
queue can take the lease as it is, the lease is passed on with no call to the
masters (see ``Lease._hand_off``); otherwise the lease is released on the masters
and the next task gets the slot and acquires as usual.
"""

from __future__ import annotations

import asyncio
import math
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ._config import LockSpec
from ._line import Line

__all__ = ["Gates", "Held", "LocalTimeoutError", "Waiter"]


class Held(Protocol):
    """What the gates need of a lease (``Lease``, which sits above this module)."""

    @property
    def validity(self) -> float:
        """Seconds of validity left."""

    def _pass_on(self) -> None:
        """Hand the lease to the next waiter, or release it (its task gave up)."""


class LocalTimeoutError(Exception):
    """The slot did not come free within the caller's timeout (internal)."""


@dataclass(eq=False, slots=True)
class Waiter:
    """One queued ``acquire()``: what a lease passed to it must look like, and where
    the lease (or the slot, ``None``) is delivered."""

    # the lock's settings; a writer of a read-write lock (``spec.queued``) takes
    # the slot, never a lease passed on (readers elsewhere would wait behind a run
    # of local writers)
    spec: LockSpec
    # when its acquire() was called (the lease's clock): a lease passed on counts
    # its wait from there
    started: float
    future: asyncio.Future[Held | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(slots=True)
class _Gate:
    # the lease that holds the slot; None while the slot's task is acquiring
    holder: Held | None = None
    waiters: Line[Waiter] = field(default_factory=Line)
    # done when a lease comes to hold the slot (`Gates.hold`): the waiters then
    # wait for its validity; made by the first waiter that sleeps, shared by all
    held: asyncio.Future[None] | None = None


class Gates:
    """Per key: whether a task holds the slot, and the tasks queued behind it.

    A key is in ``_gates`` exactly while some task holds its slot: it is trying
    to acquire, or holds a lease. A lease holds it until it is released or lost,
    or its validity ends (a lease that does not extend itself is not told; the
    next task that wants the key, queued or arriving, takes the slot back).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._gates: dict[str, _Gate] = {}
        self._clock = clock
        self.closed = False

    def slots(self) -> dict[str, int]:
        """The keys whose slot a task holds, each with the tasks queued behind it."""
        return {key: len(gate.waiters) for key, gate in self._gates.items()}

    def busy(self, key: str) -> bool:
        """Whether a task of this ``AsyncRedlock`` holds ``key``'s slot (a lease
        whose validity ran out holds it no more: it gives it up here)."""
        gate = self._gates.get(key)
        if gate is None:
            return False
        self._left(key, gate)
        return key in self._gates

    def claim(self, key: str) -> None:
        """Take the free slot of ``key``."""
        assert key not in self._gates
        self._gates[key] = _Gate()

    def hold(self, key: str, lease: Held) -> None:
        """The slot's task acquired ``lease``: it holds the slot from now on. The
        waiters wake to wait for its validity (a lease that does not extend
        itself is not told that it ran out)."""
        gate = self._gates[key]
        gate.holder = lease
        if (held := gate.held) is not None:
            gate.held = None
            held.set_result(None)

    async def wait(self, key: str, waiter: Waiter, within: float) -> Held | None:
        """Queue behind the holder of ``key``'s slot for at most ``within`` seconds.

        Returns:
            A lease passed on by the previous holder, or ``None``: the slot is
            now the caller's, to acquire on the masters and then `exit`.

        Raises:
            LocalTimeoutError: ``within`` ran out first.
        """
        gate = self._gates[key]
        gate.waiters.join(waiter)
        future = waiter.future
        deadline = self._clock() + within
        try:
            while not future.done() and (remaining := deadline - self._clock()) > 0:
                if (left := self._left(key, gate)) <= 0:
                    continue  # the slot went to the first waiter
                remaining = min(remaining, left)
                if (held := gate.held) is None:
                    held = gate.held = asyncio.get_running_loop().create_future()
                timeout = None if remaining == math.inf else remaining
                await asyncio.wait((future, held), timeout=timeout, return_when=FIRST_COMPLETED)
        except BaseException:
            self._abandon(key, waiter)
            raise
        if not future.done():
            self._abandon(key, waiter)
            raise LocalTimeoutError
        return future.result()

    def successor(self, key: str, holder: Held) -> Waiter | None:
        """The next task waiting for ``key``, if ``holder`` may pass its lease to it."""
        gate = self._gates.get(key)
        if gate is None or gate.holder is not holder or self.closed:
            return None
        while (first := gate.waiters.first()) is not None and first.future.done():
            gate.waiters.serve()
        return first

    def hand(self, key: str, waiter: Waiter, lease: Held) -> None:
        """Deliver ``lease`` to ``waiter`` (the `successor`); the slot goes with it."""
        gate = self._gates[key]
        served = gate.waiters.serve()
        assert served is waiter
        gate.holder = lease
        waiter.future.set_result(lease)

    def exit(self, key: str, holder: Held | None = None) -> None:
        """Give up ``key``'s slot: to the next waiting task, or free it.

        ``holder``: the lease giving it up (``None``: the acquiring task); a lease
        that no longer holds the slot gives up nothing.
        """
        gate = self._gates.get(key)
        if gate is None or gate.holder is not holder:
            return
        gate.holder = None
        while (waiter := gate.waiters.serve()) is not None:
            if not waiter.future.done():
                waiter.future.set_result(None)
                return
        del self._gates[key]

    def close(self) -> None:
        """Pass no more leases on (the ``AsyncRedlock`` is closing)."""
        self.closed = True

    def _left(self, key: str, gate: _Gate) -> float:
        """Seconds of validity left to the lease holding ``key``'s slot (``inf``
        while the slot's task acquires). A lease that does not extend itself is
        not told that it ran out: at 0 it gives the slot up here, to the next
        waiting task or free."""
        holder = gate.holder
        if holder is None:
            return math.inf
        left = holder.validity
        if left <= 0:
            self.exit(key, holder)
        return left

    def _abandon(self, key: str, waiter: Waiter) -> None:
        """A waiter gives up (timeout or cancellation): whatever it was given
        already goes on to the next one."""
        future = waiter.future
        if not future.done():
            future.cancel()
            gate = self._gates.get(key)
            if gate is not None:
                gate.waiters.leave(waiter)
            return
        lease = future.result()
        if lease is None:
            self.exit(key)
        else:
            lease._pass_on()
