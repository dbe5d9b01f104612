"""Review of ``asyncredlock.contrib.aiohttp``: cases the contrib tests leave out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import anyio
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from asyncredlock import AsyncRedlock
from asyncredlock.contrib.aiohttp import REDLOCK, locked, setup
from asyncredlock.testing import ServerGroup

from .apps.items import HANG_GUARD
from .conftest import Masters, errors_logged

pytestmark = pytest.mark.anyio

QUORUM = 3
Client = TestClient[web.Request, web.Application]


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[Client]:
    async with TestClient(TestServer(app)) as client:
        yield client


@asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[str]:
    """``app`` behind a real ``AppRunner`` (aiohttp's defaults) on 127.0.0.1; its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def app_with(masters: list[str]) -> web.Application:
    app = web.Application()
    setup(app, masters)
    return app


class TestDocs:
    async def test_the_docs_first_example_runs(self, servers: ServerGroup) -> None:
        """docs/aiohttp.md's first example, with the session's masters."""
        app = web.Application()
        setup(app, servers.urls, ttl=10.0)
        seen: list[object] = []

        @locked("orders:{order_id}", timeout=2)
        async def update(request: web.Request) -> web.Response:
            redlock = request.config_dict[REDLOCK]
            seen.append((await redlock.inspect("orders:7")).holder)
            return web.json_response({"ok": True})

        app.router.add_put("/orders/{order_id}", update)
        with anyio.fail_after(HANG_GUARD):
            async with (
                running(app) as url,
                aiohttp.ClientSession() as session,
                session.put(f"{url}/orders/7") as response,
            ):
                assert (response.status, await response.json()) == (200, {"ok": True})
        assert len(seen) == 1
        assert seen[0] is not None


class TestLoss:
    async def test_a_handler_that_swallows_the_cancellation_still_gets_503(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)

        @locked("job:{job}")
        async def work(request: web.Request) -> web.Response:
            try:
                await request.app[REDLOCK].force_release(f"job:{request.match_info['job']}")
                await anyio.sleep_forever()
            except asyncio.CancelledError:
                return web.Response(text="done anyway")
            return web.Response(text="unreachable")

        app.router.add_post("/work/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, client.post("/work/3") as response:
                assert response.status == 503, await response.text()


class TestNames:
    @pytest.mark.parametrize("path", ["/orders/%ED%A0%80", "/orders/%FF", "/orders/%C0%80"])
    async def test_a_path_that_is_not_utf8_is_no_server_error(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture, path: str
    ) -> None:
        app = app_with(servers.urls)

        @locked("o:{order_id}")
        async def get(request: web.Request) -> web.Response:
            return web.Response()

        app.router.add_get("/orders/{order_id}", get)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, client.get(path) as response:
                status = response.status
        assert status in (200, 400), status
        assert errors_logged(caplog) == []


class TestWithoutSetup:
    async def test_a_locked_route_of_an_app_without_setup_says_what_is_missing(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """No setup(): a 500 whose logged error says to call setup(), as FastAPI's says
        to give the app its lifespan (a bare KeyError before)."""
        app = web.Application()

        @locked("o:{order_id}")
        async def get(request: web.Request) -> web.Response:
            return web.Response()

        app.router.add_get("/orders/{order_id}", get)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, client.get("/orders/7") as response:
                status = response.status
        errors = [r.exc_info[1] for r in caplog.records if r.exc_info]
        assert status == 500
        assert len(errors) == 1
        assert isinstance(errors[0], RuntimeError), errors
        assert "setup()" in str(errors[0])


class TestOverhead:
    async def test_requests_open_no_connection_of_their_own(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        app = app_with(servers.urls)

        @locked("o:{order_id}")
        async def put(request: web.Request) -> web.Response:
            return web.Response()

        app.router.add_put("/orders/{order_id}", put)

        async def counts() -> list[int]:
            return [int((await c.info("clients"))["connected_clients"]) for c in masters.clients]

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                async with client.put("/orders/0") as response:
                    assert response.status == 200
                before = await counts()
                for i in range(30):
                    async with client.put(f"/orders/{i % 3}") as response:
                        assert response.status == 200
                after = await counts()
        assert after == before


class TestRealServer:
    async def test_a_stream_whose_client_went_away_releases_the_lock(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """AppRunner's default (no handler_cancellation): a handler streaming to a
        client gone away fails at its next write, and the lock is released."""
        app = app_with(servers.urls)
        sent, ended = asyncio.Event(), asyncio.Event()

        @locked("export:{job}")
        async def export(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            await response.prepare(request)
            try:
                await response.write(b"part\n")
                sent.set()
                while True:
                    await response.write(b"more\n")
                    await asyncio.sleep(0.01)  # a producer's pace, not a sync point
            finally:
                ended.set()

        app.router.add_get("/export/{job}", export)
        with anyio.fail_after(HANG_GUARD):
            async with running(app) as url, AsyncRedlock(servers.urls) as other:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"{url}/export/1") as response,
                ):
                    await response.content.readline()
                    await sent.wait()
                await ended.wait()
                async with other.lock("export:1", timeout=HANG_GUARD) as lease:
                    assert lease.held

    async def test_a_websocket_client_gone_releases_the_lock(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        app = app_with(servers.urls)
        ended = asyncio.Event()

        @web.middleware
        async def done(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
            try:
                return await handler(request)
            finally:
                ended.set()  # outermost: after the decorator released the lock

        app.middlewares.insert(0, done)

        @locked("room:{room}", timeout=0)
        async def chat(request: web.Request) -> web.StreamResponse:
            socket = web.WebSocketResponse()
            await socket.prepare(request)
            await socket.send_str("hello")
            async for _ in socket:
                pass
            return socket

        app.router.add_get("/rooms/{room}", chat)
        with anyio.fail_after(HANG_GUARD):
            async with running(app) as url, aiohttp.ClientSession() as session:
                socket = await session.ws_connect(f"{url}/rooms/1")
                assert (await socket.receive()).data == "hello"
                await socket.close()
                await ended.wait()
                async with session.ws_connect(f"{url}/rooms/1") as again:  # timeout=0
                    assert (await again.receive()).data == "hello"


class TestWebSocketLoss:
    async def test_a_lease_lost_while_the_handler_reads_the_socket_closes_it_with_1013(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The usual WebSocket handler sits in ``async for msg in socket`` (a pending
        receive()) when its lease is lost: the socket must still close with 1013."""
        app = app_with(servers.urls)
        cancelled: list[bool] = []
        reading = asyncio.Event()

        @locked("room:{room}")
        async def chat(request: web.Request) -> web.StreamResponse:
            socket = web.WebSocketResponse()
            await socket.prepare(request)
            await socket.send_str("hello")
            try:
                async for message in socket:
                    if message.data == "lose it":
                        await request.app[REDLOCK].force_release("room:1")
                        reading.set()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return socket

        app.router.add_get("/rooms/{room}", chat)
        with anyio.fail_after(HANG_GUARD):
            async with running(app) as url, aiohttp.ClientSession() as session:
                socket = await session.ws_connect(f"{url}/rooms/1")
                assert (await socket.receive()).data == "hello"
                await socket.send_str("lose it")
                ending = await socket.receive()
                await socket.close()
        assert cancelled == [True]
        assert (ending.type, ending.data) == (aiohttp.WSMsgType.CLOSE, 1013), ending

    async def test_a_lease_lost_on_a_sub_applications_websocket_closes_it_with_1013(
        self, servers: ServerGroup
    ) -> None:
        """setup() on the main app, the WebSocket route in a sub-application: the
        main app's middleware must still know the socket was prepared."""
        app = app_with(servers.urls)
        api = web.Application()

        @locked("room:{room}")
        async def chat(request: web.Request) -> web.StreamResponse:
            socket = web.WebSocketResponse()
            await socket.prepare(request)
            await socket.send_str("hello")
            await request.config_dict[REDLOCK].force_release("room:1")
            await anyio.sleep_forever()
            return socket

        api.router.add_get("/rooms/{room}", chat)
        app.add_subapp("/api", api)
        with anyio.fail_after(HANG_GUARD):
            async with running(app) as url, aiohttp.ClientSession() as session:
                socket = await session.ws_connect(f"{url}/api/rooms/1")
                assert (await socket.receive()).data == "hello"
                ending = await socket.receive()
                await socket.close()
        assert (ending.type, ending.data) == (aiohttp.WSMsgType.CLOSE, 1013), ending
