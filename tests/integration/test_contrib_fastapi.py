"""``asyncredlock.contrib.fastapi``: seed 003's ``/items`` race under uvicorn with two
worker processes, and each helper's behaviour in process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import httpx
import pytest
from fastapi import BackgroundTasks, Depends, FastAPI, Request, WebSocket
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse
from redis.asyncio import Redis
from uvicorn import Config, Server

from asyncredlock import AsyncRedlock, Lease, LockLostError
from asyncredlock.contrib.fastapi import (
    HTTPErrors,
    add_exception_handlers,
    lifespan,
    locked,
    redlock_of,
)
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .apps.items import HANG_GUARD, LIMIT, REQUESTS, ROUNDS, fastapi_app
from .conftest import Masters, documented, errors_logged, library_tasks, masters_in

#: The lease of a route on ``/events/{job}`` (module level: FastAPI reads the route's
#: annotations as strings, in this module's names).
EventsLease = Annotated[Lease, Depends(locked("events:{job}"))]

pytestmark = pytest.mark.anyio

APPS = Path(__file__).parent / "apps"
#: Masters holding a key while its lease is held: a quorum of the 5 at least (the
#: others' replies may still be on their way when a test looks)
QUORUM = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def uvicorn(masters: list[str], db: str, *, lock: bool) -> AsyncIterator[str]:
    """The items app served by uvicorn with two worker processes; its base URL."""
    port = free_port()
    env = os.environ | {
        "ITEMS_MASTERS": ",".join(masters),
        "ITEMS_DB": db,
        "ITEMS_LIMIT": str(LIMIT),
        "ITEMS_LOCKED": "1" if lock else "0",
        "PYTHONPATH": os.pathsep.join([str(APPS), *sys.path]),
    }
    command = [sys.executable, "-m", "uvicorn", "--factory", "items:fastapi_from_env"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--no-access-log"]
    with tempfile.TemporaryFile() as log:
        server = await anyio.open_process(command, env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            await _until_serving(url, server)
            yield url
        finally:
            with anyio.CancelScope(shield=True):
                server.terminate()
                with anyio.move_on_after(10):
                    await server.wait()
                if server.returncode is None:
                    server.kill()
                    await server.wait()
                await server.aclose()


async def _until_serving(url: str, server: anyio.abc.Process) -> None:
    """Return once both workers answer (bounded by the caller's HANG_GUARD); each
    check is a new connection, which either worker may accept."""
    pids: set[int] = set()
    while len(pids) < 2:
        assert server.returncode is None, "uvicorn exited"
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                pids.add((await client.get("/health", timeout=1)).json()["pid"])
        except httpx.TransportError:
            await anyio.sleep(0.05)  # polling for a port to open: nothing to await


async def race(url: str, db: Redis, shop: str) -> tuple[list[int], int, set[int]]:
    """Five concurrent POSTs: their statuses (sorted), the items stored, and the
    worker processes that answered."""
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        responses: list[httpx.Response] = []

        async def post() -> None:
            responses.append(await client.post(f"/items/{shop}"))

        async with anyio.create_task_group() as tg:
            for _ in range(REQUESTS):
                tg.start_soon(post)
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {201, 400}, [r.text for r in responses]
    pids = {response.json()["pid"] for response in responses}
    return statuses, await db.llen(f"items:{shop}"), pids


@pytest.fixture
def database(make_servers: MakeServers) -> ServerGroup:
    """The app's own database: a server apart from the masters."""
    return make_servers(1)


class TestSeed003UnderUvicorn:
    """Two uvicorn worker processes, five concurrent POSTs, a limit of three."""

    async def test_with_the_lock_exactly_three_are_created(
        self, servers: ServerGroup, database: ServerGroup
    ) -> None:
        db = Redis.from_url(database.urls[0])
        pids: set[int] = set()
        with anyio.fail_after(HANG_GUARD):
            async with uvicorn(servers.urls, database.urls[0], lock=True) as url:
                for round_ in range(ROUNDS):
                    statuses, stored, answered = await race(url, db, f"shop{round_}")
                    assert (statuses, stored) == ([201] * 3 + [400] * 2, LIMIT), round_
                    pids |= answered
        await db.aclose()
        assert len(pids) == 2  # both worker processes served the races

    async def test_without_the_lock_the_race_shows(
        self, servers: ServerGroup, database: ServerGroup
    ) -> None:
        db = Redis.from_url(database.urls[0])
        with anyio.fail_after(HANG_GUARD):
            async with uvicorn(servers.urls, database.urls[0], lock=False) as url:
                stored = [(await race(url, db, f"shop{round_}"))[1] for round_ in range(ROUNDS)]
        await db.aclose()
        assert all(count > LIMIT for count in stored), stored

    async def test_the_lock_is_free_when_the_response_arrives(
        self, servers: ServerGroup, database: ServerGroup
    ) -> None:
        """A client that got its answer and calls again never finds its own lock."""
        with anyio.fail_after(HANG_GUARD):
            async with (
                uvicorn(servers.urls, database.urls[0], lock=True) as url,
                httpx.AsyncClient(base_url=url) as client,
            ):
                statuses = [(await client.put("/once/a")).status_code for _ in range(30)]
        assert statuses == [200] * 30  # the route's lock has timeout=0: held would be 423


def app_with(masters: list[str], **settings: object) -> FastAPI:
    app = FastAPI(lifespan=lifespan(masters, **settings))
    add_exception_handlers(app)
    return app


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client


def answer(response: httpx.Response) -> tuple[int, str | None, Any]:
    """A response's status, Retry-After and JSON body."""
    return response.status_code, response.headers.get("Retry-After"), response.json()


def lost_held(resource: str) -> dict[str, str]:
    """The body of a loss the handler found itself (nothing was cancelled)."""
    return {"detail": "lock lost while the handler ran: it held it no longer", "resource": resource}


@asynccontextmanager
async def shut_down_at_the_end(
    app: FastAPI,
) -> AsyncIterator[tuple[httpx.AsyncClient, anyio.abc.TaskGroup]]:
    """``app`` started, a client of it and a task group for its requests; the
    lifespan exits at the block's end, the requests still running."""
    with anyio.fail_after(HANG_GUARD):
        transport = httpx.ASGITransport(app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://app") as client,
            anyio.create_task_group() as tg,
        ):
            running = app.router.lifespan_context(app)
            await running.__aenter__()
            yield client, tg
            await running.__aexit__(None, None, None)


class TestErrors:
    async def test_contended_past_the_timeout_is_423_with_retry_after(
        self, servers: ServerGroup
    ) -> None:
        app = fastapi_app(servers.urls, servers.urls[0], LIMIT, lock=True)
        async with (
            AsyncRedlock(servers.urls) as other,
            other.lock("once:0"),
            serving(app) as client,
        ):
            response = await client.put("/once/0")
        assert response.status_code == 423
        assert response.headers["retry-after"] == "1"
        assert response.json() == {
            "detail": "locked: held by another holder past the timeout",
            "resource": "once:0",
        }
        assert masters_in(response.text, servers.urls) == []

    async def test_a_majority_of_masters_down_is_503(self, make_servers: MakeServers) -> None:
        group = make_servers(3)
        app = fastapi_app(group.urls, group.urls[0], LIMIT, lock=True)
        async with serving(app) as client:
            group[1].stop()
            group[2].stop()
            response = await client.put("/once/0")
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "lock service unavailable" in response.json()["detail"]
        assert masters_in(response.text, group.urls) == []

    async def test_a_lost_lease_cancels_the_handler_and_answers_503(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)
        cancelled: list[bool] = []

        @app.post("/work/{job}")
        async def work(job: str, lease: Annotated[Lease, Depends(locked("job:{job}"))]) -> None:
            try:
                await redlock_of(app).force_release(f"job:{job}")  # as an operator would
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.post("/work/7")
        assert response.status_code == 503
        assert "lock lost" in response.json()["detail"]
        assert cancelled == [True]

    @pytest.mark.parametrize("how", ["deleted on every master", "forced free"])
    async def test_releasing_a_lost_lease_answers_503(
        self, servers: ServerGroup, masters: Masters, how: str
    ) -> None:
        """A handler releasing the lease it acquired, lost meanwhile, relied on a lock
        it no longer had: 503 with Retry-After, as a loss (it was a 500, its
        `LockNotOwnedError` taken for the caller's bug)."""
        app = app_with(servers.urls)

        @app.post("/jobs/{job}")
        async def run(job: str) -> None:
            lease = await redlock_of(app).lock(f"job:{job}").acquire()
            if how == "forced free":  # by this client: it knows its lease lost
                await redlock_of(app).force_release(lease.resource)
            else:  # behind its back: its release finds it gone
                await masters.delete_held(redlock_of(app), lease)
            await lease.release()

        with anyio.fail_after(HANG_GUARD):
            async with in_uvicorn(app) as port, httpx.AsyncClient() as client:
                response = await client.post(f"http://127.0.0.1:{port}/jobs/5")
        assert answer(response) == (503, "1", lost_held("job:5"))
        assert await masters.keys() == [[]] * len(masters)

    @pytest.mark.parametrize("call", ["release", "extend"])
    async def test_the_routes_lost_lease_found_by_the_handler_says_so(
        self, servers: ServerGroup, masters: Masters, call: str
    ) -> None:
        """The lease of a ``locked()`` route, gone from the masters behind its back, and
        released (or extended) by the handler: its `LostLeaseError` became, at the
        block's exit, a plain `LockLostError` answered "its work was cancelled", though
        the handler found the loss itself. It is answered as the handler's own release
        of a lease it acquired is."""
        app = app_with(servers.urls)
        ran_on: list[bool] = []

        @app.post("/jobs/{job}")
        async def run(job: str, lease: Annotated[Lease, Depends(locked("job:{job}"))]) -> None:
            await masters.delete_held(redlock_of(app), lease)
            try:
                await (lease.release() if call == "release" else lease.extend())
            finally:
                ran_on.append(True)  # its own call raised

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.post("/jobs/8")
        assert answer(response) == (503, "1", lost_held("job:8"))
        assert ran_on == [True]
        assert await masters.keys() == [[]] * len(masters)

    async def test_the_routes_lost_lease_found_by_the_release_after_it_says_so(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The lease of a ``locked()`` route, gone from the masters behind its back,
        the handler returning without a call of its own: the release after it finds
        the loss. Nothing was cancelled, so the body does not say so ("its work was
        cancelled" before): the handler held the lock no longer."""
        app = app_with(servers.urls)
        returned: list[str] = []

        @app.post("/jobs/{job}")
        async def run(
            job: str,
            request: Request,
            lease: Annotated[Lease, Depends(locked("job:{job}", auto_extend=False))],
        ) -> None:
            await masters.delete_held(redlock_of(request), lease)
            returned.append(job)

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.post("/jobs/9")
        assert answer(response) == (503, "1", lost_held("job:9"))
        assert returned == ["9"]
        assert await masters.keys() == [[]] * len(masters)

    async def test_releasing_a_lease_twice_stays_a_500(self, servers: ServerGroup) -> None:
        """Released already: the handler's bug, left to the framework."""
        app = app_with(servers.urls)

        @app.post("/jobs/{job}")
        async def run(job: str) -> None:
            lease = await redlock_of(app).lock(f"job:{job}").acquire()
            await lease.release()
            await lease.release()

        with anyio.fail_after(HANG_GUARD):
            async with in_uvicorn(app) as port, httpx.AsyncClient() as client:
                response = await client.post(f"http://127.0.0.1:{port}/jobs/6")
        # the framework's answer to an exception no handler took
        assert (response.status_code, response.text) == (500, "Internal Server Error")
        assert "retry-after" not in response.headers

    async def test_status_codes_and_retry_after_are_configurable(
        self, servers: ServerGroup
    ) -> None:
        app = FastAPI(lifespan=lifespan(servers.urls))
        add_exception_handlers(app, HTTPErrors(busy=409, retry_after=5))

        @app.put("/busy")
        async def busy(lease: Annotated[Lease, Depends(locked("busy", timeout=0))]) -> None: ...

        async with (
            AsyncRedlock(servers.urls) as other,
            other.lock("busy"),
            serving(app) as client,
        ):
            response = await client.put("/busy")
        assert (response.status_code, response.headers["retry-after"]) == (409, "5")

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"busy": 200}, ValueError),
            ({"lost": "503"}, TypeError),
            ({"retry_after": -1}, ValueError),
        ],
    )
    def test_bad_status_codes_are_refused(
        self, kwargs: dict[str, object], error: type[Exception]
    ) -> None:
        with pytest.raises(error):
            HTTPErrors(**kwargs)  # type: ignore[arg-type]


