"""A waiter's pauses between attempts, and the backoff of waiters whose attempts
split the masters' grants: one rule for a semaphore's waiters and a lock's (see
``docs/algorithm.md``, "Undos").

A waiter that no queue on the masters serves (a semaphore's; a lock's on several
resources, or a read-write lock's unfair writer) counts the masters that have what it
needs free (`Ticket.freed`): those that granted its failed attempt (it gave the keys
back) and those that announced another attempt's undo since. Once a quorum has, its
attempt failed only because attempts of other clients split the grants; they were
woken by the same undos, and would split them again if all went at once. So it first
waits a random backoff, in a window of its last failed attempt's duration doubled at
each such wake-up (up to the retry delay); a release still wakes it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

from ._core import Core
from ._node import Reply
from ._protocol import granted
from ._ticket import Ticket

__all__ = ["Pauses"]

#: The backoff's window stops doubling after this many wake-ups by undos.
_MAX_DOUBLINGS = 16


class Pauses:
    """The pauses of one ``acquire()`` until ``deadline`` (this client's clock)."""

    __slots__ = ("core", "deadline", "round", "splits")

    def __init__(self, core: Core, deadline: float) -> None:
        self.core = core
        self.deadline = deadline
        self.round = 0.0  # how long its latest failed attempt took
        self.splits = 0  # wake-ups by undos so far: each doubles the backoff's window

    def failed(
        self,
        started: float,
        ticket: Ticket | None,
        replies: Sequence[asyncio.Future[Reply]],
        slot_of: Callable[[Reply], int | None] | None = None,
    ) -> None:
        """Its attempt begun at ``started`` failed: each master that granted it
        (``replies``) has the keys it granted free for ``ticket``, which gives them
        back: every key of a lock; for a semaphore, the slot ``slot_of`` a reply
        reads (its index in the ticket's channels), if any."""
        self.round = self.core.clock() - started
        if ticket is None or ticket.freed is None:  # it counts no keys free
            return
        for index, reply in enumerate(replies):
            if not reply.done():
                continue
            if slot_of is not None:
                slot = slot_of(reply.result())
                channels = ticket.channels[slot : slot + 1] if slot is not None else ()
            else:
                channels = ticket.channels if granted(reply.result()) else ()
            for channel in channels:
                ticket.free(channel, index)

    async def wait(self, ticket: Ticket | None, pause: float) -> None:
        """Wait ``pause`` seconds, or until ``ticket`` is woken. A waiter that found
        what it needs free on a quorum (`Ticket.freed_on`) while its attempt was
        out waits its backoff at most. One woken by an undo waits its backoff
        before it attempts (a release still wakes it); if that runs out, not its
        pause: the undo that woke it stays spent, or waiters refused by a holder
        keeping a quorum would wake each other with their undos while it holds."""
        core = self.core
        core.note("waiting")
        if ticket is None:
            await core.pause(pause)
            return
        if ticket.freed_on(core.quorum):
            pause = min(pause, self._backoff(ticket))
        if not await core.waker.wait(ticket, pause):
            return
        core.note("woken")
        undo = ticket.needs is not None and not ticket.heeding  # woken by an undo
        if undo and not await core.waker.wait(ticket, self._backoff(ticket)):
            ticket.heeding = False

    def _backoff(self, ticket: Ticket) -> float:
        """A pause drawn at random in a window of the last failed attempt's
        duration, doubled at each wake-up by undos (up to the retry delay), so
        that the waiters woken together stop splitting the masters' grants. What
        it knew of its keys free is spent: a quorum of fresh undos wakes it again."""
        core = self.core
        self.splits += 1
        if ticket.freed is not None:
            ticket.freed.clear()
        window = self.round * 2 ** min(self.splits, _MAX_DOUBLINGS)
        window = min(window, core.settings.retry_delay)
        return max(0.0, min(random.uniform(0, window), self.deadline - core.clock()))
