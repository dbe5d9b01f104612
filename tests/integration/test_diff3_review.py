"""Review of the day's changes (70be4f4..main): a lease that outlived its event loop
(`held`/`lost`), the ResourceWarning of an `AsyncRedlock` dropped unclosed, the command
line interrupted at once (`connected`, `_close_now`) and `list`'s silent masters,
delete.lua's new reply, `statistics().handovers`, `FencedStore`'s errors, the FastAPI
WebSocket refusal by a close, aiohttp's ``request[LEASE]``."""

from __future__ import annotations

import asyncio
import functools
import gc
import sqlite3
import time
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any

import aiohttp.web_app
import anyio
import httpx
import psutil
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient as AiohttpClient
from aiohttp.test_utils import TestServer
from fastapi import Depends, FastAPI, WebSocket
from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockLostError,
    LockNotOwnedError,
    RedlockStatistics,
    StaleTokenError,
)
from asyncredlock.__main__ import build_parser
from asyncredlock._cli import listing
from asyncredlock._cli.common import connected
from asyncredlock._keeping import State
from asyncredlock.contrib import aiohttp as aiohttp_contrib
from asyncredlock.contrib import fastapi as fastapi_contrib
from asyncredlock.fencing import FencedStore, FenceGuard, SQLFence
from asyncredlock.testing import ServerGroup, Waits, hold_calls
from asyncredlock.testing.pytest_plugin import MakeServers

from .. import loops
from .conftest import Masters, library_tasks, polled

pytestmark = pytest.mark.anyio

GUARD = 30  # seconds; only stops a hung wait, never decides an outcome


def run_elsewhere(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on a new loop of the suite's kind, closed on return (as
    ``asyncio.run`` does)."""
    with loops.runner() as runner:
        return runner.run(coroutine)


def _ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("unclosed <AsyncRedlock")]


def dropped_warnings(keep: list[Any], *clients: weakref.ref[AsyncRedlock]) -> list[str]:
    """The unclosed-AsyncRedlock warnings given while ``keep`` (the only strong
    references left to ``clients``) is emptied and the garbage collector runs; the
    clients must be gone by then (else nothing could have warned)."""
    gc.collect()  # (earlier garbage: only what ``keep`` held is recorded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keep.clear()
        # aiohttp keeps the apps its requests went through in an LRU cache (with
        # their state, the AsyncRedlock included): forgotten here
        getattr(
            aiohttp.web_app, "_cached_build_middleware", functools.lru_cache()(id)
        ).cache_clear()
        gc.collect()
    said = _ours(caught)
    del caught  # (a warning's ``source`` is the client)
    gc.collect()
    assert [ref() for ref in clients] == [None] * len(clients), "a client is still alive"
    return said


def forget_quietly(drop: Callable[[], None]) -> None:
    """Let go of a client that cannot be closed (its loop is gone), its sockets' and
    its own warnings ignored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        drop()
        gc.collect()


def agrees(lease: Lease) -> bool:
    """Whether ``held`` and ``lost`` say what the lease's state says."""
    return lease.held == (lease._state is State.HELD) and lease.lost == (lease._state is State.LOST)


def state_word(lease: Lease) -> str:
    return repr(lease).rsplit(" ", 2)[-2]


# --- 83ec13f: held / lost of a lease, on a running loop and after its loop ------------


KINDS = ["lock", "fenced", "multi", "reader", "writer", "fair-writer", "semaphore"]


def make_lock(redlock: AsyncRedlock, kind: str, name: str) -> Any:
    if kind == "lock":
        return redlock.lock(name, timeout=GUARD)
    if kind == "fenced":
        return redlock.lock(name, timeout=GUARD, fencing=True)
    if kind == "multi":
        return redlock.lock([name, f"{name}:b"], timeout=GUARD)
    if kind == "reader":
        return redlock.rwlock(name).read(timeout=GUARD)
    if kind == "writer":
        return redlock.rwlock(name).write(timeout=GUARD)
    if kind == "fair-writer":
        return redlock.rwlock(name, fair=True).write(timeout=GUARD)
    assert kind == "semaphore"
    return redlock.semaphore(name, 2, timeout=GUARD)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
