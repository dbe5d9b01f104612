"""The shared machinery behind ``AsyncRedlock``, ``Lock`` and ``Lease``.

`Core` owns the masters, the quorum size, the settings, the background
tasks and the counters. It also holds the per-master steps that acquisition,
release and cleanup share, so each is written once.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Collection, Coroutine, Iterable, Sequence
from typing import Any, Protocol

import anyio

from ._config import LockSpec, Settings
from ._gate import Gates
from ._keys import aux_key, channel, queue_keys, readers_key, terms_key, undo_key
from ._node import Node, Reply
from ._protocol import TOKEN_BLOCK, QueueEntry, QueueTrace, granted, ms
from ._quorum import (
    Classify,
    Decision,
    MakeCall,
    Round,
    TaskTracker,
    Timing,
    quorum_of,
)
from ._releasing import LateUndo, Releases
from ._scripts import (
    ACQUIRE,
    ACQUIRE_RW,
    COMMIT,
    DEQUEUE,
    EXTEND,
    EXTEND_READ,
)
from ._stats import Counters
from ._timings import Timings
from ._wakeup import Waker

_OTHER_LOOP = (
    "this AsyncRedlock was first used on another event loop (each asyncio.run() has"
    " its own); its connections belong to that loop: make one per loop, inside it"
)
# (added once that loop is closed: only that loop could close its connections)
_LOOP_CLOSED = (
    "; that loop is closed, so this one can no longer be closed either: close each"
    " inside its own loop, before that ends (async with, or await aclose())"
)


class Holding(Protocol):
    """What the engine's owner (``AsyncRedlock``) needs of a lease it keeps in
    ``Core.held`` (``Lease``, which sits above this module)."""

    keys: tuple[str, ...]

    def _lose(self, decision: Decision | None, reason: str) -> None:
        """End the lease lost (its block cancelled), removing what it holds;
        ``reason`` says why, for the log."""


__all__ = ["CONTENDED_KEYS", "Core", "Holding", "refuse_if_closing"]


#: How many contended keys a client remembers (see `Core.mark_contended`).
CONTENDED_KEYS = 1024


class Core:
    """Masters, quorum, settings, background tasks and counters of one ``AsyncRedlock``."""

    def __init__(self, nodes: Sequence[Node], settings: Settings) -> None:
        self.nodes = tuple(nodes)
        self.settings = settings
        self.quorum = quorum_of(len(self.nodes))
        self.tracker = TaskTracker()
        self.releases = Releases(self)  # compare-and-delete on one master, and undo
        self.specs: dict[tuple[Any, ...], LockSpec] = {}  # of lock() calls (Lock.make)
        self.counters, self.timings = Counters(), Timings()  # totals; wait and hold times
        self.held: set[Holding] = set()  # the leases of this AsyncRedlock still held
        self.closing = self.closed = False  # closing: aclose() began; no new acquire()
        self.shut = asyncio.Event()  # set once aclose() has closed everything
        self.stopping = asyncio.Event()  # set as aclose() begins: waiters stop waiting
        self.acquiring = 0  # acquire() calls on the masters, not yet out of their queues
        self.all_left = asyncio.Event()  # set once closing and none is acquiring
        self.loop: asyncio.AbstractEventLoop | None = None  # the one of the first use
        self.timing = Timing(
            give_up_silent=True,
            max_wait=max(settings.node_timeout, settings.socket_timeout),
            node_timeout=settings.node_timeout,
        )
        # release, force release: every master waited for, up to the longest wait
        self.patient = Timing(
            give_up_silent=False, max_wait=self.timing.max_wait, node_timeout=settings.node_timeout
        )
        self.waker = Waker(self.nodes, settings.node_timeout, self.quorum)
        # keys (of one resource) whose last acquire() here was refused: the next
        # one brings its place in the masters' queue from its first attempt
        self.contended: dict[str, None] = {}
        self.gates = Gates(self.clock)
        # called with "queued", "waiting" or "woken" as an acquire() starts waiting
        # behind a task of this client, starts waiting between attempts (for a release,
        # or its retry delay), or is woken by a release; "ahead" once an attempt kept a
        # writer's (or a fair lock's) place in the masters' queue (for tests)
        self.watchers: list[Callable[[str], None]] = []

    def note(self, event: str) -> None:
        """Tell the watchers (see ``watchers``); one that fails is reported to the
        event loop's exception handler, never to the acquire() that told it."""
        for watcher in self.watchers:
            try:
                watcher(event)
            except Exception as exc:
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"asyncredlock watcher {watcher!r} failed", "exception": exc}
                )

    def begin_closing(self) -> None:
        """``aclose()`` began: no ``acquire()`` starts from now on, and those waiting
        between attempts are woken (they find it closing, and leave the masters'
        queues while the connections are still open)."""
        self.closing = True
        self.stopping.set()
        self.waker.wake_all()

    async def pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or until ``aclose()`` begins."""
        with anyio.move_on_after(delay):
            await self.stopping.wait()

    def done_acquiring(self) -> None:
        """An ``acquire()`` counted in `acquiring` ended, out of the masters' queues
        (its `dequeue` calls sent)."""
        self.acquiring -= 1
        if self.closing and not self.acquiring:
            self.all_left.set()

    async def left(self) -> None:
        """Wait until every ``acquire()`` on the masters has ended (once closing,
        each one ends at its next step, having left the masters' queues)."""
        if self.acquiring:
            await self.all_left.wait()

    def mark_contended(self, key: str) -> None:
        """Remember that an ``acquire()`` of ``key`` was refused (the latest
        ``CONTENDED_KEYS`` keys are kept)."""
        contended = self.contended
        contended.pop(key, None)
        contended[key] = None
        if len(contended) > CONTENDED_KEYS:
            del contended[next(iter(contended))]

    def clock(self) -> float:
        """The monotonic clock that validity is measured with."""
        return self.settings.clock()

    def retry_pause(self) -> float:
        """A retry delay with full jitter: uniform in ``[0, retry_delay]``."""
        return random.uniform(0, self.settings.retry_delay)

    def expiry(self, start: float, ttl: float) -> float:
        """When a lock taken or extended from ``start`` stops being valid."""
        return start + ttl - self.settings.drift(ttl)

    def fan_out(self, make: MakeCall, *, skip_silent: bool = False) -> Round:
        """Send one operation to every master.

        With ``skip_silent`` (acquisition only), a master that is silent right now
        (calls out, nothing heard back for ``node_timeout``) gets no new call.
        """
        if self.closed:
            raise RuntimeError("this AsyncRedlock is closed")
        self.check_loop()
        return Round(self.nodes, make, skip_silent=skip_silent)

    def check_loop(self) -> None:
        """Bind to the loop of the first use; `RuntimeError` on any other after."""
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
        elif loop is not self.loop:
            raise RuntimeError(_OTHER_LOOP + (_LOOP_CLOSED if self.loop.is_closed() else ""))

    def decide(
        self, rnd: Round, classify: Classify, *, wait: float | None = None
    ) -> Coroutine[Any, Any, Decision]:
        """Wait for ``rnd`` until decided (``rnd.decide()``: no coroutine of its own).

        With ``wait=None`` (acquisition), a master reported silent (nothing heard
        for ``node_timeout`` with calls out) counts as failed; one that is slow
        but answering is waited for up to ``socket_timeout``. With ``wait``
        (release, extension: calls that must not be given up lightly), every
        master is waited for up to ``wait``.
        """
        if wait is None:
            timing = self.timing
        elif wait == self.patient.max_wait:
            timing = self.patient
        else:
            node_timeout = self.settings.node_timeout
            timing = Timing(
                give_up_silent=False, max_wait=wait, node_timeout=node_timeout, one_round=True
            )
        return rnd.decide(self.quorum, classify, timing)

    def acquire_round(
        self,
        keys: Sequence[str],
        value: str,
        ttl: float,
        *,
        fencing: bool,
        entry: QueueEntry | None = None,
        rw: bool = False,
        shared: bool = False,
        queue: bool = False,
    ) -> Round:
        """Start an acquisition attempt on every master.

        Without ``rw``, ``acquire.lua``: ``SET NX PX`` on every key (refused
        while a writer or readers hold one). With fencing, each master that
        grants also counts the resource's fence counter up by `TOKEN_BLOCK` and
        returns it (the first of two phases). A lock on one resource minds its
        queue: without an ``entry``, a master refuses while anyone is queued
        there; with one (a waiter, after its first refusal), a master that
        refuses queues it, and one that finds the lock free grants it only if no
        earlier waiter is queued there. With ``rw`` (fair and read-write locks, one resource, an
        ``entry`` always), ``acquire_rw.lua`` takes it for a reader (``shared``)
        or a writer, and queues the waiter when ``queue`` is set or a queue
        exists.
        """
        # per resource: lock key, undo marker, fence counter, readers
        script_keys = tuple(
            each
            for key in keys
            for each in (key, undo_key(key, value), aux_key(key, "fence"), readers_key(key))
        )
        block = str(TOKEN_BLOCK) if fencing and not shared else "0"
        args: tuple[str | int, ...] = (value, ms(ttl), block)
        script = ACQUIRE
        if len(keys) == 1:  # one resource: mind its queue
            script_keys += (*queue_keys(keys[0]), terms_key(keys[0]))
        if entry is not None:
            args += (entry.waiter, entry.score, ms(entry.ttl))
            if rw:
                script = ACQUIRE_RW
                args += ("r" if shared else "w", "1" if queue else "0")
            if entry.handover is not None:
                args += (entry.handover, ms(entry.handover_ttl))
        return self.fan_out(lambda _, node: node.call(script, script_keys, args), skip_silent=True)

    def dequeue(
        self,
        key: str,
        entry: QueueEntry,
        trace: QueueTrace,
        *,
        everywhere: bool,
        spared: Collection[int] = (),
    ) -> None:
        """Take a waiter whose ``acquire()`` ended out of the queue, in the background.

        On each master, behind its attempts there (one connection keeps them in
        order, so a late attempt cannot queue the waiter again): ``everywhere``
        (a fair lock) or only where an attempt queued it or its outcome is not
        known yet (other locks, whose attempts queue only once refused, or, for
        a read-write lock, while a queue exists or a writer is out of patience).
        A key a release handed the waiter is deleted (it is not going to use it).
        Where the lock is free and the waiter was first in line, the next one is
        announced. Nothing is sent once this ``AsyncRedlock`` is closed: the entries lapse by
        themselves. Not on the ``spared`` masters (a lease's release does it there).
        """
        trace.prune()
        masters = [
            i
            for i in range(len(self.nodes))
            if i not in spared and (everywhere or trace.queued[i] or trace.pending[i])
        ]
        self._dequeue_on(masters, key, entry)

    def drop_handed(self, key: str, entry: QueueEntry, masters: Iterable[int]) -> None:
        """Give back, on ``masters``, a key handed to a waiter that cannot use the
        hand-over (too little validity left, its tokens not committed, or an earlier
        waiter is queued ahead of it): deleted, the first waiter announced there
        unless that is this one, which stays listed in its place."""
        if entry.handover is not None:
            self._dequeue_on(masters, key, entry, keep=True)

    def _dequeue_on(
        self, masters: Iterable[int], key: str, entry: QueueEntry, *, keep: bool = False
    ) -> None:
        """``dequeue.lua`` for ``entry`` on ``masters`` (by index), deleting a key
        handed to it (only that, with ``keep``); nothing once this ``AsyncRedlock``
        is closed."""
        if self.closed:
            return
        keys = (*queue_keys(key), key, terms_key(key))
        handed = "" if entry.handover is None else entry.handover
        args = (entry.waiter, channel(key), handed, "1" if keep else "0")
        for i in masters:
            self.nodes[i].call(DEQUEUE, keys, args)

    def commit_round(
        self,
        keys: Sequence[str],
        value: str,
        tokens: tuple[int, ...],
        acquired: Sequence[asyncio.Future[Reply]],
    ) -> Round:
        """Commit ``tokens`` (one per key) on every master that granted the first phase.

        A master commits only while it still holds ``value`` in every key and each
        counter is at most its token; it then raises the counters to the tokens. A
        master whose first-phase reply is still on its way gets its commit at once,
        behind it on the same connection (if the first phase was refused there,
        the commit finds the lock not ours and changes nothing). Masters that
        refused get no call: their first-phase reply stands in (see
        `classify_commit`).
        """
        self.counters.commits += 1
        script_keys = tuple(each for key in keys for each in (key, aux_key(key, "fence")))
        args = (value, *(str(token) for token in tokens))

        def make(i: int, node: Node) -> asyncio.Future[Reply] | Reply:
            first = acquired[i]
            if first.done() and not granted(first.result()):
                return first.result()
            return node.call(COMMIT, script_keys, args)

        return self.fan_out(make)

    def extend_round(
        self,
        keys: Sequence[str],
        acquired: Sequence[asyncio.Future[Reply]],
        args: tuple[str, int],
        *,
        shared: bool = False,
    ) -> Round:
        """Reset a lease's TTL on every master (``args``: its value and the TTL in
        ms), behind the holder's earlier calls there on the same connection. A
        master that refused the lock gets no call, nor does a silent one: the
        call would queue behind calls it is not answering (the next extension
        tries again)."""
        script, script_keys = (EXTEND_READ, (readers_key(keys[0]),)) if shared else (EXTEND, keys)

        def make(i: int, node: Node) -> asyncio.Future[Reply] | Reply:
            if node.silent:
                return Reply(error=TimeoutError("master silent: calls out, nothing heard back"))
            if acquired[i].done():
                reply = acquired[i].result()
                if reply.error is None and not granted(reply):
                    return Reply(0)
            return node.call(script, script_keys, args)

        return self.fan_out(make)

    def release_round(
        self,
        keys: Sequence[str],
        value: str,
        acquired: Sequence[asyncio.Future[Reply]],
        ttl: float,
        *,
        shared: bool = False,
        waiter: str = "",
    ) -> Round:
        """`Releases.on` every master: a lease's release."""
        return self.fan_out(
            lambda i, node: self.releases.on(
                node, keys, value, acquired[i], ttl, shared=shared, waiter=waiter
            )
        )

    def undo(
        self,
        keys: Sequence[str],
        value: str,
        acquired: Sequence[asyncio.Future[Reply]],
        ttl: float,
        *,
        shared: bool = False,
    ) -> None:
        """Release an interrupted attempt (cancelled, the client closing) on every
        master, in the background (not once this ``AsyncRedlock`` is closed: the
        keys expire with the TTL). Announced as a release: a quorum may have
        granted it."""
        if not self.closed:
            self.release_round(keys, value, acquired, ttl, shared=shared)

    def undo_failed(
        self, spec: LockSpec, value: str, acquired: Sequence[asyncio.Future[Reply]]
    ) -> list[LateUndo]:
        """Release a failed attempt of ``spec`` where it may hold a key: at once
        where its reply is in, and where it is still out once it comes (`LateUndo`;
        at the latest a quarter of ``node_timeout`` later). The undos still to come
        are returned: ``now()`` them before the next attempt."""
        if self.closed:
            return []
        keys, ttl, shared = spec.target.keys, spec.ttl, spec.shared
        late = []
        for node, reply in zip(self.nodes, acquired, strict=True):
            undo = functools.partial(
                self.releases.on, node, keys, value, reply, ttl, shared=shared, undo=True
            )
            if reply.done():
                undo()
            else:
                late.append(LateUndo(undo, reply, self, self.settings.node_timeout / 4))
        return late

    async def settle(self) -> None:
        """Wait until no call to any master and no background job is still out."""
        while True:
            await self.tracker.settle()
            for node in self.nodes:
                await node.wait_idle()
            if not self.tracker.busy and not any(node.in_flight for node in self.nodes):
                return

    def describe(self) -> dict[str, Any]:
        """Current gauges for statistics."""
        return {
            "held": len(self.held),
            "background_tasks": self.tracker.pending,
            "in_flight": sum(node.in_flight for node in self.nodes),
            "notifications": self.waker.notifications,
            "wakeups": self.waker.wakeups,
        }


def refuse_if_closing(core: Core) -> None:
    """No lease is made once ``aclose()`` began (it would never be released)."""
    if core.closing:
        raise RuntimeError("this AsyncRedlock was closed while acquire() waited")
