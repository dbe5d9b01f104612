"""Review of the day's changes (673027d..main) (its own-undo cases, a fair reader and
an unfair read-write writer, are in test_undo_wakeups' TestOwnUndoAfterEnrolling):
``statistics().held`` of leases on a loop
that closed (released, or held and not yet lost), the web helpers' checks of ``app``
(a plain Starlette app, a FastAPI subclass) and their ``StaleTokenError`` answer,
the async-callable refusal of ``add_lost_callback`` / ``clock=``, and
``SentinelProcess``'s check of its service names."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import time
import warnings
from collections.abc import Coroutine
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from asyncredlock import AsyncRedlock, Lease, Lock, LockTimeoutError
from asyncredlock.contrib.fastapi import add_exception_handlers, redlock_of
from asyncredlock.fencing import FenceGuard
from asyncredlock.testing import (
    SentinelProcess,
    ServerGroup,
    ServerProcess,
    Waits,
)

from .. import loops

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


def run_elsewhere(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on a new loop of the suite's kind, closed on return."""
    with loops.runner() as runner:
        return runner.run(coroutine)


async def _give_up(lock: object) -> None:
    with contextlib.suppress(LockTimeoutError):
        await lock.acquire()  # type: ignore[attr-defined]


# --- 776a134: statistics().held of a lease on a loop that closed ---------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("auto_extend", [True, False])
def test_a_released_lease_keeps_its_held_after_its_loop_closed(
    servers: ServerGroup, auto_extend: bool
) -> None:
    """Released on its loop after 1 s (a clock that stands still but for the test's
    steps): ``held`` stays 1.0 after the loop closed and the clock passed its TTL
    and max_hold, and the lease reads neither held nor lost."""
    now = [time.monotonic()]
    redlock = AsyncRedlock(servers.urls, clock=lambda: now[0])
    lock = redlock.lock("d4:released", ttl=5.0, max_hold=5.0, auto_extend=auto_extend)

    async def take_and_release() -> Lease:
        lease = await lock.acquire()
        now[0] += 1.0
        await lease.release()
        await redlock.aclose()
        return lease

    lease = run_elsewhere(take_and_release())
    first = lease.statistics().held
    now[0] += 20.0
    assert (first, lease.statistics().held, lease.held, lease.lost) == (1.0, 1.0, False, False)


@pytest.mark.timeout(60)
def test_a_lease_on_a_closed_loop_counts_held_on_until_it_would_be_lost(
    servers: ServerGroup,
) -> None:
    """Left held on a loop that closed, without auto_extend and with a max_hold of
    5 s: before its max_hold ``held`` is the time since it was taken (2 s, then 4 s:
    not cut short), and it stops at 5 s once it reads lost."""
    now = [time.monotonic()]
    redlock = AsyncRedlock(servers.urls, clock=lambda: now[0])
    lock = redlock.lock("d4:orphaned", ttl=30.0, max_hold=5.0, auto_extend=False)
    lease = run_elsewhere(lock.acquire())
    seen = []
    for step in (2.0, 2.0, 3.0, 10.0):
        now[0] += step
        seen.append((lease.statistics().held, lease.held, lease.lost))
    with warnings.catch_warnings():  # its loop is gone: it cannot be closed
        warnings.simplefilter("ignore", ResourceWarning)
        del lease, lock, redlock
        gc.collect()
    assert seen == [
        (2.0, True, False),
        (4.0, True, False),
        (5.0, False, True),
        (5.0, False, True),
    ]


@pytest.mark.timeout(60)
def test_a_hand_off_keeps_the_first_held_and_the_second_stops_at_the_inherited_validity(
    servers: ServerGroup,
) -> None:
    """A lease passed on release to the next task of the same client (a hand-off):
    the first's ``held`` stays where it was released, and the one passed on, left
    held when the loop closed, stops where the validity it inherited ran out (not
    its own TTL from the hand-off, nor now)."""
    now = [time.monotonic()]
    redlock = AsyncRedlock(servers.urls, ttl=30.0, clock=lambda: now[0])
    lock = redlock.lock("d4:handoff", timeout=HANG_GUARD)

    async def hand_off(redlock: AsyncRedlock, lock: Lock) -> tuple[Lease, Lease, float]:
        first = await lock.acquire()
        with Waits(redlock) as waits, anyio.fail_after(HANG_GUARD):
            waiter = asyncio.get_running_loop().create_task(lock.acquire())
            await waits.reach(queued=1)
            now[0] += 1.0
            await first.release()
            second = await waiter
        return first, second, second.validity

    first, second, validity = run_elsewhere(hand_off(redlock, lock))
    now[0] += 100.0
    seen = (
        second.statistics().source,
        first.statistics().held,
        second.statistics().held,
        second.lost,
    )
    with warnings.catch_warnings():  # its loop is gone: it cannot be closed
        warnings.simplefilter("ignore", ResourceWarning)
        del first, second, lock, redlock
        gc.collect()
    assert seen == ("hand-off", 1.0, pytest.approx(validity), True)