async def test_held_and_lost_say_what_the_state_says_on_a_running_loop(
    servers: ServerGroup, masters: Masters, kind: str
) -> None:
    """On a running loop ``held``/``lost`` (and the repr) follow the lease's state for
    every kind of lease: held, released, then lost (its keys deleted behind its back,
    found by ``extend()``)."""
    name = f"d3:{kind}"
    seen: list[tuple[bool, bool, str, bool]] = []

    def note(lease: Lease) -> None:
        seen.append((lease.held, lease.lost, state_word(lease), agrees(lease)))

    async with AsyncRedlock(servers.urls) as redlock:
        lock = make_lock(redlock, kind, name)
        lease = await lock.acquire()
        note(lease)
        await lease.release()
        note(lease)
        lease = await lock.acquire()
        for client in masters.clients:  # gone from every master: a reader's entry too
            await client.delete(*lease.keys, *(f"{{{key}}}:readers" for key in lease.keys))
        with pytest.raises(LockNotOwnedError):
            await lease.extend()
        note(lease)
    assert seen == [
        (True, False, "held", True),
        (False, False, "released", True),
        (False, True, "lost", True),
    ]


@pytest.mark.timeout(60)
async def test_a_lease_handed_off_in_process_says_what_its_state_says(
    servers: ServerGroup,
) -> None:
    """A lease passed on release to the next task of the same client (a hand-off):
    held (and the one passed on released), then lost when forced free."""
    async with AsyncRedlock(servers.urls) as redlock:
        lock = redlock.lock("d3:handoff", timeout=GUARD)
        first = await lock.acquire()
        with Waits(redlock) as waits, anyio.fail_after(GUARD):
            waiter = asyncio.get_running_loop().create_task(lock.acquire())
            await waits.reach(queued=1)
            await first.release()
            second = await waiter
        assert second.statistics().source == "hand-off"
        held = (first.held, first.lost, second.held, second.lost, state_word(second))
        assert agrees(first)
        assert agrees(second)
        await redlock.force_release("d3:handoff")
        assert (second.held, second.lost, state_word(second), agrees(second)) == (
            False,
            True,
            "lost",
            True,
        )
    assert held == (False, False, True, False, "held")


async def _taken(redlock: AsyncRedlock, kind: str) -> Lease:
    """A lease of ``kind``, taken on the running loop and left held."""
    if kind != "hand-off":
        lease: Lease = await make_lock(redlock, kind, f"d3:outlived:{kind}").acquire()
        return lease
    lock = redlock.lock("d3:outlived:hand-off", timeout=GUARD)
    first = await lock.acquire()
    with Waits(redlock) as waits:
        waiter = asyncio.get_running_loop().create_task(lock.acquire())
        await waits.reach(queued=1)
        await first.release()
        second = await waiter
    assert second.statistics().source == "hand-off"
    return second


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [*KINDS, "hand-off"])
def test_a_lease_of_any_kind_that_outlived_its_loop_is_lost_once_its_validity_ran_out(
    servers: ServerGroup, kind: str
) -> None:
    """83ec13f for every kind of lease that extends itself: held while its validity
    lasts, then lost (not held), as its repr says."""
    now = [time.monotonic()]  # its clock, moved on by hand
    redlock = AsyncRedlock(servers.urls, ttl=30.0, clock=lambda: now[0])
    lease = run_elsewhere(_taken(redlock, kind))
    before = (lease.held, lease.lost, state_word(lease))
    now[0] += 31.0
    after = (lease.held, lease.lost, lease.validity, state_word(lease))

    def drop() -> None:
        nonlocal redlock, lease
        del redlock, lease

    forget_quietly(drop)
    assert before == (True, False, "held")
    assert after == (False, True, 0.0, "lost")


