"""The public API, typed as users call it. Never run: only checked by ``mypy --strict``.

Each ``assert_type`` fails the type check if the library's annotations drift. Each
``# type: ignore[code]`` marks a call that must be refused: were it accepted, mypy
(strict, so ``warn_unused_ignores``) would report the ignore as unused.
"""

from __future__ import annotations

import math
import sqlite3
import ssl
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, assert_type

from redis.asyncio import Redis

import asyncredlock
from asyncredlock import (
    AsyncRedlock,
    Lease,
    Lock,
    LockLostError,
    LockNotOwnedError,
    LockState,
    LockTimeoutError,
    LostLeaseError,
    NodeLockState,
    NodeOutcome,
    QuorumUnavailableError,
    RedlockError,
    RedlockStatistics,
)
from asyncredlock.fencing import (
    FencedStore,
    FencedValue,
    FenceGuard,
    MissingRecordError,
    SQLFence,
    StaleTokenError,
    check_token,
)
from asyncredlock.testing import (
    FakeClock,
    FaultProxy,
    ServerGroup,
    ServerProcess,
    find_server_binary,
)


async def scoped_use() -> None:
    async with AsyncRedlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"]) as redlock:
        assert_type(redlock, AsyncRedlock)
        async with redlock.lock("orders:42", ttl=10.0) as lease:
            assert_type(lease, Lease)
            assert_type(lease.token, int | None)
            assert_type(lease.validity, float)
            assert_type(lease.held, bool)
            assert_type(lease.lost, bool)
            assert_type(lease.resource, str)
            assert_type(lease.key, str)
            assert_type(lease.value, str)
            assert_type(lease.ttl, float)


async def explicit_use(redlock: AsyncRedlock) -> None:
    lock = redlock.lock("orders:42", ttl=10.0, timeout=2.0, auto_extend=False)
    assert_type(lock, Lock)
    assert_type(lock.name, str)
    assert_type(lock.key, str)
    assert_type(lock.ttl, float)
    assert_type(lock.timeout, float)
    assert_type(lock.auto_extend, bool)
    assert_type(lock.fencing, bool)
    assert_type(redlock.lock("x", fencing=False), Lock)
    lease = await lock.acquire()
    assert_type(lease.token, int | None)
    assert_type(lease, Lease)
    await lease.extend()
    await lease.extend(ttl=30.0)
    await lease.extend(30)
    assert_type(await lease.wait_lost(), bool)
    await lease.release()


async def settings() -> None:
    client = Redis()
    redlock = AsyncRedlock(
        ["redis://h1", client, "unix:///run/redis.sock"],
        ttl=5,
        timeout=math.inf,
        node_timeout=0.05,
        retry_delay=0.1,
        drift_factor=0.01,
        prefix="app:",
        max_connections=64,
        socket_timeout=2.0,
        auto_extend=False,
        fencing=False,
        clock=lambda: 0.0,
    )
    assert_type(redlock.masters, tuple[str, ...])
    assert_type(redlock.quorum, int)
    redlock.lock("x", timeout=0)
    await redlock.aclose()


async def operator_tools(redlock: AsyncRedlock) -> None:
    state = await redlock.inspect("orders:42")
    assert_type(state, LockState)
    assert_type(state.resource, str)
    assert_type(state.key, str)
    assert_type(state.holder, str | None)
    assert_type(state.identity, str | None)
    assert_type(state.nodes, tuple[NodeLockState, ...])
    node = state.nodes[0]
    assert_type(node.node, str)
    assert_type(node.holder, str | None)
    assert_type(node.identity, str | None)
    assert_type(node.ttl, float | None)
    assert_type(node.fence, int | None)
    assert_type(node.error, str | None)
    assert_type(await redlock.force_release("orders:42"), int)
    await redlock.settle()

    stats = redlock.statistics()
    assert_type(stats, RedlockStatistics)
    assert_type(stats.acquisitions, int)
    assert_type(stats.failed_attempts, int)
    assert_type(stats.held, int)
    assert_type(stats.in_flight, int)


