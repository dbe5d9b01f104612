"""Counting semaphores over the quorum: ``AsyncRedlock.semaphore(name, limit)``.

A semaphore of ``limit`` is ``limit`` slots, each a lock key of its own,
``{K}:sem:<i>``. An acquisition takes one free slot on every master in one script
(the slot it prefers, chosen at random, else the next free one) and holds the lease
once a quorum granted it the *same* slot; the slots it got elsewhere are given back.
Each slot is then held exactly as Redlock holds a lock (validity, extension,
release, loss), so at most ``limit`` leases are valid at once. Counting holders in
one set per master instead would not be safe: with a majority quorum, ``limit + 1``
holders can each be counted by a different majority without any master counting
more than ``limit``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
import secrets
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Self

import anyio

from ._core import Core, refuse_if_closing
from ._deadline import wait_until
from ._errors import LockTimeoutError, RedlockError
from ._keys import Resources, aux_key, channel, holder_value
from ._lease import Lease
from ._lock import Lock
from ._log import log_acquired
from ._node import Reply
from ._pauses import Pauses
from ._protocol import behind, classify_acquire, granted, holder_expires_in, ms
from ._quorum import Decision, NodeSkippedError, Round
from ._refusal import acquisition_error, refusal
from ._scripts import SEM_ACQUIRE, SEM_DEQUEUE, SEM_UNDO
from ._stats import Taken
from ._telemetry import note_attempts
from ._ticket import Needs, Ticket
from ._turns import TURNS, Turns
from ._wire import ClosedError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["MAX_LIMIT", "Semaphore", "check_limit"]

#: The largest ``limit``: each slot is a key, sent to every master in each attempt.
MAX_LIMIT = 1024

#: A master's reply as the lease of the chosen slot sees it when that master granted
#: it nothing (refused, or another slot, given back): its lease sends nothing there.
_NOT_HERE = Reply([0, -1])


def check_limit(limit: object) -> int:
    """A semaphore's ``limit``: an ``int`` from 1 to `MAX_LIMIT`, returned as a plain
    ``int`` (an ``int`` subclass's own comparisons or formatting play no part)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    plain = int.__int__(limit)  # the value, whatever the subclass overrides
    if not 1 <= plain <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, got {plain}")
    return plain


class Semaphore(Lock):
    """A counting semaphore on the masters, made by `AsyncRedlock.semaphore`: up to
    ``limit`` leases on ``name`` at once, across every client of the masters.

    Used like a `Lock`: ``async with semaphore as lease`` or
    ``await semaphore.acquire()``. Each lease holds one of the ``limit`` slots
    (``lease.key`` is its key) and is kept like a lock's: extended, lost, cancelling
    its block when lost, bounded by ``max_hold``. Leases carry no fencing token
    (several hold at once: a token cannot order them). Waiters are woken when a
    slot is given back (fair: also when a waiter let in for a free slot leaves).

    Attributes:
        limit: How many leases may be held at once.
        slot_keys: The key of each slot, ``{K}:sem:<i>``.
    """

    limit: int
    slot_keys: tuple[str, ...]

    @classmethod
    def create(
        cls,
        core: Core,
        name: str,
        limit: int,
        *,
        ttl: float | None,
        timeout: float | None,
        auto_extend: bool | None,
        max_hold: float | None,
        fair: bool = False,
    ) -> Self:
        """Check the settings (as `Lock.make` does), and make the semaphore."""
        semaphore = cls.make(
            core,
            (name,),
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            fencing=False,
            fair=fair,
            max_hold=max_hold,
        )
        semaphore.limit = limit
        semaphore.slot_keys = tuple(aux_key(semaphore.key, f"sem:{i}") for i in range(limit))
        return semaphore

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit={self.limit} ttl={self.ttl:g}s>"

    async def _acquire(self, started: float, span: Span | None) -> Lease:
        if self.timeout == 0 or self.fair:  # one attempt, or each task queues itself
            return await _Acquisition(self, started).run(span)
        turns = TURNS.setdefault(self._core, Turns())
        if turns.busy(self.key, self.limit):
            self._core.note("queued")
        took = False
        with anyio.move_on_after(max(0.0, started + self.timeout - self._core.clock())):
            await turns.take(self.key, self.limit)
            took = True
        if took:
            try:
                return await _Acquisition(self, started).run(span)
            finally:
                turns.give(self.key)
        self._core.counters.timeouts += 1
        raise LockTimeoutError(
            f"could not acquire semaphore {self.name!r} within {self.timeout:g} s: its"
            f" {self.limit} turn(s) to ask the masters were taken by other tasks of this"
            " AsyncRedlock",
            resource=self.name,
            outcomes=(),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Place:
    """A fair semaphore waiter's place in the masters' queue: its id, its arrival
    score (this client's clock when ``acquire()`` began), the queue's keys."""

    waiter: str
    arrival: int
    keys: tuple[str, str]

    @classmethod
    def new(cls, core: Core, key: str) -> _Place:
        waiter = f"s:{core.waker.client}:{secrets.token_hex(8)}"
        return cls(waiter, time.time_ns() // 1000, _queue_keys(key))


def _queue_keys(key: str) -> tuple[str, str]:
    """A semaphore's queue on the masters and its expiries: a fair attempt queues
    there, an unfair one leaves the queued waiters the free slots due to them."""
    return aux_key(key, "sem:queue"), aux_key(key, "sem:queue:expiry")


class _Acquisition:
    """The attempts of one ``acquire()`` of a semaphore."""

    def __init__(self, semaphore: Semaphore, started: float) -> None:
        self.semaphore = semaphore
        self.core = semaphore._core
        self.started = started
        self.deadline = started + semaphore.timeout
        self.ticket: Ticket | None = None
        self.attempts = 0
        self.granted: int | None = None
        self.preferred = random.randrange(semaphore.limit)
        self.channels = tuple(channel(key) for key in semaphore.slot_keys)
        self.free_in = math.inf
        self.pauses = Pauses(self.core, self.deadline)
        self.acquired = False
        self.value = ""  # the latest attempt's (its give-back, announced, is its own)
        # a fair semaphore's place in the masters' queue (none for an unfair one)
        self.place = _Place.new(self.core, semaphore.key) if semaphore.fair else None

    async def run(self, span: Span | None) -> Lease:
        self.core.acquiring += 1  # aclose() waits for it to leave
        try:
            lease = await self._attempts()
        finally:
            if self.ticket is not None:
                self.core.waker.leave(self.ticket, acquired=self.acquired)
            if self.place is not None and not self.core.closed:
                # out of the queue where it is still listed (granted or not); where
                # it was let in for a free slot (or took one, given back), the next
                # one is announced there
                keys = (*self.place.keys, *self.semaphore.slot_keys)
                ended = int(self.attempts > 0 and not self.acquired)  # maybe given back
                args = (self.place.waiter, self.channels[0], ended)
                for node in self.core.nodes:
                    node.call(SEM_DEQUEUE, keys, args)
            self.core.done_acquiring()
            note_attempts(span, self.attempts, self.granted)
        if self.attempts != 1:
            log_acquired(lease, self.attempts, self.core.clock() - self.started)
        return lease

    async def _attempts(self) -> Lease:
        core = self.core
        while True:
            refuse_if_closing(core)  # woken by aclose(): run() takes it out of the queue
            outcome = await self._attempt()
            if isinstance(outcome, Lease):
                self.acquired = True
                return outcome
            if refusal(outcome) is not None:
                raise self._failure(outcome)
            if self.deadline - core.clock() <= 0:
                raise self._failure(outcome)
            refuse_if_closing(core)
            if self.ticket is None and not outcome.unavailable:
                # listen for slots given back, then try again at once: one given
                # back before the subscriptions is seen by that attempt
                # (one slot free on a quorum wakes it: see `Waker._freed`)
                with anyio.move_on_after(max(0.0, self.deadline - core.clock())):
                    self.ticket = await core.waker.enroll(
                        self.channels, needs=Needs.ONE, own=self.value
                    )
                continue
            pause = min(core.retry_pause(), self.free_in, self.deadline - core.clock())
            await self.pauses.wait(self.ticket, max(0.0, pause))

    async def _attempt(self) -> Lease | Decision:
        """One round: a lease if a quorum granted one slot in time, else the decision."""
        core, semaphore = self.core, self.semaphore
        value = holder_value(core.settings.identity)
        start = core.clock()
        core.counters.attempts += 1
        semaphore._counters.attempts += 1
        self.attempts += 1
        ttl = semaphore.ttl
        # the slots and the attempt's undo marker (what a give-back is sent), then
        # the queue (fair: the waiter's place in it)
        undo_keys = (*semaphore.slot_keys, aux_key(semaphore.key, f"sem:undo:{value}"))
        keys = (*undo_keys, *_queue_keys(semaphore.key))
        args: tuple[object, ...] = (value, ms(ttl), self.preferred + 1)
        if (place := self.place) is not None:
            args = (*args, place.waiter, place.arrival, self._entry_ms())
        self.value = value
        if self.ticket is not None:
            self.ticket.attempting(value)  # its own undos tell it nothing
        rnd = core.fan_out(lambda _, node: node.call(SEM_ACQUIRE, keys, args), skip_silent=True)
        try:
            decision = await core.decide(rnd, classify_acquire)
            slot, count = await self._slot(rnd, decision)
            refuse_if_closing(core)
        except BaseException:  # interrupted: announced, a quorum may have granted it
            self._give_back(rnd, undo_keys, value, None, announce=self.channels)
            raise
        self.granted = count
        expires_at = core.expiry(start, ttl)
        if slot is not None and count >= core.quorum and core.clock() < expires_at:
            # the other slots a minority granted it: announced as its undo (a waiter
            # refused for one of them would sleep with it free); none, nothing sent
            acquired = self._give_back(rnd, undo_keys, value, slot, self.channels, as_undo=True)
            return self._lease(value, slot, expires_at, acquired)
        core.counters.failed_attempts += 1
        self._give_back(rnd, undo_keys, value, None, announce=self.channels, as_undo=True)
        self.free_in = holder_expires_in(rnd.tasks)
        self._failed(rnd, start)
        if slot is not None:
            self.preferred = slot  # where most masters put it: ask for that one next
        return decision

    def _failed(self, rnd: Round, start: float) -> None:
        """After a failed attempt begun at ``start``: the masters that granted it
        a slot have it free for this waiter (it gave it back); one queued behind
        an earlier waiter passes its wake-up ahead."""
        self.pauses.failed(start, self.ticket, rnd.tasks, _slot_of)
        if (ticket := self.ticket) is None:
            return
        if any(behind(task) for task in rnd.tasks):
            self.core.waker.pass_ahead(ticket)  # a waiter ahead, here, may be due it

    def _entry_ms(self) -> int:
        """How long a fair waiter's entry lives unless an attempt refreshes it."""
        settings = self.core.settings
        return ms(max(1.0, 3 * (settings.retry_delay + settings.node_timeout)))

    async def _slot(self, rnd: Round, decision: Decision) -> tuple[int | None, int]:
        """The slot most masters granted, and how many did. Masters that granted
        different slots (attempts of other clients arrived in another order) may
        leave no quorum on any one: then the replies still out are waited for
        (up to ``node_timeout``), until one completes a quorum."""
        slot, count = _most_granted(rnd.tasks)
        if not decision.reached or count >= self.core.quorum:
            return slot, count

        def enough() -> bool:
            return _most_granted(rnd.tasks)[1] >= self.core.quorum

        await wait_until(rnd.tasks, enough, self.core.settings.node_timeout)
        return _most_granted(rnd.tasks)

    def _give_back(
        self,
        rnd: Round,
        keys: Sequence[str],
        value: str,
        kept: int | None,
        announce: Sequence[str] = (),
        as_undo: bool = False,
    ) -> list[asyncio.Future[Reply]]:
        """Give back, on each master, every slot of this attempt but ``kept``: at
        once behind the attempt on its connection, with a marker refusing it where
        its outcome is unknown; a slot given back is announced on its channel in
        ``announce``: ``as_undo`` (a failed attempt's, or the other slots of one
        granted ``kept``) or as a release (an interrupted one's). Returns each
        master's reply as slot ``kept``'s lease sees it (granted or not)."""
        core = self.core
        acquired: list[asyncio.Future[Reply]] = []
        keep = 0 if kept is None else kept + 1
        announce = (*announce, "1") if as_undo else tuple(announce)
        marked = (value, ms(self.semaphore.ttl), keep, *announce)  # with the marker
        for node, task in zip(core.nodes, rnd.tasks, strict=True):
            view: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
            acquired.append(view)
            reply = task.result() if task.done() else None
            if reply is not None and _slot_of(reply) == kept and kept is not None:
                view.set_result(Reply([1]))
                continue
            if reply is not None and (
                (reply.error is None and not granted(reply))
                or isinstance(reply.error, NodeSkippedError)
            ):
                view.set_result(_NOT_HERE)  # refused, undone or never sent: nothing taken
                continue
            undo = functools.partial(node.call, SEM_UNDO, keys)
            if not core.closed:
                # behind the attempt on its connection: a marker only where it failed
                unknown = reply is not None and reply.error is not None
                undo(marked if unknown else (value, 0, keep, *announce))
            if reply is not None:
                view.set_result(_NOT_HERE if reply.error is None else reply)
                continue
            # still out: the lease counts it as granted only if it gives `kept`; if it
            # fails, the undo is sent again with the marker (it may yet arrive)
            again = None if core.closed else functools.partial(undo, marked)
            task.add_done_callback(functools.partial(_view, view=view, kept=kept, again=again))
        return acquired

    def _lease(
        self, value: str, slot: int, expires_at: float, acquired: list[asyncio.Future[Reply]]
    ) -> Lease:
        """The lease of slot ``slot``: a lock on its key, with the semaphore's settings."""
        core, semaphore = self.core, self.semaphore
        core.counters.acquisitions += 1
        spec = semaphore._spec
        target = Resources(spec.target.names, (semaphore.slot_keys[slot],))
        taken = Taken("attempt", self.attempts, self.started)
        return Lease(
            core,
            dataclasses.replace(spec, target=target),
            value=value,
            expires_at=expires_at,
            acquired=acquired,
            taken=taken,
        )

    def _failure(self, decision: Decision) -> RedlockError:
        semaphore = self.semaphore
        return acquisition_error(
            decision,
            self.core.counters,
            resource=semaphore.name,
            doing=f"acquire semaphore {semaphore.name!r}",
            timeout=semaphore.timeout,
            why=f"its {semaphore.limit} slot(s) were held, or no quorum agreed on a free one",
        )


def _slot_of(reply: Reply) -> int | None:
    """The slot (0-based) a master granted, if it granted one."""
    if not granted(reply):
        return None
    return int(reply.value[1]) - 1


def _most_granted(tasks: Sequence[asyncio.Future[Reply]]) -> tuple[int | None, int]:
    counts: dict[int, int] = {}
    for task in tasks:
        if task.done() and (slot := _slot_of(task.result())) is not None:
            counts[slot] = counts.get(slot, 0) + 1
    if not counts:
        return None, 0
    slot = max(counts, key=lambda each: counts[each])
    return slot, counts[slot]


def _view(
    task: asyncio.Future[Reply],
    view: asyncio.Future[Reply],
    kept: int | None,
    again: Callable[[], object] | None,
) -> None:
    """A reply that came after the decision, as the lease of slot ``kept`` sees it;
    a failed one gets its undo again, with the marker (``again``)."""
    reply = task.result()
    if reply.error is not None:
        if again is not None and not isinstance(reply.error, ClosedError):
            again()
        view.set_result(reply)
    else:
        view.set_result(Reply([1]) if kept is not None and _slot_of(reply) == kept else _NOT_HERE)
