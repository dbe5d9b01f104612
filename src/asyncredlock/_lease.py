"""A held lock: validity from the monotonic clock, extension, release, loss."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from ._config import LockSpec, check_seconds
from ._core import Core
from ._ending import Ending
from ._errors import LockLostError, LockNotOwnedError, QuorumUnavailableError, RedlockError
from ._log import log_extension_failed, log_lost, log_release_short
from ._node import Reply
from ._protocol import TOKEN_BLOCK, classify_flag, ms
from ._quorum import Decision, Round
from ._refusal import why_unavailable
from ._stats import LeaseRecord, LeaseStatistics, Taken
from ._telemetry import EXTEND, RELEASE, traced

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Lease"]

_GONE = "a majority of masters no longer hold it"


class _State(enum.Enum):
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


class Lease:
    """A lock held on a quorum of masters, returned by ``Lock.acquire()``.

    The lease extends itself in the background (unless ``auto_extend=False``) about
    every third of its TTL. If it cannot be extended before its validity ends it is
    *lost*: `lost` becomes true and, inside ``async with``, the block is
    cancelled and `LockLostError` raised at its exit.

    Attributes:
        resource: The resource name passed to ``lock()`` (for a lock on several
            resources, their names joined by ``", "``).
        resources: The resource names, in the order given to ``lock()``.
        key: The Redis key that holds the lock (the name after the prefix; for
            several resources, the first one's).
        keys: The Redis key of each resource.
        value: This holder's value in the lock key: the ``AsyncRedlock``'s
            ``identity``, a colon, and 128 random bits (from `secrets`) in hex.
        ttl: The time to live, in seconds, set on each extension.
        token: The fencing token: an ``int`` that strictly increases with each
            acquisition of the resource (committed on a majority of masters), for
            the resource to refuse writes from older holders; ``None`` when the
            lock was taken with ``fencing=False``, and for a lock on several
            resources (see ``tokens``).
        tokens: The fencing token of each resource, by name; ``None`` when the
            lock was taken with ``fencing=False``.
        shared: Whether this is a reader's lease of a read-write lock (held
            together with other readers, never with a writer); readers get no
            fencing token.
    """

    # Until set otherwise, per lease:
    _state = _State.HELD
    _loss: Decision | None = None
    _failing = False  # the last extension round failed
    # automatic extension: a timer until one is due, a task only while it runs
    _timer: asyncio.TimerHandle | None = None
    _extender: asyncio.Task[None] | None = None
    # how many times the lease was passed on since its acquisition (see `_hand_off`)
    _handoffs = 0
    _holder: Span | None = None  # the span current where it was acquired (see telemetry)

    def __init__(
        self,
        core: Core,
        spec: LockSpec,
        *,
        value: str,
        expires_at: float,
        acquired: Sequence[asyncio.Future[Reply]],
        taken: Taken,
        tokens: tuple[int, ...] | None = None,
        extend_at: float | None = None,
    ) -> None:
        self._core = core
        self._record = LeaseRecord(taken, core.clock())  # for statistics()
        # the id it was queued as, if handed over: its entry leaves every queue on release
        self._waiter = taken.waiter
        self._ending: Ending[Lease] = Ending()  # the block, wait_lost(), loss callbacks
        self._target = target = spec.target
        self.shared = spec.shared
        self._handoff = not spec.queued  # whether it may be passed on (not a rw writer's)
        self.resource = target.label
        self.resources = target.names
        self.key = target.keys[0]
        self.keys = target.keys
        self.value = value
        ttl = self.ttl = spec.ttl
        self.tokens = None if tokens is None else dict(zip(target.names, tokens, strict=True))
        self.token = tokens[0] if tokens is not None and len(tokens) == 1 else None
        self._expires_at = expires_at
        # each master's reply to the acquisition: which masters hold something of ours
        self._acquired = tuple(acquired)
        # the tokens of the acquisition this lease descends from (see `_hand_off`)
        self._first_tokens = tokens
        core.held.add(self)
        if spec.auto_extend:
            # Extend once a third of the TTL is used up (at once for a lease passed
            # on with less validity than that), or when told.
            self._extend_at(expires_at - 2 * ttl / 3 if extend_at is None else extend_at)

    def __repr__(self) -> str:
        return f"<Lease {self.resource!r} {self._state.value} validity={self.validity:.3f}s>"

    @property
    def validity(self) -> float:
        """Seconds the lock is still held for, under Redlock's timing assumptions.

        Measured with the monotonic clock from before the acquisition (or last
        extension) was sent, less the drift allowance; 0 once lost or released.
        """
        if self._state is not _State.HELD:
            return 0.0
        return max(0.0, self._expires_at - self._core.clock())

    @property
    def held(self) -> bool:
        """Whether the lease is neither released nor lost (validity may still run out)."""
        return self._state is _State.HELD

    @property
    def lost(self) -> bool:
        """Whether the lease was lost: not extended in time, or taken away."""
        return self._state is _State.LOST

    def statistics(self) -> LeaseStatistics:
        """How this lease was taken, and kept so far (see `LeaseStatistics`)."""
        return self._record.snapshot(self._core.clock())

    async def wait_lost(self) -> bool:
        """Wait until the lease ends, by loss or by release.

        For an explicitly acquired lease this is how its holder learns of a loss
        without polling (inside ``async with`` the block is cancelled instead).

        Returns:
            ``True`` if the lease was lost, ``False`` if it was released.
        """
        return await self._ending.wait()

    def add_lost_callback(self, callback: Callable[[Lease], object]) -> None:
        """Call ``callback(lease)`` when the lease is lost.

        For code that runs outside the lease's ``async with`` block and must
        stop once the lock is gone (a loop publishing as the leader). The call
        is scheduled on the event loop (``loop.call_soon``): soon after the
        loss, or soon after this call if the lease is lost already; never if it
        is released. An exception it raises goes to the loop's exception handler.
        `TypeError` for a non-callable or an async function.
        """
        self._ending.add(callback, self)

    def remove_lost_callback(self, callback: Callable[[Lease], object]) -> int:
        """Remove ``callback`` from the loss callbacks; returns how many were removed."""
        return self._ending.remove(callback)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lock's time to live on a quorum of masters.

        Args:
            ttl: New time to live in seconds; the lease's ``ttl`` when omitted.
                Once the extension succeeds it also becomes the TTL of later
                automatic extensions.

        Raises:
            LockNotOwnedError: The lease is released, lost, or a majority of masters
                no longer holds it (what remains is then removed).
            QuorumUnavailableError: Too many masters failed to answer; the lease
                keeps its previous validity and may be extended again.
        """
        new_ttl = self.ttl if ttl is None else check_seconds("ttl", ttl)
        self._core.check_loop()
        self._check_held("extend")
        decision = await self._extend_round(new_ttl)
        if decision is None:
            self.ttl = new_ttl
            return
        if decision.unavailable:
            why = f"could not extend {self.resource!r}: {why_unavailable(decision)}"
            raise self._error(QuorumUnavailableError, why, decision)
        self._lose(decision, _GONE)
        why = f"{self.resource!r} is no longer held by this lease"
        raise self._error(LockNotOwnedError, why, decision)

    async def release(self) -> None:
        """Release the lock on every master (compare-and-delete by this lease's value).

        Returns once a quorum confirmed; the remaining masters are released in the
        background, each after any call of this lease still running there. Waits
        at most ``max(node_timeout, socket_timeout)`` for the masters. Safe to cancel: the release
        goes on. If a majority no longer held the lock, the lease counts as lost
        (`lost` becomes true) and `LockNotOwnedError` is raised.

        Raises:
            LockNotOwnedError: The lease was already released or lost, or a majority
                of masters no longer held it.
            QuorumUnavailableError: Too many masters failed to answer; their keys
                expire with the TTL.
        """
        self._core.check_loop()  # before anything changes: the lease stays held
        self._check_held("release")
        if self._hand_off():
            return
        decision = await self._release_round()
        if decision.reached:
            return
        if not self.lost:
            why = f"released {self.resource!r} on too few masters ({why_unavailable(decision)})"
            raise self._error(
                QuorumUnavailableError, f"{why}; the rest expire with the TTL", decision
            )
        why = f"{self.resource!r} was no longer held by this lease when released"
        raise self._error(LockNotOwnedError, why, decision)

    def _error(self, kind: type[RedlockError], message: str, decision: Decision) -> RedlockError:
        """An error about this lease, with the masters' answers in ``decision``."""
        return kind(message, resource=self.resource, outcomes=decision.outcomes)

    def _check_held(self, what: str) -> None:
        if self._state is _State.HELD:
            return
        raise LockNotOwnedError(
            f"cannot {what} {self.resource!r}: the lease is already {self._state.value}",
            resource=self.resource,
            outcomes=self._loss.outcomes if self._loss else (),
        )

    # -- per-master steps -------------------------------------------------------

    async def _extend_round(self, ttl: float) -> Decision | None:
        """One extension round; ``None`` when it succeeded."""
        core = self._core
        start = core.clock()
        args = (self.value, ms(ttl))
        rnd = core.extend_round(self.keys, self._acquired, args, shared=self.shared)
        # Waiting past the validity is pointless: by then the lease is lost anyway.
        left = max(core.settings.node_timeout, self._expires_at - core.clock())
        wait = min(left, core.timing.max_wait)
        expires_at = core.expiry(start, ttl)

        def accepted(decision: Decision) -> bool:
            return self._state is _State.HELD and decision.holds(expires_at, core.clock)

        decision = await traced(EXTEND, self, core.decide(rnd, classify_flag, wait=wait), accepted)
        if accepted(decision):
            self._expires_at, self._failing = expires_at, False
            core.counters.extensions += 1
            self._record.extensions += 1
            return None
        core.counters.failed_extensions += 1
        self._record.failed_extensions += 1
        log_extension_failed(self, decision.outcomes, decision.unavailable, self._failing)
        self._failing = True  # until an extension succeeds: later failures log at DEBUG
        return decision

    async def _release_round(self) -> Decision:
        """Release everywhere; a lease found gone on a majority ends lost, not released.

        ``wait_lost()`` wakes only once that is known (or the release is cancelled).
        """
        core = self._core
        self._finish(_State.RELEASED, announce=False)
        try:
            deciding = core.decide(self._send_release(), classify_flag, wait=core.timing.max_wait)
            core.counters.releases += 1
            decision = await traced(RELEASE, self, deciding)
            if not decision.reached and not decision.unavailable:
                core.counters.lost += 1
                self._state, self._loss = _State.LOST, decision
                log_lost(self, decision.outcomes, "gone from a majority when released")
            return decision
        finally:
            self._announce_end()
            self._core.gates.exit(self._target.slot, self)  # the slot, if it holds it

    def _send_release(self) -> Round:
        """Compare-and-delete on every master, each behind this lease's calls there."""
        return self._core.release_round(
            self.keys, self.value, self._acquired, self.ttl, shared=self.shared, waiter=self._waiter
        )

    # -- passing the lease on within the process -------------------------------

    def _hand_off(self) -> bool:
        """Pass this lease to the next task of this ``AsyncRedlock`` waiting for its
        key, with no call to the masters (the key keeps its value and TTL; the
        next lease keeps this one's validity); whether it was passed on.

        Its token is the next of this acquisition's block (the masters counted
        `TOKEN_BLOCK` up; their next acquisition gets at least ``token +
        TOKEN_BLOCK``). Only if neither side is a read-write lock's writer, the
        waiter extends its leases, half its TTL of validity is left, the block
        has a token left (``TOKEN_BLOCK - 1`` hand-offs in a row at most), and a
        fenced waiter gets a token.
        """
        if self._state is not _State.HELD or self.validity <= 0:
            return False
        gates, slot = self._core.gates, self._target.slot
        waiter = gates.successor(slot, self)  # only if this lease holds the key's slot
        if waiter is None:
            return False
        spec = waiter.spec
        if not spec.auto_extend or not self._handoff or spec.queued:
            return False
        handoffs = self._handoffs + 1
        if handoffs >= TOKEN_BLOCK or self.validity < spec.ttl / 2:
            return False
        tokens: tuple[int, ...] | None = None
        if spec.fencing:
            if self._first_tokens is None:
                return False
            tokens = tuple(token + handoffs for token in self._first_tokens)
        core = self._core
        successor = Lease(
            core,
            spec,
            value=self.value,
            expires_at=self._expires_at,
            acquired=self._acquired,
            taken=Taken("hand-off", 0, waiter.started, self._waiter),
            tokens=tokens,
        )
        successor._first_tokens, successor._handoffs = self._first_tokens, handoffs
        self._finish(_State.RELEASED)
        core.counters.handoffs += 1
        gates.hand(slot, waiter, successor)  # the slot goes with it
        return True

    def _pass_on(self) -> None:
        """Hand the lease on, or release it in the background (its task gave up)."""
        if not self._hand_off():
            self._core.tracker.job(self._release_quietly())

    # -- automatic extension and loss --------------------------------------------

    def _extend_at(self, when: float) -> None:
        """Schedule the next automatic extension (by the lease's clock)."""
        delay = max(0.0, min(when, self._expires_at) - self._core.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._extension_due)

    def _extension_due(self) -> None:
        self._timer = None
        if self._state is _State.HELD:
            self._extender = self._core.tracker.loop(self._extend_once())

    async def _extend_once(self) -> None:
        """One automatic extension; schedules the next, or ends the lease lost."""
        core = self._core
        if core.clock() >= self._expires_at:
            self._lose(self._loss, "not extended before its validity ran out")
            return
        start = core.clock()
        decision = await self._extend_round(self.ttl)
        self._extender = None
        if decision is None:
            self._extend_at(start + self.ttl / 3)
        elif not decision.unavailable:
            self._lose(decision, _GONE)
        else:
            self._loss = decision
            self._extend_at(core.clock() + min(self.ttl / 12, core.settings.retry_delay))

    def _lose(self, decision: Decision | None, reason: str) -> None:
        """Mark the lease lost (``reason``: why, for the log), cancel its block, and
        remove what it still holds."""
        if self._state is not _State.HELD:
            return
        self._loss = decision
        self._core.counters.lost += 1
        log_lost(self, decision.outcomes if decision else (), reason)
        self._finish(_State.LOST)
        self._ending.cancel_block()
        if not self._core.closed:
            self._send_release()
        self._core.gates.exit(self._target.slot, self)  # the slot, if it holds it

    def _announce_end(self) -> None:
        """The end is known (released or lost): tell `Ending`, count its hold time."""
        lost, ended_at = self._state is _State.LOST, self._record.ended_at
        self._ending.announce(self, lost=lost)
        held = (ended_at or self._core.clock()) - self._record.taken_at
        self._core.timings.ended(self.resource, held, lost=lost)

    def _finish(self, state: _State, *, announce: bool = True) -> None:
        self._state = state
        self._record.ended_at = self._core.clock()
        if announce:
            self._announce_end()
        self._core.held.discard(self)
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        extender, self._extender = self._extender, None
        if extender is not None and extender is not asyncio.current_task():
            extender.cancel()

    # -- the async with block ---------------------------------------------------

    def _enter_block(self) -> None:
        self._ending.enter_block()

    async def _exit_block(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End the block: release; `LockLostError` if the lease was lost (its scope
        is cancelled only then, so what the scope swallows becomes that error)."""
        swallowed = self._ending.exit_block(exc_type, exc, tb)
        if isinstance(exc, asyncio.CancelledError) and not swallowed:
            with anyio.CancelScope(shield=True):
                await self._release_quietly()
            return
        if self._state is _State.LOST:
            raise self._lost_error() from (None if swallowed else exc)
        with anyio.CancelScope(shield=True):
            await self._release_quietly()
        if self.lost:  # the release found it gone on a majority
            raise self._lost_error() from exc

    async def _release_quietly(self) -> None:
        if self._state is not _State.HELD or self._hand_off():
            return
        decision = await self._release_round()
        if decision.unavailable:
            log_release_short(self, decision.outcomes)

    def _lost_error(self) -> RedlockError:
        outcomes = self._loss.outcomes if self._loss else ()
        message = f"the lease on {self.resource!r} was lost while its block ran"
        return LockLostError(message, resource=self.resource, outcomes=outcomes)