async def errors(redlock: AsyncRedlock) -> None:
    try:
        await redlock.lock("x").acquire()
    except (LockTimeoutError, QuorumUnavailableError) as exc:
        assert_type(exc.resource, str)
        assert_type(exc.outcomes, tuple[NodeOutcome, ...])
        outcome = exc.outcomes[0]
        assert_type(outcome.node, str)
        assert_type(outcome.ok, bool)
        assert_type(outcome.detail, str)
    except (LockLostError, LockNotOwnedError) as exc:
        assert_type(exc, LockLostError | LockNotOwnedError)
    except RedlockError as exc:
        assert_type(exc.outcomes, tuple[NodeOutcome, ...])


async def lost_lease(lease: Lease) -> None:
    try:
        await lease.release()
    except LostLeaseError as exc:  # both: caught by either as before
        not_owned: LockNotOwnedError = exc
        lost: LockLostError = exc
        assert_type(not_owned.resource, str)
        assert_type(lost.outcomes, tuple[NodeOutcome, ...])


async def refused_at_type_check(redlock: AsyncRedlock) -> None:
    # A str is a Sequence[str] to a type checker: AsyncRedlock("redis://h1") passes
    # here and is refused only at run time (TypeError, see test_validation.py).
    AsyncRedlock([b"redis://h1"])  # type: ignore[list-item]
    AsyncRedlock(["redis://h1"], 5.0)  # type: ignore[call-arg]
    AsyncRedlock(["redis://h1"], ttl="5")  # type: ignore[arg-type]
    redlock.lock(42)  # type: ignore[arg-type]
    redlock.lock("x", ttl=None, timeout="1")  # type: ignore[arg-type]
    redlock.lock("x", 1.0)  # type: ignore[call-arg]
    lease = await redlock.lock("x").acquire()
    lease.token = 3  # allowed: a plain attribute
    lease.validity = 1.0  # type: ignore[misc]


def testing_support() -> None:
    assert_type(find_server_binary(), str)
    with ServerGroup(3) as group:
        assert_type(group, ServerGroup)
        assert_type(group.urls, list[str])
        assert_type(group[0], ServerProcess)
        assert_type(group[0].url, str)
        assert_type(group[0].port, int)
    proxy = FaultProxy("127.0.0.1", group[0].port)
    assert_type(proxy.url, str)
    front = FaultProxy("127.0.0.1", group[0].port, ssl_context=ssl.create_default_context())
    assert_type(front.handshakes, int)
    FaultProxy("127.0.0.1", group[0].port, ssl_context="ca.pem")  # type: ignore[arg-type]
    with ServerGroup(3, fake_clock=True) as skewed:
        clock = skewed[0].clock
        assert_type(clock, FakeClock)
        clock.jump(30)
        clock.set_offset(-20.5)
        assert_type(clock.offset, float)
        clock.jump("30")  # type: ignore[arg-type]
    assert_type(asyncredlock.__version__, str)


