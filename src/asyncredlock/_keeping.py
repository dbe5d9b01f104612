"""What keeps a lease held: extension rounds, automatic extension, the bound on
how long it is held (``max_hold``), and its end (released or lost).

`Keeping` is the base of `Lease`, which adds the public API, the release, the
hand-off within the process and the ``async with`` block.
"""

from __future__ import annotations

import asyncio
import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._config import LockSpec
from ._core import Core
from ._ending import Ending
from ._errors import LockNotOwnedError, LostLeaseError, NodeOutcome, RedlockError
from ._keys import Resources
from ._log import log_extension_failed, log_lost
from ._node import Reply
from ._protocol import classify_flag, ms
from ._quorum import Decision, Round
from ._stats import LeaseRecord
from ._telemetry import EXTEND, traced

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["BOUND", "EXPIRED", "GONE", "LATE", "RETRY_FLOOR", "Keeping", "State", "lost_by"]

#: Why a lease ends lost, for the log (and the telemetry's causes).
GONE = "a majority of masters no longer hold it"
EXPIRED = "not extended before its validity ran out"
LATE = "extended too late: a quorum confirmed it only after the expiry it set"


def lost_by(decision: Decision) -> str:
    """Why an extension round that did not hold ends the lease: a quorum took it too
    late (its answer came after the new expiry that round set, ``start + ttl -
    drift``), or a majority no longer held it."""
    return LATE if decision.reached else GONE


def _failure(decision: Decision) -> str:
    """Why an extension round failed, as its log line says."""
    if decision.reached:
        return "too late: confirmed only after the expiry it set"
    return "not held" if decision.refuted else "too many masters failed or did not answer"


BOUND = "held for its max_hold"

#: The least pause (s) between automatic extension rounds that failed, whatever
#: ``retry_delay`` (``0`` would retry at once, hundreds of rounds a second); a TTL
#: under 12 times it pauses a twelfth of the TTL.
RETRY_FLOOR = 0.01


class State(enum.Enum):
    """Where a lease is in its life."""

    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