@pytest.mark.timeout(60)
async def test_on_a_running_loop_a_lease_without_auto_extend_ends_lost_at_its_max_hold(
    servers: ServerGroup,
) -> None:
    """What a running loop says of a lease taken with ``auto_extend=False`` and a
    ``max_hold``: lost (not held) at its bound."""
    async with AsyncRedlock(servers.urls) as redlock:
        lock = redlock.lock("d3:bounded", ttl=0.3, max_hold=0.3, auto_extend=False)
        lease = await lock.acquire()
        assert await polled(lambda: not lease.held)
        assert (lease.held, lease.lost, state_word(lease)) == (False, True, "lost")


@pytest.mark.timeout(60)
def test_a_lease_without_auto_extend_that_outlived_its_loop_is_lost_past_its_max_hold(
    servers: ServerGroup,
) -> None:
    now = [time.monotonic()]
    redlock = AsyncRedlock(servers.urls, clock=lambda: now[0])
    lock = redlock.lock("d3:bounded-outlived", ttl=5.0, max_hold=5.0, auto_extend=False)
    lease = run_elsewhere(lock.acquire())
    now[0] += 10.0  # twice its max_hold
    after = (lease.held, lease.lost, state_word(lease))

    def drop() -> None:
        nonlocal redlock, lease, lock
        del redlock, lease, lock

    forget_quietly(drop)
    assert after == (False, True, "lost")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("auto_extend", [True, False])
def test_a_lease_that_outlived_its_loop_was_held_until_it_was_lost_not_until_now(
    servers: ServerGroup, auto_extend: bool
) -> None:
    """``statistics().held`` of a lease read lost because it outlived its loop stops
    where it was lost (its validity run out if it extends itself, its max_hold of
    5 s reached if not; on a clock that stands still), not at the clock's now."""
    now = [time.monotonic()]
    redlock = AsyncRedlock(servers.urls, clock=lambda: now[0])
    lock = redlock.lock("d3:held-outlived", ttl=5.0, max_hold=5.0, auto_extend=auto_extend)
    lease = run_elsewhere(lock.acquire())
    now[0] += 3.0
    while_held, validity = lease.statistics().held, lease.validity
    now[0] += 7.0  # twice its max_hold and TTL in all
    held, lost = lease.statistics().held, lease.lost

    def drop() -> None:
        nonlocal redlock, lease, lock
        del redlock, lease, lock

    forget_quietly(drop)
    lost_at = 3.0 + validity if auto_extend else 5.0  # (validity: the TTL less the drift)
    assert (while_held, held, lost) == (3.0, pytest.approx(lost_at), True)


# --- 55466d8: the ResourceWarning of a client dropped unclosed -----------------------


@pytest.mark.timeout(60)
def test_a_client_used_only_to_make_locks_and_read_statistics_does_not_warn(
    servers: ServerGroup,
) -> None:
    """Making locks, read-write locks, semaphores and ``locked()`` decorators, and
    reading the statistics, inside a running loop sends nothing and binds nothing."""

    async def use() -> AsyncRedlock:
        redlock = AsyncRedlock(servers.urls)
        redlock.lock("d3:a"), redlock.rwlock("d3:b"), redlock.semaphore("d3:c", 2)
        redlock.locked("d3:{x}")
        redlock.statistics(), redlock.resource_statistics()
        return redlock

    keep = [run_elsewhere(use())]
    said = dropped_warnings(keep, weakref.ref(keep[0]))  # (not in an assert: pytest
    assert said == []  # would keep the operands, the client among them, for its report)


@pytest.mark.timeout(60)
def test_a_client_that_never_opened_a_connection_does_not_warn(servers: ServerGroup) -> None:
    async def use() -> AsyncRedlock:
        redlock = AsyncRedlock(servers.urls)
        await redlock.settle()  # nothing out: returns at once, sends nothing
        assert redlock.statistics().background_tasks == 0
        return redlock

    keep = [run_elsewhere(use())]
    said = dropped_warnings(keep, weakref.ref(keep[0]))  # (not in an assert: pytest
    assert said == []  # would keep the operands, the client among them, for its report)


