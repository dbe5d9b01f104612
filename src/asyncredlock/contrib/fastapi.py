"""FastAPI helpers: the ``AsyncRedlock`` in the app's lifespan, a lock per request
as a dependency, and the lock's errors as HTTP responses.

::

    from typing import Annotated

    from fastapi import Depends, FastAPI
    from asyncredlock import Lease
    from asyncredlock.contrib.fastapi import add_exception_handlers, lifespan, locked

    app = FastAPI(lifespan=lifespan(["redis://h1", "redis://h2", "redis://h3"], ttl=10.0))
    add_exception_handlers(app)

    @app.put("/orders/{order_id}")
    async def update(order_id: int, lease: Annotated[Lease, Depends(locked("orders:{order_id}"))]):
        ...  # runs holding the lock "orders:<order_id>"
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from .._config import LockOptions
from .._lease import Lease
from .._redlock import AsyncRedlock
from ._http import (
    ANSWERED,
    HTTPErrors,
    RequestLock,
    answer,
    check_redlock,
    close_code,
    errors_or_default,
    missing_framework,
)

try:
    from fastapi import Depends, FastAPI, WebSocket
    from fastapi.requests import HTTPConnection
    from fastapi.responses import JSONResponse, Response
    from fastapi.websockets import WebSocketState
    from starlette.applications import Starlette
except ImportError:  # pragma: no cover - exercised in a subprocess
    raise missing_framework("fastapi", "FastAPI", "fastapi") from None

__all__ = ["HTTPErrors", "add_exception_handlers", "lifespan", "locked", "redlock_of"]

#: Where `lifespan` puts the ``AsyncRedlock`` in the lifespan state it yields, which
#: the server copies into each request's ``request.state``, routes of a mounted
#: sub-application's included (whose own lifespan never runs).
_STATE_KEY = "asyncredlock.contrib.fastapi.redlock"

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]


def lifespan(masters: Sequence[Any], /, **settings: Any) -> Lifespan:
    """A lifespan that makes the app's ``AsyncRedlock`` at startup, stores it as
    ``app.state.redlock`` and in the lifespan state it yields, and closes it at
    shutdown (it stays there, closed, until the next startup: a request served
    after the shutdown gets 503 with `add_exception_handlers`).

    ``masters`` and ``settings`` are those of `AsyncRedlock`, checked now: a bad
    one raises here, not when the app starts. Each startup makes a fresh
    ``AsyncRedlock`` on the loop that serves the app. The server copies the
    lifespan state into each request, so the routes of a sub-application mounted
    with ``app.mount()`` (whose own lifespan the server never runs) find it too.
    To run an app's own startup and shutdown too, enter this lifespan inside that
    one, and yield what it yields::

        redlock_lifespan = lifespan(masters)

        @asynccontextmanager
        async def app_lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
            async with redlock_lifespan(app) as state:
                ...  # the app's own startup: app.state.redlock is there
                yield state
                ...  # its shutdown, before the AsyncRedlock closes

    Raises:
        TypeError, ValueError: As `AsyncRedlock` raises for bad masters or settings.
    """
    check_redlock(masters, settings)

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncRedlock(masters, **settings) as redlock:
            # kept once closed, as in the lifespan state the requests hold: a request
            # come after the shutdown is refused by it (503), not by a missing setup
            app.state.redlock = redlock
            yield {_STATE_KEY: redlock}

    return run


def redlock_of(app: FastAPI | HTTPConnection) -> AsyncRedlock:
    """The ``AsyncRedlock`` `lifespan` made: the app's ``app.state.redlock``.

    Given a request (or WebSocket), that of the app serving it, else the one the
    lifespan state brings to the request: in a route of a mounted sub-application,
    the ``AsyncRedlock`` of the app the server runs. After the lifespan exited, the
    one it closed (whose ``lock()`` raises `RuntimeError`), until the next startup.

    Raises:
        TypeError: ``app`` is neither a FastAPI (Starlette) application nor a
            request or WebSocket.
        RuntimeError: There is none: the app the server runs was not given
            `lifespan` (a lifespan of its own that enters it did not yield its
            state, for mounted apps), or has not started.
    """
    if not isinstance(app, Starlette | HTTPConnection):
        raise TypeError(
            "app must be a FastAPI application (or a request or WebSocket of one),"
            f" not {type(app).__name__}"
        )
    state = app.app.state if isinstance(app, HTTPConnection) else app.state
    redlock = getattr(state, "redlock", None)
    if redlock is None and isinstance(app, HTTPConnection):
        redlock = (app.scope.get("state") or {}).get(_STATE_KEY)
    if not isinstance(redlock, AsyncRedlock):
        raise RuntimeError(
            "app.state.redlock is not set, nor does the request's lifespan state hold one:"
            " give the app the server runs asyncredlock.contrib.fastapi.lifespan()"
            " (a mounted sub-application's own lifespan never runs: its routes use"
            " the main app's, if a lifespan of yours that enters it yields its state)"
        )
    return redlock


def locked(
    name: str,
    /,
    *,
    ttl: float | None = None,
    timeout: float | None = None,
    auto_extend: bool | None = None,
    fencing: bool | None = None,
    fair: bool = False,
    max_hold: float | None = None,
) -> Callable[..., Awaitable[Lease]]:
    """A dependency holding a lock while the request's handler runs; it yields the
    `Lease`.

    ``name`` is filled with the route's path parameters (``"orders:{order_id}"``);
    the other arguments are `AsyncRedlock.lock`'s. The lock is taken before the
    handler runs (a contended one past ``timeout`` raises `LockTimeoutError`: 423
    with `add_exception_handlers`), and released when it returns, before the
    response is sent. A lease lost while the handler runs cancels the handler and
    raises `LockLostError` (503), so no response is built on unprotected work; so
    does a handler still running at ``max_hold`` (`HoldLimitError`).

    A generator handler, which FastAPI streams (JSON Lines, server-sent events or
    its ``response_class``), runs its body while the response is sent: on such a
    route the lock is held until the request ends, through the stream and the
    response's background tasks (on other routes they run after the release). A
    ``StreamingResponse`` the handler returns streams after the handler, without
    the lock.

    On a WebSocket route the lock is held until the handler returns.

    Raises:
        TypeError, ValueError: A bad template or setting, raised here. At a
            request, `ValueError` if a field is not a path parameter of the route
            (a 500); a path whose lock name the library refuses (a NUL in it) is
            the client's error, 400 with `add_exception_handlers`.
        RuntimeError: At a request, when the app the server runs was not given
            `lifespan` (see `redlock_of`): there is no ``AsyncRedlock`` to lock
            with (a 500).
    """
    request_lock = RequestLock(
        name, LockOptions(ttl, timeout, auto_extend, fencing, fair, max_hold)
    )
    return _lease_dependency(request_lock)


def _lease_dependency(request_lock: RequestLock) -> Callable[..., Awaitable[Lease]]:
    """`locked`'s dependency: the lease of ``request_lock`` for one request.

    A streamed route holds the lock in a request-scoped sub-dependency: FastAPI
    closes the function scope when the handler gives its response, before a
    generator's body has run, and the request scope when the response is sent.
    Any other route holds it with "function" scope, released when the handler
    returns, whatever the scope of the user's ``Depends()``. (Defaults, not
    ``Annotated``: with postponed annotations FastAPI could not resolve the local
    names from the annotation strings.)
    """

    @asynccontextmanager
    async def holding(connection: HTTPConnection) -> AsyncIterator[Lease]:
        redlock = redlock_of(connection)
        async with request_lock.held(redlock, connection.path_params) as lease:
            yield lease

    async def hold_stream(connection: HTTPConnection) -> AsyncIterator[Lease | None]:
        if not _streamed(connection):
            yield None
            return
        # Held until the request scope closes: after the response's background tasks,
        # and after FastAPI stopped a server-sent-events producer that a client gone
        # away left running (released sooner, another holder could get in beside it).
        async with holding(connection) as lease:
            yield lease

    async def hold_call(
        connection: HTTPConnection,
        stream_lease: Lease | None = Depends(hold_stream, scope="request"),  # noqa: B008
    ) -> AsyncIterator[Lease]:
        if stream_lease is not None:
            yield stream_lease
            return
        async with holding(connection) as lease:
            yield lease

    async def lease(held: Lease = Depends(hold_call, scope="function")) -> Lease:  # noqa: B008
        return held

    return lease


def _streamed(connection: HTTPConnection) -> bool:
    """Whether the route's handler is a generator (sync or async), which FastAPI
    streams: its body runs while the response is sent."""
    call = connection.scope.get("endpoint")
    return call is not None and _generator_callable(call)


def _generator_callable(call: Callable[..., Any]) -> bool:
    """FastAPI's rule for a generator callable (``_is_gen_callable`` or
    ``_is_async_gen_callable`` of ``fastapi/dependencies/models.py``): the same
    checks, in the same order, on the same objects. The callable itself is checked
    before it is unwrapped (a ``functools.wraps`` wrapper that is a generator makes
    the route a stream, whatever it wraps), then its ``__call__``, then the
    unwrapped callable's ``__call__``."""
    if _generator(_impartial(call)) or _generator(_unwrapped(call)):
        return True
    if inspect.isclass(_unwrapped(call)):
        return False
    dunder_call = getattr(_impartial(call), "__call__", None)  # noqa: B004
    if dunder_call is None:
        return False
    if _generator(_impartial(dunder_call)) or _generator(_unwrapped(dunder_call)):
        return True
    dunder_unwrapped_call = getattr(_unwrapped(call), "__call__", None)  # noqa: B004
    if dunder_unwrapped_call is None:
        return False
    return _generator(_impartial(dunder_unwrapped_call)) or _generator(
        _unwrapped(dunder_unwrapped_call)
    )


