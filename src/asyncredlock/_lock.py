"""``Lock``: what to lock and how; each acquisition gives a `Lease`."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self

from ._attempt import Acquisition
from ._blocks import (
    ENDED,
    Entered,
    Owner,
    by_frame,
    drop_ended,
    exits_by_frame,
    latest,
    may_exit_elsewhere,
)
from ._config import LockOptions, LockSpec, Role
from ._core import Core, refuse_if_closing
from ._errors import LockTimeoutError, QuorumUnavailableError
from ._gate import LocalTimeoutError, Waiter
from ._keys import Resources, key_slot, lock_key
from ._lease import Lease
from ._stats import LockCounters, LockStatistics
from ._telemetry import ACQUIRE, end_span, holder_span, record_acquire, start_span

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["SPECS_KEPT", "Lock"]

#: How many lock specs an ``AsyncRedlock`` keeps (see `Lock.make`).
SPECS_KEPT = 1024


class Lock:
    """A distributed lock on one resource or several, made by ``AsyncRedlock.lock()``.

    A ``Lock`` holds no state on the masters: each `acquire` returns a new
    `Lease`, and ``async with lock as lease:`` acquires, keeps the lease
    extended while the block runs, and releases it at the end. The same ``Lock``
    may be used by many tasks at once; each gets its own lease. A lock on several
    resources takes all of them or none on each master, in one script.

    A block is exited by the task that entered it (its cancellation on a lost lease
    works within that task only). Exited by another task (an async generator closed
    or finalised elsewhere), it releases that block's lease (found by the frame of the
    ``async with``) and raises `RuntimeError` (a lease found lost is said so, its
    `LockLostError` the cause); entered and exited by hand from two frames, it
    releases the lease only if it is this ``Lock``'s only such block. To hold a lock
    across tasks, use `acquire` and ``lease.release()``. A task that ends with a
    block open (a generator suspended inside it) leaves it held, with a WARNING: its
    lease is kept until the block exits or max_hold ends it.

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
        max_hold: The longest a lease is held, in seconds (``math.inf``: no bound).
        fencing: Whether leases carry a fencing token (two phases per
            acquisition instead of one).
        fair: Whether waiters are served in arrival order, through a queue on
            the masters.
        shared: Whether this is the read side of a read-write lock
            (``rwlock(name).read()``): its leases are held by many readers at
            once, never with a writer.
    """

    def __init__(self, core: Core, spec: LockSpec, counters: LockCounters | None = None) -> None:
        self._core = core
        self._spec = spec
        self._counters = LockCounters() if counters is None else counters
        target = spec.target
        self.name = target.label
        self.names = target.names
        self.key = target.keys[0]
        self.keys = target.keys
        self._slot = target.slot
        self.ttl = spec.ttl
        self.timeout = spec.timeout
        self.auto_extend = spec.auto_extend
        self.max_hold = spec.max_hold
        self.fencing = spec.fencing
        self.fair = spec.fair
        self.shared = spec.shared
        # its open async with blocks by entering task (made by the first block)
        self._entered: Entered | None = None

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
        max_hold: float | None = None,
        role: Role = Role.EXCLUSIVE,
        patience: float = math.inf,
        counters: LockCounters | None = None,
    ) -> Self:
        """Check the settings, fill in ``core``'s defaults, and make the lock
        (counting its acquisitions in ``counters``, its own if omitted).

        The spec is kept per set of arguments (their types included: ``ttl=True``
        is refused, not taken for ``ttl=1``), so that the same ``lock()`` call
        again is not checked and built again; the ``SPECS_KEPT`` latest are kept."""
        if core.closing:
            raise RuntimeError("this AsyncRedlock is closed")
        options = (ttl, timeout, auto_extend, fencing, fair, max_hold)
        key = (names, role, patience, *options, *map(type, options))
        specs = core.specs
        try:
            spec, keep = specs.get(key), True
        except TypeError:  # unhashable: LockOptions says what is wrong with it
            spec, keep = None, False
        if spec is None:
            spec = _spec(core, names, LockOptions(*options), role, patience)
            if keep:
                specs[key] = spec
                if len(specs) > SPECS_KEPT:
                    del specs[next(iter(specs))]
        return cls(core, spec, counters)

    def __repr__(self) -> str:
        side = " shared" if self.shared else ""  # a read lock, told from the write side
        return f"<Lock {self.name!r}{side} ttl={self.ttl:g}s timeout={self.timeout:g}s>"

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
        half its TTL of validity is left (but no more than its ``max_hold``), and
        fewer than 63 such hand-offs came in
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
            RuntimeError: The ``AsyncRedlock`` is closed, or was first used on
                another event loop.
        """
        core, counters = self._core, self._counters
        if core.closing:
            raise RuntimeError("this AsyncRedlock is closed")
        core.check_loop()
        started = core.clock()
        counters.waiting += 1
        span = start_span(ACQUIRE, self.name)
        try:
            lease = await self._acquire(started, span)
        except BaseException as exc:
            self._failed(exc, started, span)
            raise
        finally:
            counters.waiting -= 1
        counters.acquisitions += 1
        waited = core.clock() - started
        counters.waited += waited
        core.timings.waited(self.name, waited)
        record_acquire(waited, "acquired")
        lease._holder = holder_span(span)  # what its spans (and a loss event) hang from
        end_span(span, "acquired", token=lease.token, source=lease._record.taken.source)
        return lease

    def _failed(self, exc: BaseException, started: float, span: Span | None) -> None:
        """Count an ``acquire()`` that raised ``exc``, and end its span."""
        core, counters = self._core, self._counters
        if isinstance(exc, LockTimeoutError):
            counters.timeouts += 1
            core.timings.timed_out(self.name)
            outcome = "timeout"
        elif isinstance(exc, QuorumUnavailableError):
            counters.unavailable += 1
            outcome = "unavailable"
        else:
            outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
        record_acquire(core.clock() - started, outcome)
        end_span(span, outcome, error=None if outcome == "cancelled" else exc)

    def statistics(self) -> LockStatistics:
        """The ``acquire()`` calls of this ``Lock`` so far (see `LockStatistics`)."""
        return self._counters.snapshot()

    async def _acquire(self, started: float, span: Span | None) -> Lease:
        core = self._core
        # its place in the masters' queue, should it wait there (this client's clock)
        arrival = time.time_ns() // 1000
        if self.fair or self.shared:
            # Each task asks the masters itself: fair waiters queue there, and
            # readers do not exclude one another.
            return await Acquisition(core, self._spec, started, arrival, self._counters).run(span)
        gates = core.gates
        if gates.busy(self._slot):
            handed = await self._queue(started)
            if handed is not None and handed.held:
                handed._take()
                return handed
            if handed is not None:  # lost before this task ran (aclose(), a loss)
                refuse_if_closing(core)
                return await self._acquire(started, span)  # the slot went on with it
        else:
            gates.claim(self._slot)
        lease: Lease | None = None
        try:
            lease = await Acquisition(core, self._spec, started, arrival, self._counters).run(span)
            gates.hold(self._slot, lease)  # from now on the lease holds the slot
            return lease
        finally:
            if lease is None:
                gates.exit(self._slot)

    async def _queue(self, started: float) -> Lease | None:
        """Wait behind the task of this ``AsyncRedlock`` that holds the key's slot:
        for its lease, or for the slot."""
        core = self._core
        counters = core.counters
        if self.timeout == 0:
            counters.timeouts += 1
            raise self._busy_error()
        deadline = started + self.timeout
        waiter = Waiter(self._spec, started)
        try:
            core.note("queued")
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

    async def __aenter__(self) -> Lease:
        caller = sys._getframe().f_back  # its __aexit__ comes from the same frame
        lease = await self.acquire()
        lease._enter_block()
        if self._entered is None:
            self._entered = {}
        task = asyncio.current_task()
        stack = self._entered.get(task)
        if stack is None:
            stack = self._entered[task] = []
            if task is not None:  # warned of if it ends with them open
                task.add_done_callback(self._task_ended)
        stack.append((caller, lease))
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        entered = {} if self._entered is None else self._entered
        caller = sys._getframe().f_back
        found = by_frame(entered, task, caller)
        if found is None:  # (entered and exited from two frames) its task's latest
            found = latest(entered, task)
        if found is None:
            await self._exit_elsewhere(entered, caller)
        owner, index = found
        lease = self._pop(entered, owner, index)
        if owner is not task:  # its task ended, or another task exits it
            await self._exit_elsewhere_with(lease)
        await lease._exit_block(exc_type, exc, tb)

    def _pop(self, entered: Entered, owner: Owner, index: int) -> Lease:
        """Take the block at ``index`` of ``owner``'s out of ``entered``."""
        stack = entered[owner]
        _, lease = stack.pop(index)
        if not stack:
            del entered[owner]
            if isinstance(owner, asyncio.Task):
                owner.remove_done_callback(self._task_ended)
        return lease

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """``task`` ended with blocks of this ``Lock`` open (in an async generator
        suspended inside one, as ``wait_for(anext(agen), t)`` leaves it): they can no
        longer be cancelled on a lost lease (logged); their leases are kept until they
        exit (`_exit_elsewhere_with`), kept apart so as not to keep the task; a block
        whose lease has ended is forgotten (nothing is left to release)."""
        entered = {} if self._entered is None else self._entered
        for entry in entered.pop(task, ()):
            if entry[1].held:
                entered.setdefault(ENDED, []).append(entry)
            entry[1]._orphan(self, task)

    async def _exit_elsewhere(self, entered: Entered, frame: FrameType | None) -> NoReturn:
        """A block is exited by another task, from another frame than its own (an
        ``AsyncExitStack`` closed by a shutdown task): release the lease if it is the
        only lease held in this ``Lock``'s blocks that may be exited so (which else is
        unknown, and stays held). Then raise `RuntimeError` all the same."""
        drop_ended(entered)
        if exits_by_frame(frame):  # a generator's block is found by frame if kept
            raise RuntimeError(
                f"the async with block of {self!r} was exited from an async generator but"
                " is not open (never entered, or its task and its lease ended); no lease"
                f" was released. {_ACROSS_TASKS}"
            )
        if not entered:
            raise RuntimeError(f"the async with block of {self!r} was exited but never entered")
        blocks = may_exit_elsewhere(entered)
        if len(blocks) == 1:
            await self._exit_elsewhere_with(self._pop(entered, *blocks[0]))
        if blocks:
            done = f"its lease (one of {len(blocks)} held in blocks of this Lock) is still held"
        else:
            done = "no lease was released (no block of this Lock that may be exited so holds one)"
        raise RuntimeError(f"{self._elsewhere()}; {done}. {_ACROSS_TASKS}")

    async def _exit_elsewhere_with(self, lease: Lease) -> NoReturn:
        """The exit, from another task, of the block of ``lease``: release it, and
        raise `RuntimeError` (from the `LockLostError` of a lease found lost)."""
        await lease._release_elsewhere()
        lost = lease._lost_error() if lease.lost else None
        done = "its lease was lost" if lost is not None else "its lease was released"
        raise RuntimeError(f"{self._elsewhere()}; {done}. {_ACROSS_TASKS}") from lost

    def _elsewhere(self) -> str:
        return (
            f"the async with block of {self!r} was exited from another task than the one"
            " that entered it"
        )


