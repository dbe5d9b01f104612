"""A waiting ``acquire()`` as the wake-ups see it (`Ticket`), and whom a release
wakes among the waiters of one channel (`wake_first`); see `Waker`.

A waiter is *waiting* inside `Waker.wait`, and its attempt is *out* from when it
leaves it (or enrolls) until it waits again or leaves. A release wakes a waiting
one before one whose attempt is out: that attempt may take the slot the release
freed (a semaphore's, or a lock's for a set of resources) and end with the lease,
and the release's wake-up would go with it, while the next waiter sleeps with a
slot free. Woken with nobody waiting, a waiter whose attempt is out keeps the
wake-up as a *spare*: it tries again at once if that attempt fails, and passes it
on if it takes the lease. A waiter that leaves without the lease (cancelled, timed
out, refused) passes on the wake-up it was using (`Ticket.owes`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Sequence

__all__ = ["OWN_KEPT", "Needs", "Ticket", "keep_latest", "undone_by", "wake_first"]


class Needs(enum.Enum):
    """What a waiter that counts the masters with its keys free (`Ticket.freed`)
    needs free on a quorum of them to go: ``ONE`` of its channels' keys (a
    semaphore's slots), or ``EVERY`` one (a lock's resources, on the same masters)."""

    ONE = enum.auto()
    EVERY = enum.auto()


class Ticket:
    """One waiting ``acquire()``: its channels (one per resource of its lock), its
    place in each channel's queue, and its wake-up flag.

    A waiter that no queue on the masters serves (a semaphore's; a lock's on several
    resources, or a read-write lock's unfair writer) ``needs`` its keys free on a
    quorum of masters (`Needs`): ``freed`` holds, per channel, the masters (by index)
    that have that key free for it since its latest attempt began, as far as it
    knows (they granted that attempt the key, or announced another attempt's undo of
    it). Both are None for the others (readers, waiters in the masters' queue).
    """

    __slots__ = (
        "channels",
        "event",
        "everyone",
        "freed",
        "handed",
        "heard",
        "heeding",
        "needs",
        "nudge",
        "out",
        "own",
        "spare",
        "spent",
        "using",
        "waiter",
    )

    def __init__(
        self,
        channels: Sequence[str],
        *,
        everyone: bool = False,
        waiter: str | None = None,
        needs: Needs | None = None,
        own: str = "",
    ) -> None:
        self.channels = tuple(channels)
        self.event = asyncio.Event()
        # a reader: several may go at once, so a release wakes all of them
        self.everyone = everyone
        # its id in the masters' queue: a release that names it wakes it
        self.waiter = None if waiter is None else waiter.encode()
        # per master (by index), the latest announcement that named it first in line
        # (a release's value, or a waiter leaving) since it was last woken
        self.heard: dict[int, bytes] = {}
        # the announcements that woke it last: heard again from other masters, they
        # wake it no more
        self.spent: dict[bytes, None] = {}
        # the masters (by index) that handed it the key: the attempt whose hand-over
        # terms they used, and the fence count
        self.handed: dict[int, tuple[str, int]] = {}
        # the wake-up due if fewer than a quorum of masters hand it the key
        self.nudge: asyncio.TimerHandle | None = None
        # its latest attempts' values (``own``: the one before it enrolled): their undos say nothing
        self.own: dict[bytes, None] = {own.encode(): None} if own else {}
        # whether an undo's announcement wakes it: not again once one did, until
        # its pause runs out or anything else wakes it
        self.heeding = True
        # its attempt is out (it enrolled, or left `Waker.wait`, and attempts):
        # a release wakes a waiter that waits before it
        self.out = True
        # the attempt out follows a wake-up: it uses it
        self.using = False
        # woken while its attempt was out (nobody waiting to be woken instead)
        self.spare = False
        self.needs = needs  # (see the class's docstring)
        self.freed: dict[str, set[int]] | None = None if needs is None else {}

    def heeds(self, undone: bytes) -> bool:
        """Whether the announced undo of the attempt that held ``undone`` wakes
        it: not when woken already, not its own attempt's, and not since the last
        undo that woke it (its attempt then failed: a holder may still hold,
        granted by the masters that lost its key, and the waiters woken by each
        other's undos would go on attempting, and undoing, for as long as it holds)."""
        return self.heeding and not self.event.is_set() and undone not in self.own

    def wake(self, *, undo: bool = False) -> None:
        """Wake it: by an attempt's ``undo``, or by anything else (a release, a
        lost subscription), after which it heeds undos again."""
        self.heeding = not undo
        self.event.set()

    def attempting(self, value: str) -> None:
        """An attempt holding ``value`` goes out: what it finds supersedes the
        announcements heard so far from fewer than a quorum of masters."""
        self.heard.clear()
        keep_latest(self.own, (value.encode(),), OWN_KEPT)
        if self.freed is not None:
            self.freed.clear()

    def free(self, channel: str, index: int) -> None:
        """Master ``index`` has ``channel``'s key free for this waiter (nothing,
        unless it counts them: `needs`)."""
        if self.freed is not None:
            self.freed.setdefault(channel, set()).add(index)

    def freed_on(self, quorum: int) -> bool:
        """Whether a quorum of masters has what it `needs` free since its latest
        attempt began, as far as it knows: one slot of a semaphore; every key of
        a lock, on the same masters."""
        freed = self.freed
        if not freed:
            return False
        if self.needs is Needs.ONE:
            return any(len(masters) >= quorum for masters in freed.values())
        masters = set.intersection(*(freed.get(each, set()) for each in self.channels))
        return len(masters) >= quorum

    def owes(self, *, acquired: bool) -> int:
        """How many wake-ups it leaves unused, to pass on: a spare one; unless
        ``acquired``, also the one its attempt out used, or the one it was woken
        with while waiting."""
        if acquired:
            return int(self.spare)
        if self.out:
            return int(self.using) + int(self.spare)
        return int(self.event.is_set())


def keep_latest(recent: dict[bytes, None], items: Iterable[bytes], kept: int) -> None:
    """Add ``items`` to ``recent`` (an ordered set), keeping the latest ``kept``."""
    for item in items:
        recent[item] = None
    while len(recent) > kept:
        del recent[next(iter(recent))]


#: How many of its latest attempts' values a waiter remembers (see `Ticket.own`).
OWN_KEPT = 4

#: What an undo's announcement on a lock's channel starts with (``release.lua``,
#: ``release_read.lua``); a lock value holds no space.
_UNDO = b"undo "


def undone_by(message: bytes) -> bytes | None:
    """The value of the attempt whose undo ``message`` announces; None for a
    release (or a waiter leaving)."""
    return message[len(_UNDO) :] if message.startswith(_UNDO) else None


def wake_first(queue: Iterable[Ticket], undone: bytes | None = None) -> Ticket | None:
    """Wake the first waiter not already woken (for the undo of the attempt that
    held ``undone``, the first that heeds it), one that waits before one whose
    attempt is out (that one keeps it as a spare); which one, if any."""
    out: Ticket | None = None
    for ticket in queue:
        if ticket.heeds(undone) if undone is not None else not ticket.event.is_set():
            if not ticket.out:
                ticket.wake(undo=undone is not None)
                return ticket
            out = out or ticket
    if out is not None:
        out.spare = True
        out.wake(undo=undone is not None)
    return out
