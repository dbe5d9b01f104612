"""`_stats`: the running totals and the snapshots that ``statistics()`` return."""

from __future__ import annotations

import dataclasses

import pytest

from asyncredlock._stats import (
    Counters,
    LeaseRecord,
    LeaseStatistics,
    LockCounters,
    LockStatistics,
    RedlockStatistics,
    Taken,
)


def test_every_counter_is_a_field_of_the_snapshot() -> None:
    totals = Counters(attempts=3, commits=1).totals()
    assert totals["attempts"] == 3
    assert totals["commits"] == 1
    snapshot_fields = {field.name for field in dataclasses.fields(RedlockStatistics)}
    assert set(totals) <= snapshot_fields


def test_a_lock_snapshot_copies_its_counters() -> None:
    counters = LockCounters(acquisitions=2, attempts=5, timeouts=1, waiting=1, waited=0.5)
    snapshot = counters.snapshot()
    assert snapshot == LockStatistics(2, 5, 1, 0, 1, 0.5)
    counters.acquisitions += 1
    assert snapshot.acquisitions == 2  # a snapshot, not a view
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.acquisitions = 9  # type: ignore[misc]


def test_a_lease_record_measures_its_wait_and_hold_on_the_lease_clock() -> None:
    record = LeaseRecord(Taken("hand-over", 2, started=10.0, waiter="w:c:1"), taken_at=10.25)
    record.extensions += 1
    held = record.snapshot(now=11.0)
    assert held == LeaseStatistics("hand-over", 2, 0.25, 1, 0, 0.75)
    record.ended_at = 12.0
    assert record.snapshot(now=20.0).held == 1.75  # ended: up to its end, not to now
