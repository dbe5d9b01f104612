"""Wait and hold times, for the whole ``AsyncRedlock`` and per resource, in memory
bounded whatever the traffic: durations go into logarithmic buckets, and only the
resources used most recently are kept."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from ._telemetry import record_hold

__all__ = ["RESOURCES_KEPT", "DurationStatistics", "ResourceStatistics", "Timings"]

#: How many resources `Timings` keeps (the least recently used go first).
RESOURCES_KEPT = 1024

_FLOOR = 1e-6  # seconds: the first bucket's bound
_STEP = 2**0.125  # each bucket about 9% wider than the last
_LOG_STEP = math.log(_STEP)


@dataclass(frozen=True, slots=True)
class DurationStatistics:
    """A summary of durations, in seconds.

    Attributes:
        count: How many.
        total: Their sum.
        max: The longest (0.0 when there are none).
        p50: The median, and ``p99`` the 99th percentile: each the upper bound of
            the bucket it falls in, so at most about 9% above the true value
            (and never above ``max``); 0.0 when there are none.
    """

    count: int
    total: float
    max: float
    p50: float
    p99: float

    @property
    def mean(self) -> float:
        """``total / count`` (0.0 when there are none)."""
        return self.total / self.count if self.count else 0.0


@dataclass(slots=True)
class _Histogram:
    counts: dict[int, int] = field(default_factory=dict)  # bucket -> count
    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        bucket = 0 if seconds <= _FLOOR else math.ceil(math.log(seconds / _FLOOR) / _LOG_STEP)
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def quantile(self, q: float) -> float:
        rank, seen = q * self.count, 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return min(self.max, _FLOOR * _STEP**bucket)
        return self.max

    def summary(self) -> DurationStatistics:
        return DurationStatistics(
            self.count, self.total, self.max, self.quantile(0.5), self.quantile(0.99)
        )


@dataclass(frozen=True, slots=True)
class ResourceStatistics:
    """One resource's locks through this ``AsyncRedlock`` (see
    ``AsyncRedlock.resource_statistics()``).

    Attributes:
        acquisitions: ``acquire()`` calls that returned a lease.
        timeouts: ``acquire()`` calls that raised `LockTimeoutError`.
        lost: Leases lost.
        wait: From each successful ``acquire()`` call to its lease.
        hold: From each lease to its end (release, loss or hand-off).
    """

    acquisitions: int
    timeouts: int
    lost: int
    wait: DurationStatistics
    hold: DurationStatistics


@dataclass(slots=True)
class _Resource:
    timeouts: int = 0
    lost: int = 0
    wait: _Histogram = field(default_factory=_Histogram)
    hold: _Histogram = field(default_factory=_Histogram)

    def summary(self) -> ResourceStatistics:
        wait = self.wait.summary()
        return ResourceStatistics(wait.count, self.timeouts, self.lost, wait, self.hold.summary())


class Timings:
    """Wait and hold times of one ``AsyncRedlock``: all of them, and per resource
    for the `RESOURCES_KEPT` used most recently."""

    def __init__(self) -> None:
        self.wait = _Histogram()
        self.hold = _Histogram()
        self._resources: OrderedDict[str, _Resource] = OrderedDict()

    def waited(self, resource: str, seconds: float) -> None:
        """An ``acquire()`` of ``resource`` returned a lease after ``seconds``."""
        self.wait.add(seconds)
        self._resource(resource).wait.add(seconds)

    def timed_out(self, resource: str) -> None:
        """An ``acquire()`` of ``resource`` raised `LockTimeoutError`."""
        self._resource(resource).timeouts += 1

    def ended(self, resource: str, held: float, *, lost: bool) -> None:
        """A lease on ``resource`` ended after ``held`` seconds, ``lost`` or not."""
        self.hold.add(held)
        record_hold(held, lost)
        entry = self._resource(resource)
        entry.hold.add(held)
        entry.lost += lost

    def resources(self) -> dict[str, ResourceStatistics]:
        """Each kept resource's summary, the least recently used first."""
        return {name: entry.summary() for name, entry in self._resources.items()}

    def _resource(self, name: str) -> _Resource:
        entry = self._resources.get(name)
        if entry is None:
            entry = self._resources[name] = _Resource()
            if len(self._resources) > RESOURCES_KEPT:
                self._resources.popitem(last=False)
        else:
            self._resources.move_to_end(name)
        return entry