async def _closed_by_a_cancelled_aclose(group: ServerGroup) -> AsyncRedlock:
    """A client whose aclose() was cancelled while it waited for a silent master (a
    lease held there to release): it closes first, then raises."""
    redlock = AsyncRedlock(group.urls, node_timeout=3.0)
    lease = await redlock.lock("d3:cancelled-close", ttl=10.0).acquire()
    group[2].pause()
    try:
        closing = asyncio.get_running_loop().create_task(redlock.aclose())
        assert await polled(lambda: lease.lost)  # aclose() began: the lease ended
        assert closing.cancel()
        with anyio.fail_after(GUARD):
            await asyncio.wait([closing])
        assert closing.cancelled()
    finally:
        group[2].resume()
    with pytest.raises(RuntimeError, match="closed"):
        redlock.lock("d3:x")
    stats = redlock.statistics()
    assert (stats.background_tasks, stats.in_flight) == (0, 0)
    return redlock


@pytest.mark.timeout(60)
async def test_a_client_closed_by_a_cancelled_aclose_does_not_warn(
    make_servers: MakeServers,
) -> None:
    keep = [await _closed_by_a_cancelled_aclose(make_servers(3))]
    said = dropped_warnings(keep, weakref.ref(keep[0]))  # (not in an assert: pytest
    assert said == []  # would keep the operands, the client among them, for its report)


async def _singleton_ended_by_aclose(urls: list[str]) -> AsyncRedlock:
    redlock = AsyncRedlock(urls)
    started = anyio.Event()

    async def job(lease: Lease) -> None:
        started.set()
        await anyio.sleep_forever()

    running = asyncio.get_running_loop().create_task(redlock.run_singleton("d3:single", job))
    with anyio.fail_after(GUARD):
        await started.wait()
        await redlock.aclose()
        await asyncio.wait([running])
    assert isinstance(running.exception(), RuntimeError | LockLostError)
    return redlock


@pytest.mark.timeout(60)
async def test_a_run_singleton_ended_by_aclose_leaves_nothing_to_warn_of(
    servers: ServerGroup,
) -> None:
    keep = [await _singleton_ended_by_aclose(servers.urls)]
    said = dropped_warnings(keep, weakref.ref(keep[0]))  # (not in an assert: pytest
    assert said == []  # would keep the operands, the client among them, for its report)


async def _served_by_both_frameworks(urls: list[str]) -> list[Any]:
    """A request served by a FastAPI app (its lifespan's client) and one by an aiohttp
    app (setup()'s), each app shut down after: the apps."""
    app = FastAPI(lifespan=fastapi_contrib.lifespan(urls))
    fastapi_contrib.add_exception_handlers(app)

    @app.put("/orders/{order_id}")
    async def update(
        order_id: int, lease: Annotated[Lease, Depends(fastapi_contrib.locked("o:{order_id}"))]
    ) -> dict[str, bool]:
        return {"held": lease.held}

    web_app = web.Application()
    aiohttp_contrib.setup(web_app, urls)

    @aiohttp_contrib.locked("o:{order_id}")
    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"held": request[aiohttp_contrib.LEASE].held})

    web_app.router.add_put("/orders/{order_id}", handle)
    with anyio.fail_after(GUARD):
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                assert (await client.put("/orders/1")).json() == {"held": True}
            used = [fastapi_contrib.redlock_of(app)]
        async with AiohttpClient(TestServer(web_app)) as web_client:
            async with web_client.put("/orders/1") as response:
                assert await response.json() == {"held": True}
            used.append(web_app[aiohttp_contrib.REDLOCK])
    return [app, web_app, *used]


@pytest.mark.timeout(60)
async def test_the_frameworks_clients_are_closed_at_shutdown_and_do_not_warn(
    servers: ServerGroup,
) -> None:
    """The FastAPI lifespan's and aiohttp setup()'s clients, used by a request and
    closed at the app's shutdown; the clients they make at once to check the settings
    are never used: no warning for either."""
    keep = await _served_by_both_frameworks(servers.urls)
    said = dropped_warnings(keep, *[weakref.ref(each) for each in keep[2:]])
    assert said == []


# --- f522642 / bdb329e / 5ab699b: the command line interrupted, inspect(), delete.lua ---


