"""The shared machinery behind ``AsyncRedlock``, ``Lock`` and ``Lease``.

`Core` owns the masters, the quorum size, the settings, the background
tasks and the counters. It also holds the per-master steps that acquisition,
release and cleanup share, so each is written once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._config import Settings
from ._gate import Gates
from ._keys import aux_key
from ._node import Node, Reply
from ._quorum import (
    Classify,
    Decision,
    MakeCall,
    NodeSkippedError,
    Round,
    TaskTracker,
    Timing,
    Verdict,
    quorum_of,
)
from ._quorum import describe_error as _describe_error
from ._scripts import ACQUIRE, ACQUIRE_RW, COMMIT, DEQUEUE, RELEASE, RELEASE_READ
from ._wakeup import Waker


class Holding(Protocol):
    """What the engine's owner (``AsyncRedlock``) needs of a lease it keeps in
    ``Core.held`` (``Lease``, which sits above this module)."""

    keys: tuple[str, ...]

    def _lose(self, decision: Decision | None) -> None:
        """End the lease lost (its block cancelled), removing what it holds."""

    async def _release_quietly(self) -> None:
        """Release it, reporting nothing."""


__all__ = [
    "TOKEN_BLOCK",
    "Core",
    "Counters",
    "QueueEntry",
    "QueueTrace",
    "channel",
    "classify_acquire",
    "classify_commit",
    "classify_deleted",
    "classify_flag",
    "fence_tokens",
    "may_be_queued",
    "ms",
    "readers_key",
]


#: How far a fenced acquisition counts the fence counter up. The acquisition's
#: token is ``t``; the next acquisition gets at least ``t + TOKEN_BLOCK``, so the
#: tokens in between are this holder's to give to the tasks it passes the lease
#: on to (see ``_gate``), at most ``TOKEN_BLOCK - 1`` of them in a row.
TOKEN_BLOCK = 64


#: How many contended keys a client remembers (see `Core.mark_contended`).
CONTENDED_KEYS = 1024

#: Why ``acquire.lua`` and ``acquire_rw.lua`` refused (the 4th element of a refusal).
_WRITER, _READERS, _QUEUE, _HANDED = 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A waiter that may queue on the masters: its id (``r:...`` for a reader), its
    arrival score (the same on every master, so they agree on the order), and how
    long its entry lives unrefreshed; for a writer whose lease extends itself, the
    value a release may hand it the key with, and for how long (seconds)."""

    waiter: str
    score: int
    ttl: float
    handover: str | None = None
    handover_ttl: float = 0.0


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds for ``PX``, at least 1."""
    return max(1, round(seconds * 1000))


def channel(key: str) -> str:
    """The pub/sub channel on which a release of ``key`` is announced."""
    return aux_key(key, "released")


def readers_key(key: str) -> str:
    """The sorted set of a read-write lock's readers (value -> when it lapses)."""
    return aux_key(key, "readers")


def queue_keys(key: str) -> tuple[str, str]:
    """The queue of a fair or read-write lock, and its entries' expiries."""
    return aux_key(key, "queue"), aux_key(key, "queue:expiry")


def terms_key(key: str) -> str:
    """The hand-over terms of a lock's queued waiters (see ``release.lua``)."""
    return aux_key(key, "queue:terms")


def undo_key(key: str, value: str) -> str:
    """The marker that refuses a late ``SET`` of the attempt holding ``value``."""
    return aux_key(key, f"undo:{value}")


def granted(reply: Reply) -> bool:
    """Whether an acquire reply says the master took the lock."""
    return reply.error is None and int(reply.value[0]) == 1


