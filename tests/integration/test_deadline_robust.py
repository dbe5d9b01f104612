"""The one deadline timer of a `Timing` ends every round waiting under it, even when
one of those rounds raises as its deadline is handled (a bug of that round's); a round
given up on after a busy loop says how long it waited.

Every test here runs on both loops (whatever ``ASYNCREDLOCK_TEST_LOOP`` says).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import ClassVar

import anyio
import pytest

from asyncredlock import AsyncRedlock, QuorumUnavailableError, RedlockError, _quorum
from asyncredlock.testing import FaultProxy, ServerGroup

from . import test_loops
from .conftest import errors_logged

anyio_backend = test_loops.anyio_backend  # both loops here

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome
ACQUIRES = 4
STALL = 0.6  # seconds the loop is kept busy (CPU-bound work in a callback)
# db 1: the connection's handshake sends SELECT, and waits for its reply this long
STUCK = "/1?socket_timeout=60&socket_connect_timeout=60"
# a master's detail in a round decided before it was given up on
NOT_YET = "not answered yet (the round was decided without it)"


@asynccontextmanager
async def blackholed(group: ServerGroup) -> AsyncIterator[list[FaultProxy]]:
    """A FaultProxy in front of three of the session's masters, each a blackhole."""
    async with AsyncExitStack() as stack:
        proxies = [
            await stack.enter_async_context(FaultProxy("127.0.0.1", group[i].port))
            for i in range(3)
        ]
        for proxy in proxies:
            proxy.blackhole = True
        yield proxies
        for proxy in proxies:
            proxy.heal()


class _Broken(RuntimeError):
    pass


class _FirstRound(_quorum._Tally):
    """A round that records, in its class's ``first``, the first round of that class
    made: the one a test makes raise (each subclass, a test's, has a list of its own)."""

    first: ClassVar[list[_quorum._Tally]]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.first = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if not self.first:
            self.first.append(self)


async def test_a_round_that_raises_at_its_deadline_strands_no_other_round(
    servers: ServerGroup, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four acquisitions wait under the client's one acquisition timing; every master
    is stuck in its connection's handshake (no silence is judged before a connection
    is open), so only the round's deadline ends them. The first round's
    ``out_of_time()`` raises. That exception escaped the timer's callback (to the
    loop's exception handler) and the timer was never armed again: no acquisition
    returned. Now each returns; the three others fail as out of time
    (QuorumUnavailableError), and the fault is logged once, at ERROR."""

    class Tally(_FirstRound):
        def out_of_time(self, waited: float | None = None) -> None:
            if self is self.first[0]:
                raise _Broken("a round's own fault")
            super().out_of_time(waited)

    monkeypatch.setattr(_quorum, "_Tally", Tally)
    async with blackholed(servers) as proxies:
        masters = [proxy.url + STUCK for proxy in proxies]
        async with AsyncRedlock(masters, node_timeout=0.1, socket_timeout=0.3) as redlock:
            outcomes = await _acquire_all(redlock)
    # the first round's decided as it stood (its calls still out), the others out of time
    _assert_ended(outcomes, "no reply within 0.3 s")
    _assert_logged_once(caplog)


async def test_a_round_that_raises_on_hearing_of_silence_strands_no_other_round(
    servers: ServerGroup, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four acquisitions, every master silent (connected, then blackholed): the one
    watcher of the timing tells each round. The first round's ``on_silent()`` raises
    when told. That exception escaped the watcher (to the loop's exception handler,
    the master's watchdog left unarmed) and the rounds after it never heard of the
    silence. Now each of the others gives the masters up as silent, the first ends
    (its deadline handled), and the fault is logged once, at ERROR."""

    class Tally(_FirstRound):
        def on_silent(self) -> None:
            if self is self.first[0] and any(node.silent for node in self.rnd.nodes):
                raise _Broken("a round's own fault")  # told by the watcher, not at start
            super().on_silent()

    async with blackholed(servers) as proxies:
        for proxy in proxies:
            proxy.heal()
        async with AsyncRedlock([p.url for p in proxies], node_timeout=0.1) as redlock:
            warm = await redlock.lock("robust:warm", auto_extend=False).acquire()
            await warm.release()  # connected before the masters fall silent
            for proxy in proxies:
                proxy.blackhole = True
            monkeypatch.setattr(_quorum, "_Tally", Tally)
            outcomes = await _acquire_all(redlock)
    _assert_ended(outcomes, "master silent for over 0.1 s")
    _assert_logged_once(caplog)


async def test_a_round_given_up_after_a_busy_loop_says_how_long_it_waited(
    servers: ServerGroup,
) -> None:
    """Every master is stuck in its connection's handshake, and the loop is kept busy
    (``STALL`` seconds, CPU-bound) from before the round's deadline (0.3 s) to well
    past it: the deadline is looked at again, then the round gives up. Each master's
    outcome read ``no reply within 0.3 s`` though the round had waited over 0.8 s; it
    now says how long it waited, and why."""
    async with blackholed(servers) as proxies:
        masters = [proxy.url + STUCK for proxy in proxies]
        async with AsyncRedlock(masters, node_timeout=0.1, socket_timeout=0.3) as redlock:
            # due before the round's deadline (the round starts after it is scheduled)
            asyncio.get_running_loop().call_later(0.2, time.sleep, STALL)
            with anyio.fail_after(HANG_GUARD), pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock("robust:busy", timeout=0).acquire()
    details = [o.detail for o in caught.value.outcomes]
    found = [
        re.fullmatch(r"no reply within 0\.3 s \(([\d.]+) s waited, the loop busy\)", d)
        for d in details
    ]
    assert all(found), details
    # the stall alone (from 0.2 s on) outlasts the round's deadline
    assert [float(m[1]) > STALL for m in found if m] == [True] * len(details)


async def _acquire_all(redlock: AsyncRedlock) -> dict[int, RedlockError]:
    """``ACQUIRES`` acquisitions at once, none waiting, each failing: how, by number."""
    outcomes: dict[int, RedlockError] = {}

    async def acquire(i: int) -> None:
        with pytest.raises(RedlockError) as caught:
            await redlock.lock(f"robust:{i}", timeout=0).acquire()
        outcomes[i] = caught.value

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            for i in range(ACQUIRES):
                tg.start_soon(acquire, i)
    return outcomes


def _assert_ended(outcomes: dict[int, RedlockError], why: str) -> None:
    """Every acquisition failed, all but one (the faulty round's) for ``why`` on a
    majority of masters, the rest not heard yet when that decided it
    (QuorumUnavailableError)."""
    assert sorted(outcomes) == list(range(ACQUIRES))
    assert not any(o.ok for outcome in outcomes.values() for o in outcome.outcomes)
    others = [outcome for outcome in outcomes.values() if _ended_for(outcome, why)]
    assert [type(outcome) for outcome in others] == [QuorumUnavailableError] * (ACQUIRES - 1)


def _ended_for(outcome: RedlockError, why: str) -> bool:
    """Whether ``why`` decided ``outcome``: a majority of the masters gave up for it, and
    any other was not heard yet (its watchdog may fire just after the decision)."""
    details = [o.detail for o in outcome.outcomes]
    return details.count(why) * 2 > len(details) and set(details) <= {why, NOT_YET}


def _assert_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    errors = errors_logged(caplog)
    assert [(r.name, r.exc_info[0] if r.exc_info else None) for r in errors] == [
        ("asyncredlock", _Broken)
    ]
    assert "_Broken: a round's own fault" in errors[0].getMessage()