def _connections_to(port: int) -> list[Any]:
    """This process's TCP sockets connected to ``port``."""
    return [
        conn
        for conn in psutil.Process().net_connections(kind="tcp")
        if conn.raddr and conn.raddr.port == port
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["inspect", "force-release", "list"])
async def test_an_interrupted_command_leaves_no_task_or_connection(
    servers: ServerGroup, make_servers: MakeServers, command: str
) -> None:
    """One master of 3 frozen, ``--node-timeout 1000``: the command's work cancelled
    (as Ctrl-C cancels it) while its call to that master is out ends at once and
    leaves no task of the library running, no call out, no socket to that master."""
    frozen = make_servers(1)[0]
    urls = [*servers.urls[:2], frozen.url]
    argv = [command, *([] if command == "list" else ["d3:cli"]), "--node-timeout", "1000"]
    args = build_parser().parse_args([*argv, *(arg for url in urls for arg in ("--master", url))])
    used: list[AsyncRedlock] = []

    async def run() -> None:
        if command == "list":
            await listing._collect(args)  # (its SCAN of the frozen master is out)
            return
        async with connected(args) as redlock:
            used.append(redlock)
            if command == "inspect":
                await redlock.inspect("d3:cli")
            else:
                await redlock._force_free("d3:cli")

    def out() -> bool:
        calls = command == "list" or (bool(used) and used[0].statistics().in_flight >= 1)
        return calls and bool(_connections_to(frozen.port))

    frozen.pause()
    try:
        task = asyncio.get_running_loop().create_task(run())
        assert await polled(out)
        task.cancel()
        with anyio.fail_after(GUARD):  # (a hang guard: 1000 s is the alternative)
            await asyncio.wait([task])
        left = (task.cancelled(), _connections_to(frozen.port), library_tasks())
        stats = [(each.statistics().background_tasks, each.statistics().in_flight) for each in used]
    finally:
        frozen.resume()
    assert left == (True, [], [])
    assert stats == ([] if command == "list" else [(0, 0)])


@pytest.mark.timeout(60)
async def test_inspect_asks_a_silent_master_again_at_each_call(make_servers: MakeServers) -> None:
    """``read_state(failed=...)`` is the command line's: ``inspect()`` remembers no
    silent master, it asks it at every call (and reads it again once it answers)."""
    group = make_servers(3)
    async with AsyncRedlock(group.urls, node_timeout=0.5, socket_timeout=0.5) as redlock:
        lease = await redlock.lock("d3:ask", ttl=30.0).acquire()
        group[2].pause()
        try:
            silent = [(await redlock.inspect("d3:ask")).nodes[2].error for _ in range(2)]
        finally:
            group[2].resume()
        again = None
        for _ in range(20):  # (a bound: the master answers again at once, or soon)
            again = (await redlock.inspect("d3:ask")).nodes[2]
            if again.error is None:
                break
        await lease.release()
    assert all(error is not None for error in silent), silent
    assert not any(str(error).startswith("not read") for error in silent), silent
    assert again is not None
    assert (again.error, again.holder) == (None, lease.value)


@pytest.mark.timeout(60)
async def test_force_release_counts_the_masters_where_it_deleted_anything(
    servers: ServerGroup, masters: Masters
) -> None:
    """delete.lua now says what it deleted (1 the key, 2 the readers, 3 both):
    ``force_release()`` still counts the masters where anything went (the readers of
    a read-write lock included), the command line says which."""
    from asyncredlock._cli.state import _deleted

    async with AsyncRedlock(servers.urls) as redlock:
        rw = redlock.rwlock("d3:fr")
        reader = await rw.read().acquire()
        readers_only = await redlock._force_free("d3:fr")
        writer = await rw.write().acquire()
        writer_count = await redlock.force_release("d3:fr")
        nothing = await redlock._force_free("d3:fr")
        reader2 = await rw.read().acquire()
        for client in masters.clients[:2]:  # a writer's key too, on two masters
            await client.set("d3:fr", "web-9:0123", px=30_000)
        both = await redlock._force_free("d3:fr")
        reader3 = await rw.read().acquire()
        readers_count = await redlock.force_release("d3:fr")
    assert (reader.lost, writer.lost, reader2.lost, reader3.lost) == (True,) * 4
    assert (readers_only.deleted, readers_only.key, readers_only.readers) == (5, 0, 5)
    assert (writer_count, readers_count) == (5, 5)
    assert (nothing.deleted, nothing.key, nothing.readers) == (0, 0, 0)
    assert (both.deleted, both.key, both.readers) == (5, 2, 5)
    assert _deleted(both, "d3:fr", 5) == (
        "deleted the lock key of 'd3:fr' on 2 and its reader entries on 5 of 5 masters"
    )
    assert _deleted(readers_only, "d3:fr", 5) == (
        "deleted the reader entries of 'd3:fr' on 5 of 5 masters"
    )