class Keeping(ABC):
    """A lease's state on the masters, and what keeps it there (see the module)."""

    # Until set otherwise, per lease:
    _state = State.HELD
    _loss: Decision | None = None
    _failing = False  # the last extension round failed
    _capped = False  # its validity ends at its bound (max_hold): no more extensions
    _bounded_out = False  # it ended lost at its bound
    # automatic extension: a timer until one is due, a task only while it runs
    _timer: asyncio.TimerHandle | None = None
    _extender: asyncio.Task[None] | None = None
    _limit: asyncio.TimerHandle | None = None  # ends the lease at its bound
    _holder: Span | None = None  # the span current where it was acquired (see telemetry)
    _untaken = False  # passed to a task that has not taken it yet (see Lease._take)
    # the event loop it was taken on, whose timers extend it and end it at its bound
    _keeper: asyncio.AbstractEventLoop | None = None
    token: int | None = None

    def __init__(
        self,
        core: Core,
        spec: LockSpec,
        *,
        value: str,
        expires_at: float,
        acquired: Sequence[asyncio.Future[Reply]],
        record: LeaseRecord,
    ) -> None:
        self._core = core
        self._record = record  # for statistics()
        # the id a writer was queued as, if any: its entry leaves the queues on release
        self._waiter = record.taken.waiter
        # the block, wait_lost(), loss callbacks (called with the `Lease`)
        self._ending: Ending[Any] = Ending()
        self._target: Resources = spec.target
        self.shared = spec.shared
        self.resource = spec.target.label
        self.keys = spec.target.keys
        self.value = value
        self.ttl = spec.ttl
        self._expires_at = expires_at
        # extension rounds out (by number, see `_number`): the least expiry a round
        # sent after each may set on the masters
        self._later: dict[int, float] = {}
        self._sent = 0
        # each master's reply to the acquisition: which masters hold something of ours
        self._acquired = tuple(acquired)
        # the bound on how long it is held: its keys are never extended past it
        self._max_hold = spec.max_hold
        self._bound = record.taken_at + spec.max_hold
        core.held.add(self)
        if spec.max_hold != math.inf:
            delay = max(0.0, self._bound - core.clock())
            self._limit = asyncio.get_running_loop().call_later(delay, self._reach_bound)

    @property
    def validity(self) -> float:
        """Seconds the lock is still held for, under Redlock's timing assumptions.

        Measured with the monotonic clock from before the acquisition (or last
        extension) was sent, less the drift allowance; 0 once lost or released.
        """
        if self._state is not State.HELD:
            return 0.0
        return max(0.0, self._expires_at - self._core.clock())

    @abstractmethod
    def _pass_on(self) -> None:
        """Hand the lease to the next waiter of this process, or release it (its
        task gave up): `Lease` knows how."""

    def _error(self, kind: type[RedlockError], message: str, decision: Decision) -> RedlockError:
        """An error about this lease, with the masters' answers in ``decision``."""
        return kind(message, resource=self.resource, outcomes=decision.outcomes)

    def _not_owned(self, message: str, outcomes: Sequence[NodeOutcome]) -> LockNotOwnedError:
        """The error of a release or extension of a lease no longer held: a
        `LostLeaseError` once it is lost (a loss its holder must hear of as one), a
        plain `LockNotOwnedError` once released (the caller's bug)."""
        kind = LostLeaseError if self._state is State.LOST else LockNotOwnedError
        return kind(message, resource=self.resource, outcomes=outcomes)

    def _ended_as(self) -> str:
        """How the lease ended, for an error: ``released``, or ``lost`` (with why, at
        its bound)."""
        if self._bounded_out:
            return "lost: it reached its max_hold"
        return self._state.value

    def _check_held(self, what: str) -> None:
        if self._state is State.HELD:
            return
        raise self._not_owned(
            f"cannot {what} {self.resource!r}: the lease is already {self._ended_as()}",
            self._loss.outcomes if self._loss else (),
        )

    # -- per-master steps -------------------------------------------------------

    async def _extend_round(self, ttl: float, *, keeping: bool = False) -> Decision | None:
        """One extension round (to ``ttl``, or to the bound if sooner); ``None`` when
        it succeeded. ``keeping`` (the automatic extender): it waits no longer than
        the validity left, when the lease ends lost (its block runs only while it is
        valid); a caller's round waits at least ``node_timeout``."""
        core = self._core
        start = core.clock()
        capped = ttl > self._bound - start
        ttl = min(ttl, max(self._bound - start, 0.001))
        args = (self.value, ms(ttl))
        rnd = core.extend_round(self.keys, self._acquired, args, shared=self.shared)
        left = self._expires_at - core.clock()
        floor = 0.0 if keeping else core.settings.node_timeout
        wait = min(max(left, floor), core.timing.max_wait)
        expires_at = core.expiry(start, ttl)
        cut, number = self._cut_to(expires_at), self._number(expires_at)

        def accepted(decision: Decision) -> bool:
            return self._state is State.HELD and decision.holds(expires_at, core.clock)

        try:
            decision = await traced(
                EXTEND, self, core.decide(rnd, classify_flag, wait=wait), accepted
            )
        finally:
            later = self._later.pop(number)  # the least expiry a round sent since may set
        if accepted(decision):
            self._expires_at, self._failing = min(expires_at, later), False
            self._capped = capped and later >= expires_at  # (not if a later round cut it)
            core.counters.extensions += 1
            self._record.extensions += 1
            return None
        if self._state is State.HELD:  # (else it ended while the round ran: no failure
            self._failed(decision, cut)  # of its own, its release or loss tells)
        return decision

    def _failed(self, decision: Decision, cut: bool) -> None:
        """An extension round of a held lease failed: count and log it."""
        if cut:
            self._reschedule()  # an automatic extension may keep it: due by the cut
        self._core.counters.failed_extensions += 1
        self._record.failed_extensions += 1
        log_extension_failed(self, decision.outcomes, _failure(decision), self._failing)
        self._failing = True  # until an extension succeeds: later failures log at DEBUG

    def _number(self, expires_at: float) -> int:
        """Number an extension round as it is sent, and cap each round still out at
        its ``expires_at``: every master runs the later round after them (on the same
        connection), so its PX is the last word there; confirming an earlier round
        must not lift the validity past it (a shorter ``extend(ttl=...)`` sent while
        an automatic round is out). How many rounds were sent, this one included."""
        self._sent += 1
        for number, least in self._later.items():
            if expires_at < least:
                self._later[number] = expires_at
        self._later[self._sent] = math.inf
        return self._sent

    def _cut_to(self, expires_at: float) -> bool:
        """A round was sent that asks for less than the validity left (a shorter TTL):
        masters may hold the key only until ``expires_at`` from the moment it lands
        there, so the validity counts on no more, from before any reply comes (a
        pending automatic extension is due by then at the latest). Whether it cut."""
        if expires_at >= self._expires_at:
            return False
        due = self._expires_at - 2 * self.ttl / 3
        self._expires_at, self._capped = expires_at, False  # (short of its bound now)
        if self._timer is not None:
            self._timer.cancel()
            self._extend_at(due)  # (no later than the new expiry)
        return True

    def _send_release(self) -> Round:
        """Compare-and-delete on every master, each behind this lease's calls there."""
        return self._core.release_round(
            self.keys, self.value, self._acquired, self.ttl, shared=self.shared, waiter=self._waiter
        )

    # -- automatic extension, the bound, and loss ---------------------------------

    def _reschedule(self) -> None:
        """The validity or the TTL changed: a pending automatic extension is due by
        them (at once if the validity left is under two thirds of the TTL)."""
        if self._timer is not None:
            self._timer.cancel()
            self._extend_at(self._expires_at - 2 * self.ttl / 3)

    def _extend_at(self, when: float) -> None:
        """Schedule the next automatic extension (by the lease's clock)."""
        delay = max(0.0, min(when, self._expires_at) - self._core.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._extension_due)

    def _extension_due(self) -> None:
        self._timer = None
        if self._state is State.HELD:
            self._extender = self._core.tracker.loop(self._extend_kept())

    async def _extend_kept(self) -> None:
        """`_extend_once`; should it fail (a bug), the lease is no longer kept, so it
        ends lost (its block cancelled) rather than run on unextended."""
        try:
            await self._extend_once()
        except Exception as exc:
            self._lose(None, f"its extension failed ({type(exc).__name__}: {exc})")
            raise  # (logged as a background task's crash)

    async def _extend_once(self) -> None:
        """One automatic extension; schedules the next, or ends the lease lost."""
        core = self._core
        start = core.clock()
        if start >= self._expires_at:
            if self._capped and self._at_bound():  # extended as far as its bound allows
                self._reach_bound()
            else:
                self._lose(self._loss, EXPIRED)
            return
        if self._capped or self._bound - self._expires_at <= self._drift():
            # Its validity reaches its bound already: nothing left to extend (a
            # shorter and shorter PX would only race its own round). It ends then.
            self._capped = True
            self._extend_at(self._expires_at)
            return
        decision = await self._extend_round(self.ttl, keeping=True)
        self._extender = None
        if decision is None:
            self._extend_at(start + self.ttl / 3)
        elif self._at_bound():
            self._reach_bound()  # the bound came while the round ran
        elif decision.reached or decision.refuted:
            self._lose(decision, lost_by(decision))
        else:
            self._loss = decision
            pause = max(core.settings.retry_delay, RETRY_FLOOR)
            self._extend_at(core.clock() + min(self.ttl / 12, pause))

    def _drift(self) -> float:
        return self._core.settings.drift(self.ttl)

    def _at_bound(self) -> bool:
        """Whether the lease is at its bound (within the drift allowance): no
        extension can keep it any longer."""
        return self._core.clock() >= self._bound - self._drift()

    def _reach_bound(self) -> None:
        """The lease was held for its ``max_hold`` (or its validity, extended as
        far as that allows, ran out): it ends lost, and is released."""
        if self._state is State.HELD:
            self._bounded_out = True
            self._lose(None, BOUND)

    def _lose(self, decision: Decision | None, reason: str) -> None:
        """Mark the lease lost (``reason``: why, for the log), cancel its block, and
        remove what it still holds."""
        if self._state is not State.HELD:
            return
        self._loss = decision
        self._count_loss(decision, reason)
        self._finish(State.LOST)
        self._ending.cancel_block()
        if not self._core.closed:
            self._send_release()
        self._core.gates.exit(self._target.slot, self)  # the slot, if it holds it

    def _count_loss(self, decision: Decision | None, reason: str) -> None:
        """Count and log the loss, unless no task took the lease (nobody's loss: the
        task it was passed to acquires anew)."""
        if not self._untaken:
            self._core.counters.lost += 1
            log_lost(self, decision.outcomes if decision else (), reason)

    def _announce_end(self) -> None:
        """The end is known (released or lost): tell `Ending`, count its hold time."""
        lost, ended_at = self._state is State.LOST, self._record.ended_at
        self._ending.announce(self, lost=lost)
        if self._untaken:  # never held by a task: no hold to count
            return
        held = (ended_at or self._core.clock()) - self._record.taken_at
        self._core.timings.ended(self.resource, held, lost=lost)

    def _finish(self, state: State, *, announce: bool = True) -> None:
        self._state = state
        self._record.ended_at = self._core.clock()
        if announce:
            self._announce_end()
        self._core.held.discard(self)
        for handle in (self._timer, self._limit):
            if handle is not None:
                handle.cancel()
        self._timer = self._limit = None
        extender, self._extender = self._extender, None
        if extender is not None and extender is not asyncio.current_task():
            extender.cancel()