class TestLifespan:
    async def test_composes_with_the_apps_own_and_closes_at_shutdown(
        self, servers: ServerGroup
    ) -> None:
        redlock_lifespan = lifespan(servers.urls, identity="api-1")
        seen: list[str] = []

        @asynccontextmanager
        async def app_lifespan(app: FastAPI) -> AsyncIterator[None]:
            async with redlock_lifespan(app):
                seen.append(redlock_of(app).identity)
                yield

        app = FastAPI(lifespan=app_lifespan)
        async with app.router.lifespan_context(app):
            redlock = redlock_of(app)
            async with redlock.lock("inside"):
                pass
        assert seen == ["api-1"]
        with pytest.raises(RuntimeError, match="is closed"):
            redlock.lock("after")
        assert redlock_of(app) is redlock  # kept, closed, until the next startup
        with pytest.raises(RuntimeError, match=r"app.state.redlock is not set"):
            redlock_of(FastAPI(lifespan=redlock_lifespan))  # never started
        async with app.router.lifespan_context(app):  # a restart makes a fresh one
            assert redlock_of(app) is not redlock

    def test_bad_settings_raise_when_the_lifespan_is_made(self) -> None:
        with pytest.raises(ValueError, match=r"^ttl must be > 0"):
            lifespan(["redis://127.0.0.1:1"], ttl=0)
        with pytest.raises(TypeError):
            lifespan(["redis://127.0.0.1:1"], colour="blue")