# --- e044556: attempts = won + failed (+ cut short), handovers ----------------------


def _contended(redlock: AsyncRedlock, kind: str) -> Any:
    name = f"d3:stats:{kind}"
    if kind == "lock":
        return redlock.lock(name, timeout=GUARD)
    if kind == "fair":
        return redlock.lock(name, timeout=GUARD, fair=True, fencing=True)
    if kind == "fair-writer":
        return redlock.rwlock(name, fair=True).write(timeout=GUARD)
    if kind == "fair-semaphore":
        return redlock.semaphore(name, 1, timeout=GUARD, fair=True)
    assert kind == "multi"
    return redlock.lock([name, f"{name}:b"], timeout=GUARD)


def _won_failed_attempts(stats: RedlockStatistics) -> tuple[int, int]:
    return stats.acquisitions - stats.handovers + stats.failed_attempts, stats.attempts


STATS_KINDS = ["lock", "fair", "fair-writer", "fair-semaphore", "multi"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", STATS_KINDS)
async def test_the_attempts_add_up_with_handovers(servers: ServerGroup, kind: str) -> None:
    """Three rounds of a holder (one client) releasing to a parked waiter (another):
    on each client, the attempts won (``acquisitions - handovers``) and failed make
    ``attempts`` (none cut short), and ``handovers`` counts the leases whose source
    is "hand-over"."""
    sources: list[str] = []
    async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as waiter:
        for _ in range(3):
            lease = await _contended(holder, kind).acquire()
            with Waits(waiter) as waits, anyio.fail_after(GUARD):
                taking = asyncio.get_running_loop().create_task(_contended(waiter, kind).acquire())
                await waits.reach(1)
                await lease.release()
                got = await taking
            sources.append(got.statistics().source)
            await got.release()
        totals = [_won_failed_attempts(each.statistics()) for each in (holder, waiter)]
        handovers = waiter.statistics().handovers
    assert [won == attempts for won, attempts in totals] == [True, True], totals
    assert handovers == sources.count("hand-over"), sources
    if kind in ("lock", "fair", "fair-writer"):
        assert handovers >= 1, sources  # (the counter was exercised)


SCRIPTS = {
    "lock": "acquire",
    "fair": "acquire_rw",  # (a fair lock's attempts are acquire_rw.lua's)
    "fair-writer": "acquire_rw",
    "fair-semaphore": "sem_acquire",
    "multi": "acquire",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", STATS_KINDS)
async def test_an_attempt_cancelled_mid_round_counts_in_neither(
    servers: ServerGroup, kind: str
) -> None:
    """An acquire() cancelled while its attempt's calls are out: the attempt counts,
    won and failed do not: ``acquisitions - handovers + failed_attempts`` is one
    short of ``attempts``."""
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await _contended(redlock, kind).acquire()  # won: 1 of 1
        await lease.release()
        with hold_calls(redlock, SCRIPTS[kind]) as held, anyio.fail_after(GUARD):
            taking = asyncio.get_running_loop().create_task(_contended(redlock, kind).acquire())
            await held.reached.wait()
            taking.cancel()
            await asyncio.wait([taking])
        await redlock.settle()
        stats = redlock.statistics()
    assert taking.cancelled()
    assert _won_failed_attempts(stats) == (1, 2)


# --- 1991772 / b288b76: FencedStore's errors ------------------------------------------


@pytest.mark.timeout(60)
async def test_a_stale_token_names_the_full_key_of_a_store_and_the_name_of_the_others(
    servers: ServerGroup,
) -> None:
    """A FencedStore's StaleTokenError has ``resource`` = prefix + key (write,
    delete, fenced read alike); FenceGuard and SQLFence name what they were given."""
    client = Redis.from_url(servers.urls[0])
    try:
        store = FencedStore(client, prefix="data:orders:")
        await store.write("42", b"a", 10)
        refused: list[StaleTokenError] = []
        for call in (
            lambda: store.write("42", b"b", 9),
            lambda: store.delete("42", 9),
            lambda: store.read("42", 9),
        ):
            with pytest.raises(StaleTokenError) as raised:
                await call()
            refused.append(raised.value)
    finally:
        await client.aclose()
    guard = FenceGuard()
    guard.check(5, "orders:42")
    with pytest.raises(StaleTokenError) as by_guard:
        guard.check(4, "orders:42")
    database = sqlite3.connect(":memory:")
    database.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, fence BIGINT)")
    fence = SQLFence("orders")
    fence.upsert(database, 42, {"status": "paid"}, 7)
    with pytest.raises(StaleTokenError) as by_sql:
        fence.upsert(database, 42, {"status": "void"}, 6)
    database.close()
    assert [(e.resource, e.token, e.newest) for e in refused] == [("data:orders:42", 9, 10)] * 3
    assert all("'data:orders:42'" in str(e) for e in refused)
    assert (by_guard.value.resource, by_sql.value.resource) == ("orders:42", "42")


@pytest.mark.timeout(60)
async def test_a_store_on_a_held_locks_key_refuses_with_value_error_and_changes_nothing(
    servers: ServerGroup, masters: Masters
) -> None:
    """A store whose prefix makes a lock's key (``"orders:"``): every call on the held
    lock's key raises ValueError (its cause the WRONGTYPE reply), and the lock's key
    is left as it was."""
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await redlock.lock("orders:42", ttl=30.0).acquire()
        client = masters.clients[0]
        store = FencedStore(client, prefix="orders:")
        errors: list[BaseException] = []
        for call in (
            lambda: store.write("42", b"x", 10**6),
            lambda: store.delete("42", 10**6),
            lambda: store.read("42"),
            lambda: store.read("42", 10**6),
        ):
            with pytest.raises(ValueError, match="another type of value") as raised:
                await call()
            errors.append(raised.value)
        kept = await client.get("orders:42")
        assert lease.held
        await lease.release()
    assert kept == lease.value.encode()
    assert all("WRONGTYPE" in str(error.__cause__) for error in errors)


# --- 0900619 / 7b2e631: FastAPI WebSocket refusals, aiohttp request[LEASE] ------------

Message = dict[str, Any]


@asynccontextmanager
async def asgi_websocket(
    app: FastAPI, path: str, *, denial: bool
) -> AsyncIterator[Callable[[], Awaitable[Message]]]:
    """One WebSocket connection to ``app`` in ASGI messages (as test_contrib_fastapi
    speaks them); ``denial``: the server lists the denial response extension."""
    to_app, app_reads = anyio.create_memory_object_stream[Message](8)
    app_writes, from_app = anyio.create_memory_object_stream[Message](8)
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"app")],
        "server": ("app", 80),
        "client": ("127.0.0.1", 1),
        "subprotocols": [],
        "extensions": {"websocket.http.response": {}} if denial else {},
    }
    # all four ends closed (the app's too): one left open warns when collected
    async with to_app, app_reads, app_writes, from_app, anyio.create_task_group() as tg:
        tg.start_soon(app, scope, app_reads.receive, app_writes.send)
        await to_app.send({"type": "websocket.connect"})
        yield from_app.receive


