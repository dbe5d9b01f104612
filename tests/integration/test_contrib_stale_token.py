"""The web helpers answer a handler's refused fenced write (`StaleTokenError`) as a
loss: 503 with ``Retry-After`` (a WebSocket closed with 1013), as they answer
`LockLostError`; `MissingRecordError` stays the framework's 500.

The handler's write is refused for real: a second client forces the handler's lock
free, acquires it and writes the record with its larger token before the handler
writes. The handler's lease does not extend itself (an extension would find the loss
and cancel the handler before it writes), and two of the three masters are stopped
before the handler writes: the release after it reaches one master, which cannot
tell, so nothing turns the `StaleTokenError` into a loss (with the masters reachable
the release finds the lease gone: `test_with_the_masters_reachable_...`)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
import httpx
import pytest
from aiohttp import WSMsgType, web
from fastapi import Depends, FastAPI, WebSocket
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.contrib import aiohttp as web_helpers
from asyncredlock.contrib._http import CLOSE_TRY_AGAIN_LATER, close_code
from asyncredlock.contrib.fastapi import HTTPErrors, add_exception_handlers, lifespan, locked
from asyncredlock.fencing import (
    FencedStore,
    FencedValue,
    MissingRecordError,
    SQLFence,
    StaleTokenError,
    check_token,
)
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .apps.items import HANG_GUARD
from .test_contrib_aiohttp import serving as aiohttp_serving
from .test_contrib_fastapi import answer, lost_held, serving, websocket

pytestmark = pytest.mark.anyio

Handle = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The body's ``detail`` for a refused fenced write.
STALE = "fenced write or read refused: a later holder of the lock had used the resource first"
#: The store's prefix: the answer's ``resource`` is the record's full key.
PREFIX = "data:orders:"

#: A route's lease on ``orders:{order_id}`` that does not extend itself (module level:
#: FastAPI reads the handlers' annotations as strings, in this module's names).
OrderLease = Annotated[Lease, Depends(locked("orders:{order_id}", auto_extend=False))]


@asynccontextmanager
async def fenced_store(make_servers: MakeServers) -> AsyncIterator[FencedStore]:
    """A `FencedStore` on a server of its own, apart from the masters."""
    client = Redis.from_url(make_servers(1).urls[0])
    try:
        yield FencedStore(client, prefix=PREFIX)
    finally:
        await client.aclose()


async def supersede(masters: ServerGroup, store: FencedStore, order: str) -> int:
    """A second client takes the lock of ``order`` from the handler by force (as an
    operator would), writes the record with its own, larger token and releases; its
    token."""
    async with AsyncRedlock(masters.urls) as other:
        await other.force_release(f"orders:{order}")
        async with other.lock(f"orders:{order}") as later:
            token = check_token(later.token)
            await store.write(order, b"later", token)
    return token


def cut_off(masters: ServerGroup) -> None:
    """Stop two of the three masters: the release after the handler cannot tell
    whether the lease was lost."""
    masters[1].stop()
    masters[2].stop()


def fastapi_app(masters: ServerGroup) -> FastAPI:
    app = FastAPI(lifespan=lifespan(masters.urls))
    add_exception_handlers(app)
    return app


def aiohttp_app(masters: ServerGroup) -> web.Application:
    app = web.Application()
    web_helpers.setup(app, masters.urls)
    return app


def orders_table() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, fence BIGINT NOT NULL)")
    return db


class TestFastAPI:
    @pytest.mark.parametrize("reachable", [False, True], ids=["cut off", "reachable"])
    async def test_a_refused_fenced_write_is_503_with_retry_after(
        self, make_servers: MakeServers, reachable: bool
    ) -> None:
        """Cut off from a majority, the release after the handler cannot tell the
        lease is gone: the `StaleTokenError` itself is answered. With the masters
        reachable the release finds its lease gone: a `LostLeaseError` (caused by the
        `StaleTokenError`), answered as the loss it is, 503 naming the lock. The docs
        say so."""
        group = make_servers(3)
        app = fastapi_app(group)
        holding, superseded = anyio.Event(), anyio.Event()
        responses: list[httpx.Response] = []

        async with fenced_store(make_servers) as store:

            @app.put("/orders/{order_id}")
            async def pay(order_id: str, lease: OrderLease) -> None:
                holding.set()
                await superseded.wait()
                await store.write(order_id, b"paid late", check_token(lease.token))

            with anyio.fail_after(HANG_GUARD):
                async with serving(app) as client, anyio.create_task_group() as tg:

                    async def put() -> None:
                        responses.append(await client.put("/orders/42"))

                    tg.start_soon(put)
                    await holding.wait()
                    token = await supersede(group, store, "42")
                    if not reachable:
                        cut_off(group)
                    superseded.set()
            kept = await store.read("42")
        if reachable:
            assert answer(responses[0]) == (503, "1", lost_held("orders:42"))
        else:
            assert answer(responses[0]) == (503, "1", {"detail": STALE, "resource": PREFIX + "42"})
        assert kept == FencedValue(b"later", token)  # the late write was not applied

    async def test_a_refused_fenced_write_after_the_handshake_closes_with_1013(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(3)
        app = fastapi_app(group)

        async with fenced_store(make_servers) as store:

            @app.websocket("/orders/{order_id}")
            async def pay(socket: WebSocket, order_id: str, lease: OrderLease) -> None:
                await socket.accept()
                await socket.receive_text()  # "pay", once the lock was taken from it
                await store.write(order_id, b"paid late", check_token(lease.token))

            with anyio.fail_after(HANG_GUARD):
                async with (
                    app.router.lifespan_context(app),
                    websocket(app, "/orders/42") as (send, receive),
                ):
                    assert (await receive())["type"] == "websocket.accept"
                    token = await supersede(group, store, "42")
                    cut_off(group)
                    await send({"type": "websocket.receive", "text": "pay"})
                    closing = await receive()
            kept = await store.read("42")
        assert closing == {"type": "websocket.close", "code": 1013, "reason": STALE}
        assert kept == FencedValue(b"later", token)

    async def test_a_missing_record_stays_a_500(self, servers: ServerGroup) -> None:
        """`MissingRecordError`, a fenced update of a record that does not exist, is
        the app's bug: no handler takes it."""
        app = FastAPI(lifespan=lifespan(servers.urls))
        add_exception_handlers(app)
        db = orders_table()

        @app.put("/orders/{order_id}")
        async def pay(order_id: int, lease: OrderLease) -> None:
            SQLFence("orders").update(db, order_id, {"status": "paid"}, check_token(lease.token))

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                with pytest.raises(MissingRecordError):  # the server's 500
                    await client.put("/orders/42")
        db.close()


