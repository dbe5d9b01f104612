"""What the scripts are sent and what their replies mean: the acquisition's
refusal codes, verdicts for the quorum, fence tokens, and the waiter's queue entry."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ._errors import NodeOutcome
from ._node import Reply
from ._quorum import Decision, NodeSkippedError, Verdict
from ._quorum import describe_error as _describe_error

__all__ = [
    "TOKEN_BLOCK",
    "QueueEntry",
    "QueueTrace",
    "behind",
    "classify_acquire",
    "classify_commit",
    "classify_deleted",
    "classify_flag",
    "expired_decision",
    "fence_tokens",
    "granted",
    "handed_already",
    "holder_expires_in",
    "holds_ours",
    "may_be_queued",
    "ms",
    "queued_by",
    "settled_grant",
]


#: How far a fenced acquisition counts the fence counter up. The acquisition's
#: token is ``t``; the next acquisition gets at least ``t + TOKEN_BLOCK``, so the
#: tokens in between are this holder's to give to the tasks it passes the lease
#: on to (see ``_gate``), at most ``TOKEN_BLOCK - 1`` of them in a row.
TOKEN_BLOCK = 64


#: Why ``acquire.lua`` and ``acquire_rw.lua`` refused (the 4th element of a refusal).
_WRITER, _READERS, _QUEUE, _HANDED = 1, 2, 3, 4
# the verdicts of the common replies, made once (one per reply on the hot path)
_GRANTED = (Verdict.YES, "granted")
_DONE = (Verdict.YES, "done")
_NOT_HELD = (Verdict.NO, "not held by this lease")


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

    def refresh_pause(self) -> float:
        """A pause for a waiter in line, between the attempts that keep its entry
        (and its hand-over terms) fresh: uniform in ``[L / 2, L]``, ``L`` a third of
        the shorter of the two lifetimes, so that at least two refreshes come
        before either lapses (unless its retry delay is longer still)."""
        shortest = self.ttl if self.handover is None else min(self.ttl, self.handover_ttl)
        return random.uniform(shortest / 6, shortest / 3)


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds for ``PX``, at least 1."""
    return max(1, round(seconds * 1000))


def granted(reply: Reply) -> bool:
    """Whether an acquire reply says the master took the lock."""
    return reply.error is None and int(reply.value[0]) == 1


def settled_grant() -> asyncio.Future[Reply]:
    """A settled "granted" reply: what a lease handed over by the masters records
    for every master, so that its release and extension go to all of them (the
    scripts change nothing where the key does not hold its value)."""
    future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    future.set_result(Reply([1]))
    return future


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
        tuple(map(int, future.result().value[1:]))
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
        return _GRANTED
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


def holder_expires_in(replies: Sequence[asyncio.Future[Reply]]) -> float:
    """From an acquisition round's replies: the median time to live the refusing
    masters reported for another holder's key (``acquire.lua``'s second element),
    about when that holder's lock expires if it is not released; ``inf`` when
    none reported one."""
    pttls = sorted(
        max(0, int(reply.value[1]))
        for reply in (f.result() for f in replies if f.done())
        if reply.error is None and int(reply.value[0]) == 0 and int(reply.value[1]) >= 0
    )
    if not pttls:
        return math.inf
    return pttls[len(pttls) // 2] / 1000


def behind(reply: asyncio.Future[Reply]) -> bool:
    """Whether an acquisition reply says an earlier waiter is queued ahead of this
    one on that master (the lock free, held, or handed to this one)."""
    if not reply.done() or (result := reply.result()).error is not None:
        return False
    value = result.value
    if int(value[0]) != 0 or len(value) < 4:
        return False
    why = int(value[3])
    if why == _HANDED:
        return len(value) > 5 and int(value[5]) == 1
    return why == _QUEUE or (why == _WRITER and len(value) > 4 and int(value[4]) == 1)


def handed_already(replies: Sequence[asyncio.Future[Reply]]) -> dict[int, tuple[int, int]]:
    """From an acquisition round's replies: the masters that had handed the key to
    this waiter in a release it did not hear of ("already handed to this waiter"),
    each with the key's time to live in ms and the fence count it was handed."""
    found: dict[int, tuple[int, int]] = {}
    for index, future in enumerate(replies):
        reply = future.result() if future.done() else None
        if reply is None or reply.error is not None or len(reply.value) < 5:
            continue
        code, pttl, _, why, count = reply.value[:5]
        if int(code) == 0 and int(why) == _HANDED and int(pttl) > 0:
            found[index] = (int(pttl), int(count))
    return found


def holds_ours(future: asyncio.Future[Reply]) -> bool:
    """Whether a master may hold what an attempt set, by its reply to it: it
    granted, or the reply is unknown (failed, or still out). The attempt's undo,
    or its lease's release, goes there."""
    if not future.done():
        return True
    reply = future.result()
    if reply.error is not None:
        return not isinstance(reply.error, NodeSkippedError)
    return granted(reply)


def queued_by(future: asyncio.Future[Reply]) -> bool:
    """Whether an attempt's reply says the master refused it and queued the waiter
    (or refreshed its entry)."""
    if not future.done() or (reply := future.result()).error is not None:
        return False
    value = reply.value
    return len(value) > 3 and int(value[0]) == 0 and int(value[2]) == 1


def may_be_queued(future: asyncio.Future[Reply]) -> bool:
    """Whether an attempt of a queueing waiter may have left it in the master's
    queue: it was granted (a writer stays listed), its reply says it was queued,
    or the reply is unknown."""
    if holds_ours(future):
        return True
    reply = future.result()
    return reply.error is None and len(reply.value) > 2 and int(reply.value[2]) == 1


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
    return _DONE if int(reply.value) == 1 else _NOT_HELD


def classify_deleted(reply: Reply) -> tuple[Verdict, str]:
    """Count a force-release reply: any answer is a success (the key is gone)."""
    if reply.error is not None:
        return Verdict.FAILED, _describe_error(reply)
    return Verdict.YES, "deleted" if int(reply.value) else "no key"


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


def expired_decision(decision: Decision, elapsed: float, ttl: float) -> Decision:
    """A quorum that came too late: say so in every granting master's outcome."""
    note = f"granted, but validity was used up ({elapsed:.3f} s elapsed of ttl {ttl:g} s)"
    outcomes = tuple(NodeOutcome(o.node, False, note) if o.ok else o for o in decision.outcomes)
    return Decision(
        0,
        decision.yes + decision.no,
        decision.failed,
        outcomes,
        decision.pending,
        quorum=decision.quorum,
    )