_ACROSS_TASKS = (
    "The block's cancellation on a lost lease works within one task only: to hold a"
    " lock across tasks, use acquire() and lease.release()"
)


def _spec(
    core: Core, names: tuple[str, ...], options: LockOptions, role: Role, patience: float
) -> LockSpec:
    """The spec of a lock on ``names`` with ``options`` (checked), ``core``'s defaults
    filled in."""
    settings = core.settings
    keys = tuple(lock_key(settings.prefix, each) for each in names)
    if len(keys) > 1 and any(node.cluster for node in core.nodes):
        _check_one_slot(names, keys)
    ttl, timeout, auto_extend, fencing, max_hold = options.spec_values(settings)
    ttl = min(ttl, max_hold)  # no key set for longer than a lease may be held
    return LockSpec(
        Resources(names, keys),
        ttl=ttl,
        timeout=timeout,
        auto_extend=auto_extend,
        fencing=fencing,
        fair=options.fair,
        role=role,
        patience=patience,
        max_hold=max_hold,
    )


def _check_one_slot(names: tuple[str, ...], keys: tuple[str, ...]) -> None:
    """Cluster masters: the keys of a lock on several resources share one slot."""
    slots = {key_slot(key) for key in keys}
    if len(slots) > 1:
        raise ValueError(
            f"the keys of {', '.join(map(repr, names))} are in {len(slots)} cluster"
            " slots; a lock on several resources runs one script per master, so"
            ' their keys must share a hash tag, e.g. "{order:7}:items"'
        )