@pytest.mark.timeout(60)
async def test_a_lock_error_of_the_websocket_handler_itself_before_the_handshake(
    servers: ServerGroup,
) -> None:
    """A lock the handler takes itself (not through ``locked()``), refused before it
    accepts: the denial response (423) where the server offers it, else a close with
    1013 and the detail."""
    app = FastAPI(lifespan=fastapi_contrib.lifespan(servers.urls))
    fastapi_contrib.add_exception_handlers(app)

    @app.websocket("/rooms/{room}")
    async def chat(socket: WebSocket, room: str) -> None:
        async with fastapi_contrib.redlock_of(socket).lock(f"room:{room}", timeout=0):
            raise AssertionError("the lock is held elsewhere")

    with anyio.fail_after(GUARD):
        async with (
            app.router.lifespan_context(app),
            fastapi_contrib.redlock_of(app).lock("room:1"),  # (once the lifespan began)
        ):
            async with asgi_websocket(app, "/rooms/1", denial=True) as receive:
                denied = await receive()
            async with asgi_websocket(app, "/rooms/1", denial=False) as receive:
                closed = await receive()
    assert (denied["type"], denied["status"]) == ("websocket.http.response.start", 423)
    assert closed == {
        "type": "websocket.close",
        "code": 1013,
        "reason": "locked: held by another holder past the timeout",
    }


