"""`_spin.Spin`, the busy poll, on a socket pair (no server: it only watches sockets):
a reply there is caught, none makes it poll less and less often, and it gives way to
any other work of the loop and to the loop's next timer. It exists on asyncio's own
loops only: these tests run on one whichever loop the suite runs on, and the last
checks that the suite's loop has a poller exactly when it is asyncio's."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from asyncredlock._spin import Spin, spin_of
from tests import loops

BUDGET = 0.0005  # seconds; a miss costs this much
HANG_GUARD = 30.0  # seconds; only stops a hung test, never decides an outcome


def on_asyncio(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run the async ``test`` on a new asyncio selector loop."""

    def run() -> None:
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            runner.run(test())

    run.__name__ = test.__name__
    return run


@contextlib.contextmanager
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected pair: ours watched by the running loop (as a transport's socket
    is), theirs to send from."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    loop.add_reader(ours.fileno(), lambda: None)
    try:
        yield ours, theirs
    finally:
        loop.remove_reader(ours.fileno())
        ours.close()
        theirs.close()


def one_poll(spin: Spin, fd: int, budget: float = BUDGET) -> None:
    """What the callback that a write on ``fd`` schedules does, run here and now: the
    test decides what else the loop has to run (nothing, unless it says so), so the
    outcome does not hang on how fast this host runs a loop iteration."""
    spin.fds.append(fd)
    spin.budget = budget
    spin._poll()
    assert (spin.fds, spin.budget) == ([], 0.0)  # polled, and forgotten


def counts(spin: Spin) -> tuple[int, int, int, int]:
    return spin.caught, spin.missed, spin.passed, spin.gave_way


def fresh() -> Spin:
    loop: Any = asyncio.get_running_loop()
    return Spin(loop._ready, loop._selector.fileno())


@on_asyncio
async def test_a_reply_already_there_is_caught() -> None:
    spin = fresh()
    with pair() as (ours, theirs):
        theirs.send(b"+OK\r\n")
        one_poll(spin, ours.fileno())
    assert counts(spin) == (1, 0, 0, 0)
    assert spin.penalty == 0


@on_asyncio
async def test_misses_back_off_exponentially_and_a_catch_resets_them() -> None:
    spin = fresh()
    with pair() as (ours, theirs):
        verdicts = []
        for _ in range(12):
            before = counts(spin)
            one_poll(spin, ours.fileno())
            verdicts.append("miss" if spin.missed > before[1] else "pass")
        assert verdicts == (
            ["miss", "pass"] + ["miss"] + ["pass"] * 2 + ["miss"] + ["pass"] * 4 + ["miss", "pass"]
        )
        assert spin.penalty == 8
        while spin.skip:  # the chances it lets pass, then a reply in time
            one_poll(spin, ours.fileno())
        theirs.send(b"+OK\r\n")
        one_poll(spin, ours.fileno())
    assert (spin.caught, spin.missed, spin.penalty, spin.skip) == (1, 4, 0, 0)


@on_asyncio
async def test_other_work_of_the_loop_is_never_held_up() -> None:
    spin = fresh()
    ran: list[int] = []
    with pair() as (ours, _):
        asyncio.get_running_loop().call_soon(ran.append, 1)  # work waiting to run
        one_poll(spin, ours.fileno(), budget=1.0)  # would poll for a second
        assert ran == []
        await asyncio.sleep(0)
    assert ran == [1]
    assert counts(spin) == (0, 0, 0, 1)


@on_asyncio
async def test_an_event_on_another_socket_of_the_loop_ends_the_poll_with_no_verdict() -> None:
    spin = fresh()
    with pair() as (ours, _), pair() as (_, other):
        other.send(b"not a reply")  # for another protocol of the loop
        one_poll(spin, ours.fileno(), budget=1.0)  # would poll for a second
    assert counts(spin) == (0, 0, 0, 1)  # gave way, no miss


@on_asyncio
async def test_a_threads_call_soon_threadsafe_ends_the_poll() -> None:
    """A thread handing work to the loop (an executor's result, ``to_thread``) is not
    held up for the budget: the poll gives way."""
    spin = fresh()
    loop = asyncio.get_running_loop()
    polling = threading.Event()

    def hand_over() -> None:
        polling.wait(HANG_GUARD)
        loop.call_soon_threadsafe(lambda: None)

    with pair() as (ours, _):
        thread = threading.Thread(target=hand_over)
        thread.start()
        polling.set()
        one_poll(spin, ours.fileno(), budget=5.0)  # ended by the thread, long before
        thread.join(HANG_GUARD)
    assert counts(spin) == (0, 0, 0, 1)


@on_asyncio
async def test_the_loops_next_timer_ends_the_poll_with_no_verdict() -> None:
    spin = fresh()
    loop = asyncio.get_running_loop()
    with pair() as (ours, _):
        timer = loop.call_later(0.01, lambda: None)  # due before the budget runs out
        one_poll(spin, ours.fileno(), budget=1.0)
        assert loop.time() >= timer.when()  # it polled until the timer was due
        timer.cancel()
    assert counts(spin) == (0, 0, 0, 1)  # gave way, no miss
    assert spin.penalty == 0


@on_asyncio
async def test_the_writes_of_one_loop_iteration_make_one_poll_of_all_their_sockets() -> None:
    loop = asyncio.get_running_loop()
    ready = loop._ready  # type: ignore[attr-defined]
    spin = fresh()
    with pair() as (first, _), pair() as (second, theirs):
        waiting = len(ready)
        spin.wrote(first.fileno(), BUDGET / 2)
        spin.wrote(second.fileno(), BUDGET)
        spin.wrote(first.fileno(), BUDGET / 4)
        assert len(ready) == waiting + 1  # one callback for the three
        assert (spin.fds, spin.budget) == (
            [first.fileno(), second.fileno(), first.fileno()],
            BUDGET,
        )
        theirs.send(b"+OK\r\n")  # the second's reply: any of the sockets ends the poll
        ready.pop()._run()  # that callback, run now with nothing else waiting
    assert counts(spin) == (1, 0, 0, 0)
    assert (spin.fds, spin.budget) == ([], 0.0)


@pytest.mark.anyio
async def test_the_suites_loop_has_one_poller_if_it_is_asyncios() -> None:
    loop = asyncio.get_running_loop()
    if loops.selected() == "asyncio":
        assert spin_of(loop) is spin_of(loop) is not None
    else:
        assert spin_of(loop) is None  # uvloop shows no queue of callbacks to run
