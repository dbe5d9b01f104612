"""`Ticket.freed_on`: when a waiter that no queue on the masters serves knows what it
needs free on a quorum of masters (see `Waker._freed`)."""

from __future__ import annotations

from asyncredlock._ticket import Needs, Ticket

QUORUM = 3  # of five masters


def test_a_semaphores_waiter_needs_one_slot_free_on_a_quorum() -> None:
    """Slots are alternatives: slot 0 free on masters 0 and 1 and slot 1 on master 2
    is no slot free on a quorum; slot 1 on masters 3 and 4 as well is."""
    ticket = Ticket(["s0", "s1"], needs=Needs.ONE)
    for channel, index in [("s0", 0), ("s0", 1), ("s1", 2)]:
        ticket.free(channel, index)
    assert not ticket.freed_on(QUORUM)
    ticket.free("s1", 3)
    ticket.free("s1", 4)
    assert ticket.freed_on(QUORUM)


def test_a_locks_waiter_needs_every_key_free_on_the_same_quorum() -> None:
    """A lock on "a" and "b": "a" free on every master (the undos of waiters on "a"
    alone) is not enough while "b" is free on two masters only (a holder keeps it on
    the others: undos of "a" there must not wake the waiter for as long as it holds);
    "b" free on three masters of which "a" is free on two neither. Both free on
    masters 2, 3 and 4 is."""
    ticket = Ticket(["a", "b"], needs=Needs.EVERY)
    for index in range(5):
        ticket.free("a", index)
    ticket.free("b", 0)
    ticket.free("b", 1)
    assert not ticket.freed_on(QUORUM)
    ticket = Ticket(["a", "b"], needs=Needs.EVERY)
    for index in (0, 1, 2):
        ticket.free("b", index)
    for index in (2, 3):
        ticket.free("a", index)
    assert not ticket.freed_on(QUORUM)
    for index in (3, 4):
        ticket.free("b", index)
    ticket.free("a", 4)
    assert ticket.freed_on(QUORUM)


def test_an_attempt_forgets_what_was_free_and_other_waiters_count_nothing() -> None:
    """What was free before a waiter's latest attempt began no longer counts (the
    attempt saw the masters since); a reader or a waiter in the masters' queue
    counts nothing."""
    ticket = Ticket(["k"], needs=Needs.EVERY)
    for index in range(QUORUM):
        ticket.free("k", index)
    assert ticket.freed_on(QUORUM)
    ticket.attempting("value")
    assert not ticket.freed_on(QUORUM)
    for plain in (Ticket(["k"], everyone=True), Ticket([], waiter="w:client:1")):
        for index in range(QUORUM):
            plain.free("k", index)
        assert plain.freed is None
        assert not plain.freed_on(QUORUM)
