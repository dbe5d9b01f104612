"""The checker (``harness.check``) on histories written out as the workers report
them: a lease is measured against the validity in force at each moment, the one its
acquisition reported and then each extension's, not its first validity alone."""

from __future__ import annotations

from typing import Any

from .harness import Event, Outcome, check, holds
from .report import Expected, matches


def ev(worker: int, kind: str, t: float, **fields: Any) -> Event:
    return Event(worker, kind, t, fields)


def held_by_b(start: float) -> list[Event]:
    """B (worker 1, a plain client: no token) takes the lock at ``start``, reads,
    increments, releases."""
    return [
        ev(1, "acquired", start, token=None, until=start + 2.0),
        ev(1, "read", start + 0.01, value=0, ok=True),
        ev(1, "wrote", start + 0.02, ok=True, value=1, token=None),
        ev(1, "released", start + 0.03, lost=False),
    ]


def extending_a(*extensions: tuple[float, float], wrote: float) -> list[Event]:
    """A (worker 0, a plain client) takes the lock at 0 with validity to 1.0, is granted
    ``extensions`` (when, until), writes at ``wrote`` and releases."""
    return [
        ev(0, "acquired", 0.0, token=None, until=1.0),
        ev(0, "read", 0.1, value=0, ok=True),
        *(ev(0, "extended", when, token=None, until=until) for when, until in extensions),
        ev(0, "wrote", wrote, ok=True, value=1, token=None),
        ev(0, "released", wrote + 0.01, lost=False),
    ]


def test_an_extended_lease_is_valid_until_its_last_extension() -> None:
    """A's lease extends itself past its first validity and A writes at 2.0, within
    the validity its last extension granted (to 2.2): not a late write. B taking the
    lock at 1.5 overlaps A while both are valid: exclusion broken (the checker that
    cut A at its first validity saw only a believed overlap, and a late write)."""
    a = extending_a((0.4, 1.4), (0.8, 1.8), (1.2, 2.2), wrote=2.0)
    outcome = check(a + held_by_b(1.5), final=1)
    assert (outcome.overlaps, outcome.believed, outcome.late_writes) == (1, 1, 0)


def test_an_extended_lease_ends_with_its_last_extension() -> None:
    """A's last extension runs to 1.4; B takes the lock at 1.5 and A, stalled, writes
    at 2.0: no overlap of valid leases, one believed, A's write late."""
    a = extending_a((0.4, 1.4), wrote=2.0)
    outcome = check(a + held_by_b(1.5), final=1)
    assert (outcome.overlaps, outcome.believed, outcome.late_writes) == (0, 1, 1)
    expected = Expected(violation=False, lost_updates=True, rejected=False, late_writes=True)
    assert matches(expected, outcome)


def test_an_extension_granted_after_the_validity_ran_out() -> None:
    """A's validity ends at 1.0; an extension is granted only at 1.2: A is not valid in
    between, where B's whole hold lies, and valid again from 1.2 to its write."""
    a = extending_a((1.2, 2.2), wrote=1.5)
    events = a + held_by_b(1.05)
    a_hold = next(h for h in holds(events) if h.worker == 0)
    assert a_hold.valid == ((0.0, 1.0), (1.2, 1.5))
    outcome = check(events, final=1)
    assert (outcome.overlaps, outcome.believed, outcome.late_writes) == (0, 1, 0)


def test_a_loss_is_timed_from_the_last_extension() -> None:
    """Validity extended to 1.4, the loss reported at 1.45: 0.05 s after it could be
    known (not 0.45 s after the acquisition's validity)."""
    events = [
        ev(0, "acquired", 0.0, token=None, until=1.0),
        ev(0, "read", 0.1, value=0, ok=True),
        ev(0, "extended", 0.4, token=None, until=1.4),
        ev(0, "lost", 1.45),
    ]
    assert check(events, final=0).detection == [0.05]


def test_an_unexpected_late_write_is_not_as_expected() -> None:
    """A scenario that expects no late write fails on one, and one that expects it
    fails without."""
    quiet = Expected(violation=False, lost_updates=False, rejected=False)
    late = Expected(violation=False, lost_updates=False, rejected=False, late_writes=True)
    assert matches(quiet, Outcome(late_writes=0, acknowledged=1, final=1))
    assert not matches(quiet, Outcome(late_writes=1, acknowledged=1, final=1))
    assert matches(late, Outcome(late_writes=1, acknowledged=1, final=1))
    assert not matches(late, Outcome(late_writes=0, acknowledged=1, final=1))


