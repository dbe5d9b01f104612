"""The running totals behind the ``statistics()`` of ``AsyncRedlock``, ``Lock``,
``RWLock`` and ``Lease``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from ._timings import DurationStatistics

__all__ = [
    "Counters",
    "LeaseRecord",
    "LeaseSource",
    "LeaseStatistics",
    "LockCounters",
    "LockStatistics",
    "RWLockStatistics",
    "RedlockStatistics",
    "Taken",
]

#: How a lease was taken: by an attempt of its own ``acquire()``, handed over by a
#: quorum of masters in a release, or passed on by another task of the client.
LeaseSource = Literal["attempt", "hand-over", "hand-off"]


@dataclass(slots=True)
class Counters:
    """Running totals behind ``AsyncRedlock.statistics()``."""

    attempts: int = 0
    acquisitions: int = 0
    handovers: int = 0
    failed_attempts: int = 0
    timeouts: int = 0
    unavailable: int = 0
    extensions: int = 0
    failed_extensions: int = 0
    releases: int = 0
    lost: int = 0
    handoffs: int = 0
    commits: int = 0

    def totals(self) -> dict[str, int]:
        """Every total, by name (the counters of ``RedlockStatistics``)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass(frozen=True, slots=True)
class RedlockStatistics:
    """Counters and gauges of one ``AsyncRedlock`` (see ``AsyncRedlock.statistics()``).

    Attributes:
        attempts: Acquisition rounds sent to the masters. Each is won (a lease
            in ``acquisitions``), failed (``failed_attempts``), or cut short
            before its outcome (cancelled, its client closing, an error raised:
            in neither): ``acquisitions - handovers + failed_attempts <=
            attempts``, equal when none was cut short.
        acquisitions: Leases taken from the masters: won by an attempt, or
            handed over by a release (``handovers``, no attempt of their own).
        handovers: Leases a quorum of masters handed over in a release to a
            waiter first in their queue (``source="hand-over"``); counted in
            ``acquisitions`` too, and the waiter's refused attempts before it in
            ``failed_attempts``.
        failed_attempts: Attempts that did not take the lock (contention, outage
            or validity), those of a waiter later handed it over included.
        timeouts: ``LockTimeoutError`` raised.
        unavailable: ``QuorumUnavailableError`` raised by acquisition.
        extensions: Successful extensions (automatic or explicit).
        failed_extensions: Extension rounds that did not reach a quorum in time
            (not one of a lease that ended, released or lost, while it ran).
        releases: Release rounds started.
        lost: Leases lost while held (not extended in time, or found taken); not
            one passed to a task that had not taken it yet (that task acquires again).
        handoffs: Leases passed on release straight to the next task of this
            ``AsyncRedlock`` waiting for the same key, with no call to the masters,
            and taken by that task (counted in neither ``acquisitions`` nor
            ``releases``; a lease passed to a task cancelled before it ran is not
            counted, nor its hold in ``hold``).
        held: Leases held right now.
        background_tasks: Background tasks running (calls still out, extenders).
        in_flight: Calls to masters waiting for a reply right now.
        notifications: Release announcements received from the masters (each
            release is announced by every master that deleted the key; a failed
            attempt's undo too, counted whether it woke a waiter or not).
        wakeups: Waiting acquisitions woken by a release announcement, instead
            of waiting out their retry delay: one per release, but for a waiter
            told by fewer than a quorum of masters within a quarter of
            ``node_timeout``, woken to attempt then and counted again when the
            others tell it. A wake-up that a waiter of several resources could not
            use (another of them is held) and passed on to the next waiter is not
            counted again; one that a semaphore's waiter, refused as queued behind
            an earlier waiter with a slot free, hands to the first waiter before it
            in this process is: that release counts two wake-ups. An undo's
            announcement that wakes nobody (the waiter's own, or one an undo woke
            already) is not counted.
        commits: Second rounds sent to commit a fencing token (skipped when a
            quorum of masters counted the same token in the first).
        wait: From each successful ``acquire()`` call to its lease.
        hold: From each lease to its end (release, loss or hand-off).
    """

    attempts: int
    acquisitions: int
    handovers: int
    failed_attempts: int
    timeouts: int
    unavailable: int
    extensions: int
    failed_extensions: int
    releases: int
    lost: int
    handoffs: int
    held: int
    background_tasks: int
    in_flight: int
    notifications: int
    wakeups: int
    commits: int
    wait: DurationStatistics
    hold: DurationStatistics