class TestAiohttp:
    async def test_a_refused_fenced_write_is_503_with_retry_after(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(3)
        app = aiohttp_app(group)
        holding, superseded = anyio.Event(), anyio.Event()
        seen: list[tuple[int, str | None, Any]] = []

        async with fenced_store(make_servers) as store:

            @web_helpers.locked("orders:{order_id}", auto_extend=False)
            async def pay(request: web.Request) -> web.Response:
                holding.set()
                await superseded.wait()
                token = check_token(request[web_helpers.LEASE].token)
                await store.write(request.match_info["order_id"], b"paid late", token)
                return web.Response()

            app.router.add_put("/orders/{order_id}", pay)
            with anyio.fail_after(HANG_GUARD):
                async with aiohttp_serving(app) as client, anyio.create_task_group() as tg:

                    async def put() -> None:
                        async with client.put("/orders/42") as response:
                            retry = response.headers.get("Retry-After")
                            seen.append((response.status, retry, await response.json()))

                    tg.start_soon(put)
                    await holding.wait()
                    token = await supersede(group, store, "42")
                    cut_off(group)
                    superseded.set()
            kept = await store.read("42")
        assert seen == [(503, "1", {"detail": STALE, "resource": PREFIX + "42"})]
        assert kept == FencedValue(b"later", token)

    async def test_a_refused_fenced_write_on_a_websocket_closes_it_with_1013(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(3)
        app = aiohttp_app(group)

        async with fenced_store(make_servers) as store:

            @web_helpers.locked("orders:{order_id}", auto_extend=False)
            async def pay(request: web.Request) -> web.WebSocketResponse:
                socket = web.WebSocketResponse()
                await socket.prepare(request)
                await socket.receive()  # "pay", once the lock was taken from it
                token = check_token(request[web_helpers.LEASE].token)
                await store.write(request.match_info["order_id"], b"paid late", token)
                return socket

            app.router.add_get("/orders/{order_id}", pay)
            with anyio.fail_after(HANG_GUARD):
                async with aiohttp_serving(app) as client:
                    socket = await client.ws_connect("/orders/42")
                    token = await supersede(group, store, "42")
                    cut_off(group)
                    await socket.send_str("pay")
                    ending = await socket.receive()
                    await socket.close()
            kept = await store.read("42")
        assert (ending.type, ending.data, ending.extra) == (WSMsgType.CLOSE, 1013, STALE)
        assert kept == FencedValue(b"later", token)

    async def test_a_missing_record_stays_a_500(self, servers: ServerGroup) -> None:
        app = web.Application()
        web_helpers.setup(app, servers.urls)
        db = orders_table()
        failures: list[BaseException] = []

        @web.middleware
        async def keep(request: web.Request, handler: Handle) -> web.StreamResponse:
            try:
                return await handler(request)
            except Exception as exc:
                failures.append(exc)
                raise

        app.middlewares.insert(0, keep)

        @web_helpers.locked("orders:{order_id}")
        async def pay(request: web.Request) -> web.Response:
            token = check_token(request[web_helpers.LEASE].token)
            SQLFence("orders").update(db, request.match_info["order_id"], {"status": "paid"}, token)
            return web.Response()

        app.router.add_put("/orders/{order_id}", pay)
        with anyio.fail_after(HANG_GUARD):
            async with aiohttp_serving(app) as client, client.put("/orders/42") as response:
                status, retry = response.status, response.headers.get("Retry-After")
        db.close()
        assert (status, retry) == (500, None)
        assert [type(failure) for failure in failures] == [MissingRecordError]


class TestMapping:
    def test_the_lost_status_answers_it_and_a_missing_record_is_left_alone(self) -> None:
        """`HTTPErrors.lost` is the status (configurable as for a loss); the detail fits
        a WebSocket close reason (123 bytes), closed with 1013 (Try Again Later)."""
        errors = HTTPErrors(lost=409, retry_after=7)
        stale = StaleTokenError("stale", resource="data:orders:42", token=1, newest=2)
        missing = MissingRecordError("no order 42", resource="42")
        response = errors.response(stale)
        assert response is not None
        assert (response.status, response.headers, response.body) == (
            409,
            {"Retry-After": "7"},
            {"detail": STALE, "resource": "data:orders:42"},
        )
        assert close_code(response) == CLOSE_TRY_AGAIN_LATER
        assert len(STALE.encode()) <= 123
        assert errors.response(missing) is None
