"""What one waiting ``acquire()`` knows of the keys the masters handed it (see
``release.lua``): the hand-overs its inbox heard, those its attempts found, and when
the attempts that could leave hand-over terms were sent."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence

from ._core import Core
from ._keys import aux_key
from ._node import Reply
from ._protocol import QueueEntry, behind, granted, handed_already, ms
from ._quorum import NodeSkippedError
from ._scripts import ADOPT
from ._wakeup import Ticket

__all__ = ["HandOvers"]

#: How many of its latest attempts a waiter remembers the start of: a master hands
#: the key over with the terms of the last attempt it saw, one of the latest.
_ATTEMPTS_KEPT = 32


class HandOvers:
    """The hand-overs of one waiter's key (see the module's docstring)."""

    __slots__ = ("core", "found", "gave", "starts")

    def __init__(self, core: Core) -> None:
        self.core = core
        # when each attempt that could leave hand-over terms was sent, by its value
        self.starts: dict[str, float] = {}
        # masters whose attempt reply said they had handed it the key (a release it
        # did not hear of): until when the key surely lives there, and its count
        self.found: dict[int, tuple[float, int]] = {}
        # per master, when it last gave a key handed to it back there: a hand-over
        # heard later with the terms of an attempt sent before is that key's
        self.gave: dict[int, float] = {}

    def held(self, ticket: Ticket | None) -> set[int]:
        """The masters known to have handed it the key (heard, or found)."""
        return self.found.keys() | (ticket.handed.keys() if ticket is not None else set())

    def forget(self, ticket: Ticket | None) -> None:
        """Forget every hand-over (taken, or given back)."""
        self.found = {}
        if ticket is not None:
            ticket.handed = {}

    def remember(self, value: str, start: float) -> None:
        """When the attempt holding ``value`` was sent: it may leave hand-over terms."""
        self.starts[value] = start
        if len(self.starts) > _ATTEMPTS_KEPT:
            del self.starts[next(iter(self.starts))]

    def live(self, key: str, entry: QueueEntry, ticket: Ticket) -> dict[int, tuple[float, int]]:
        """Per master that handed it the key: until when the key surely lives
        there, and the fence count. Keys it cannot count on (their attempt
        forgotten, or as good as expired) are given back. A hand-over heard
        after the key was given back is ignored (its message came late): a
        master hands the key over again only with the terms of a later attempt
        (each hand-over uses the terms up, and an attempt that finds the key
        handed to it leaves none)."""
        core = self.core
        now = core.clock()
        self.found = {i: found for i, found in self.found.items() if found[0] > now}
        live = dict(self.found)
        stale = []
        for i, (attempt, count) in ticket.handed.items():
            start = self.starts.get(attempt)
            if start is not None and start <= self.gave.get(i, -math.inf):
                stale.append(i)
            elif start is not None and (expiry := core.expiry(start, entry.handover_ttl)) > now:
                live[i] = max(live.get(i, (expiry, count)), (expiry, count))
        self.drop(key, entry, [i for i in ticket.handed if i not in live and i not in stale])
        ticket.handed = {i: each for i, each in ticket.handed.items() if i in live}
        return live

    def drop(self, key: str, entry: QueueEntry, masters: Iterable[int]) -> None:
        """Give the keys handed to it back on ``masters`` (see `Core.drop_handed`)."""
        masters = list(masters)
        if masters:
            now = self.core.clock()
            for i in masters:
                self.gave[i] = now
            self.core.drop_handed(key, entry, masters)

    async def note(
        self, replies: Sequence[asyncio.Future[Reply]], start: float, ticket: Ticket | None
    ) -> None:
        """The masters whose reply to the attempt sent at ``start`` says they
        handed it the key already (a release it did not hear of). The round was
        decided without some replies: when those could make a quorum of such
        masters, they are waited for (up to ``node_timeout``), or a waiter whose
        quick masters refuse would miss the hand-over every time."""
        core, out = self.core, [reply for reply in replies if not reply.done()]
        found = handed_already(replies)
        known = self.held(ticket) | found.keys()
        if known and out and len(known) < core.quorum <= len(known) + len(out):
            await asyncio.wait(out, timeout=core.settings.node_timeout)
            found = handed_already(replies)
        for i, (pttl, count) in found.items():
            if (expiry := core.expiry(start, pttl / 1000)) > core.clock():
                self.found[i] = (expiry, count)

    def give_way(
        self,
        key: str,
        entry: QueueEntry | None,
        ticket: Ticket | None,
        replies: Sequence[asyncio.Future[Reply]],
    ) -> None:
        """Handed the key by fewer than a quorum of masters while an earlier waiter
        is queued ahead of it (by the attempt's ``replies``: on another master, or
        on one that handed it the key, listed there since by attempts that came
        after the release): give the keys back. Masters that heard a release at
        different times may hand the key to different waiters (each the first it
        had queued then); each would wait for the others' keys until they expire.
        The earliest waiter gives way to nobody (the holder, listed first, is not
        counted by the masters); the others do (staying listed in their place),
        and it collects the keys (given back, they are announced to it where it
        is first). ``entry`` is the waiter's own, with its hand-over value (an
        attempt may have been sent without)."""
        held = self.held(ticket)
        if entry is None or not held or len(held) >= self.core.quorum:
            return
        # where it holds a handed key, only a reply that found it handed is news (a
        # refusal there came before the hand-over)
        found = handed_already(replies)
        if any((i not in held or i in found) and behind(r) for i, r in enumerate(replies)):
            self.drop(key, entry, held)
            self.forget(ticket)

    def adopt(
        self,
        key: str,
        entry: QueueEntry | None,
        ticket: Ticket | None,
        replies: Sequence[asyncio.Future[Reply]],
        lease: tuple[str, float, int | None],
    ) -> list[asyncio.Future[Reply]]:
        """The masters a lease taken by an attempt holds, per master as its release
        and extension read them (see `holds_ours`), given the attempt's ``replies``.

        A master that refused the attempt because a release had handed the waiter
        the key there (heard, or found by an attempt: the undo of its own attempt
        granted there hands the key back to it, first in line) gets ``adopt.lua``
        behind the attempt on its connection: the key goes from the hand-over
        value to the lease's (``lease``: value, TTL, token), whose PX it gets, so
        the lease holds it too instead of giving it back. The validity stays the
        attempt's: the key is set after the attempt's start, with its TTL."""
        acquired = list(replies)
        if entry is None or entry.handover is None or self.core.closed:
            return acquired  # (no hand-over terms: nothing was handed to it)
        held = self.held(ticket) | handed_already(replies).keys()
        if not held:
            return acquired
        value, ttl, token = lease
        args = (entry.handover, value, ms(ttl), "" if token is None else str(token))
        self.forget(ticket)  # its keys: the lease's now (or gone)
        for i in held:
            reply = replies[i].result() if replies[i].done() else None
            # granted: held already; skipped (silent): its calls are not answered
            if reply is None or not (granted(reply) or isinstance(reply.error, NodeSkippedError)):
                call = self.core.nodes[i].call(ADOPT, (key, aux_key(key, "fence")), args)
                acquired[i] = _joined(replies[i], call)
        return acquired


def _joined(
    attempt: asyncio.Future[Reply], adopted: asyncio.Future[Reply]
) -> asyncio.Future[Reply]:
    """A master's reply for a lease, once its ``attempt`` and then its ``adopted``
    call answered: the attempt's if it granted or failed (its outcome unknown: the
    release leaves an undo marker), else the adoption's."""
    joined: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

    def done(_: object) -> None:
        if attempt.done() and adopted.done() and not joined.done():
            first = attempt.result()
            joined.set_result(
                first if first.error is not None or granted(first) else adopted.result()
            )

    attempt.add_done_callback(done)
    adopted.add_done_callback(done)
    return joined