@dataclass(slots=True)
class LockCounters:
    """Running totals of the ``acquire()`` calls of one ``Lock`` (or of one side of
    the locks an ``RWLock`` made)."""

    acquisitions: int = 0
    attempts: int = 0
    timeouts: int = 0
    unavailable: int = 0
    waiting: int = 0
    waited: float = 0.0

    def snapshot(self) -> LockStatistics:
        """The totals now."""
        return LockStatistics(
            self.acquisitions,
            self.attempts,
            self.timeouts,
            self.unavailable,
            self.waiting,
            self.waited,
        )


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """The ``acquire()`` calls of one ``Lock`` so far (see ``Lock.statistics()``).

    Attributes:
        acquisitions: Calls that returned a lease.
        attempts: Acquisition rounds they sent to the masters (those of calls
            that failed or were cancelled included).
        timeouts: ``LockTimeoutError`` raised.
        unavailable: ``QuorumUnavailableError`` raised.
        waiting: Calls in progress right now.
        waited: Seconds that the calls which returned a lease took, together
            (``waited / acquisitions`` is their mean wait).
    """

    acquisitions: int
    attempts: int
    timeouts: int
    unavailable: int
    waiting: int
    waited: float


@dataclass(frozen=True, slots=True)
class RWLockStatistics:
    """The ``acquire()`` calls of the locks one ``RWLock`` made, by side (see
    ``RWLock.statistics()``).

    Attributes:
        read: Those of the locks made by ``read()``.
        write: Those of the locks made by ``write()``.
    """

    read: LockStatistics
    write: LockStatistics


@dataclass(frozen=True, slots=True)
class Taken:
    """How a lease was taken: ``source``, after ``attempts`` rounds of its own,
    for an ``acquire()`` called at ``started`` (the lease's clock); ``waiter``,
    the id a writer was queued as on the masters (handed the key, or granted by
    an attempt of a queueing ``acquire()``): its release takes that queue entry
    out wherever it is left."""

    source: LeaseSource
    attempts: int
    started: float
    waiter: str = ""


@dataclass(frozen=True, slots=True)
class LeaseStatistics:
    """How one lease was taken and kept (see ``Lease.statistics()``).

    Attributes:
        source: ``"attempt"``: an attempt of its own ``acquire()`` won a quorum;
            ``"hand-over"``: a quorum of masters handed it the key in a release
            (it was first in their queue); ``"hand-off"``: another task of the
            same ``AsyncRedlock`` passed its lease on, with no call to the masters.
        attempts: Acquisition rounds its ``acquire()`` sent to the masters (0 for
            a hand-off).
        waited: Seconds from the ``acquire()`` call to the lease.
        extensions: Successful extensions (automatic or explicit).
        failed_extensions: Extension rounds that did not reach a quorum in time
            (not one of a lease that ended, released or lost, while it ran).
        held: Seconds from the lease to its end (release, loss or hand-off), or
            to now while it is held (for a lease that outlived its event loop, to
            when it would have been lost there, once it reads lost).
    """

    source: LeaseSource
    attempts: int
    waited: float
    extensions: int
    failed_extensions: int
    held: float


@dataclass(slots=True)
class LeaseRecord:
    """What ``Lease.statistics()`` reports, kept as the lease goes (times by the
    lease's clock)."""

    taken: Taken
    taken_at: float
    extensions: int = 0
    failed_extensions: int = 0
    ended_at: float | None = None

    def snapshot(self, now: float) -> LeaseStatistics:
        """The record at ``now``."""
        taken = self.taken
        held = (now if self.ended_at is None else self.ended_at) - self.taken_at
        waited = self.taken_at - taken.started
        return LeaseStatistics(
            taken.source, taken.attempts, waited, self.extensions, self.failed_extensions, held
        )
