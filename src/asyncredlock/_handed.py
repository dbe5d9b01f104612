"""What one waiting ``acquire()`` knows of the keys the masters handed it (see
``release.lua``): the hand-overs its inbox heard, those its attempts found, and when
the attempts that could leave hand-over terms were sent."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence

from ._core import Core
from ._node import Reply
from ._protocol import QueueEntry, behind, handed_already
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