def fence_tokens(
    replies: Sequence[asyncio.Future[Reply]], quorum: int
) -> tuple[tuple[int, ...], bool]:
    """The tokens of a fenced first phase, one per resource (the largest counter a
    master returned for it), and whether a quorum of masters returned exactly
    these tokens.

    When they did, their commit would change nothing: each holds the keys for this
    value (they were just set) and its counters are exactly the tokens. The first
    phase is then the commit, and the second round is skipped.
    """
    counts = [
        tuple(int(count) for count in future.result().value[1:])
        for future in replies
        if future.done() and granted(future.result())
    ]
    tokens = tuple(max(column) for column in zip(*counts, strict=True))
    return tokens, sum(1 for each in counts if each == tokens) >= quorum


def classify_acquire(reply: Reply) -> tuple[Verdict, str]:
    """Count an ``acquire.lua`` or ``acquire_rw.lua`` reply toward the quorum."""
    if reply.error is not None:
        return Verdict.FAILED, _describe_error(reply)
    code = int(reply.value[0])
    if code == 1:
        return Verdict.YES, "granted"
    if code == 0:
        left = int(reply.value[1])
        why = int(reply.value[3]) if len(reply.value) > 3 else _WRITER
        if why == _QUEUE:
            return Verdict.NO, "free, but an earlier waiter is first in the queue"
        if why == _HANDED:
            return Verdict.NO, "already handed to this waiter by a release"
        if why == _READERS:
            return Verdict.NO, f"held by readers ({left} ms until the last one lapses)"
        return Verdict.NO, f"held by another holder ({left} ms left)"
    return Verdict.NO, "attempt already undone here"


def may_be_queued(future: asyncio.Future[Reply]) -> bool:
    """Whether an ``acquire_rw.lua`` call may have left the waiter in the queue:
    its reply says so, or is unknown (failed, or still out)."""
    if not future.done():
        return True
    reply = future.result()
    if reply.error is not None:
        return not isinstance(reply.error, NodeSkippedError)
    value = reply.value
    return int(value[0]) == 0 and len(value) > 2 and int(value[2]) == 1


def classify_commit(reply: Reply) -> tuple[Verdict, str]:
    """Count a commit reply (second phase of a fenced acquisition) toward the quorum.

    A master that did not grant the first phase gets no commit: its first-phase
    reply stands in.
    """
    if reply.error is not None:
        return Verdict.FAILED, _describe_error(reply)
    if isinstance(reply.value, list):
        return classify_acquire(reply)
    code = int(reply.value)
    if code == 1:
        return Verdict.YES, "granted, token committed"
    if code == 0:
        return Verdict.NO, "granted, but the lock was gone before the commit"
    return Verdict.NO, "granted, but the fence counter here was already past the token"


def classify_flag(reply: Reply) -> tuple[Verdict, str]:
    """Count a 1/0 script reply (release, extend) toward the quorum."""
    if reply.error is not None:
        return Verdict.FAILED, _describe_error(reply)
    if int(reply.value) == 1:
        return Verdict.YES, "done"
    return Verdict.NO, "not held by this lease"


def classify_deleted(reply: Reply) -> tuple[Verdict, str]:
    """Count a force-release reply: any answer is a success (the key is gone)."""
    if reply.error is not None:
        return Verdict.FAILED, _describe_error(reply)
    return Verdict.YES, "deleted" if int(reply.value) == 1 else "no key"


class QueueTrace:
    """Per master, what the attempts of one queueing ``acquire()`` left: whether
    one may have queued the waiter there, and the calls still out (whose reply
    will tell). Finished calls are dropped, so a long wait keeps nothing."""

    __slots__ = ("pending", "queued")

    def __init__(self, masters: int) -> None:
        self.pending: list[list[asyncio.Future[Reply]]] = [[] for _ in range(masters)]
        self.queued = [False] * masters

    def add(self, replies: Sequence[asyncio.Future[Reply]]) -> None:
        """Record one attempt's calls (one per master)."""
        for calls, reply in zip(self.pending, replies, strict=True):
            calls.append(reply)
        self.prune()

    def prune(self) -> None:
        for i, calls in enumerate(self.pending):
            still_out = []
            for call in calls:
                if not call.done():
                    still_out.append(call)
                elif may_be_queued(call):
                    self.queued[i] = True
            self.pending[i] = still_out