def _generator(call: object) -> bool:
    return inspect.isgeneratorfunction(call) or inspect.isasyncgenfunction(call)


def _impartial(call: Callable[..., Any]) -> Callable[..., Any]:
    while isinstance(call, functools.partial):
        call = call.func
    return call


def _unwrapped(call: Callable[..., Any]) -> Any:
    return inspect.unwrap(_impartial(call))


def _can_deny(websocket: WebSocket) -> bool:
    """Whether an HTTP response may still refuse ``websocket``: before the handshake,
    on a server that lists the ASGI denial response among the scope's extensions."""
    extensions = websocket.scope.get("extensions") or {}
    return (
        websocket.application_state is WebSocketState.CONNECTING
        and "websocket.http.response" in extensions
    )


def add_exception_handlers(app: FastAPI, errors: HTTPErrors | None = None) -> None:
    """Answer the lock's errors with HTTP responses (see `HTTPErrors`):
    `LockTimeoutError` 423, `QuorumUnavailableError` and `LockLostError` 503,
    `StaleTokenError` 503 (a fenced write of the handler's refused: a later holder of
    the lock had written; `MissingRecordError` is left a 500), and a request whose
    lock was refused because the app shuts down (its ``AsyncRedlock`` closing: the
    `RuntimeError` of `locked`'s acquisition) 503, each with
    ``Retry-After`` and a JSON body ``{"detail": ..., "resource": ...}``; and a
    path that makes a lock name the library refuses (a NUL in it) 400, with a JSON
    body ``{"detail": ...}``.

    On a WebSocket route, an error before the handshake is accepted answers it the
    same way where the server offers the ASGI WebSocket denial response (the
    ``websocket.http.response`` extension). Elsewhere, and after the handshake (a
    lease lost during the conversation), it closes the socket with code 1013 (Try
    Again Later; 1008, Policy Violation, for a bad path) and the ``detail`` as its
    reason, as ASGI allows no HTTP response there: before the handshake the server
    answers that close with 403.

    Args:
        app: The application.
        errors: Other status codes or ``Retry-After`` (``HTTPErrors(busy=409)``).

    Raises:
        TypeError: ``app`` is not a FastAPI (Starlette) application, or ``errors``
            is not an `HTTPErrors`; nothing is registered.
    """
    if not isinstance(app, Starlette):
        raise TypeError(f"app must be a FastAPI application, not {type(app).__name__}")
    mapping = errors_or_default(errors)

    async def handle(connection: HTTPConnection, exc: Exception) -> Response | None:
        response = answer(mapping, exc)
        assert response is not None  # registered only for the errors it answers
        if isinstance(connection, WebSocket) and not _can_deny(connection):
            # accepted, or a server without the denial response: a close, no HTTP response
            if connection.application_state in (
                WebSocketState.CONNECTING,
                WebSocketState.CONNECTED,
            ):
                await connection.close(close_code(response), response.body["detail"])
            return None
        return JSONResponse(response.body, status_code=response.status, headers=response.headers)

    for error in ANSWERED:
        # handle() takes the Request or the WebSocket Starlette gives
        app.add_exception_handler(error, handle)  # type: ignore[arg-type]