async def fencing(lease: Lease, client: Redis) -> None:
    token = check_token(lease.token)
    assert_type(token, int)
    guard = FenceGuard()
    guard.check(token, "orders:42")
    assert_type(guard.newest("orders:42"), int | None)
    guard.check(lease.token)  # type: ignore[arg-type]

    store = FencedStore(client, prefix="app:")
    await store.write("orders:42", b"paid", token)
    await store.write("orders:42", 1.5, token)
    found = await store.read("orders:42")
    assert_type(found, FencedValue | None)
    if found is not None:
        assert_type(found.value, bytes)
        assert_type(found.token, int)
    assert_type(await store.read("orders:42", token), FencedValue | None)
    await store.read("orders:42", "7")  # type: ignore[arg-type]
    await store.delete("orders:42", token)
    await store.write("orders:42", None, token)  # type: ignore[arg-type]
    FencedStore(client, "app:")  # type: ignore[call-arg]

    fence = SQLFence("shop.orders", key_column="id", fence_column="fence", paramstyle="dollar")
    sql, params = fence.update_statement(42, {"status": "paid"}, token)
    assert_type(sql, str)
    assert_type(params, tuple[object, ...] | dict[str, object])
    assert_type(
        fence.upsert_statement("a", {"status": "paid"}, token),
        tuple[str, tuple[object, ...] | dict[str, object]],
    )
    assert_type(fence.token_statement(42)[0], str)
    with sqlite3.connect(":memory:") as db:
        SQLFence("orders").update(db, 42, {"status": "paid"}, token)
        SQLFence("orders").upsert(db, 42, {"status": "paid"}, token)
    SQLFence("orders", paramstyle="percent")  # type: ignore[arg-type]
    SQLFence("orders", "id")  # type: ignore[call-arg]

    try:
        guard.check(token)
    except StaleTokenError as exc:
        assert_type(exc.token, int)
        assert_type(exc.newest, int)
        assert_type(exc.resource, str)
    except MissingRecordError as exc:
        assert_type(exc, MissingRecordError)
    assert_type(asyncredlock.StaleTokenError, type[StaleTokenError])


async def decorated(redlock: AsyncRedlock) -> None:
    @redlock.locked("jobs:{job_id}", ttl=30.0, timeout=0)
    async def run_job(job_id: int, *, dry_run: bool = False) -> str:
        return f"{job_id} {dry_run}"

    assert_type(await run_job(7, dry_run=True), str)
    await run_job("7")  # type: ignore[arg-type]
    redlock.locked("jobs", ttl="30")  # type: ignore[arg-type]
    assert_type(redlock.identity, str)
    lease = await redlock.lock("leader").acquire()

    def step_down(lost: Lease) -> None: ...

    assert_type(lease.add_lost_callback(step_down), None)
    assert_type(lease.remove_lost_callback(step_down), int)

    def takes_nothing() -> None: ...

    lease.add_lost_callback(takes_nothing)  # type: ignore[arg-type]
    AsyncRedlock(["redis://h1"], identity="web-3")


async def returns_from_the_block(redlock: AsyncRedlock) -> int:
    # The block never swallows an exception, so a return inside it is the last word
    # (mypy would report a missing return if __aexit__ were typed as returning bool).
    async with redlock.lock("orders:42"):
        return 42


def web_apps() -> None:
    from aiohttp import web
    from fastapi import Depends, FastAPI

    from asyncredlock.contrib import aiohttp as redlock_aiohttp
    from asyncredlock.contrib import fastapi as redlock_fastapi

    app = FastAPI(lifespan=redlock_fastapi.lifespan(["redis://h1"], ttl=10.0))
    redlock_fastapi.add_exception_handlers(app, redlock_fastapi.HTTPErrors(busy=409))

    @app.put("/orders/{order_id}")
    async def update(
        order_id: int, lease: Annotated[Lease, Depends(redlock_fastapi.locked("orders:{order_id}"))]
    ) -> int | None:
        return lease.token

    assert_type(redlock_fastapi.redlock_of(app), AsyncRedlock)
    redlock_fastapi.locked("orders", ttl="10")  # type: ignore[arg-type]

    web_app = web.Application()
    redlock_aiohttp.setup(web_app, ["redis://h1"], errors=redlock_aiohttp.HTTPErrors())

    @redlock_aiohttp.locked("orders:{order_id}", timeout=2)
    async def handler(request: web.Request) -> web.Response:
        assert_type(request.app[redlock_aiohttp.REDLOCK], AsyncRedlock)
        assert_type(request[redlock_aiohttp.LEASE], Lease)
        return web.Response()

    kept: Callable[[web.Request], Coroutine[Any, Any, web.Response]] = handler  # same signature
    assert kept is handler