class TestShutdown:
    """The lifespan exits while a request holds its lease."""

    async def test_a_request_holding_a_lease_at_shutdown_gets_503_and_leaves_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The handler is cancelled, the client gets 503; no key, no task left."""
        app = app_with(servers.urls)
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

        async with shut_down_at_the_end(app) as (client, tg):

            async def post() -> None:
                response = await client.post("/work/1")
                answers.append((response.status_code, response.json()["resource"]))

            tg.start_soon(post)
            await inside.wait()
        assert ends == ["cancelled"]
        assert answers == [(503, "work:1")]
        assert await masters.keys() == [[]] * len(masters)
        assert library_tasks() == []

    async def test_a_stream_holding_a_lease_at_shutdown_is_cut_and_leaves_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The same for a generator handler mid-stream: the stream is cut."""
        app = app_with(servers.urls)
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
        async with shut_down_at_the_end(app) as (client, tg):

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
        assert ends == ["cancelled"]
        assert got == [True]
        assert await masters.keys() == [[]] * len(masters)
        assert library_tasks() == []

    async def test_a_request_waiting_for_the_lock_at_shutdown_gets_503_too(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """One request holds the route's lock, another waits for it (queued in the
        app's ``AsyncRedlock``) when the lifespan exits: the holder gets the loss's
        503, the waiter the shutdown's 503 (it was a 500: the acquisition's
        ``RuntimeError``), each with ``Retry-After``; nothing is left."""
        app = app_with(servers.urls)
        inside = anyio.Event()

        @app.get("/work/{job}")
        async def work(
            job: str, lease: Annotated[Lease, Depends(locked("work:{job}", timeout=HANG_GUARD))]
        ) -> None:
            inside.set()
            await anyio.sleep_forever()

        answers: list[tuple[int, str | None, dict[str, str]]] = []
        async with shut_down_at_the_end(app) as (client, tg):

            async def get() -> None:
                answers.append(answer(await client.get("/work/1")))

            tg.start_soon(get)
            await inside.wait()
            waits = Waits(app.state.redlock)
            tg.start_soon(get)
            await waits.reach(queued=1)  # behind the holder, in the client
            waits.close()
        lost = "lock lost while the handler ran: its work was cancelled"
        down = "lock service shutting down"
        assert sorted(answers, key=lambda a: a[2]["detail"]) == [
            (503, "1", {"detail": lost, "resource": "work:1"}),
            (503, "1", {"detail": down, "resource": "work:1"}),
        ]
        assert await masters.keys() == [[]] * len(masters)
        assert library_tasks() == []

    async def test_a_request_after_the_shutdown_gets_503_not_the_setup_error(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A request served after the lifespan exited (its ``AsyncRedlock`` closed),
        through ``app.state`` (no lifespan state in its scope): the shutdown's 503
        with ``Retry-After`` (it was the 500 of an app never given the lifespan)."""
        app = app_with(servers.urls)
        ran: list[str] = []

        @app.get("/work/{job}")
        async def work(job: str, lease: Annotated[Lease, Depends(locked("work:{job}"))]) -> None:
            ran.append(job)

        async with app.router.lifespan_context(app):
            pass
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            response = await client.get("/work/1")
        assert (response.status_code, response.headers.get("Retry-After")) == (503, "1")
        assert response.json() == {"detail": "lock service shutting down", "resource": "work:1"}
        assert ran == []
        assert await masters.keys() == [[]] * len(masters)

    async def test_a_request_after_the_redlock_was_closed_by_hand_gets_503(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The app's ``AsyncRedlock`` closed (``aclose()`` by hand) while the app still
        serves: a request that comes then is refused by ``lock()`` ("this
        AsyncRedlock is closed"), answered with the shutdown's 503 and
        ``Retry-After``; its handler never runs."""
        app = app_with(servers.urls)
        ran: list[str] = []

        @app.get("/work/{job}")
        async def work(job: str, lease: Annotated[Lease, Depends(locked("work:{job}"))]) -> None:
            ran.append(job)

        async with serving(app) as client:
            await redlock_of(app).aclose()
            response = await client.get("/work/1")
        assert (response.status_code, response.headers.get("Retry-After")) == (503, "1")
        assert response.json() == {"detail": "lock service shutting down", "resource": "work:1"}
        assert ran == []
        assert await masters.keys() == [[]] * len(masters)


class TestDependency:
    async def test_released_before_the_response_starts(self, servers: ServerGroup) -> None:
        app = app_with(servers.urls)
        seen: list[str | None] = []

        @app.put("/orders/{order_id}")
        async def update(
            order_id: str, lease: Annotated[Lease, Depends(locked("o:{order_id}"))]
        ) -> None:
            seen.append(lease.resource)

        async def watched(scope: Any, receive: Any, send: Any) -> None:
            async def sending(message: Any) -> None:
                if message["type"] == "http.response.start":  # headers leave now
                    seen.append((await redlock_of(app).inspect("o:7")).holder)
                await send(message)

            await app(scope, receive, sending)

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(watched)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                assert (await client.put("/orders/7")).status_code == 200
        assert seen == ["o:7", None]  # held in the handler, free when the response starts

    async def test_a_path_converter_gives_one_name_per_resource(self, servers: ServerGroup) -> None:
        app = app_with(servers.urls)
        names: list[str] = []

        @app.put("/orders/{order_id:int}")
        async def update(
            order_id: int, lease: Annotated[Lease, Depends(locked("o:{order_id}"))]
        ) -> None:
            names.append(lease.resource)

        async with serving(app) as client:
            for path in ("/orders/7", "/orders/007"):
                assert (await client.put(path)).status_code == 200
        assert names == ["o:7", "o:7"]

    async def test_a_handler_still_running_at_max_hold_is_cancelled_with_503(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)

        @app.post("/slow/{job}")
        async def slow(
            job: str, lease: Annotated[Lease, Depends(locked("slow:{job}", max_hold=0.3))]
        ) -> None:
            await anyio.sleep_forever()

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.post("/slow/7")
        assert response.status_code == 503
        assert "max_hold" in response.json()["detail"]

    def test_bad_template_or_setting_raises_when_made(self) -> None:
        with pytest.raises(ValueError, match="fields must be named"):
            locked("orders:{}")
        with pytest.raises(ValueError, match="malformed field"):
            locked("orders:{order_id!x}")
        with pytest.raises(ValueError, match=r"^timeout must be >= 0"):
            locked("orders:{order_id}", timeout=-1)
        with pytest.raises(ValueError, match=r"^max_hold must be > 0"):
            locked("orders:{order_id}", max_hold=0)

    async def test_a_field_that_is_not_a_path_parameter_is_a_clear_error(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)

        @app.get("/orders/{order}")
        async def get(lease: Annotated[Lease, Depends(locked("orders:{order_id}"))]) -> None: ...

        async with serving(app) as client:
            with pytest.raises(ValueError, match="uses order_id, which is not a path parameter"):
                await client.get("/orders/7")
        async with AsyncRedlock(servers.urls) as redlock:
            assert (await redlock.inspect("orders:7")).holder is None

    @pytest.mark.parametrize("path", ["/orders/%00", "/orders/%7Bo%7D:fence"])
    async def test_a_path_the_lock_cannot_be_named_after_is_a_client_error(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture, path: str
    ) -> None:
        """The name comes from the client's path: one the library refuses (a NUL, a
        reserved key) raised ValueError at the request, a 500 with a traceback."""
        app = app_with(servers.urls)

        @app.get("/orders/{order_id}")
        async def get(lease: Annotated[Lease, Depends(locked("{order_id}"))]) -> None:
            raise AssertionError("not reached")

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                response = await client.get(path)
        assert (response.status_code, response.json()) == (
            400,
            {"detail": "bad path: the lock name it makes cannot be used"},
        )
        assert "retry-after" not in response.headers
        assert errors_logged(caplog) == []

    async def test_without_the_lifespan_the_error_says_what_is_missing(self) -> None:
        app = FastAPI()

        @app.get("/x")
        async def get(lease: Annotated[Lease, Depends(locked("x"))]) -> None: ...

        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            with pytest.raises(RuntimeError, match=r"give the app .*lifespan"):
                await client.get("/x")


class TestStreaming:
    """A generator handler, which FastAPI streams, runs its body while the response
    is sent: the lock is held until the stream ends."""

    @pytest.mark.parametrize("response_class", [None, EventSourceResponse, StreamingResponse])
    async def test_a_generator_handler_streams_holding_the_lock(
        self, servers: ServerGroup, response_class: type[StreamingResponse] | None
    ) -> None:
        app = app_with(servers.urls)
        inside, go = anyio.Event(), anyio.Event()
        holders: list[str | None] = []
        extra = {} if response_class is None else {"response_class": response_class}

        @app.get("/export/{job}", **extra)  # type: ignore[arg-type]
        async def export(
            job: str, lease: Annotated[Lease, Depends(locked("export:{job}", timeout=0))]
        ) -> AsyncIterator[str]:
            holders.append((await redlock_of(app).inspect(f"export:{job}")).holder)
            if not inside.is_set():
                inside.set()
                await go.wait()
            yield "part"

        statuses: dict[str, int] = {}

        async def get(who: str) -> None:
            statuses[who] = (await client.get("/export/1")).status_code

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, anyio.create_task_group() as tg:
                tg.start_soon(get, "first")
                await inside.wait()  # the first stream's body runs
                await get("second")  # timeout=0: one attempt
                go.set()
        assert statuses == {"first": 200, "second": 423}
        assert len(holders) == 1  # the second request's body never ran
        assert holders[0] is not None

    async def test_background_tasks_of_a_stream_run_holding_the_lock(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        app = app_with(servers.urls)
        held: list[int] = []

        async def after() -> None:
            held.append(await masters.holding("export:1"))

        @app.get("/export/{job}")
        async def export(
            job: str,
            tasks: BackgroundTasks,
            lease: Annotated[Lease, Depends(locked("export:{job}"))],
        ) -> AsyncIterator[str]:
            tasks.add_task(after)
            held.append(await masters.holding(f"export:{job}"))
            yield "part"

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                assert (await client.get("/export/1")).status_code == 200
        # in the stream's body, then in the background: released only after both (a
        # quorum at least: the masters beyond it may not have answered when it was read)
        assert len(held) == 2
        assert min(held) >= QUORUM, held
        assert await masters.holding("export:1") == 0

    async def test_a_lease_lost_mid_stream_cancels_the_stream(self, servers: ServerGroup) -> None:
        app = FastAPI(lifespan=lifespan(servers.urls))
        cancelled: list[bool] = []

        @app.get("/export/{job}")
        async def export(
            job: str, lease: Annotated[Lease, Depends(locked("export:{job}"))]
        ) -> AsyncIterator[str]:
            yield "part"
            try:
                await redlock_of(app).force_release(f"export:{job}")  # as an operator would
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise
            yield "unprotected"

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                with pytest.raises(LockLostError):  # the status was sent: the stream is cut
                    await client.get("/export/1")
        assert cancelled == [True]

    async def test_with_the_handlers_a_stream_cut_raises_starlettes_error_from_the_loss(
        self, servers: ServerGroup
    ) -> None:
        """What the docs say the server logs: with add_exception_handlers, Starlette
        cannot send the 503 of a handled error once the response started and raises
        a RuntimeError, whose direct cause is the LockLostError."""
        app = app_with(servers.urls)

        @app.get("/export/{job}")
        async def export(
            job: str, lease: Annotated[Lease, Depends(locked("export:{job}"))]
        ) -> AsyncIterator[str]:
            yield "part"
            await redlock_of(app).force_release(f"export:{job}")  # as an operator would
            await anyio.sleep_forever()
            yield "unprotected"

        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                with pytest.raises(RuntimeError, match="response already started") as raised:
                    await client.get("/export/1")
        assert isinstance(raised.value.__cause__, LockLostError)

    async def test_a_client_gone_mid_stream_releases_the_lock(self, servers: ServerGroup) -> None:
        app = app_with(servers.urls)
        inside, cancelled = anyio.Event(), anyio.Event()

        @app.get("/export/{job}")
        async def export(
            job: str, lease: Annotated[Lease, Depends(locked("export:{job}"))]
        ) -> AsyncIterator[str]:
            yield "part"
            inside.set()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.set()

        with anyio.fail_after(HANG_GUARD):
            async with in_uvicorn(app) as port, AsyncRedlock(servers.urls) as other:
                async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                    await stream.send(b"GET /export/1 HTTP/1.1\r\nHost: app\r\n\r\n")
                    await inside.wait()
                await cancelled.wait()  # uvicorn noticed the client went away
                async with other.lock("export:1", timeout=HANG_GUARD) as lease:
                    assert lease.held  # taken once the stream's lock was released

    @pytest.mark.parametrize("kind", ["async", "sync"])
    async def test_a_client_gone_from_an_event_stream_lets_nobody_in_beside_it(
        self, servers: ServerGroup, masters: Masters, kind: str
    ) -> None:
        """Server-sent events: FastAPI runs the generator in a task of its own, which
        a disconnect does not stop, and the response's background tasks run while it
        is still in a step. The lock must still be held then, and the next holder get
        it only after the step ended (before, a release put first among the
        background tasks let another client in beside the handler)."""
        app = app_with(servers.urls)
        step, first_sent = threading.Event(), anyio.Event()
        seen: list[str] = []

        async def after() -> None:
            seen.append(f"background: held on {await masters.holding('events:1')}")
            step.set()  # let the handler's step end

        def work() -> None:
            step.wait(HANG_GUARD)
            seen.append("step ended")

        async def events_async(job: str, tasks: BackgroundTasks, lease: EventsLease) -> Any:
            tasks.add_task(after)
            yield {"part": 1}
            first_sent.set()
            await anyio.to_thread.run_sync(work)

        def events_sync(job: str, tasks: BackgroundTasks, lease: EventsLease) -> Any:
            tasks.add_task(after)
            yield {"part": 1}
            anyio.from_thread.run_sync(first_sent.set)
            work()

        route = events_async if kind == "async" else events_sync
        app.get("/events/{job}", response_class=EventSourceResponse)(route)
        with anyio.fail_after(HANG_GUARD):
            async with in_uvicorn(app) as port, AsyncRedlock(servers.urls) as other:
                async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                    await stream.send(b"GET /events/1 HTTP/1.1\r\nHost: app\r\n\r\n")
                    await first_sent.wait()
                async with other.lock("events:1", timeout=HANG_GUARD):
                    seen.append("next holder in")
        assert seen == [f"background: held on {len(masters)}", "step ended", "next holder in"]


Message = dict[str, Any]


@asynccontextmanager
async def websocket(
    app: FastAPI, path: str, *, denial: bool = True
) -> AsyncIterator[tuple[Callable[[Message], Awaitable[None]], Callable[[], Awaitable[Message]]]]:
    """One WebSocket session with ``app``, spoken in ASGI messages (uvicorn here has
    no WebSocket library): a function sending the app a message, one receiving the
    app's next. The app's handler is awaited at the end. ``denial``: the server
    offers the WebSocket denial response extension."""
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
        yield to_app.send, from_app.receive


@asynccontextmanager
async def in_uvicorn(app: FastAPI) -> AsyncIterator[int]:
    """``app`` served by uvicorn in this process (its lifespan run); its port."""
    with socket.socket() as sock:  # closed however the server ends
        sock.bind(("127.0.0.1", 0))
        server = Server(Config(app, lifespan="on", log_level="warning"))
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            while not server.started:  # noqa: ASYNC110 - uvicorn sets a flag, no event
                await anyio.sleep(0.01)
            try:
                yield int(sock.getsockname()[1])
            finally:
                server.should_exit = True


class TestWebSocket:
    async def test_a_websocket_handler_runs_holding_the_lock(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        app = app_with(servers.urls)

        @app.websocket("/rooms/{room}")
        async def chat(
            socket: WebSocket,
            room: str,
            lease: Annotated[Lease, Depends(locked("room:{room}", timeout=0))],
        ) -> None:
            await socket.accept()
            await socket.send_json({"resource": lease.resource})
            await socket.receive_text()  # until the client says goodbye
            await socket.close()

        with anyio.fail_after(HANG_GUARD):
            async with (
                app.router.lifespan_context(app),
                websocket(app, "/rooms/1") as (send, receive),
            ):
                assert (await receive())["type"] == "websocket.accept"
                assert (await receive())["text"] == '{"resource":"room:1"}'
                async with websocket(app, "/rooms/1") as (_, refused):  # held: timeout=0
                    start = await refused()
                    assert (start["type"], start["status"]) == (
                        "websocket.http.response.start",
                        423,
                    )
                    assert json.loads((await refused())["body"])["resource"] == "room:1"
                held = await masters.holding("room:1")
                await send({"type": "websocket.receive", "text": "bye"})
                assert (await receive())["type"] == "websocket.close"
        assert held >= QUORUM
        assert await masters.holding("room:1") == 0  # released when the handler ended

    async def test_refused_by_a_close_where_the_server_has_no_denial_response(
        self, servers: ServerGroup
    ) -> None:
        """Without the ``websocket.http.response`` extension ASGI allows the app no
        HTTP response: a lock error before the handshake closes the socket (the
        server's 403), 1013 for a busy lock, 1008 for a path whose lock name is
        refused (retrying does not mend it), each with the body's ``detail``."""
        app = app_with(servers.urls)

        @app.websocket("/rooms/{room}")
        async def chat(
            socket: WebSocket,
            room: str,
            lease: Annotated[Lease, Depends(locked("room:{room}", timeout=0))],
        ) -> None:
            raise AssertionError("the handler runs only holding the lock")

        with anyio.fail_after(HANG_GUARD):
            async with app.router.lifespan_context(app):
                async with (
                    redlock_of(app).lock("room:1"),
                    websocket(app, "/rooms/1", denial=False) as (_, refused),
                ):
                    busy = await refused()
                async with websocket(app, "/rooms/\x00", denial=False) as (_, refused):
                    bad = await refused()
        assert busy == {
            "type": "websocket.close",
            "code": 1013,
            "reason": "locked: held by another holder past the timeout",
        }
        assert bad == {
            "type": "websocket.close",
            "code": 1008,
            "reason": "bad path: the lock name it makes cannot be used",
        }

    async def test_a_lease_lost_after_the_handshake_closes_the_socket(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Once the socket is accepted, ASGI allows no HTTP response: a lost lease
        closes it with 1013 (Try Again Later) and says why (it sent a 503 response
        start, which uvicorn fails as an internal error)."""
        app = app_with(servers.urls)
        cancelled: list[bool] = []

        @app.websocket("/rooms/{room}")
        async def chat(
            socket: WebSocket, room: str, lease: Annotated[Lease, Depends(locked("room:{room}"))]
        ) -> None:
            await socket.accept()
            await socket.send_json({"resource": lease.resource})
            try:
                await redlock_of(app).force_release(f"room:{room}")  # as an operator would
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise

        with anyio.fail_after(HANG_GUARD):
            async with (
                app.router.lifespan_context(app),
                websocket(app, "/rooms/1") as (_, receive),
            ):
                assert (await receive())["type"] == "websocket.accept"
                assert (await receive())["type"] == "websocket.send"
                after_loss = await receive()
        assert cancelled == [True]
        assert after_loss == {
            "type": "websocket.close",
            "code": 1013,
            "reason": "lock lost while the handler ran: its work was cancelled",
        }
        assert await masters.keys() == [[]] * len(masters)


def test_importing_without_fastapi_says_what_to_install() -> None:
    code = "import sys; sys.modules['fastapi'] = None; import asyncredlock.contrib.fastapi"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: asyncredlock.contrib.fastapi needs FastAPI:"
        " pip install 'asyncredlock[fastapi]'"
    )


def test_the_docs_show_lockeds_signature() -> None:
    text = " ".join((Path(__file__).parents[2] / "docs" / "fastapi.md").read_text().split())
    assert documented(locked) in text
