"""One ``acquire()`` on the masters: attempts until one takes the lock or the deadline
passes, the waiter's place in the masters' queue, and its wake-ups in between."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from ._config import LockSpec
from ._core import Core, refuse_if_closing
from ._errors import RedlockError
from ._handed import HandOvers
from ._keys import channel, holder_value
from ._lease import Lease, make_lease
from ._log import log_acquired
from ._node import Reply
from ._pauses import Pauses
from ._protocol import (
    QueueEntry,
    QueueTrace,
    classify_acquire,
    classify_commit,
    expired_decision,
    fence_tokens,
    granted,
    holder_expires_in,
    queued_by,
    settled_grant,
)
from ._quorum import Decision, Round
from ._refusal import acquisition_error, refusal, why_refused
from ._releasing import LateUndo
from ._stats import LockCounters, Taken
from ._telemetry import note_attempts
from ._ticket import Needs
from ._wakeup import Ticket, waiter_id

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Acquisition"]


@dataclass(frozen=True, slots=True)
class _Failed:
    """An attempt that did not take the lock: the counted replies, whether a
    quorum did grant it but too late (validity used up), and in how many seconds
    the holder's keys expire (``inf`` when not known), and its replies. Its undo is
    on its way: where a reply is still out, once it comes, or at the latest ahead
    of the next attempt on that master's connection (`LateUndo`)."""

    decision: Decision
    expired: bool
    free_in: float = math.inf
    replies: Sequence[asyncio.Future[Reply]] = ()

    def in_line(self, quorum: int) -> bool:
        """Whether a quorum of masters queued the waiter (or refreshed its entry)."""
        return sum(map(queued_by, self.replies)) >= quorum


