"""Bad input to the public entry points: a clear, typed error at the boundary, naming
the parameter, before any I/O, losing nothing (review ``badin``: a sweep of every
public function, constructor and method for the gaps the suite left).

Most of the sweep found the checks in place (the lock, rwlock, semaphore, locked,
run_singleton, extend, fencing and testing-helper arguments, the CLI's options). The
tests here cover what no test guarded yet, and the entry points that let a wrong type
through to a crash later (strict xfails until they were fixed): an ``AttributeError``
deep inside, a spawned process that dies on its configuration, or an error that does
not say which argument was wrong.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from fastapi import FastAPI

from asyncredlock import AsyncRedlock, Lease, LockNotOwnedError
from asyncredlock.contrib.fastapi import add_exception_handlers, redlock_of
from asyncredlock.fencing import SQLFence
from asyncredlock.testing import SentinelProcess, ServerGroup, ServerProcess

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome


async def _client_count(masters: Masters) -> int:
    return sum([len(await client.client_list()) for client in masters.clients])


async def _still_works(redlock: AsyncRedlock, masters: Masters, name: str) -> None:
    """One good acquire and release on the same client after the refused call, with
    no key left behind (fence counters aside: ``masters.keys()`` hides them)."""
    with anyio.fail_after(HANG_GUARD):
        lease = await redlock.lock(name, timeout=0).acquire()
        assert lease.held
        await lease.release()
        await redlock.settle()
    assert await masters.keys() == [[]] * len(masters)
    assert redlock.statistics().background_tasks == 0


async def _async_clock() -> float:
    return 1.0


class _AsyncCall:
    """An object whose ``__call__`` is async: calling it makes a coroutine, as an
    async function's call does (``inspect.iscoroutinefunction`` says False of it)."""

    async def __call__(self, *args: object) -> float:
        return 1.0


class TestLossCallbacks:
    """``Lease.add_lost_callback`` documents ``TypeError`` for a non-callable or an
    async function; no test guarded it, nor that a refused callback is not kept."""

    @pytest.mark.parametrize(
        "callback",
        [None, 5, "on_lost", _async_clock, _AsyncCall()],
        ids=["None", "int", "str", "async-function", "async-call"],
    )
    async def test_a_refused_callback_is_a_type_error_and_is_not_kept(
        self, servers: ServerGroup, masters: Masters, callback: Any
    ) -> None:
        lost = anyio.Event()
        seen: list[Lease] = []

        def on_lost(lease: Lease) -> None:
            seen.append(lease)
            lost.set()

        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("badin:cb", auto_extend=False).acquire()
            attempts = redlock.statistics().attempts
            with pytest.raises(TypeError, match="loss callback"):
                lease.add_lost_callback(callback)
            # nothing sent, nothing kept, the lease untouched
            assert redlock.statistics().attempts == attempts
            assert lease.remove_lost_callback(callback) == 0
            assert lease.held
            # loses nothing: a good callback still runs, once, when the lease is lost
            lease.add_lost_callback(on_lost)
            with anyio.fail_after(HANG_GUARD):
                await masters.delete_held(redlock, lease)
                with pytest.raises(LockNotOwnedError):
                    await lease.extend()
                await lost.wait()
                await redlock.settle()
            assert seen == [lease]
            await _still_works(redlock, masters, "badin:cb")

    async def test_a_callback_that_takes_no_lease_is_refused_when_added(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("badin:cb0", auto_extend=False).acquire()
            try:
                with pytest.raises(TypeError, match="callback"):
                    lease.add_lost_callback(lambda: None)  # type: ignore[arg-type, misc]
            finally:
                with anyio.fail_after(HANG_GUARD):
                    await lease.release()
            await _still_works(redlock, masters, "badin:cb0")


class TestClock:
    @pytest.mark.parametrize("clock", [_async_clock, _AsyncCall()], ids=["function", "call"])
    async def test_an_async_clock_is_refused_at_construction(
        self, servers: ServerGroup, masters: Masters, clock: object
    ) -> None:
        before = await _client_count(masters)
        refused: TypeError | None = None
        try:
            redlock = AsyncRedlock(servers.urls, clock=clock)  # type: ignore[arg-type]
        except TypeError as exc:
            refused = exc
        else:
            await redlock.aclose()
        assert refused is not None, "an async clock was accepted"
        assert "clock" in str(refused)
        assert await _client_count(masters) <= before
        async with AsyncRedlock(servers.urls) as redlock:
            await _still_works(redlock, masters, "badin:clock")


class TestFastAPIHelpers:
    @pytest.mark.parametrize("app", ["app", None], ids=["str", "None"])
    def test_add_exception_handlers_refuses_an_app_that_is_no_application(
        self, app: object
    ) -> None:
        with pytest.raises(TypeError, match="app"):
            add_exception_handlers(app)  # type: ignore[arg-type]

    def test_add_exception_handlers_with_bad_errors_leaves_the_app_as_it_was(self) -> None:
        """The refused ``errors`` registers no handler: a later call with good
        arguments is the only one the app has."""
        app = FastAPI()
        handlers = dict(app.exception_handlers)
        with pytest.raises(TypeError, match="errors must be an HTTPErrors"):
            add_exception_handlers(app, {"busy": 409})  # type: ignore[arg-type]
        assert app.exception_handlers == handlers
        add_exception_handlers(app)
        assert len(app.exception_handlers) > len(handlers)

    @pytest.mark.parametrize("app", [None, "app"], ids=["None", "str"])
    def test_redlock_of_refuses_what_is_no_app_nor_connection(self, app: object) -> None:
        with pytest.raises(TypeError, match="app"):
            redlock_of(app)  # type: ignore[arg-type]


def _orders() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL,"
        " fence BIGINT NOT NULL DEFAULT 0)"
    )
    db.execute("INSERT INTO orders (id, status, fence) VALUES (7, 'new', 0)")
    return db