@dataclass(slots=True)
class Counters:
    """Running totals behind ``AsyncRedlock.statistics()``."""

    attempts: int = 0
    acquisitions: int = 0
    failed_attempts: int = 0
    timeouts: int = 0
    unavailable: int = 0
    extensions: int = 0
    failed_extensions: int = 0
    releases: int = 0
    lost: int = 0
    handoffs: int = 0


class Core:
    """Masters, quorum, settings, background tasks and counters of one ``AsyncRedlock``."""

    def __init__(self, nodes: Sequence[Node], settings: Settings) -> None:
        self.nodes = tuple(nodes)
        self.settings = settings
        self.quorum = quorum_of(len(self.nodes))
        self.tracker = TaskTracker()
        # the last release built by _delete: its keys, value, marker TTL, shared,
        # then the script, its keys and its arguments
        self._last_delete: tuple[Any, ...] = (None, None, None, None, None, None, None)
        self.counters = Counters()
        self.held: set[Holding] = set()  # the leases of this AsyncRedlock still held
        self.closed = False
        self.timing = Timing(
            give_up_silent=True,
            max_wait=max(settings.node_timeout, settings.socket_timeout),
            node_timeout=settings.node_timeout,
        )
        # release, force release: every master waited for, up to the longest wait
        self.patient = Timing(give_up_silent=False, max_wait=self.timing.max_wait)
        self.waker = Waker(self.nodes, settings.node_timeout, self.quorum)
        # keys (of one resource) whose last acquire() here was refused: the next
        # one brings its place in the masters' queue from its first attempt
        self.contended: dict[str, None] = {}
        self.gates = Gates(self.clock)

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
        return Round(self.nodes, make, skip_silent=skip_silent)

    async def decide(
        self, rnd: Round, classify: Classify, *, wait: float | None = None
    ) -> Decision:
        """Wait for ``rnd`` until its outcome is decided.

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
            timing = Timing(give_up_silent=False, max_wait=wait)
        return await rnd.decide(self.quorum, classify, timing)

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
        script_keys = [
            each
            for key in keys
            for each in (key, undo_key(key, value), aux_key(key, "fence"), readers_key(key))
        ]
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
        drop: bool = True,
        skip: Collection[int] = (),
    ) -> None:
        """Take a waiter whose ``acquire()`` ended out of the queue, in the background.

        On each master, behind its attempts there (one connection keeps them in
        order, so a late attempt cannot queue the waiter again): ``everywhere``
        (a fair lock) or only where an attempt queued it or its outcome is not
        known yet (other locks, whose attempts queue only once refused, or, for
        a read-write lock, while a queue exists or a writer is out of patience).
        With ``drop``, a key a release handed the waiter is deleted (it is not
        going to use it). Where the lock is free and the waiter was first in line,
        the next one is announced. Masters in ``skip`` (by index) get nothing.
        Nothing is sent once this ``AsyncRedlock`` is closed: the entries lapse by
        themselves.
        """
        trace.prune()
        masters = [
            i
            for i in range(len(self.nodes))
            if (everywhere or trace.queued[i] or trace.pending[i]) and i not in skip
        ]
        self._dequeue_on(masters, key, entry, drop=drop)

    def drop_handed(self, key: str, entry: QueueEntry, masters: Iterable[int]) -> None:
        """Give back, on ``masters``, a key handed to a waiter that cannot use the
        hand-over (too little validity left, or its tokens not committed): deleted,
        the waiter out of the queue there (its next attempt queues it again, in the
        same place), the next waiter announced."""
        if entry.handover is not None:
            self._dequeue_on(masters, key, entry, drop=True)

    def _dequeue_on(
        self, masters: Iterable[int], key: str, entry: QueueEntry, *, drop: bool
    ) -> None:
        """``dequeue.lua`` for ``entry`` on ``masters`` (by index), deleting the key
        handed to it with ``drop``; nothing once this ``AsyncRedlock`` is closed."""
        if self.closed:
            return
        keys = (*queue_keys(key), key, terms_key(key))
        handed = entry.handover if drop and entry.handover is not None else ""
        args = (entry.waiter, channel(key), handed)
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
        script_keys = [each for key in keys for each in (key, aux_key(key, "fence"))]
        args = (value, *(str(token) for token in tokens))

        def make(i: int, node: Node) -> asyncio.Future[Reply] | Reply:
            first = acquired[i]
            if first.done() and not granted(first.result()):
                return first.result()
            return node.call(COMMIT, script_keys, args)

        return self.fan_out(make)

    def release_on(
        self,
        node: Node,
        keys: Sequence[str],
        value: str,
        acquired: asyncio.Future[Reply],
        ttl: float,
        *,
        shared: bool = False,
    ) -> asyncio.Future[Reply] | Reply:
        """Compare-and-delete on one master, ordered behind the ``SET`` it undoes.

        Every call to a master goes out on one connection, in order, so the
        release cannot overtake the attempt. A master that refused the lock holds
        nothing of ours and gets no call; one whose ``SET`` failed in an unknown
        way (its connection broke) gets an undo marker too, which refuses that
        ``SET`` should it still arrive. While the ``SET``'s reply is out, the
        release goes at once behind it; if both then fail, it is sent once more,
        with the marker, on the next connection. A reader (``shared``) removes its
        entry from the readers instead.
        """
        if acquired.done():
            reply = acquired.result()
            if reply.error is None and not granted(reply):
                return Reply(0)
            if isinstance(reply.error, NodeSkippedError):  # never sent there
                return Reply(0)
            return self._delete(node, keys, value, 0 if reply.error is None else ms(ttl), shared)
        first = self._delete(node, keys, value, 0, shared)
        result: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        def settle(_: object) -> None:
            reply = first.result()
            unknown = not acquired.done() or acquired.result().error is not None
            if reply.error is None or not unknown or self.closed:
                result.set_result(reply)
                return
            again = self._delete(node, keys, value, ms(ttl), shared)
            again.add_done_callback(lambda done: result.set_result(done.result()))

        first.add_done_callback(settle)
        return self.tracker.follow(result)

    def _delete(
        self, node: Node, keys: Sequence[str], value: str, marker_ttl: int, shared: bool
    ) -> asyncio.Future[Reply]:
        last = self._last_delete
        if last[0] is keys and last[1] is value and last[2] == marker_ttl and last[3] == shared:
            # the same release to the next master of the round: built once
            return node.call(last[4], last[5], last[6])
        script_keys: tuple[str, ...]
        if shared:
            (key,) = keys
            script = RELEASE_READ
            script_keys = (readers_key(key), undo_key(key, value), *queue_keys(key))
            args: tuple[Any, ...] = (value, marker_ttl, channel(key))
        else:
            script = RELEASE
            script_keys = tuple(
                each
                for key in keys
                for each in (
                    key,
                    undo_key(key, value),
                    *queue_keys(key),
                    terms_key(key),
                    readers_key(key),
                    aux_key(key, "fence"),
                )
            )
            args = (value, marker_ttl, *(channel(key) for key in keys))
        self._last_delete = (keys, value, marker_ttl, shared, script, script_keys, args)
        return node.call(script, script_keys, args)

    def undo(
        self,
        keys: Sequence[str],
        value: str,
        acquired: Sequence[asyncio.Future[Reply]],
        ttl: float,
        *,
        shared: bool = False,
    ) -> None:
        """Release a failed or cancelled attempt on every master, in the background
        (not once this ``AsyncRedlock`` is closed: the keys expire with the TTL)."""
        if self.closed:
            return
        for node, future in zip(self.nodes, acquired, strict=True):
            self.release_on(node, keys, value, future, ttl, shared=shared)

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