# --- 8303827 / 7f8ee88: the web helpers' app check and StaleTokenError answer -------


def _stale_app(app_type: type[Starlette]) -> Starlette:
    guard = FenceGuard()
    guard.check(7, "orders:1")

    async def write(request: Request) -> Response:
        guard.check(3, "orders:1")  # a later holder wrote with 7: StaleTokenError
        return Response("written")

    app = app_type(routes=[Route("/write", write, methods=["POST"])])
    add_exception_handlers(app)  # type: ignore[arg-type]
    return app


@pytest.mark.parametrize("app_type", [Starlette, FastAPI], ids=["Starlette", "FastAPI"])
async def test_a_starlette_app_is_taken_and_answers_a_stale_token_with_503(
    app_type: type[Starlette],
) -> None:
    """`add_exception_handlers` takes a plain Starlette application as the docs say
    ("a FastAPI (or Starlette) application"), and its StaleTokenError answer is the
    loss's: 503, Retry-After, the guarded resource in the body."""
    app = _stale_app(app_type)
    transport = httpx.ASGITransport(app=app)
    with anyio.fail_after(HANG_GUARD):
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.post("/write")
    assert (response.status_code, response.headers.get("retry-after")) == (503, "1")
    assert response.json()["resource"] == "orders:1"
    assert response.json()["detail"].startswith("fenced write or read refused")


async def test_a_fastapi_subclass_is_an_app_for_redlock_of(servers: ServerGroup) -> None:
    """A subclass of FastAPI is an application for `redlock_of` and
    `add_exception_handlers` (the check is isinstance, not the exact type); an
    ASGI middleware wrapping the app is not (TypeError naming app)."""

    class MyApp(FastAPI):
        pass

    app = MyApp()
    add_exception_handlers(app)
    async with AsyncRedlock(servers.urls) as redlock:
        app.state.redlock = redlock
        assert redlock_of(app) is redlock
    with pytest.raises(TypeError, match="app must be"):
        redlock_of(GZipMiddleware(app))  # type: ignore[arg-type]


# --- 8f3f6f6 / 2c7e077 / 5529f72: async callables refused ---------------------------


class _AsyncCall:
    async def __call__(self, *args: object) -> float:
        return 0.0


async def test_a_partial_of_an_async_callable_object_is_refused_as_a_loss_callback(
    servers: ServerGroup,
) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await redlock.lock("d4:partial-callback").acquire()
        try:
            with pytest.raises(TypeError):
                lease.add_lost_callback(functools.partial(_AsyncCall()))
        finally:
            await lease.release()


def test_a_partial_of_an_async_callable_object_is_refused_as_clock(servers: ServerGroup) -> None:
    with pytest.raises(TypeError, match="clock"):
        AsyncRedlock(servers.urls, clock=functools.partial(_AsyncCall()))


# --- 3a616ed: SentinelProcess's service names -------------------------------------


@pytest.mark.parametrize("service", ['o"k', "o'k"], ids=["double", "single"])
def test_a_service_name_with_a_quote_is_refused_or_monitored(service: str) -> None:
    """A name Sentinel cannot read (a quote opens a quoted argument in its config
    parser) should be a ValueError when made, as other names it cannot read are;
    if taken, the sentinel must start and name the master."""
    with ServerProcess() as server:
        try:
            sentinel = SentinelProcess({service: server})
        except ValueError:
            return
        with sentinel:  # started
            assert sentinel.master_address(service) == ("127.0.0.1", server.port)


def test_monitor_given_as_pairs_once_is_monitored() -> None:
    with ServerProcess() as server:
        pairs = zip(["svc"], [server], strict=True)
        with SentinelProcess(pairs) as sentinel:  # type: ignore[arg-type]
            assert sentinel.master_address("svc") == ("127.0.0.1", server.port)