class TestSQLFenceConnection:
    @pytest.mark.parametrize("method", ["update", "upsert"])
    @pytest.mark.parametrize("connection", [None, "sqlite://orders"], ids=["None", "str"])
    def test_a_connection_without_cursor_is_a_type_error(
        self, method: str, connection: object
    ) -> None:
        run: Callable[..., None] = getattr(SQLFence("orders"), method)
        with pytest.raises(TypeError, match="connection"):
            run(connection, 7, {"status": "paid"}, 5)

    @pytest.mark.parametrize("method", ["update", "upsert"])
    @pytest.mark.parametrize(
        ("token", "error"),
        [(True, TypeError), (5.0, TypeError), (None, TypeError), (-1, ValueError)],
        ids=["bool", "float", "None", "negative"],
    )
    def test_a_bad_token_runs_no_statement_and_the_fence_still_works(
        self, method: str, token: object, error: type[Exception]
    ) -> None:
        """Refused before any statement: the connection runs nothing (its trace
        stays empty), the row is unchanged, and a good write after it is applied."""
        db = _orders()
        try:
            statements: list[str] = []
            db.set_trace_callback(statements.append)
            fence = SQLFence("orders")
            with pytest.raises(error, match="fencing token"):
                getattr(fence, method)(db, 7, {"status": "paid"}, token)
            assert statements == []
            db.set_trace_callback(None)
            assert db.execute("SELECT status, fence FROM orders").fetchall() == [("new", 0)]
            getattr(fence, method)(db, 7, {"status": "paid"}, 5)
            assert db.execute("SELECT status, fence FROM orders").fetchall() == [("paid", 5)]
        finally:
            db.close()


class TestSentinelProcessMonitor:
    """``SentinelProcess(monitor)`` checks its service names and servers when made:
    they go into the sentinel's configuration file, which must be able to read them."""

    def test_a_monitored_server_that_is_no_server_process_is_refused(self) -> None:
        refused: TypeError | None = None
        try:
            sentinel = SentinelProcess({"svc": "127.0.0.1:6379"})  # type: ignore[dict-item]
        except TypeError as exc:
            refused = exc
        else:
            sentinel.close()
        assert refused is not None, "a str was accepted as the monitored server"
        assert "monitor" in str(refused)

    @pytest.mark.parametrize(
        ("service", "error"),
        [(5, TypeError), ("a b", ValueError), ("", ValueError), ("svc\nsentinel", ValueError)],
        ids=["int", "space", "empty", "newline"],
    )
    def test_a_service_name_the_sentinel_cannot_read_is_refused(
        self, servers: ServerGroup, service: object, error: type[Exception]
    ) -> None:
        refused: Exception | None = None
        try:
            sentinel = SentinelProcess({service: servers[0]})  # type: ignore[dict-item]
        except (TypeError, ValueError) as exc:
            refused = exc
        else:
            sentinel.close()  # made, never started: nothing was spawned
        assert isinstance(refused, error)
        assert "service" in str(refused) or "monitor" in str(refused)


class TestServerProcessPaths:
    @pytest.mark.parametrize("make", ["process", "group"])
    def test_a_binary_that_is_no_path_is_refused_when_made(self, make: str) -> None:
        refused: TypeError | None = None
        try:
            made = ServerProcess(binary=5) if make == "process" else ServerGroup(1, binary=5)  # type: ignore[arg-type]
        except TypeError as exc:
            refused = exc
        else:
            made.close()
        assert refused is not None, "binary=5 was accepted"
        assert "binary" in str(refused)

    def test_a_workdir_that_is_no_path_names_the_argument(self) -> None:
        with pytest.raises(TypeError, match="workdir"):
            ServerProcess(workdir=5)  # type: ignore[arg-type]