class Acquisition:
    """The attempts of one ``acquire()`` on the masters.

    Fair and read-write locks queue from the start; other locks on one resource
    once refused (the queue orders waiters of different clients), or from the
    start when this client's last ``acquire()`` of the key had to wait.
    """

    __slots__ = (
        "acquired",
        "arrival",
        "attempts",
        "core",
        "counters",
        "deadline",
        "entry",
        "granted",
        "hand_overs",
        "handed_by",
        "inbox_only",
        "key",
        "late",
        "pauses",
        "single",
        "spec",
        "started",
        "ticket",
        "trace",
        "value",
        "won",
    )

    def __init__(
        self, core: Core, spec: LockSpec, started: float, arrival: int, counters: LockCounters
    ) -> None:
        self.core = core
        self.counters = counters  # the Lock's
        self.spec = spec
        self.started = started
        self.deadline = started + spec.timeout
        self.arrival = arrival
        self.key = spec.target.keys[0]
        self.single = len(spec.target.keys) == 1
        queues = spec.queued or (self.single and self.key in core.contended)
        self.entry = self._new_entry() if queues else None
        self.trace = QueueTrace(len(core.nodes)) if self.entry is not None else None
        self.ticket: Ticket | None = None
        self.hand_overs = HandOvers(core)  # the keys the masters handed it
        # whether its wake-ups come through the inbox only (writers, but those of a
        # read-write lock that is not fair: they also listen on the lock's channel)
        self.inbox_only = not spec.shared and (spec.fair or not spec.queued)
        self.acquired = False
        self.handed_by: frozenset[int] = frozenset()  # the masters that handed it the lease
        self.attempts = 0  # rounds sent to the masters
        self.granted: int | None = None  # masters that granted the latest round
        self.won: Sequence[asyncio.Future[Reply]] = ()  # the replies to the round that took it
        self.late: list[LateUndo] = []  # the last failed attempt's undos still to send
        self.value = ""  # the latest attempt's (its undo, announced, is its own)
        self.pauses = Pauses(core, self.deadline)

    async def run(self, span: Span | None = None) -> Lease:
        """Attempt until one takes the lock or the deadline passes (adding the
        attempts to ``span``, the ``acquire()`` call's)."""
        self.core.acquiring += 1  # aclose() waits for its _leave()
        try:
            lease = await self._attempts()
        finally:
            self._leave()
            self.core.done_acquiring()
            note_attempts(span, self.attempts, self.granted)
        if self.attempts != 1 or self.handed_by:  # it waited (retried, or was handed it)
            log_acquired(lease, self.attempts, self.core.clock() - self.started)
        return lease

    async def _attempts(self) -> Lease:
        core, spec = self.core, self.spec
        first = True  # the first attempt of this acquire()
        while True:
            refuse_if_closing(core)  # woken by aclose(): _leave() takes it out of the queue
            if self.entry is not None:  # a waiter: handed the lock, or to enroll first?
                handed = await self._take_handed()
                if handed is not None:
                    return handed
                await self._enroll_early()
            # A writer out of patience queues: readers that come later wait for it.
            impatient = not spec.shared and core.clock() - self.started >= spec.patience
            # hand-over terms only once enrolled: a hand-over is then always heard
            terms = self.ticket is not None and core.waker.inbox_ready()
            ahead = spec.fair or impatient
            outcome = await self._attempt(ahead, terms=terms)
            if ahead and not spec.shared:
                core.note("ahead")
            if isinstance(outcome, Lease):
                self.acquired = True
                if first:
                    core.contended.pop(self.key, None)  # no contention this time
                return outcome
            first = False
            if refusal(outcome.decision) is not None:
                raise self._failure(outcome)  # AUTH, an ACL, a certificate: retrying cannot help
            if self._was_handed():
                continue  # handed the lock (heard, or found by the attempt): take it
            if self.deadline - core.clock() <= 0:
                raise self._failure(outcome)
            refuse_if_closing(core)
            self._contended()
            if self.ticket is None and not outcome.decision.unavailable:
                await self._enroll()
                continue
            if self.ticket is not None and len(self.ticket.channels) > 1:
                core.waker.pass_on(self.ticket)  # a set: the release may serve a later one
            await self._pause(outcome)

    def _was_handed(self) -> bool:
        ticket = self.ticket  # terms (so hand-overs) only once enrolled
        return ticket is not None and len(self.hand_overs.held(ticket)) >= self.core.quorum

    async def _enroll_early(self) -> None:
        """Its inbox is listened to already: a release after the next attempt
        (which queues it) is heard, and no retry is needed to catch one before.
        It is enrolled first, so that none goes unheard."""
        waker, entry = self.core.waker, self.entry
        if self.ticket is None and entry is not None and self.inbox_only and waker.inbox_ready():
            self.ticket = await waker.enroll((), waiter=entry.waiter, own=self.value)

    def _contended(self) -> None:
        """Refused: a lock on one resource queues from now on, and its next
        ``acquire()`` here from its first attempt."""
        if not self.single:
            return
        if self.entry is None:
            self.arrival = time.time_ns() // 1000  # its place: from when it first queues
            self.entry = self._new_entry()
            self.trace = QueueTrace(len(self.core.nodes))
        self.core.mark_contended(self.key)

    async def _enroll(self) -> None:
        """Listen for the release, then try again at once: a release before the
        subscription is seen by that attempt, one after it is announced. No
        wake-up is lost in between. A release announces the first writer of the
        masters' queue to its client's inbox: only that waiter goes. Readers (all
        woken: several may go at once), waiters of several resources and writers
        of read-write locks (queued only while a queue exists) also listen on the
        lock's channel; those but readers also go once a quorum of masters has
        their every key free (`Waker._freed`): no queue on the masters serves them."""
        core, entry, shared = self.core, self.entry, self.spec.shared
        with anyio.move_on_after(max(0.0, self.deadline - core.clock())):
            broadcast = entry is None or not self.inbox_only
            channels = [channel(key) for key in self.spec.target.keys] if broadcast else []
            self.ticket = await core.waker.enroll(
                channels,
                everyone=shared,
                waiter=None if entry is None else entry.waiter,
                needs=Needs.EVERY if broadcast and not shared else None,
                own=self.value,
            )

    async def _pause(self, outcome: _Failed) -> None:
        """Wait out the retry delay (less if the holder's keys expire sooner, or
        the deadline comes), or until a release wakes it. A writer in line waits
        at least a refresh pause (`QueueEntry.refresh_pause`): the release that
        hands it the key tells it, and its attempts only keep its entry fresh."""
        core, entry = self.core, self.entry
        pause = core.retry_pause()
        if entry is not None and outcome.in_line(core.quorum) and self._told():
            pause = max(pause, entry.refresh_pause())
        pause = max(0.0, min(pause, outcome.free_in, self.deadline - core.clock()))
        await self.pauses.wait(self.ticket, pause)

    def _undo_now(self) -> None:
        """Send the last failed attempt's undos still waiting for a reply (behind
        its ``SET`` on each master's connection)."""
        late, self.late = self.late, []
        for undo in late:
            undo.now()

    def _told(self) -> bool:
        """Whether a release will tell it: it listens to its inbox only, a quorum
        of masters confirmed the inbox's subscription, and no master handed it the
        key yet (a partial hand-over is settled by its attempts, see
        `HandOvers.give_way`)."""
        ticket = self.ticket
        return (
            ticket is not None
            and self.inbox_only
            and self.core.waker.inbox_ready()
            and not self.hand_overs.held(ticket)
        )

    def _leave(self) -> None:
        """Out of the wake-ups and, in the background, of the masters' queue (the
        last failed attempt's undos still waiting for a reply go first).

        A granted waiter may still be listed by the masters that refused; a key
        handed to it that it is not using is given back. Not where its attempt
        was granted (no call now, none in vain): a writer stays listed there and
        its lease's release takes the entry out; a reader left the queue when
        granted. A lease handed over sends nothing: its release goes to every
        master. A reply still out, or failed, may yet be a refusal that queued
        it (and left hand-over terms): dequeued there."""
        core = self.core
        self._undo_now()
        if self.ticket is not None:
            core.waker.leave(self.ticket, acquired=self.acquired)
        if self.entry is not None and self.trace is not None and not self.handed_by:
            won = self.won
            spared = [i for i, reply in enumerate(won) if reply.done() and granted(reply.result())]
            core.dequeue(self.key, self.entry, self.trace, everywhere=self.spec.fair, spared=spared)

    def _new_entry(self) -> QueueEntry:
        """This ``acquire()``'s place in the masters' queue (its entry lives three
        retry delays and node timeouts unless an attempt refreshes it). A writer
        whose lease extends itself may be handed the key by a release, for no
        longer than its entry lives (should it have died, the key frees itself as
        soon as its entry would have lapsed); its lease then extends it."""
        settings, spec = self.core.settings, self.spec
        ttl = max(1.0, 3 * (settings.retry_delay + settings.node_timeout))
        handed = not spec.shared and spec.auto_extend
        return QueueEntry(
            waiter=waiter_id(self.core.waker.client, reader=spec.shared),
            score=self.arrival,
            ttl=ttl,
            handover=holder_value(settings.identity) if handed else None,
            handover_ttl=min(ttl, spec.ttl),
        )

    async def _take_handed(self) -> Lease | None:
        """The lease of a key that a quorum of masters handed to this waiter; or
        None (then given back where it was handed, unless others may still hand
        it over). None is made once ``aclose()`` began: the closing error.

        A master hands the key over (``release.lua``) with the terms of the last
        attempt it queued the waiter with, so after that attempt was sent: the key
        lives there at least until that attempt's start plus the hand-over TTL, by
        this client's clock (less the drift allowance); where an attempt found it
        handed already (the announcement unheard), that attempt's start plus the
        key's PTTL read back. The validity is the quorum-th longest of those. With
        fencing, the token is the largest count a master returned (or, found,
        holds), committed in a second round unless a quorum returned it.
        """
        if not self._was_handed():
            return None
        core, entry, ticket = self.core, self.entry, self.ticket
        assert entry is not None
        assert entry.handover is not None
        assert ticket is not None
        live = self.hand_overs.live(self.key, entry, ticket)
        if len(live) < core.quorum:
            return None  # the others may still hand it over
        self.hand_overs.forget(ticket)
        expiries = sorted((expiry for expiry, _ in live.values()), reverse=True)
        acquired = [settled_grant() for _ in core.nodes]
        tokens: tuple[int, ...] | None = None
        usable = True
        if self.spec.fencing:
            counts = [count for _, count in live.values()]
            tokens = (max(counts),)
            if counts.count(tokens[0]) < core.quorum:
                second = core.commit_round(self.spec.target.keys, entry.handover, tokens, acquired)
                usable = (await core.decide(second, classify_commit)).reached
        if not usable or expiries[core.quorum - 1] <= core.clock():
            self.hand_overs.drop(self.key, entry, live)
            return None
        refuse_if_closing(core)  # no lease: _leave() gives the handed keys back
        expires_at = expiries[core.quorum - 1]
        now = core.clock()
        # the key lives a hand-over TTL: extended to the lease's own TTL once a third
        # of that is used (a short hold never needs to)
        extend_at = now + (expires_at - now) / 3
        self.acquired, self.handed_by, self.granted = True, frozenset(live), len(live)
        # its release takes the entry out where it is left
        taken = Taken("hand-over", self.attempts, self.started, entry.waiter)
        value = entry.handover
        return make_lease(
            core, self.spec, value, expires_at, acquired, tokens, taken=taken, extend_at=extend_at
        )

    async def _attempt(self, queue: bool, *, terms: bool) -> Lease | _Failed:
        """One round on every master (and, fenced, its commit round when needed)."""
        core, spec = self.core, self.spec
        value = holder_value(core.settings.identity)
        start = core.clock()
        entry = self._starting(terms, value, start)
        core.counters.attempts += 1
        self.counters.attempts += 1
        self.attempts += 1
        expires_at = core.expiry(start, spec.ttl)
        rnd = core.acquire_round(
            spec.target.keys,
            value,
            spec.ttl,
            fencing=spec.fencing,
            entry=entry,
            rw=spec.queued,
            shared=spec.shared,
            queue=queue,
        )
        if self.trace is not None:
            self.trace.add(rnd.tasks)
        try:
            decision, tokens = await self._decide(rnd, value, expires_at)
            refuse_if_closing(core)
        except BaseException:
            core.undo(spec.target.keys, value, rnd.tasks, spec.ttl, shared=spec.shared)
            raise
        if decision.holds(expires_at, core.clock):
            return self._taken(rnd.tasks, value, expires_at, tokens)
        core.counters.failed_attempts += 1
        self.late = core.undo_failed(spec, value, rnd.tasks)
        self.pauses.failed(start, self.ticket, rnd.tasks)
        await self.hand_overs.note(rnd.tasks, start, self.ticket)
        self.hand_overs.give_way(self.key, self.entry, self.ticket, rnd.tasks)
        expired = decision.reached
        if expired:
            decision = expired_decision(decision, core.clock() - start, spec.ttl)
        return _Failed(decision, expired, holder_expires_in(rnd.tasks), rnd.tasks)

    def _starting(self, terms: bool, value: str, start: float) -> QueueEntry | None:
        """An attempt holding ``value`` goes out: the last attempt's undos go
        ahead of it, its ticket is told (`Ticket.attempting`). The entry it
        carries: its hand-over terms only with ``terms``; one that carries them is
        remembered (a master may hand it the key with them)."""
        self._undo_now()
        self.value = value
        if self.ticket is not None:
            self.ticket.attempting(value)
        entry = self.entry
        if not terms and entry is not None and entry.handover is not None:
            entry = dataclasses.replace(entry, handover=None)
        if entry is not None and entry.handover is not None:
            self.hand_overs.remember(value, start)
        return entry

    def _taken(
        self,
        replies: Sequence[asyncio.Future[Reply]],
        value: str,
        expires_at: float,
        tokens: tuple[int, ...] | None,
    ) -> Lease:
        """The lease of the attempt that took the lock, with the keys handed to it
        (`HandOvers.adopt`). A writer stays listed where it was granted: its
        lease's release takes the entry out there."""
        entry, spec = self.entry, self.spec
        token = None if tokens is None else tokens[0]
        lease = (value, spec.ttl, token)
        self.won = self.hand_overs.adopt(self.key, entry, self.ticket, replies, lease)
        waiter = "" if entry is None or spec.shared else entry.waiter
        taken = Taken("attempt", self.attempts, self.started, waiter)
        return make_lease(self.core, spec, value, expires_at, self.won, tokens, taken=taken)

    async def _decide(
        self, rnd: Round, value: str, expires_at: float
    ) -> tuple[Decision, tuple[int, ...] | None]:
        """The round's decision and, fenced, the tokens; once a quorum granted in
        time, the decision is that of the commit round, when one is needed."""
        core, spec = self.core, self.spec
        decision = await core.decide(rnd, classify_acquire)
        self.granted = decision.yes
        if not (spec.fencing and decision.holds(expires_at, core.clock)):
            return decision, None
        tokens, committed = fence_tokens(rnd.tasks, core.quorum)
        if not committed:
            second = core.commit_round(spec.target.keys, value, tokens, rnd.tasks)
            decision = await core.decide(second, classify_commit)
            self.granted = decision.yes
        return decision, tokens

    def _failure(self, failed: _Failed) -> RedlockError:
        name = self.spec.target.label
        slow = "the masters answered too slowly for the TTL"
        return acquisition_error(
            failed.decision,
            self.core.counters,
            resource=name,
            doing=f"lock {name!r}",
            timeout=self.spec.timeout,
            why=slow if failed.expired else why_refused(failed.decision),
        )
