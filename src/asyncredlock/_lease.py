"""A held lock: validity from the monotonic clock, extension, release, loss."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import TracebackType

import anyio

from ._config import LockSpec, check_ttl
from ._core import Core
from ._errors import HoldLimitError, LockLostError, LostLeaseError, QuorumUnavailableError
from ._keeping import Keeping, State, lost_by
from ._log import log_block_orphaned, log_release_short
from ._node import Reply
from ._protocol import TOKEN_BLOCK, classify_flag
from ._quorum import Decision, Round
from ._refusal import why_unavailable
from ._stats import LeaseRecord, LeaseStatistics, Taken
from ._telemetry import RELEASE, traced

__all__ = ["Lease", "make_lease"]

_HELD = State.HELD  # (a global: faster to read than the enum's attribute, in `held`)


class Lease(Keeping):
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

    # how many times the lease was passed on since its acquisition (see `_hand_off`)
    _handoffs = 0

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
        record = LeaseRecord(taken, core.clock())
        super().__init__(
            core, spec, value=value, expires_at=expires_at, acquired=acquired, record=record
        )
        target = spec.target
        self._handoff = not spec.queued  # whether it may be passed on (not a rw writer's)
        self.resources = target.names
        self.key = target.keys[0]
        self.tokens = None if tokens is None else dict(zip(target.names, tokens, strict=True))
        self.token = tokens[0] if tokens is not None and len(tokens) == 1 else None
        # the tokens of the acquisition this lease descends from (see `_hand_off`)
        self._first_tokens = tokens
        self._keeper, self._extends = asyncio.get_running_loop(), spec.auto_extend
        if spec.auto_extend:
            # Extend once a third of the TTL is used up (at once for a lease passed
            # on with less validity than that), or when told.
            ttl = self.ttl
            self._extend_at(expires_at - 2 * ttl / 3 if extend_at is None else extend_at)

    def __repr__(self) -> str:
        shared = " shared" if self.shared else ""
        state = "lost" if self.lost else self._state.value
        return f"<Lease {self.resource!r}{shared} {state} validity={self.validity:.3f}s>"

    @property
    def held(self) -> bool:
        """Whether the lease is neither released nor lost (validity may still run out;
        see `lost` for a lease that outlived its event loop)."""
        return self._state is _HELD and not self.lost

    @property
    def lost(self) -> bool:
        """Whether the lease was lost: not extended in time, or taken away. A lease
        that outlived its event loop (closed with the lease still held, without
        ``aclose()``: nothing extends or ends it any more) is lost once its validity
        has run out if it extends itself, and once its ``max_hold`` is reached."""
        if self._state is not _HELD:
            return self._state is State.LOST
        # Nothing can mark such a lease lost (its loop is gone), so it is found so here;
        # read often, this reads the clock only once that loop is closed.
        return self._orphaned() and self._core.clock() >= self._lost_at()

    def _orphaned(self) -> bool:
        """Whether it is held on an event loop that closed (nothing extends or ends it)."""
        keeper = self._keeper
        return self._state is _HELD and keeper is not None and keeper.is_closed()

    def _lost_at(self) -> float:
        """(Orphaned.) When it would have ended lost on a running loop: its validity
        run out while it extended itself, or its max_hold reached."""
        return min(self._bound, self._expires_at) if self._extends else self._bound

    def statistics(self) -> LeaseStatistics:
        """How this lease was taken, and kept so far (see `LeaseStatistics`)."""
        now = self._core.clock()  # (orphaned: held until it would have been lost, at most)
        return self._record.snapshot(min(now, self._lost_at()) if self._orphaned() else now)

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
        `TypeError` for a non-callable, an async function, or one not taking the lease.
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
                automatic extensions (the next one due a third of it later).

        Raises:
            LockNotOwnedError: The lease is released or lost (before the round, or
                while it ran), or a majority of masters no longer holds it, or a
                quorum confirmed it only after the expiry this round set (``ttl``
                from before it was sent, less the drift allowance; what remains is
                then removed), or it reached its
                ``max_hold`` (it ends lost then, and is released). A
                `LostLeaseError` (also a `LockLostError`) whenever the lease is lost.
            QuorumUnavailableError: Too many masters failed to answer for a quorum
                to extend it (some may have answered that they no longer hold it,
                too few to outvote a quorum); the lease may be extended again, its
                validity unchanged (or cut to this round's ``ttl`` when shorter: some
                masters may have set it).
            TypeError: ``ttl`` is not a number (a ``bool`` is refused), before any I/O.
            ValueError: ``ttl`` is NaN, infinite, under 0.01 s or over 1e9 s, before
                any I/O.
        """
        new_ttl = self.ttl if ttl is None else check_ttl("ttl", ttl)
        self._core.check_loop()
        self._check_held("extend")
        decision = None if self._at_bound() else await self._extend_round(new_ttl)
        if self._at_bound():  # (also when it came while the round ran)
            self._reach_bound()  # (unless it ended meanwhile: then it says how)
        if self._bounded_out:
            raise self._not_owned(f"cannot extend {self.resource!r}: it reached its max_hold", ())
        if decision is None:
            self.ttl = min(new_ttl, self._max_hold)
            self._reschedule()  # the next automatic extension: by the new TTL
            return
        gone = f"{self.resource!r} is no longer held by this lease"
        if not self.held:  # it ended (released, or lost) while the round ran
            raise self._not_owned(f"{gone} (already {self._ended_as()})", decision.outcomes)
        if not (decision.reached or decision.refuted):  # failures may pass
            why = f"could not extend {self.resource!r}: {why_unavailable(decision)}"
            raise self._error(QuorumUnavailableError, why, decision)
        self._lose(decision, lost_by(decision))
        late = f"{self.resource!r}: extended too late, confirmed only after the expiry it set"
        raise self._not_owned(late if decision.reached else gone, decision.outcomes)

    async def release(self) -> None:
        """Release the lock on every master (compare-and-delete by this lease's value).

        Returns once a quorum confirmed; the remaining masters are released in the
        background, each after any call of this lease still running there. Waits
        at most ``max(node_timeout, socket_timeout)`` for the masters. Safe to cancel: the release
        goes on. If a majority no longer held the lock, the lease counts as lost
        (`lost` becomes true) and `LostLeaseError` is raised.

        Raises:
            LockNotOwnedError: The lease was already released or lost, or a majority
                of masters no longer held it. A `LostLeaseError` (also a
                `LockLostError`) whenever the lease is lost.
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
        raise self._not_owned(why, decision.outcomes)

    async def _release_round(self) -> Decision:
        """Release everywhere; a lease found gone on a majority ends lost, not released.

        ``wait_lost()`` wakes only once that is known: cancelled, the release goes on
        and its outcome is still taken, in the background.
        """
        core = self._core
        later = False
        try:
            try:
                rnd = self._send_release()
            finally:  # (after the send: while the masters work)
                self._finish(State.RELEASED, announce=False)
            deciding = core.decide(rnd, classify_flag, wait=core.timing.max_wait)
            core.counters.releases += 1
            try:
                decision = await traced(RELEASE, self, deciding)
            except asyncio.CancelledError:
                later = True
                core.tracker.job(self._released_later(rnd))
                raise
            self._judge_release(decision)
            return decision
        finally:
            if not later:
                self._announce_end()
            self._core.gates.exit(self._target.slot, self)  # the slot, if it holds it

    async def _released_later(self, rnd: Round) -> None:
        """The outcome of a release whose caller was cancelled (the release goes on):
        a loss, or a release short of a quorum (logged: no caller hears of it)."""
        try:
            core = self._core
            decision = await core.decide(rnd, classify_flag, wait=core.timing.max_wait)
            self._judge_release(decision)
            if not (decision.reached or decision.refuted):
                log_release_short(self, decision.outcomes)
        finally:
            self._announce_end()

    def _judge_release(self, decision: Decision) -> None:
        if decision.refuted:
            self._state, self._loss = State.LOST, decision
            self._count_loss(decision, "gone from a majority when released")

    # -- passing the lease on within the process -------------------------------

    def _hand_off(self) -> bool:
        """Pass this lease to the next task of this ``AsyncRedlock`` waiting for its
        key, with no call to the masters (the key keeps its value and TTL; the
        next lease keeps this one's validity); whether it was passed on.

        Its token is the next of this acquisition's block (the masters counted
        `TOKEN_BLOCK` up; their next acquisition gets at least ``token +
        TOKEN_BLOCK``). Only if neither side is a read-write lock's writer, the
        waiter extends its leases, half its TTL of validity is left (and no more
        than its ``max_hold``), the block
        has a token left (``TOKEN_BLOCK - 1`` hand-offs in a row at most), and a
        fenced waiter gets a token.
        """
        if self._state is not State.HELD or self.validity <= 0:
            return False
        gates, slot = self._core.gates, self._target.slot
        waiter = gates.successor(slot, self)  # only if this lease holds the key's slot
        if waiter is None:
            return False
        spec = waiter.spec
        if not spec.auto_extend or not self._handoff or spec.queued:
            return False
        handoffs = self._handoffs + 1
        if handoffs >= TOKEN_BLOCK or not spec.ttl / 2 <= self.validity <= spec.max_hold:
            return False  # (a key set past the waiter's bound is not its to take)
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
        successor._untaken = True  # counted as a hand-off once its task takes it
        self._finish(State.RELEASED)
        gates.hand(slot, waiter, successor)  # the slot goes with it
        return True

    def _take(self) -> None:
        """The task this lease was passed to takes it: a hand-off, and from now on a
        hold of its own (one passed on again, its task gone, is neither)."""
        self._untaken = False
        self._core.counters.handoffs += 1

    def _pass_on(self) -> None:
        """Hand the lease on, or release it in the background (its task gave up)."""
        if not self._hand_off():
            self._core.tracker.job(self._release_quietly())

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
        is cancelled only then, so what the scope swallows becomes that error), a
        `LostLeaseError` if the block's own call found the loss (it was not cancelled
        for it, or that call's `LostLeaseError` ends the block), or the release here
        did."""
        cancelled = self._ending.block_cancelled()
        swallowed = self._ending.exit_block(exc_type, exc, tb)
        if isinstance(exc, asyncio.CancelledError) and not swallowed:
            with anyio.CancelScope(shield=True):
                await self._release_quietly()
            return
        if self._state is State.LOST:
            if swallowed and _handling(exc):
                # the loss came while the block handled an exception (its cleanup, or
                # an except clause): shown in the chain, not made the cause
                raise self._lost_error()
            # found by the block's own release() (no cancellation), or extend()
            found = not cancelled or (
                isinstance(exc, LostLeaseError) and exc.resource == self.resource
            )
            raise self._lost_error(found=found) from (None if swallowed else exc)
        with anyio.CancelScope(shield=True):
            await self._release_quietly()
        if self.lost:  # the release found it gone on a majority: nothing was cancelled
            raise self._lost_error(found=True) from exc

    def _orphan(self, block: object, task: asyncio.Task[object]) -> None:
        """The task that entered this lease's ``async with`` block (of ``block``)
        ended with it open: its scope, in that task, is left alone (the block can no
        longer be cancelled), and a lease still held is kept until the block exits
        (logged)."""
        self._ending.scope = None
        if self._state is State.HELD:
            log_block_orphaned(self, block, task.get_name())

    async def _release_elsewhere(self) -> None:
        """End the block from another task than its own: its scope, entered in that
        task, is left alone (it cannot be exited here), and the lease is released."""
        self._ending.scope = None
        with anyio.CancelScope(shield=True):
            await self._release_quietly()

    async def _release_quietly(self) -> None:
        if self._state is not State.HELD or self._hand_off():
            return
        decision = await self._release_round()
        if not (decision.reached or decision.refuted):
            log_release_short(self, decision.outcomes)

    def _lost_error(self, *, found: bool = False) -> LockLostError:
        """The block's error for a lease that ended lost; ``found``: by the block's own
        `release` or `extend`, or the release at its exit (a `LostLeaseError`: the
        block was not cancelled for it)."""
        outcomes = self._loss.outcomes if self._loss else ()
        if self._bounded_out:
            message = f"the lease on {self.resource!r} reached its max_hold while its block ran"
            return HoldLimitError(message, resource=self.resource, outcomes=outcomes)
        if found:
            message = (
                f"the lease on {self.resource!r} was lost while its block ran"
                " (found by the block's own release() or extend(), or by the release"
                " at its exit)"
            )
            return LostLeaseError(message, resource=self.resource, outcomes=outcomes)
        message = f"the lease on {self.resource!r} was lost while its block ran"
        return LockLostError(message, resource=self.resource, outcomes=outcomes)


def _handling(cancelled: BaseException | None) -> bool:
    """Whether the loss's cancellation came while the block was handling an
    exception of its own (in a ``finally`` or an ``except`` clause)."""
    context = None if cancelled is None else cancelled.__context__
    return context is not None and not isinstance(context, asyncio.CancelledError)


def make_lease(
    core: Core,
    spec: LockSpec,
    value: str,
    expires_at: float,
    acquired: Sequence[asyncio.Future[Reply]],
    tokens: tuple[int, ...] | None,
    *,
    taken: Taken,
    extend_at: float | None = None,
) -> Lease:
    """The lease of an acquisition that succeeded (counted: a hand-over in
    ``handovers`` too)."""
    core.counters.acquisitions += 1
    if taken.source == "hand-over":
        core.counters.handovers += 1
    return Lease(
        core,
        spec,
        value=value,
        expires_at=expires_at,
        acquired=acquired,
        taken=taken,
        tokens=tokens,
        extend_at=extend_at,
    )
