"""Review of the framework integrations (rint): shutdown with requests in flight, a
lease lost on a WebSocket or an aiohttp stream, a client gone away."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Annotated, Any

import anyio
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from fastapi import Depends, FastAPI

from asyncredlock import AsyncRedlock, Lease, LockLostError
from asyncredlock.contrib import aiohttp as redlock_aiohttp
from asyncredlock.contrib.fastapi import add_exception_handlers, lifespan, locked, redlock_of
from asyncredlock.testing import FaultProxy, ServerGroup, Waits

from .conftest import Masters, library_tasks

pytestmark = pytest.mark.anyio

#: Bounds a hung test; never decides an outcome.
HANG_GUARD = 10


def fastapi_app(masters: list[str]) -> FastAPI:
    app = FastAPI(lifespan=lifespan(masters))
    add_exception_handlers(app)
    return app


def aiohttp_app(masters: list[str]) -> web.Application:
    app = web.Application()
    redlock_aiohttp.setup(app, masters)
    return app


class TestFastAPIShutdown:
    async def test_a_request_holding_a_lease_at_shutdown_gets_503_and_leaves_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Guard (not covered elsewhere): the lifespan exits while a handler holds
        its lease: the handler is cancelled, the client gets 503, no key, no task."""
        app = fastapi_app(servers.urls)
        inside = anyio.Event()
        ends: list[str] = []
        answers: list[tuple[int, str]] = []

        @app.post("/work/{job}")
        async def work(job: str, lease: Annotated[Lease, Depends(locked("work:{job}"))]) -> None:
            inside.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                ends.append("cancelled")
                raise

        with anyio.fail_after(HANG_GUARD):
            transport = httpx.ASGITransport(app)
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://app") as client,
                anyio.create_task_group() as tg,
            ):
                running = app.router.lifespan_context(app)
                await running.__aenter__()

                async def post() -> None:
                    response = await client.post("/work/1")
                    answers.append((response.status_code, response.json()["resource"]))

                tg.start_soon(post)
                await inside.wait()
                await running.__aexit__(None, None, None)
        assert ends == ["cancelled"]
        assert answers == [(503, "work:1")]
        assert await masters.keys() == [[]] * len(masters)
        assert library_tasks() == []

    async def test_a_stream_holding_a_lease_at_shutdown_is_cut_and_leaves_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Guard: the same for a generator handler mid-stream."""
        app = fastapi_app(servers.urls)
        inside = anyio.Event()
        ends: list[str] = []

        @app.get("/export/{job}")
        async def export(job: str, lease: Annotated[Lease, Depends(locked("export:{job}"))]) -> Any:
            yield "part"
            inside.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                ends.append("cancelled")
                raise
            yield "unprotected"

        got: list[object] = []
        with anyio.fail_after(HANG_GUARD):
            transport = httpx.ASGITransport(app)
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://app") as client,
                anyio.create_task_group() as tg,
            ):
                running = app.router.lifespan_context(app)
                await running.__aenter__()

                async def get() -> None:
                    try:
                        await client.get("/export/1")
                    except Exception as exc:  # the status went out: the stream is cut
                        # with add_exception_handlers, Starlette's RuntimeError("response
                        # already started") from the LockLostError
                        chain = [exc, exc.__cause__, exc.__context__]
                        got.append(any(isinstance(e, LockLostError) for e in chain))

                tg.start_soon(get)
                await inside.wait()
                await running.__aexit__(None, None, None)
        assert ends == ["cancelled"]
        assert got == [True]
        assert await masters.keys() == [[]] * len(masters)
        assert library_tasks() == []


class TestAiohttpClientGone:
    async def test_a_client_gone_releases_the_lease(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Guard (documented, not tested elsewhere): with handler_cancellation (the
        test server's default) a disconnect cancels the handler and releases."""
        app = aiohttp_app(servers.urls)
        inside, ended = asyncio.Event(), asyncio.Event()

        @redlock_aiohttp.locked("job:{job}")
        async def work(request: web.Request) -> web.Response:
            inside.set()
            try:
                await anyio.sleep_forever()
            finally:
                ended.set()
            return web.Response()

        app.router.add_get("/job/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with TestClient(TestServer(app)) as client, AsyncRedlock(servers.urls) as other:
                async with anyio.create_task_group() as tg:

                    async def get() -> None:
                        async with client.get("/job/1"):
                            pass

                    tg.start_soon(get)
                    await inside.wait()
                    tg.cancel_scope.cancel()  # the client goes away
                await ended.wait()
                async with other.lock("job:1", timeout=HANG_GUARD) as lease:
                    assert lease.held
        assert await masters.keys() == [[]] * len(masters)

    async def test_a_request_waiting_for_the_lock_at_close_leaves_the_queue(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Guard: a request waiting for a contended lock when the client goes away
        stops waiting: the next holder gets it at once after the holder's release."""
        app = aiohttp_app(servers.urls)
        ran: list[bool] = []
        done = asyncio.Event()

        @web.middleware
        async def ended(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                return await handler(request)
            finally:
                done.set()

        app.middlewares.insert(0, ended)

        @redlock_aiohttp.locked("job:{job}", timeout=HANG_GUARD, fair=True)
        async def work(request: web.Request) -> web.Response:
            ran.append(True)
            return web.Response()

        app.router.add_get("/job/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with TestClient(TestServer(app)) as client, AsyncRedlock(servers.urls) as other:
                async with other.lock("job:1"):
                    waits = Waits(client.app[redlock_aiohttp.REDLOCK])
                    async with anyio.create_task_group() as tg:

                        async def get() -> None:
                            async with client.get("/job/1"):
                                pass

                        tg.start_soon(get)
                        await waits.reach(1)  # the request waits on the masters' queue
                        tg.cancel_scope.cancel()
                    waits.close()
                    await done.wait()  # the server saw the disconnect: the handler ended
                async with other.lock("job:1", timeout=0) as lease:  # fair: nobody queued
                    assert lease.held
        assert ran == []
        assert await masters.keys() == [[]] * len(masters)


class TestExtensionFailsMidRequest:
    """A request whose lease cannot be extended (a majority of masters gone silent)
    ends with 503 at the end of its validity, in both frameworks."""

    async def test_fastapi_answers_503_when_the_extension_cannot_reach_a_quorum(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncExitStack() as stack:
            proxies, urls = await three_behind_proxies(stack, servers, masters)
            app = FastAPI(lifespan=lifespan(urls, node_timeout=0.3, socket_timeout=0.5))
            add_exception_handlers(app)
            inside = anyio.Event()
            cancelled: list[bool] = []

            @app.post("/work/{job}")
            async def work(
                job: str, lease: Annotated[Lease, Depends(locked("work:{job}", ttl=1.0))]
            ) -> None:
                await redlock_of(app).settle()  # the key is on every master
                inside.set()
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    cancelled.append(True)
                    raise

            answers: list[tuple[int, str]] = []
            with anyio.fail_after(HANG_GUARD):
                async with app.router.lifespan_context(app), anyio.create_task_group() as tg:
                    transport = httpx.ASGITransport(app)
                    client = await stack.enter_async_context(
                        httpx.AsyncClient(transport=transport, base_url="http://app")
                    )

                    async def post() -> None:
                        response = await client.post("/work/1")
                        answers.append((response.status_code, response.json()["detail"]))

                    tg.start_soon(post)
                    await inside.wait()
                    for proxy in proxies:
                        proxy.blackhole = True
                for proxy in proxies:
                    proxy.heal()
            assert cancelled == [True]
            assert answers == [(503, "lock lost while the handler ran: its work was cancelled")]
        assert library_tasks() == []  # the client's and, closed now, the proxies'

    async def test_aiohttp_answers_503_when_the_extension_cannot_reach_a_quorum(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncExitStack() as stack:
            proxies, urls = await three_behind_proxies(stack, servers, masters)
            app = web.Application()
            redlock_aiohttp.setup(app, urls, node_timeout=0.3, socket_timeout=0.5)
            inside = asyncio.Event()

            @redlock_aiohttp.locked("work:{job}", ttl=1.0)
            async def work(request: web.Request) -> web.Response:
                await request.app[redlock_aiohttp.REDLOCK].settle()
                inside.set()
                await anyio.sleep_forever()
                return web.Response()

            app.router.add_post("/work/{job}", work)
            with anyio.fail_after(HANG_GUARD):
                async with TestClient(TestServer(app)) as client:
                    async with anyio.create_task_group() as tg:
                        answers: list[tuple[int, str]] = []

                        async def post() -> None:
                            async with client.post("/work/1") as response:
                                body = await response.json()
                                answers.append((response.status, body["detail"]))

                        tg.start_soon(post)
                        await inside.wait()
                        for proxy in proxies:
                            proxy.blackhole = True
                    for proxy in proxies:
                        proxy.heal()
            assert answers == [(503, "lock lost while the handler ran: its work was cancelled")]


async def three_behind_proxies(
    stack: AsyncExitStack, servers: ServerGroup, masters: Masters
) -> tuple[list[FaultProxy], list[str]]:
    """A proxy before each of the first three masters (closed with ``stack``): the
    proxies, and the five masters' URLs, those three through their proxy."""
    proxies = [
        await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
        for server in list(servers)[:3]
    ]
    return proxies, [proxy.url for proxy in proxies] + masters.urls[3:]
