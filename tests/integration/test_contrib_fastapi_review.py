"""Review of ``asyncredlock.contrib.fastapi``: cases the contrib tests leave out."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, WebSocket
from fastapi.dependencies.models import _is_async_gen_callable, _is_gen_callable

from asyncredlock import Lease
from asyncredlock.contrib.fastapi import (
    _generator_callable,
    add_exception_handlers,
    lifespan,
    locked,
    redlock_of,
)
from asyncredlock.testing import ServerGroup

from .apps.items import HANG_GUARD
from .conftest import Masters, errors_logged, library_tasks
from .test_contrib_fastapi import app_with, in_uvicorn, serving, websocket

pytestmark = pytest.mark.anyio

QUORUM = 3


class TestStreamedDetection:
    async def test_a_generator_handler_of_an_included_router_streams_holding_the_lock(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Most apps declare routes on an APIRouter: the stream's body must still run
        holding the lock."""
        app = app_with(servers.urls)
        router = APIRouter(prefix="/api")
        held: list[int] = []

        @router.get("/export/{job}")
        async def export(
            job: str, lease: Annotated[Lease, Depends(locked("export:{job}"))]
        ) -> AsyncIterator[str]:
            held.append(await masters.holding(f"export:{job}"))
            yield "part"

        app.include_router(router)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                assert (await client.get("/api/export/1")).status_code == 200
        assert len(held) == 1
        assert held[0] >= QUORUM, held

    async def test_a_handler_made_a_generator_by_its_decorator_streams_holding_the_lock(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A decorator (functools.wraps) whose wrapper is an async generator turns a
        coroutine handler into one FastAPI streams (it checks the wrapper before
        unwrapping): the body runs while the response is sent, so the lock must be
        held then too."""
        app = app_with(servers.urls)
        held: list[int] = []

        def lines(handler: Callable[..., Awaitable[list[str]]]) -> Callable[..., Any]:
            @functools.wraps(handler)
            async def streamed(*args: Any, **kwargs: Any) -> AsyncIterator[str]:
                for line in await handler(*args, **kwargs):
                    yield line

            return streamed

        @app.get("/export/{job}")
        @lines
        async def export(
            job: str, lease: Annotated[Lease, Depends(locked("export:{job}"))]
        ) -> list[str]:
            held.append(await masters.holding(f"export:{job}"))
            return ["part"]

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.get("/export/1")
        assert response.status_code == 200
        assert len(held) == 1
        assert held[0] >= QUORUM, held  # 0: the lock was released before the body ran

    def test_streamed_detection_agrees_with_fastapis_own(self) -> None:
        """_streamed() asks what FastAPI decides: the same answer for plain, decorated,
        partial and callable-object handlers, whichever layer is the generator."""

        def coroutine() -> Callable[..., Any]:
            async def call() -> None: ...

            return call

        def agen() -> Callable[..., Any]:
            async def call() -> AsyncIterator[str]:
                yield ""

            return call

        def gen() -> Callable[..., Any]:
            def call() -> Iterator[str]:
                yield ""

            return call

        class Instance:
            async def __call__(self) -> AsyncIterator[str]:
                yield ""

        class Wrapped:  # its __call__ a generator wrapping a coroutine
            __call__ = functools.wraps(coroutine())(agen())

        kinds = [coroutine, agen, gen, Instance]
        calls: list[Any] = [make() for make in kinds] + [Wrapped(), Instance]
        # each wrapper a fresh function, over each kind (functools.wraps sets __wrapped__)
        calls += [functools.wraps(inner())(outer()) for inner in kinds for outer in kinds[:3]]
        calls += [functools.partial(c, 1) for c in calls if not isinstance(c, type)]
        ours = [_generator_callable(c) for c in calls]
        theirs = [_is_gen_callable(c) or _is_async_gen_callable(c) for c in calls]
        assert ours == theirs
        assert True in ours
        assert False in ours


class TestLoss:
    async def test_a_handler_that_swallows_the_cancellation_still_gets_503(
        self, servers: ServerGroup
    ) -> None:
        """A handler catching CancelledError and returning: the docs promise no 200
        built on unprotected work."""
        app = app_with(servers.urls)

        @app.post("/work/{job}")
        async def work(job: str, lease: Annotated[Lease, Depends(locked("job:{job}"))]) -> str:
            try:
                await redlock_of(app).force_release(f"job:{job}")
                await anyio.sleep_forever()
            except asyncio.CancelledError:
                return "done anyway"
            return "unreachable"

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.post("/work/7")
        assert response.status_code == 503, response.text


class TestOverhead:
    async def test_requests_open_no_connection_of_their_own(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Each request's lock goes over the AsyncRedlock's connections: thirty
        requests leave the masters' client counts where one left them."""
        app = app_with(servers.urls)

        @app.put("/orders/{order_id}")
        async def update(
            order_id: str, lease: Annotated[Lease, Depends(locked("o:{order_id}"))]
        ) -> None: ...

        async def counts() -> list[int]:
            return [int((await c.info("clients"))["connected_clients"]) for c in masters.clients]

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                assert (await client.put("/orders/0")).status_code == 200
                before = await counts()
                for i in range(30):
                    assert (await client.put(f"/orders/{i % 3}")).status_code == 200
                after = await counts()
        assert after == before


class TestNames:
    @pytest.mark.parametrize("path", ["/orders/%ED%A0%80", "/orders/%FF", "/orders/a%2Fb"])
    async def test_a_path_that_is_not_utf8_is_no_server_error(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture, path: str
    ) -> None:
        app = app_with(servers.urls)
        names: list[str] = []

        @app.get("/orders/{order_id:path}")
        async def get(lease: Annotated[Lease, Depends(locked("o:{order_id}"))]) -> None:
            names.append(lease.resource)

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.get(path)
        assert response.status_code in (200, 400), (response.status_code, response.text)
        assert errors_logged(caplog) == []


class TestCancelledFromOutside:
    async def test_a_timeout_middleware_cancelling_the_handler_leaves_the_lock_free(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A pure ASGI middleware bounding each request (anyio.fail_after) cancels the
        handler while it holds the lock: the lock must be free, no task left, when
        the 504 leaves."""
        inner = app_with(servers.urls)
        inside = anyio.Event()

        @inner.post("/work/{job}")
        async def work(job: str, lease: Annotated[Lease, Depends(locked("job:{job}"))]) -> None:
            inside.set()
            await anyio.sleep_forever()

        async def bounded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            with anyio.move_on_after(0.2):  # the middleware's deadline, not a measure
                await inner(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 504, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        with anyio.fail_after(HANG_GUARD):
            async with inner.router.lifespan_context(inner):
                transport = httpx.ASGITransport(bounded)
                async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
                    response = await client.post("/work/1")
                    held = (await redlock_of(inner).inspect("job:1")).holder
                    tasks = library_tasks()
        assert inside.is_set()
        assert response.status_code == 504
        assert held is None
        assert [t for t in tasks if "release" in repr(t.get_coro())] == []

    async def test_a_sync_handler_whose_lease_is_lost_gets_503(self, servers: ServerGroup) -> None:
        """docs/fastapi.md: a sync handler cannot be cancelled; on a loss it runs to
        its end, and the client still gets 503."""
        app = app_with(servers.urls)

        @app.post("/work/{job}")
        def work(job: str, lease: Annotated[Lease, Depends(locked("job:{job}"))]) -> str:
            anyio.from_thread.run(redlock_of(app).force_release, f"job:{job}")
            anyio.from_thread.run(lease.wait_lost)
            return "built on unprotected work"

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.post("/work/7")
        assert response.status_code == 503, response.text


class TestMounted:
    @pytest.mark.parametrize("wrapped", [False, True], ids=["lifespan", "wrapped"])
    async def test_a_mounted_sub_applications_routes_find_the_main_apps_redlock(
        self, servers: ServerGroup, wrapped: bool
    ) -> None:
        """A server runs the lifespan of the app it serves, never a mounted one's: the
        routes of a sub-application mounted with app.mount() find the AsyncRedlock of
        the main app's lifespan (its lifespan state), through locked() and
        redlock_of(request); also when the app's own lifespan enters it and yields
        its state (docs/fastapi.md)."""
        redlock_lifespan = lifespan(servers.urls)

        @asynccontextmanager
        async def app_lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
            async with redlock_lifespan(app) as state:
                yield state

        main = FastAPI(lifespan=app_lifespan if wrapped else redlock_lifespan)
        sub = FastAPI()
        add_exception_handlers(sub)
        holders: list[str | None] = []

        @sub.put("/orders/{order_id}")
        async def update(
            request: Request,
            order_id: str,
            lease: Annotated[Lease, Depends(locked("o:{order_id}"))],
        ) -> str:
            holders.append((await redlock_of(request).inspect(lease.resource)).holder)
            return lease.resource

        main.mount("/v2", sub)
        with anyio.fail_after(HANG_GUARD):
            async with in_uvicorn(main) as port, httpx.AsyncClient() as client:
                response = await client.put(f"http://127.0.0.1:{port}/v2/orders/7")
        assert (response.status_code, response.text) == (200, '"o:7"')  # was 500
        assert len(holders) == 1
        assert holders[0] is not None


class TestScopes:
    async def test_a_request_scoped_depends_still_releases_before_the_response(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """docs/fastapi.md: released before the response is sent "whatever scope your
        Depends() has", so also with Depends(locked(...), scope="request")."""
        app = app_with(servers.urls)
        seen: list[int] = []

        @app.put("/orders/{order_id}")
        async def update(
            order_id: str,
            lease: Annotated[Lease, Depends(locked("o:{order_id}"), scope="request")],
        ) -> None:
            seen.append(await masters.holding("o:7"))

        async def watched(scope: Any, receive: Any, send: Any) -> None:
            async def sending(message: Any) -> None:
                if message["type"] == "http.response.start":  # a quorum released?
                    seen.append(int((await redlock_of(app).inspect("o:7")).holder is not None))
                await send(message)

            await app(scope, receive, sending)

        with anyio.fail_after(HANG_GUARD):
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(watched)
                async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
                    assert (await client.put("/orders/7")).status_code == 200
        assert len(seen) == 2
        assert seen[0] >= QUORUM, seen  # held in the handler
        assert seen[1] == 0, seen  # free when the response starts


class TestWebSocketShutdown:
    async def test_a_websocket_holding_a_lease_at_shutdown_is_closed_with_1013(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The lifespan exits mid-conversation: the handler is cancelled, the socket
        closed as for a lost lease (1013), no key left."""
        app = app_with(servers.urls)
        ends: list[str] = []

        @app.websocket("/rooms/{room}")
        async def chat(
            socket: WebSocket, room: str, lease: Annotated[Lease, Depends(locked("room:{room}"))]
        ) -> None:
            await socket.accept()
            await socket.send_text("hello")
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                ends.append("cancelled")
                raise

        with anyio.fail_after(HANG_GUARD):
            running = app.router.lifespan_context(app)
            await running.__aenter__()
            async with websocket(app, "/rooms/1") as (_, receive):
                assert (await receive())["type"] == "websocket.accept"
                assert (await receive())["text"] == "hello"
                await running.__aexit__(None, None, None)
                ending = await receive()
        assert ends == ["cancelled"]
        assert (ending["type"], ending.get("code")) == ("websocket.close", 1013), ending
        assert await masters.keys() == [[]] * len(masters)

    async def test_a_handler_that_raises_releases_before_its_error_response(
        self, servers: ServerGroup
    ) -> None:
        """An HTTPException from the handler: its 409 leaves with the lock free."""
        app = app_with(servers.urls)
        holders: list[str | None] = []

        @app.put("/orders/{order_id}")
        async def update(
            order_id: str, lease: Annotated[Lease, Depends(locked("o:{order_id}"))]
        ) -> None:
            raise HTTPException(409, "conflict")

        async def watched(scope: Any, receive: Any, send: Any) -> None:
            async def sending(message: Any) -> None:
                if message["type"] == "http.response.start":
                    holders.append((await redlock_of(app).inspect("o:7")).holder)
                await send(message)

            await app(scope, receive, sending)

        with anyio.fail_after(HANG_GUARD):
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(watched)
                async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
                    assert (await client.put("/orders/7")).status_code == 409
        assert holders == [None]
