"""``Lock``: what to lock and how; each acquisition gives a `Lease`."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio

from ._config import check_seconds
from ._core import Core
from ._errors import LockTimeoutError, NodeOutcome, QuorumUnavailableError, RedlockError
from ._gate import LocalTimeoutError, Waiter
from ._keys import Resources, channel, key_slot, lock_key
from ._lease import Lease
from ._node import Reply
from ._protocol import QueueEntry, QueueTrace, classify_acquire, classify_commit, fence_tokens
from ._quorum import Decision
from ._wakeup import Ticket, waiter_id

__all__ = ["Lock"]


class Lock:
    """A distributed lock on one resource or several, made by ``AsyncRedlock.lock()``.

    A ``Lock`` holds no state on the masters: each `acquire` returns a new
    `Lease`, and ``async with lock as lease:`` acquires, keeps the lease
    extended while the block runs, and releases it at the end. The same ``Lock``
    may be used by many tasks at once; each gets its own lease. A lock on several
    resources takes all of them or none on each master, in one script.

    Attributes:
        name: The resource name (for several resources, their names joined by
            ``", "``).
        names: The resource names, in the order given.
        key: The Redis key (the name after the ``AsyncRedlock``'s prefix; for
            several resources, the first one's).
        keys: The Redis key of each resource.
        ttl: Time to live of the key, in seconds.
        timeout: How long `acquire` waits for a contended lock, in seconds
            (``0``: one attempt; ``math.inf``: no limit).
        auto_extend: Whether leases extend themselves until released.
        fencing: Whether leases carry a fencing token (two phases per
            acquisition instead of one).
        fair: Whether waiters are served in arrival order, through a queue on
            the masters.
        shared: Whether this is the read side of a read-write lock
            (``rwlock(name).read()``): its leases are held by many readers at
            once, never with a writer.
    """

    def __init__(
        self,
        core: Core,
        *,
        target: Resources,
        ttl: float,
        timeout: float,
        auto_extend: bool,
        fencing: bool,
        fair: bool = False,
        shared: bool = False,
        rw: bool = False,
        patience: float = math.inf,
    ) -> None:
        self._core = core
        self._target = target
        self.name = target.label
        self.names = target.names
        self.key = target.keys[0]
        self.keys = target.keys
        self._slot = target.slot
        self.ttl = ttl
        self.timeout = timeout
        self.auto_extend = auto_extend
        self.fencing = fencing
        self.fair = fair
        self.shared = shared
        # a fair or read-write lock: attempts through acquire_rw.lua, with a queue
        # entry; a writer of a read-write lock queues after ``patience`` seconds
        self._rw = rw or fair
        self._patience = patience
        self._entered: dict[asyncio.Task[Any] | None, list[Lease]] = {}

    @classmethod
    def make(
        cls,
        core: Core,
        names: tuple[str, ...],
        *,
        ttl: float | None,
        timeout: float | None,
        auto_extend: bool | None,
        fencing: bool | None,
        fair: bool,
        shared: bool = False,
        rw: bool = False,
        patience: float = math.inf,
    ) -> Self:
        """Check the settings, fill in ``core``'s defaults, and make the lock."""
        settings = core.settings
        if core.closed:
            raise RuntimeError("this AsyncRedlock is closed")
        keys = tuple(lock_key(settings.prefix, each) for each in names)
        if len(keys) > 1 and any(node.cluster for node in core.nodes):
            slots = {key_slot(key) for key in keys}
            if len(slots) > 1:
                raise ValueError(
                    f"the keys of {', '.join(map(repr, names))} are in {len(slots)} cluster"
                    " slots; a lock on several resources runs one script per master, so"
                    ' their keys must share a hash tag, e.g. "{order:7}:items"'
                )
        ttl = settings.ttl if ttl is None else check_seconds("ttl", ttl)
        if timeout is None:
            timeout = settings.timeout
        timeout = check_seconds("timeout", timeout, allow_zero=True, allow_inf=True)
        if auto_extend is None:
            auto_extend = settings.auto_extend
        elif not isinstance(auto_extend, bool):
            raise TypeError("auto_extend must be a bool")
        if fencing is None:
            fencing = settings.fencing
        elif not isinstance(fencing, bool):
            raise TypeError("fencing must be a bool")
        return cls(
            core,
            target=Resources(names, keys),
            fair=fair,
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            fencing=fencing,
            shared=shared,
            rw=rw,
            patience=patience,
        )

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} ttl={self.ttl:g}s timeout={self.timeout:g}s>"

    async def acquire(self) -> Lease:
        """Take the lock on a quorum of masters, retrying until ``timeout``.

        Each attempt sends ``SET NX PX`` to every master at once and succeeds when
        a majority granted it with validity left. With fencing, each granting
        master also counts the resource's fence counter up; the largest count is
        the token, committed in a second round on the masters that granted, and
        the attempt succeeds only if a majority commits it (the second round is
        skipped when a majority returned that very count). A failed attempt is
        undone on every master; between attempts the task sleeps a jittered
        delay, or less: a waiting acquisition listens for the holder's release
        (announced by the masters) and retries as soon as it is heard, and never
        sleeps past the holder's remaining TTL. Waiters of different clients
        (processes) queue on the masters in arrival order: a release is announced
        to the first of them only, and if its lease extends itself the masters
        hand it the key in the release itself (its validity then counts from its
        last attempt, and the key lives its queue entry's TTL, about a second,
        until the lease extends it).

        Tasks of the same ``AsyncRedlock`` that want the same key queue in
        arrival order, and only the first of them sends attempts to the masters
        (fair locks and readers do not queue here: each task asks the masters).
        When a lease is released while another task of the same ``AsyncRedlock``
        waits for its key, it is passed straight to that task, without a call to
        the masters, if that task's lease extends itself (the default), at least
        half its TTL of validity is left, and fewer than 63 such hand-offs came in
        a row; the new lease gets the next fencing token. Writers of a read-write
        lock are never passed a lease, nor pass theirs on: a released write lock
        goes back to the masters, where readers may take it.

        Safe to cancel, also under ``asyncio.timeout()`` or
        ``anyio.fail_after()``: what the interrupted attempt took is released in
        the background, and a lease passed to a task that was cancelled
        meanwhile goes on to the next one (or is released).

        Returns:
            The lease, already extending itself unless ``auto_extend=False``.

        Raises:
            LockTimeoutError: Other holders kept the lock for the whole timeout.
            QuorumUnavailableError: So many masters failed or stayed silent in the
                last attempt that no quorum was possible (an outage).
            RuntimeError: The ``AsyncRedlock`` is closed.
        """
        core = self._core
        started = core.clock()
        # its place in the masters' queue, should it wait there (this client's clock)
        arrival = time.time_ns() // 1000
        deadline = started + self.timeout
        if self.fair or self.shared:
            # Each task asks the masters itself: fair waiters queue there, and
            # readers do not exclude one another.
            return await self._acquire(started, deadline, arrival)
        gates = core.gates
        if gates.busy(self._slot):
            handed = await self._queue(deadline)
            if handed is not None:
                return handed
        else:
            gates.claim(self._slot)
        lease: Lease | None = None
        try:
            lease = await self._acquire(started, deadline, arrival)
            gates.hold(self._slot, lease)
            lease._gates = gates
            return lease
        finally:
            if lease is None:
                gates.exit(self._slot)

    async def _queue(self, deadline: float) -> Lease | None:
        """Wait behind the task of this ``AsyncRedlock`` that holds the key's slot:
        for its lease, or for the slot."""
        core = self._core
        counters = core.counters
        if self.timeout == 0:
            counters.timeouts += 1
            raise self._busy_error()
        waiter = Waiter(
            self._target, self.ttl, self.auto_extend, self.fencing, handoff=not self._rw
        )
        try:
            passed = await core.gates.wait(self._slot, waiter, max(0.0, deadline - core.clock()))
        except LocalTimeoutError:
            counters.timeouts += 1
            raise self._busy_error() from None
        # the gates hold leases (of this module's kind) without knowing the class
        assert passed is None or isinstance(passed, Lease)
        return passed

    def _busy_error(self) -> LockTimeoutError:
        wait = "one attempt" if self.timeout == 0 else f"{self.timeout:g} s"
        return LockTimeoutError(
            f"could not lock {self.name!r} within {wait}: held by another task of"
            " this AsyncRedlock",
            resource=self.name,
            outcomes=(),
        )

    async def _acquire(self, started: float, deadline: float, arrival: int) -> Lease:
        """Attempts on the masters until one takes the lock or ``deadline`` passes."""
        core = self._core
        # Fair and read-write locks queue from the start; other locks on one
        # resource once refused (the queue orders waiters of different clients),
        # or from the start when this client's last acquire() of it had to wait.
        contended = core.contended
        single = len(self.keys) == 1
        entry = self._entry(arrival) if self._rw or (single and self.key in contended) else None
        trace = QueueTrace(len(core.nodes)) if entry is not None else None
        ticket: Ticket | None = None
        # when each attempt that could leave hand-over terms was sent, by its value
        starts: dict[str, float] = {}
        waker = core.waker
        # whether its wake-ups come through the inbox only (writers, but those of a
        # read-write lock that is not fair: they also listen on the lock's channel)
        inbox_only = not self.shared and (self.fair or not self._rw)
        acquired = False
        first = True  # the first attempt of this acquire()
        handed_by: frozenset[int] = frozenset()  # the masters that handed it the lease
        try:
            while True:
                if ticket is not None and len(ticket.handed) >= core.quorum:
                    assert entry is not None
                    taken = await self._take_handed(entry, ticket, starts)
                    if taken is not None:
                        acquired = True
                        lease, handed_by = taken
                        return lease
                if ticket is None and entry is not None and inbox_only and waker.inbox_ready():
                    # Its inbox is listened to already: a release after this attempt
                    # (which queues it) is heard, and no retry is needed to catch one
                    # before. It is enrolled first, so that none goes unheard.
                    ticket = await waker.enroll((), waiter=entry.waiter)
                # A writer out of patience queues: readers that come later wait for it.
                impatient = not self.shared and core.clock() - started >= self._patience
                # hand-over terms only once enrolled: a hand-over is then always heard
                outcome = await self._attempt(
                    entry,
                    self.fair or impatient,
                    trace,
                    starts,
                    terms=ticket is not None and waker.inbox_ready(),
                )
                if isinstance(outcome, Lease):
                    acquired = True
                    if first:
                        contended.pop(self.key, None)  # no contention this time
                    return outcome
                first = False
                if deadline - core.clock() <= 0:
                    if ticket is not None and len(ticket.handed) >= core.quorum:
                        continue  # handed the lock meanwhile: take it (top of the loop)
                    raise self._failure(outcome)
                if core.closed:
                    raise RuntimeError("this AsyncRedlock was closed while acquire() waited")
                if entry is None and single:
                    entry = self._entry(arrival)
                    trace = QueueTrace(len(core.nodes))
                if single:
                    core.mark_contended(self.key)
                if ticket is None and not outcome.decision.unavailable:
                    # Listen for the release, then try again at once: a release
                    # before the subscription is seen by that attempt, one after
                    # it is announced. No wake-up is lost in between. A release
                    # announces the first writer of the masters' queue to its
                    # client's inbox: only that waiter goes. Readers (all woken:
                    # several may go at once), waiters of several resources and
                    # writers of read-write locks (queued only while a queue
                    # exists) also listen on the lock's channel.
                    with anyio.move_on_after(max(0.0, deadline - core.clock())):
                        broadcast = entry is None or not inbox_only
                        channels = [channel(key) for key in self.keys] if broadcast else []
                        ticket = await waker.enroll(
                            channels,
                            everyone=self.shared,
                            waiter=None if entry is None else entry.waiter,
                        )
                    continue
                pause = min(core.retry_pause(), outcome.free_in, deadline - core.clock())
                if ticket is None:
                    await anyio.sleep(max(0.0, pause))
                else:
                    await core.waker.wait(ticket, max(0.0, pause))
        finally:
            if ticket is not None:
                core.waker.leave(ticket, acquired=acquired)
            if entry is not None and trace is not None:
                # a granted waiter may still be listed by the masters that refused;
                # a key handed to it that it is not using is given back; the masters
                # that handed it the lease took it out of their queue already
                core.dequeue(
                    self.key,
                    entry,
                    trace,
                    everywhere=self.fair,
                    drop=not handed_by,
                    skip=handed_by,
                )

    def _entry(self, arrival: int) -> QueueEntry:
        """This ``acquire()``'s place in the masters' queue (its entry lives three
        retry delays and node timeouts unless an attempt refreshes it). A writer
        whose lease extends itself may be handed the key by a release, for no
        longer than its entry lives (should it have died, the key frees itself as
        soon as its entry would have lapsed); its lease then extends it."""
        settings = self._core.settings
        ttl = max(1.0, 3 * (settings.retry_delay + settings.node_timeout))
        return QueueEntry(
            waiter=waiter_id(self._core.waker.client, reader=self.shared),
            score=arrival,
            ttl=ttl,
            handover=None if self.shared or not self.auto_extend else secrets.token_hex(16),
            handover_ttl=min(ttl, self.ttl),
        )

    async def _take_handed(
        self, entry: QueueEntry, ticket: Ticket, starts: dict[str, float]
    ) -> tuple[Lease, frozenset[int]] | None:
        """The lease of a key that a quorum of masters handed to this waiter, and
        which masters did; or None (then given back where it was handed).

        A master hands the key over (``release.lua``) with the terms of the last
        attempt it queued the waiter with, so after that attempt was sent: the key
        lives there at least until that attempt's start plus the hand-over TTL, by
        this client's clock (less the drift allowance). The validity is the
        quorum-th longest of those. With fencing, the token is the largest count a
        master returned, committed in a second round unless a quorum returned it.
        """
        core = self._core
        assert entry.handover is not None
        now = core.clock()
        # per master that handed it the key: until when the key surely lives there
        live: dict[int, tuple[float, int]] = {}
        for i, (attempt, count) in ticket.handed.items():
            start = starts.get(attempt)
            if start is not None and (expiry := core.expiry(start, entry.handover_ttl)) > now:
                live[i] = (expiry, count)
        # keys it cannot count on (their attempt forgotten, or as good as expired)
        core.drop_handed(self.key, entry, [i for i in ticket.handed if i not in live])
        ticket.handed = {i: ticket.handed[i] for i in live}
        if len(live) < core.quorum:
            return None  # the others may still hand it over
        ticket.handed = {}
        expiries = sorted((expiry for expiry, _ in live.values()), reverse=True)
        acquired = [_granted() for _ in core.nodes]
        tokens: tuple[int, ...] | None = None
        usable = True
        if self.fencing:
            counts = [count for _, count in live.values()]
            tokens = (max(counts),)
            if counts.count(tokens[0]) < core.quorum:
                second = core.commit_round(self.keys, entry.handover, tokens, acquired)
                decision = await core.decide(second, classify_commit)
                usable = decision.reached
        if not usable or expiries[core.quorum - 1] <= core.clock():
            core.drop_handed(self.key, entry, live)
            return None
        expires_at = expiries[core.quorum - 1]
        now = core.clock()
        # the key lives a hand-over TTL: extended to the lease's own TTL once a third
        # of that is used (a short hold never needs to)
        extend_at = now + (expires_at - now) / 3
        lease = self._lease(entry.handover, expires_at, acquired, tokens, extend_at=extend_at)
        return lease, frozenset(live)

    def _lease(
        self,
        value: str,
        expires_at: float,
        acquired: Sequence[asyncio.Future[Reply]],
        tokens: tuple[int, ...] | None,
        *,
        extend_at: float | None = None,
    ) -> Lease:
        """The lease of an acquisition that succeeded (counted)."""
        self._core.counters.acquisitions += 1
        return Lease(
            self._core,
            target=self._target,
            value=value,
            ttl=self.ttl,
            expires_at=expires_at,
            acquired=acquired,
            auto_extend=self.auto_extend,
            tokens=tokens,
            shared=self.shared,
            handoff=not self._rw,
            extend_at=extend_at,
        )

    async def _attempt(
        self,
        entry: QueueEntry | None,
        queue: bool,
        trace: QueueTrace | None,
        starts: dict[str, float],
        *,
        terms: bool,
    ) -> Lease | _Failed:
        core = self._core
        value = secrets.token_hex(16)
        start = core.clock()
        if not terms and entry is not None and entry.handover is not None:
            entry = dataclasses.replace(entry, handover=None)
        if entry is not None and entry.handover is not None:
            starts[value] = start
            if len(starts) > _ATTEMPTS_KEPT:
                del starts[next(iter(starts))]
        core.counters.attempts += 1
        expires_at = core.expiry(start, self.ttl)
        rnd = core.acquire_round(
            self.keys,
            value,
            self.ttl,
            fencing=self.fencing,
            entry=entry,
            rw=self._rw,
            shared=self.shared,
            queue=queue,
        )
        if trace is not None:
            trace.add(rnd.tasks)
        tokens: tuple[int, ...] | None = None
        try:
            decision = await core.decide(rnd, classify_acquire)
            if self.fencing and decision.holds(expires_at, core.clock()):
                tokens, committed = fence_tokens(rnd.tasks, core.quorum)
                if not committed:
                    second = core.commit_round(self.keys, value, tokens, rnd.tasks)
                    decision = await core.decide(second, classify_commit)
        except BaseException:
            core.undo(self.keys, value, rnd.tasks, self.ttl, shared=self.shared)
            raise
        if decision.holds(expires_at, core.clock()):
            return self._lease(value, expires_at, rnd.tasks, tokens)
        core.counters.failed_attempts += 1
        core.undo(self.keys, value, rnd.tasks, self.ttl, shared=self.shared)
        free_in = _free_in(rnd.tasks)
        if decision.reached:
            decision = _expired(decision, core.clock() - start, self.ttl)
            return _Failed(decision, expired=True, free_in=free_in)
        return _Failed(decision, expired=False, free_in=free_in)

    def _failure(self, failed: _Failed) -> RedlockError:
        decision = failed.decision
        counters = self._core.counters
        if decision.unavailable:
            counters.unavailable += 1
            return QuorumUnavailableError(
                f"could not lock {self.name!r}: too many masters failed or did not answer",
                resource=self.name,
                outcomes=decision.outcomes,
            )
        counters.timeouts += 1
        wait = "one attempt" if self.timeout == 0 else f"{self.timeout:g} s"
        why = (
            "the masters answered too slowly for the TTL"
            if failed.expired
            else "held by another holder"
        )
        return LockTimeoutError(
            f"could not lock {self.name!r} within {wait}: {why}",
            resource=self.name,
            outcomes=decision.outcomes,
        )

    async def __aenter__(self) -> Lease:
        lease = await self.acquire()
        lease._enter_block()
        self._entered.setdefault(asyncio.current_task(), []).append(lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task = asyncio.current_task()
        stack = self._entered[task]
        lease = stack.pop()
        if not stack:
            del self._entered[task]
        return await lease._exit_block(exc_type, exc, tb)


@dataclass(frozen=True, slots=True)
class _Failed:
    """An attempt that did not take the lock: the counted replies, whether a
    quorum did grant it but too late (validity used up), and in how many seconds
    the holder's keys expire (``inf`` when not known). Its undo is on its way,
    ahead of any later attempt on each master's connection."""

    decision: Decision
    expired: bool
    free_in: float = math.inf


#: How many of its latest attempts a waiter remembers the start of: a master hands
#: the key over with the terms of the last attempt it saw, one of the latest.
_ATTEMPTS_KEPT = 32


def _granted() -> asyncio.Future[Reply]:
    """A settled "granted" reply: what a lease handed over by the masters records
    for every master, so that its release and extension go to all of them (the
    scripts change nothing where the key does not hold its value)."""
    future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    future.set_result(Reply([1]))
    return future


def _free_in(replies: Sequence[asyncio.Future[Reply]]) -> float:
    """The median time to live the masters reported for another holder's key:
    about when that holder's lock expires if it is not released."""
    pttls = sorted(
        max(0, int(reply.value[1]))
        for reply in (f.result() for f in replies if f.done())
        if reply.error is None and int(reply.value[0]) == 0 and int(reply.value[1]) >= 0
    )
    if not pttls:
        return math.inf
    return pttls[len(pttls) // 2] / 1000


def _expired(decision: Decision, elapsed: float, ttl: float) -> Decision:
    """A quorum that came too late: say so in every granting master's outcome."""
    note = f"granted, but validity was used up ({elapsed:.3f} s elapsed of ttl {ttl:g} s)"
    outcomes = tuple(NodeOutcome(o.node, False, note) if o.ok else o for o in decision.outcomes)
    return Decision(0, decision.yes + decision.no, decision.failed, outcomes, decision.pending)
