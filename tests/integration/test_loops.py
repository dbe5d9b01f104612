"""A slice of the suite on both event loops, asyncio and uvloop, in every default run.

The whole suite runs on one loop (``ASYNCREDLOCK_TEST_LOOP``; ``nox -s tests_uvloop``
runs it all on uvloop). This module runs each of its tests on both, whatever the
variable says, so that CI covers uvloop without running the suite twice: a lease's
cycle over three masters, a waiter woken across clients, a cancellation storm that
must leave nothing behind, and ``aclose()`` ending the calls that wait on a paused
majority.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockNotOwnedError, QuorumUnavailableError
from asyncredlock.testing import ServerGroup, Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .. import loops
from .conftest import Masters, library_tasks
from .test_cancellation import _is_listener, _waves

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a retry delay no test waits out
THREE = 3  # masters


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops here, whatever ``ASYNCREDLOCK_TEST_LOOP`` says."""
    return loops.BACKENDS[request.param]


@pytest.fixture
async def three(servers: ServerGroup) -> AsyncIterator[Masters]:
    """Direct clients to three of the session's (flushed) servers."""
    direct = Masters(servers.urls[:THREE])
    yield direct
    await direct.aclose()


async def test_the_loop_is_the_one_asked_for(anyio_backend: tuple[str, dict[str, Any]]) -> None:
    module = type(asyncio.get_running_loop()).__module__.split(".")[0]
    assert module == ("uvloop" if anyio_backend[1].get("use_uvloop") else "asyncio")


async def test_acquire_extend_release_over_three_masters(three: Masters) -> None:
    async with AsyncRedlock(three.urls) as redlock:
        lease = await redlock.lock(
            "loops:cycle", ttl=5.0, fencing=True, auto_extend=False
        ).acquire()
        assert lease.held
        assert lease.token is not None
        assert lease.token > 0
        assert await three.holding("loops:cycle") == THREE
        await lease.extend(ttl=60.0)
        # a key set for 5 s lives longer only if the extension reached it
        assert [await c.pttl("loops:cycle") > 5000 for c in three.clients] == [True] * THREE
        await lease.release()
        assert not lease.held
        await redlock.settle()
        stats = redlock.statistics()
    assert (stats.acquisitions, stats.extensions, stats.releases) == (1, 1, 1)
    assert await three.keys() == [[]] * THREE


async def test_a_waiter_is_woken_by_the_release_of_another_client(three: Masters) -> None:
    async with (
        AsyncRedlock(three.urls) as holder,
        AsyncRedlock(three.urls, retry_delay=NEVER) as waiter,
    ):
        lease = await holder.lock("loops:handoff", ttl=60.0).acquire()
        probe = Waits(waiter)
        got: list[bool] = []

        async def wait_for_it() -> None:
            taken = await waiter.lock("loops:handoff", timeout=HANG_GUARD).acquire()
            got.append(taken.held)
            await taken.release()

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_it)
                await probe.reach(1)  # parked: only the release can move it in time
                await lease.release()
        stats = waiter.statistics()
    assert got == [True]
    assert stats.wakeups == 1
    assert await three.keys() == [[]] * THREE


async def test_a_cancellation_storm_leaves_no_key_task_or_connection(three: Masters) -> None:
    rng = random.Random(20261207)
    names = [f"loops:storm:{i}" for i in range(16)]
    cancelled = 0
    async with (
        AsyncRedlock(three.urls, retry_delay=0.02) as first,
        AsyncRedlock(three.urls, retry_delay=0.02) as second,
    ):
        redlocks = (first, second)

        async def one(i: int) -> None:
            nonlocal cancelled
            lock = redlocks[i % 2].lock(rng.choice(names), ttl=2.0, timeout=5.0, fencing=i % 3 != 0)
            with anyio.move_on_after(rng.uniform(0, 0.1)) as scope:
                async with lock:
                    await anyio.sleep(rng.uniform(0, 0.01))
            cancelled += scope.cancelled_caught

        with anyio.fail_after(HANG_GUARD):
            await _waves(one, 4, 100)
            for redlock in redlocks:
                await redlock.settle()
        stats = [redlock.statistics() for redlock in redlocks]
        opened = [client_state(r).connections for r in redlocks]
        gates = [client_state(r).slots for r in redlocks]
        running = [t for t in library_tasks() if not _is_listener(t)]
    assert cancelled > 0
    assert [(s.held, s.in_flight, s.background_tasks) for s in stats] == [(0, 0, 0)] * 2
    assert opened == [(1,) * THREE] * 2  # one connection per master, never reopened
    assert gates == [{}, {}]
    assert running == []
    assert library_tasks() == []  # after aclose()
    assert await three.keys() == [[]] * THREE


async def test_aclose_ends_every_call_pending_on_a_paused_majority(
    make_servers: MakeServers,
) -> None:
    group = make_servers(THREE)
    redlock = AsyncRedlock(group.urls, socket_timeout=30.0)
    outcomes: dict[str, BaseException | object] = {}
    try:
        held = await redlock.lock("loops:hung", auto_extend=False).acquire()
        kept = await redlock.lock("loops:kept", auto_extend=False).acquire()
        group[1].pause()
        group[2].pause()
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "release": held.release,
            "extend": kept.extend,
            "acquire": redlock.lock("loops:other", timeout=HANG_GUARD).acquire,
            "force_release": lambda: redlock.force_release("loops:hung"),
        }

        async def call(name: str) -> None:
            try:
                outcomes[name] = await calls[name]()
            except Exception as exc:
                outcomes[name] = exc

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                for name in calls:
                    tg.start_soon(call, name)
                await anyio.wait_all_tasks_blocked()  # every call waits on the masters
                in_flight = client_state(redlock).in_flight
                assert in_flight[1] >= len(calls)
                assert in_flight[2] >= len(calls)
                await redlock.aclose()
    finally:
        group[1].resume()
        group[2].resume()
        await redlock.aclose()
    assert sorted(outcomes) == sorted(calls)
    # the acquisition learns of the close between its rounds, or from its round
    assert isinstance(outcomes.pop("acquire"), RuntimeError | QuorumUnavailableError)
    # the close ended the lease while its extension ran: it is no longer held
    assert isinstance(outcomes["extend"], LockNotOwnedError), outcomes["extend"]
    for name, error in outcomes.items():
        expected = LockNotOwnedError if name == "extend" else QuorumUnavailableError
        assert isinstance(error, expected), (name, error)
        # the master that answers, then the two paused ones ended by aclose()
        assert [o.detail.split(":")[0] for o in error.outcomes][1:] == ["ClosedError"] * 2, name
    stats = redlock.statistics()
    assert (stats.in_flight, stats.background_tasks) == (0, 0)
    assert library_tasks() == []
