"""`_line.Line`: waiters in arrival order, taken out wherever they stand."""

from __future__ import annotations

from asyncredlock._line import Line


class Waiter:
    """Compared by identity, as the library's waiters are."""


def test_waiters_are_served_in_arrival_order() -> None:
    line: Line[Waiter] = Line()
    a, b, c = Waiter(), Waiter(), Waiter()
    for waiter in (a, b, c):
        line.join(waiter)
    assert (len(line), list(line), line.first()) == (3, [a, b, c], a)
    assert line.serve() is a
    assert line.serve() is b
    assert line.first() is c  # left in place
    assert line.serve() is c
    assert (line.serve(), line.first(), bool(line)) == (None, None, False)


def test_one_that_leaves_is_taken_out_wherever_it_stands() -> None:
    line: Line[Waiter] = Line()
    a, b, c = Waiter(), Waiter(), Waiter()
    for waiter in (a, b, c):
        line.join(waiter)
    assert line.leave(b) is True
    assert b not in line
    assert line.leave(b) is False  # not there any more
    assert line.leave(Waiter()) is False  # never was
    assert list(line) == [a, c]
    assert a in line


def test_a_waiter_joining_again_keeps_its_place() -> None:
    line: Line[Waiter] = Line()
    a, b = Waiter(), Waiter()
    line.join(a)
    line.join(b)
    line.join(a)
    assert list(line) == [a, b]