def slot_held(worker: int, start: float, until: float, wrote: float) -> list[Event]:
    """``worker`` takes a slot of a semaphore of limit 2 at ``start`` (valid until
    ``until``), reads, increments at ``wrote`` and releases."""
    return [
        ev(worker, "acquired", start, token=None, until=until, shared=False, limit=2),
        ev(worker, "read", start + 0.01, value=0, ok=True),
        ev(worker, "wrote", wrote, ok=True, value=1, token=None),
        ev(worker, "released", wrote + 0.01, lost=False),
    ]


def test_a_semaphore_holds_its_limit_at_once() -> None:
    """Limit 2: A and B hold at once, C takes a slot once A is done, with B still
    holding. Two at once at most, valid and believed: no overlap."""
    events = slot_held(0, 0.0, 2.0, 0.5) + slot_held(1, 0.1, 2.1, 1.5)
    events += slot_held(2, 0.6, 2.6, 1.0)
    outcome = check(events, final=3)
    assert (outcome.overlaps, outcome.believed) == (0, 0)
    assert (outcome.limit, outcome.most_valid, outcome.most_believed) == (2, 2, 2)
    assert matches(Expected(violation=False, lost_updates=False, rejected=False), outcome)


def test_a_semaphore_over_its_limit() -> None:
    """Limit 2, four holders whose valid leases share a moment: every group of three
    of them is an overlap (four groups), valid and believed; the bound is broken."""
    events = [e for w in range(4) for e in slot_held(w, 0.1 * w, 2.0, 0.5 + 0.1 * w)]
    outcome = check(events, final=4)
    assert (outcome.overlaps, outcome.believed) == (4, 4)
    assert (outcome.most_valid, outcome.most_believed) == (4, 4)
    assert outcome.violated


def test_a_semaphore_believed_over_its_limit() -> None:
    """Limit 2: A's validity ends at 0.5 while it is stalled; C takes a slot at 0.6
    with B holding; A writes at 1.2, late. Three believed they held a slot at once,
    never three valid leases: the bound holds, the belief does not."""
    events = slot_held(0, 0.0, 0.5, 1.2) + slot_held(1, 0.1, 5.0, 1.1)
    events += slot_held(2, 0.6, 5.0, 0.7)
    outcome = check(events, final=3)
    assert (outcome.overlaps, outcome.believed, outcome.late_writes) == (0, 1, 1)
    assert (outcome.most_valid, outcome.most_believed) == (2, 3)
    expected = Expected(violation=False, lost_updates=False, rejected=False, late_writes=True)
    assert matches(expected, outcome)


def test_a_killed_holder_holds_until_its_kill() -> None:
    """A lock holder killed after its read holds (valid) until the kill: B taking
    the lock before then, while A's lease is valid, overlaps it."""
    events = [
        ev(0, "acquired", 0.0, token=None, until=2.0),
        ev(0, "read", 0.1, value=0, ok=True),
        ev(0, "killed", 1.0),
        *held_by_b(0.5),
    ]
    (a_hold,) = [h for h in holds(events) if h.worker == 0]
    assert (a_hold.end, a_hold.valid) == (1.0, ((0.0, 1.0),))
    outcome = check(events, final=1)
    assert (outcome.overlaps, outcome.believed) == (1, 1)


def read_held(worker: int, start: float, until: float, read: float) -> list[Event]:
    """Reader ``worker`` of a read-write lock takes the read lock at ``start`` (valid
    until ``until``), reads, reads again at ``read`` and releases."""
    return [
        ev(worker, "acquired", start, token=None, until=until, shared=True, limit=None),
        ev(worker, "read", start + 0.01, value=0, ok=True),
        ev(worker, "read", read, value=0, ok=True),
        ev(worker, "released", read + 0.01, lost=False),
    ]


def test_readers_overlap_each_other_never_a_writer() -> None:
    """Three readers hold at once, A's validity ending before the others read again;
    B (a writer) takes the lock after them: no overlap, and the most readers at once
    is three believed, two valid after A's validity ended. B taking the lock while
    the readers hold overlaps each of them."""
    readers = read_held(2, 0.0, 0.5, 0.9) + read_held(3, 0.1, 5.0, 1.0)
    readers += read_held(4, 0.6, 5.0, 0.8)
    outcome = check(readers + held_by_b(1.5), final=1)
    assert (outcome.overlaps, outcome.believed, outcome.acknowledged) == (0, 0, 1)
    assert (outcome.limit, outcome.most_valid, outcome.most_believed) == (None, 2, 3)
    outcome = check(readers + held_by_b(0.7), final=1)
    assert (outcome.overlaps, outcome.believed) == (2, 3)
