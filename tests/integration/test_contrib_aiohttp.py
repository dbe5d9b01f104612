"""``asyncredlock.contrib.aiohttp``: seed 003's ``/items`` race through aiohttp's test
server, and each helper's behaviour."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import ClientPayloadError, WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, LockLostError
from asyncredlock.contrib.aiohttp import LEASE, REDLOCK, HTTPErrors, locked, setup
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .apps.items import HANG_GUARD, LIMIT, REQUESTS, ROUNDS, aiohttp_app
from .conftest import Masters, documented, errors_logged, masters_in

pytestmark = pytest.mark.anyio

Client = TestClient[web.Request, web.Application]


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[Client]:
    async with TestClient(TestServer(app)) as client:
        yield client


async def race(
    client: TestClient[web.Request, web.Application], db: Redis, shop: str
) -> tuple[list[int], int]:
    statuses: list[int] = []

    async def post() -> None:
        async with client.post(f"/items/{shop}") as response:
            statuses.append(response.status)

    async with anyio.create_task_group() as tg:
        for _ in range(REQUESTS):
            tg.start_soon(post)
    return sorted(statuses), await db.llen(f"items:{shop}")


class TestSeed003:
    async def test_with_the_lock_exactly_three_are_created(
        self, servers: ServerGroup, make_servers: MakeServers
    ) -> None:
        database = make_servers(1).urls[0]
        db = Redis.from_url(database)
        with anyio.fail_after(HANG_GUARD):
            async with serving(aiohttp_app(servers.urls, database, LIMIT, lock=True)) as client:
                results = [await race(client, db, f"shop{i}") for i in range(ROUNDS)]
        await db.aclose()
        assert results == [([201] * 3 + [400] * 2, LIMIT)] * ROUNDS

    async def test_without_the_lock_the_race_shows(
        self, servers: ServerGroup, make_servers: MakeServers
    ) -> None:
        database = make_servers(1).urls[0]
        db = Redis.from_url(database)
        with anyio.fail_after(HANG_GUARD):
            async with serving(aiohttp_app(servers.urls, database, LIMIT, lock=False)) as client:
                stored = [(await race(client, db, f"shop{i}"))[1] for i in range(ROUNDS)]
        await db.aclose()
        assert all(count > LIMIT for count in stored), stored


async def answered(app: web.Application, path: str) -> tuple[int, str | None, Any]:
    """Serve ``app`` and POST ``path`` to it: the status, Retry-After and JSON body."""
    with anyio.fail_after(HANG_GUARD):
        async with serving(app) as client, client.post(path) as response:
            return response.status, response.headers.get("Retry-After"), await response.json()


def lost_held(resource: str) -> dict[str, str]:
    """The body of a loss the handler found itself (nothing was cancelled)."""
    return {"detail": "lock lost while the handler ran: it held it no longer", "resource": resource}


def app_with(masters: list[str], errors: HTTPErrors | None = None) -> web.Application:
    app = web.Application()
    setup(app, masters, errors=errors)
    return app


class TestErrors:
    async def test_contended_past_the_timeout_is_423_with_retry_after(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)

        @locked("orders:{order_id}", timeout=0)
        async def update(request: web.Request) -> web.Response:
            raise AssertionError("must not run while the lock is held elsewhere")

        app.router.add_put("/orders/{order_id}", update)
        async with (
            AsyncRedlock(servers.urls) as other,
            other.lock("orders:7"),
            serving(app) as client,
            client.put("/orders/7") as response,
        ):
            body = await response.json()
        assert (response.status, response.headers["Retry-After"]) == (423, "1")
        assert body["resource"] == "orders:7"
        assert masters_in(json.dumps(body), servers.urls) == []

    async def test_a_majority_of_masters_down_is_503(self, make_servers: MakeServers) -> None:
        group = make_servers(3)
        app = app_with(group.urls, HTTPErrors(unavailable=502, retry_after=4))

        @locked("x", timeout=0)
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text="unreachable")

        app.router.add_get("/x", handler)
        async with serving(app) as client:
            group[0].stop()
            group[2].stop()
            async with client.get("/x") as response:
                body = await response.json()
        assert (response.status, response.headers["Retry-After"]) == (502, "4")
        assert "lock service unavailable" in body["detail"]
        assert masters_in(json.dumps(body), group.urls) == []

    async def test_a_lost_lease_cancels_the_handler_and_answers_503(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)
        cancelled: list[bool] = []

        @locked("job:{job}")
        async def work(request: web.Request) -> web.Response:
            try:
                await request.app[REDLOCK].force_release(f"job:{request.match_info['job']}")
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise
            return web.Response()

        app.router.add_post("/work/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, client.post("/work/3") as response:
                body = await response.json()
        assert response.status == 503
        assert "lock lost" in body["detail"]
        assert cancelled == [True]

    @pytest.mark.parametrize("how", ["deleted on every master", "forced free"])
    async def test_releasing_a_lost_lease_answers_503(
        self, servers: ServerGroup, masters: Masters, how: str
    ) -> None:
        """A handler releasing the lease it acquired, lost meanwhile, relied on a lock
        it no longer had: 503 with Retry-After, as a loss (it was a 500, its
        `LockNotOwnedError` taken for the caller's bug)."""
        app = app_with(servers.urls)

        async def run(request: web.Request) -> web.Response:
            redlock = request.app[REDLOCK]
            lease = await redlock.lock(f"job:{request.match_info['job']}").acquire()
            if how == "forced free":  # by this client: it knows its lease lost
                await redlock.force_release(lease.resource)
            else:  # behind its back: its release finds it gone
                await masters.delete_held(redlock, lease)
            await lease.release()
            return web.Response()

        app.router.add_post("/jobs/{job}", run)
        assert await answered(app, "/jobs/5") == (503, "1", lost_held("job:5"))
        assert await masters.keys() == [[]] * len(masters)

    async def test_a_blocks_lost_lease_released_by_the_handler_says_it_found_it(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A ``locked()`` handler's own ``async with`` block (aiohttp's handler is not
        given the route's lease) whose lease, gone from the masters behind its back,
        it released: the block's exit turned the `LostLeaseError` into a plain
        `LockLostError`, answered "its work was cancelled", though nothing was. It is
        answered as the handler's own release of a lost lease is."""
        app = app_with(servers.urls)

        @locked("route:{job}")
        async def run(request: web.Request) -> web.Response:
            name = f"job:{request.match_info['job']}"
            async with request.app[REDLOCK].lock(name) as lease:
                await masters.delete_held(request.app[REDLOCK], lease)
                await lease.release()
            return web.Response()

        app.router.add_post("/jobs/{job}", run)
        assert await answered(app, "/jobs/9") == (503, "1", lost_held("job:9"))
        assert await masters.keys() == [[]] * len(masters)

    async def test_releasing_a_lease_twice_stays_a_500(self, servers: ServerGroup) -> None:
        """Released already: the handler's bug, left to the framework."""
        app = app_with(servers.urls)

        async def run(request: web.Request) -> web.Response:
            lease = await request.app[REDLOCK].lock("twice").acquire()
            await lease.release()
            await lease.release()
            return web.Response()

        app.router.add_post("/twice", run)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, client.post("/twice") as response:
                text = await response.text()
        assert response.status == 500
        assert "Retry-After" not in response.headers
        assert "lock lost" not in text


class TestLostMidResponse:
    """A lease lost after the handler prepared its response itself: no 503 can be
    sent any more."""

    async def test_a_lease_lost_on_a_websocket_closes_it_with_1013(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The middleware wrote its 503 into the upgraded connection: the client read
        it as a broken frame (1002 "Received frame with non-zero reserved bits")."""
        app = app_with(servers.urls)
        cancelled: list[bool] = []

        @locked("room:{room}")
        async def chat(request: web.Request) -> web.StreamResponse:
            socket = web.WebSocketResponse()
            await socket.prepare(request)
            await socket.send_str("hello")
            try:
                await request.app[REDLOCK].force_release(f"room:{request.match_info['room']}")
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise
            return socket

        app.router.add_get("/rooms/{room}", chat)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                socket = await client.ws_connect("/rooms/1")
                assert (await socket.receive()).data == "hello"
                ending = await socket.receive()
                await socket.close()
        assert cancelled == [True]
        assert (ending.type, ending.data, ending.extra) == (
            WSMsgType.CLOSE,
            1013,
            "lock lost while the handler ran: its work was cancelled",
        )
        assert socket.close_code == 1013
        assert await masters.keys() == [[]] * len(masters)

    async def test_a_lease_lost_mid_stream_cuts_the_response(
        self, servers: ServerGroup, masters: Masters, caplog: pytest.LogCaptureFixture
    ) -> None:
        """After the handler prepared and wrote a StreamResponse, the middleware
        returned a 503 for a response already started: the client's read hung (and
        the test server's shutdown with it). The error is raised on instead: aiohttp
        logs it and drops the connection, so the client sees the body cut off."""
        app = app_with(servers.urls)
        cancelled: list[bool] = []

        @locked("export:{job}")
        async def export(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b"part\n")
            try:
                await request.app[REDLOCK].force_release(f"export:{request.match_info['job']}")
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise
            return response

        app.router.add_get("/export/{job}", export)
        seen: list[object] = []
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            with anyio.move_on_after(HANG_GUARD):  # bounds the hang before the fix
                async with client.get("/export/1") as response:
                    seen.append(response.status)
                    try:
                        while chunk := await response.content.readany():
                            seen.append(chunk)
                    except ClientPayloadError:
                        seen.append("cut")
                    else:
                        seen.append("complete")
        finally:
            with anyio.move_on_after(HANG_GUARD, shield=True):
                await client.close()
        assert seen == [200, b"part\n", "cut"]
        assert cancelled == [True]
        logged = [
            r.exc_info[1] for r in caplog.records if r.name == "aiohttp.server" and r.exc_info
        ]
        assert [type(error) for error in logged] == [LockLostError]
        assert await masters.keys() == [[]] * len(masters)


class TestHandlers:
    async def test_a_view_method_takes_the_lock_from_its_request(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)

        class Order(web.View):
            @locked("orders:{order_id}")
            async def put(self) -> web.Response:
                state = await self.request.app[REDLOCK].inspect("orders:1")
                return web.json_response({"held": state.holder is not None})

        app.router.add_view("/orders/{order_id}", Order)
        async with serving(app) as client, client.put("/orders/1") as response:
            assert await response.json() == {"held": True}

    async def test_the_handler_finds_its_lease_on_the_request(self, servers: ServerGroup) -> None:
        """``request[LEASE]`` is the handler's lease while it runs: the holder on the
        masters, its fencing token (greater at each request), ``extend()``. Under
        two ``@locked`` the inner one's, then the outer's again; nothing is left on
        the request once the handler returned."""
        app = app_with(servers.urls)
        seen: list[tuple[str, int | None]] = []
        requests: list[web.Request] = []

        @locked("items:{order_id}")
        async def inner(request: web.Request) -> web.Response:
            seen.append((request[LEASE].resource, request[LEASE].token))
            return web.json_response({})

        @locked("orders:{order_id}", fencing=True)
        async def update(request: web.Request) -> web.Response:
            requests.append(request)
            lease = request[LEASE]
            await lease.extend()
            state = await request.config_dict[REDLOCK].inspect(lease.resource)
            assert state.holder == lease.value
            seen.append((lease.resource, lease.token))
            response = await inner(request)
            seen.append((request[LEASE].resource, request[LEASE].token))
            return response

        app.router.add_put("/orders/{order_id}", update)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                for _ in range(2):
                    async with client.put("/orders/1") as response:
                        assert response.status == 200
        (_, first), _, (_, again), (_, second), _, _ = seen
        assert isinstance(first, int)
        assert isinstance(second, int)
        assert second > first
        assert again == first
        assert [resource for resource, _ in seen] == ["orders:1", "items:1", "orders:1"] * 2
        assert [LEASE in request for request in requests] == [False, False]

    async def test_a_sub_applications_route_uses_the_main_apps_redlock(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)
        api = web.Application()

        @locked("orders:{order_id}", timeout=0)
        async def get(request: web.Request) -> web.Response:
            state = await request.config_dict[REDLOCK].inspect("orders:5")
            return web.json_response({"held": state.holder is not None})

        api.router.add_get("/orders/{order_id}", get)
        app.add_subapp("/api", api)
        async with serving(app) as client, client.get("/api/orders/5") as response:
            assert await response.json() == {"held": True}

    async def test_the_app_owns_one_redlock_while_it_runs(self, servers: ServerGroup) -> None:
        app = app_with(servers.urls)
        async with serving(app):
            redlock = app[REDLOCK]
            async with redlock.lock("owned"):
                pass
        with pytest.raises(RuntimeError, match="is closed"):
            redlock.lock("after")

    def test_bad_input_raises_when_set_up_or_decorated(self) -> None:
        with pytest.raises(ValueError, match=r"^ttl must be > 0"):
            setup(web.Application(), ["redis://127.0.0.1:1"], ttl=0)
        with pytest.raises(TypeError, match="errors must be an HTTPErrors"):
            setup(web.Application(), ["redis://127.0.0.1:1"], errors=423)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="fields must be named"):
            locked("orders:{}")
        with pytest.raises(ValueError, match="malformed field"):
            locked("orders:{order_id.}")
        with pytest.raises(TypeError, match="async handlers"):
            locked("orders")(lambda request: web.Response())  # type: ignore[arg-type, return-value]

    async def test_a_field_that_is_not_in_the_route_is_a_clear_error(
        self, servers: ServerGroup
    ) -> None:
        app = app_with(servers.urls)
        failures: list[BaseException] = []

        @web.middleware
        async def keep(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
            try:
                return await handler(request)
            except ValueError as exc:
                failures.append(exc)
                raise

        app.middlewares.insert(0, keep)

        @locked("orders:{order_id}")
        async def get(request: web.Request) -> web.Response:
            return web.Response()

        app.router.add_get("/orders/{order}", get)
        async with serving(app) as client, client.get("/orders/7") as response:
            assert response.status == 500
        assert "uses order_id, which is not a path parameter" in str(failures[0])

    @pytest.mark.parametrize("path", ["/orders/%00", "/orders/%7Bo%7D:fence"])
    async def test_a_path_the_lock_cannot_be_named_after_is_a_client_error(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture, path: str
    ) -> None:
        """The name comes from the client's path: one the library refuses (a NUL, a
        reserved key) raised ValueError at the request, a 500 with a traceback."""
        app = app_with(servers.urls)

        @locked("{order_id}")
        async def get(request: web.Request) -> web.Response:
            raise AssertionError("not reached")

        app.router.add_get("/orders/{order_id:[^/]+}", get)  # braces too (not by default)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, client.get(path) as response:
                body = await response.json()
        assert (response.status, body) == (
            400,
            {"detail": "bad path: the lock name it makes cannot be used"},
        )
        assert "Retry-After" not in response.headers
        assert errors_logged(caplog) == []


class TestClientGone:
    """With ``handler_cancellation`` (the test server's default), a client that
    goes away cancels its handler."""

    async def test_a_client_gone_releases_the_lease(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A disconnect cancels the handler holding the lease, which is released."""
        app = app_with(servers.urls)
        inside, ended = asyncio.Event(), asyncio.Event()

        @locked("job:{job}")
        async def work(request: web.Request) -> web.Response:
            inside.set()
            try:
                await anyio.sleep_forever()
            finally:
                ended.set()
            return web.Response()

        app.router.add_get("/job/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, AsyncRedlock(servers.urls) as other:
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
        """A request waiting for a contended lock when the client goes away stops
        waiting: the next holder gets it at once after the holder's release."""
        app = app_with(servers.urls)
        ran: list[bool] = []
        done = asyncio.Event()

        @web.middleware
        async def ended(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                return await handler(request)
            finally:
                done.set()

        app.middlewares.insert(0, ended)

        @locked("job:{job}", timeout=HANG_GUARD, fair=True)
        async def work(request: web.Request) -> web.Response:
            ran.append(True)
            return web.Response()

        app.router.add_get("/job/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client, AsyncRedlock(servers.urls) as other:
                async with other.lock("job:1"):
                    waits = Waits(client.app[REDLOCK])
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


class TestShutdown:
    async def test_a_request_waiting_for_the_lock_when_the_redlock_closes_gets_503(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The app's ``AsyncRedlock`` closes (here by hand: aiohttp's runner cancels
        the handlers before its cleanup closes it) while one request holds the
        route's lock and another waits for it, queued behind it in the client: the
        holder gets the loss's 503, the waiter the shutdown's 503 (it was a 500:
        the acquisition's ``RuntimeError``), each with ``Retry-After``."""
        app = app_with(servers.urls)
        inside = asyncio.Event()

        @locked("job:{job}", timeout=HANG_GUARD)
        async def work(request: web.Request) -> web.Response:
            inside.set()
            await anyio.sleep_forever()
            return web.Response()  # pragma: no cover

        app.router.add_get("/job/{job}", work)
        answers: list[tuple[int, str | None, Any]] = []
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:

                async def get() -> None:
                    async with client.get("/job/1") as response:
                        retry = response.headers.get("Retry-After")
                        answers.append((response.status, retry, await response.json()))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(get)
                    await inside.wait()
                    with Waits(client.app[REDLOCK]) as waits:
                        tg.start_soon(get)
                        await waits.reach(queued=1)  # behind the holder, in the client
                    await client.app[REDLOCK].aclose()
        lost = "lock lost while the handler ran: its work was cancelled"
        down = "lock service shutting down"
        assert sorted(answers, key=lambda a: a[2]["detail"]) == [
            (503, "1", {"detail": lost, "resource": "job:1"}),
            (503, "1", {"detail": down, "resource": "job:1"}),
        ]
        assert await masters.keys() == [[]] * len(masters)

    async def test_a_request_after_the_redlock_was_closed_gets_503(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The app's ``AsyncRedlock`` closed (``aclose()`` by hand) while the app still
        serves: a request that comes then is refused by ``lock()`` ("this
        AsyncRedlock is closed"), answered with the shutdown's 503 and
        ``Retry-After``; its handler never runs."""
        app = app_with(servers.urls)
        ran: list[str] = []

        @locked("job:{job}")
        async def work(request: web.Request) -> web.Response:
            ran.append(request.match_info["job"])
            return web.Response()

        app.router.add_get("/job/{job}", work)
        with anyio.fail_after(HANG_GUARD):
            async with serving(app) as client:
                await client.app[REDLOCK].aclose()
                async with client.get("/job/1") as response:
                    retry = response.headers.get("Retry-After")
                    answer = (response.status, retry, await response.json())
        down = {"detail": "lock service shutting down", "resource": "job:1"}
        assert answer == (503, "1", down)
        assert ran == []
        assert await masters.keys() == [[]] * len(masters)


def test_importing_without_aiohttp_says_what_to_install() -> None:
    code = "import sys; sys.modules['aiohttp'] = None; import asyncredlock.contrib.aiohttp"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: asyncredlock.contrib.aiohttp needs aiohttp:"
        " pip install 'asyncredlock[aiohttp]'"
    )


def test_the_docs_show_lockeds_signature() -> None:
    text = " ".join((Path(__file__).parents[2] / "docs" / "aiohttp.md").read_text().split())
    assert documented(locked) in text
