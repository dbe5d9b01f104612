"""`HandOvers`: which keys the masters handed a waiter still count."""

from __future__ import annotations

from typing import cast

from asyncredlock._core import Core
from asyncredlock._handed import HandOvers
from asyncredlock._protocol import QueueEntry
from asyncredlock._wakeup import Ticket

ENTRY = QueueEntry("w:client:1", 1, 1.0, handover="handed-value", handover_ttl=1.0)


class _Core:
    """The members of `Core` that `HandOvers` uses: a clock the test moves, and the
    keys given back (their masters, per call)."""

    quorum = 3

    def __init__(self) -> None:
        self.now = 100.0
        self.dropped: list[list[int]] = []

    def clock(self) -> float:
        return self.now

    def expiry(self, start: float, ttl: float) -> float:
        return start + ttl

    def drop_handed(self, key: str, entry: QueueEntry, masters: list[int]) -> None:
        self.dropped.append(sorted(masters))


def test_a_hand_over_heard_after_its_key_was_given_back_does_not_count() -> None:
    """Master 0 handed the key with attempt a1's terms; the waiter gave it back (the
    key deleted there); the message of that hand-over comes late. It must not count
    (the key is gone), nor be given back again (a newer key may be there): only a
    hand-over with the terms of an attempt sent after the give-back counts."""
    core = _Core()
    hand_overs = HandOvers(cast(Core, core))
    ticket = Ticket((), waiter=ENTRY.waiter)
    hand_overs.remember("a1", 100.0)
    core.now = 100.1
    hand_overs.drop("k", ENTRY, [0])
    hand_overs.forget(ticket)
    ticket.handed[0] = ("a1", 0)  # the late message
    core.now = 100.2
    assert hand_overs.live("k", ENTRY, ticket) == {}
    assert core.dropped == [[0]]
    hand_overs.remember("a2", 100.3)
    ticket.handed[0] = ("a2", 0)
    core.now = 100.4
    assert hand_overs.live("k", ENTRY, ticket) == {0: (101.3, 0)}
    assert core.dropped == [[0]]


def test_a_hand_over_of_a_forgotten_or_expired_attempt_is_given_back() -> None:
    core = _Core()
    hand_overs = HandOvers(cast(Core, core))
    ticket = Ticket((), waiter=ENTRY.waiter)
    hand_overs.remember("a1", 100.0)
    ticket.handed = {0: ("a1", 0), 1: ("unknown", 0)}
    core.now = 101.5  # a1's key lived until 101.0
    assert hand_overs.live("k", ENTRY, ticket) == {}
    assert core.dropped == [[0, 1]]
    assert ticket.handed == {}