@pytest.mark.timeout(60)
async def test_the_lease_on_an_aiohttp_request_goes_however_the_handler_ends(
    servers: ServerGroup,
) -> None:
    """``request[LEASE]``: there while a streaming handler writes and in a WebSocket
    handler; the outer lease again after an inner ``@locked`` raised; and gone from
    the request once the handler ended, by returning, raising, or losing its lease."""
    lease_key, locked = aiohttp_contrib.LEASE, aiohttp_contrib.locked
    app = web.Application()
    aiohttp_contrib.setup(app, servers.urls)
    requests: dict[str, web.Request] = {}

    @locked("d3:{what}")
    async def fails(request: web.Request) -> web.Response:
        requests["fails"] = request
        raise ValueError(f"failed holding {request[lease_key].resource}")

    @locked("d3:{what}", fencing=True)
    async def streams(request: web.Request) -> web.StreamResponse:
        requests["streams"] = request
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(3):
            await response.write(f"{request[lease_key].token}\n".encode())
        return response

    @locked("d3:inner:{what}")
    async def inner(request: web.Request) -> web.Response:
        raise web.HTTPConflict()

    @locked("d3:{what}")
    async def outer(request: web.Request) -> web.Response:
        requests["outer"] = request
        with pytest.raises(web.HTTPConflict):
            await inner(request)
        return web.json_response({"after": request[lease_key].resource})

    @locked("d3:{what}")
    async def socket(request: web.Request) -> web.WebSocketResponse:
        requests["socket"] = request
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        lease = request[lease_key]
        await ws.send_json({"resource": lease.resource, "held": lease.held})
        await ws.close()
        return ws

    @locked("d3:{what}")
    async def forced(request: web.Request) -> web.Response:
        requests["forced"] = request
        await request.config_dict[aiohttp_contrib.REDLOCK].force_release(
            request[lease_key].resource
        )
        await anyio.sleep_forever()  # (cancelled by the loss)
        raise AssertionError("not cancelled")

    app.router.add_put("/fails/{what}", fails)
    app.router.add_get("/streams/{what}", streams)
    app.router.add_put("/outer/{what}", outer)
    app.router.add_get("/socket/{what}", socket)
    app.router.add_put("/forced/{what}", forced)
    with anyio.fail_after(GUARD):
        async with AiohttpClient(TestServer(app)) as client:
            async with client.put("/fails/a") as response:
                failed = response.status
            async with client.get("/streams/b") as response:
                lines = (await response.text()).split()
            async with client.put("/outer/c") as response:
                after = await response.json()
            async with client.ws_connect("/socket/d") as ws:
                said = await ws.receive_json()
            async with client.put("/forced/e") as response:
                lost = response.status
    assert (failed, lost) == (500, 503)
    assert len(lines) == 3, lines
    assert len(set(lines)) == 1, lines  # one lease, one token, throughout
    assert lines[0].isdigit(), lines
    assert after == {"after": "d3:c"}
    assert said == {"resource": "d3:d", "held": True}
    assert {name: lease_key in request for name, request in requests.items()} == dict.fromkeys(
        ["fails", "streams", "outer", "socket", "forced"], False
    )
