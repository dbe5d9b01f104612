"""The running totals behind ``AsyncRedlock.statistics()``."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Counters", "RedlockStatistics"]


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
    commits: int = 0

    def totals(self) -> dict[str, int]:
        """Every total, by name (the counters of ``RedlockStatistics``)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass(frozen=True, slots=True)
class RedlockStatistics:
    """Counters and gauges of one ``AsyncRedlock`` (see ``AsyncRedlock.statistics()``).

    Attributes:
        attempts: Acquisition rounds sent to the masters (including rounds cut
            short by cancellation, which count in neither of the next two).
        acquisitions: Attempts that took the lock.
        failed_attempts: Attempts that did not (contention, outage or validity).
        timeouts: ``LockTimeoutError`` raised.
        unavailable: ``QuorumUnavailableError`` raised by acquisition.
        extensions: Successful extensions (automatic or explicit).
        failed_extensions: Extension rounds that did not reach a quorum in time.
        releases: Release rounds started.
        lost: Leases lost while held (not extended in time, or found taken).
        handoffs: Leases passed on release straight to the next task of this
            ``AsyncRedlock`` waiting for the same key, with no call to the masters
            (counted in neither ``acquisitions`` nor ``releases``).
        held: Leases held right now.
        background_tasks: Background tasks running (calls still out, extenders).
        in_flight: Calls to masters waiting for a reply right now.
        notifications: Release announcements received from the masters (each
            release is announced by every master that deleted the key).
        wakeups: Waiting acquisitions woken by a release announcement (at most
            one per release), instead of waiting out their retry delay.
        commits: Second rounds sent to commit a fencing token (skipped when a
            quorum of masters counted the same token in the first).
    """

    attempts: int
    acquisitions: int
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
