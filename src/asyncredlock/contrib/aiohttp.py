"""aiohttp helpers: the ``AsyncRedlock`` in the app's cleanup context, the lock's
errors as HTTP responses, and a handler decorator holding a lock per request.

::

    from aiohttp import web
    from asyncredlock.contrib.aiohttp import LEASE, locked, setup

    app = web.Application()
    setup(app, ["redis://h1", "redis://h2", "redis://h3"], ttl=10.0)

    @locked("orders:{order_id}", timeout=2)
    async def update(request: web.Request) -> web.Response:
        lease = request[LEASE]  # runs holding the lock "orders:<order_id>"
        ...

    app.router.add_put("/orders/{order_id}", update)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from .._config import LockOptions
from .._lease import Lease
from .._redlock import AsyncRedlock
from ._http import (
    ANSWERED,
    CLOSE_TRY_AGAIN_LATER,
    HTTPErrors,
    RequestLock,
    answer,
    check_redlock,
    errors_or_default,
    missing_framework,
)

try:
    from aiohttp import web
except ImportError:  # pragma: no cover - exercised in a subprocess
    raise missing_framework("aiohttp", "aiohttp", "aiohttp") from None

__all__ = ["LEASE", "REDLOCK", "HTTPErrors", "locked", "setup"]

Value = TypeVar("Value")


def _request_key(name: str, kind: type[Value]) -> web.RequestKey[Value]:
    """A key of a request's own data: a ``web.RequestKey`` where aiohttp has them
    (3.13 and later), else the string key older versions take (typed as the
    installed aiohttp's)."""
    if hasattr(web, "RequestKey"):
        return web.RequestKey(name, kind)
    return cast("web.RequestKey[Value]", name)  # pragma: no cover - aiohttp before 3.13


#: The app's ``AsyncRedlock``, set by `setup` while the app runs: ``app[REDLOCK]``,
#: or ``request.config_dict[REDLOCK]`` in a handler (which also finds it from a
#: sub-application's routes).
REDLOCK: web.AppKey[AsyncRedlock] = web.AppKey("asyncredlock", AsyncRedlock)

#: The handler's `Lease`, set by `locked` while the handler runs:
#: ``request[LEASE]`` (its ``token`` for fenced writes, ``extend()``...). A
#: ``web.RequestKey``; on aiohttp before 3.13, which has none, the string
#: ``"asyncredlock.lease"``.
LEASE: web.RequestKey[Lease] = _request_key("asyncredlock.lease", Lease)

#: Where `setup`'s ``on_response_prepare`` signal keeps the response a handler
#: prepared itself.
_PREPARED = _request_key("asyncredlock.prepared", web.StreamResponse)


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[web.StreamResponse]])
Handle = Callable[[web.Request], Awaitable[web.StreamResponse]]


def setup(
    app: web.Application,
    masters: Sequence[Any],
    /,
    *,
    errors: HTTPErrors | None = None,
    **settings: Any,
) -> None:
    """Give ``app`` an ``AsyncRedlock`` and answer the lock's errors.

    A cleanup context makes the ``AsyncRedlock`` at startup (``app[REDLOCK]``)
    and closes it at cleanup; a middleware answers `LockTimeoutError` with 423,
    `QuorumUnavailableError` and `LockLostError` with 503, `StaleTokenError` with
    503 (a fenced write of the handler's refused: a later holder of the lock had
    written; `MissingRecordError` is left a 500), and a request whose lock was
    refused because the ``AsyncRedlock`` was closing with 503, each with
    ``Retry-After`` and a JSON body (``errors``: other codes, see `HTTPErrors`),
    and a path that makes a lock name the library refuses (a NUL in it) with 400.
    A WebSocket the handler prepared is closed with code 1013 (Try Again Later)
    and the body's ``detail`` as the reason instead; after another response the
    handler prepared (its status sent) the error is raised on, and aiohttp drops
    the connection: the client sees the body cut off.

    Args:
        app: The application, before it starts.
        masters: As for `AsyncRedlock`.
        errors: How errors become responses; `HTTPErrors` defaults if omitted.
        settings: `AsyncRedlock`'s keyword settings.

    Raises:
        TypeError: ``app`` is not a ``web.Application``.
        RuntimeError: `setup` was called on ``app`` already (it would make a second
            ``AsyncRedlock`` and a second middleware).
        TypeError, ValueError: As `AsyncRedlock` raises for bad masters or
            settings, and for a bad ``errors``: raised here, not at startup.
    """
    _check_app(app)
    mapping = errors_or_default(errors)
    check_redlock(masters, settings)

    async def own_redlock(app: web.Application) -> AsyncIterator[None]:
        async with AsyncRedlock(masters, **settings) as redlock:
            app[REDLOCK] = redlock
            yield

    @web.middleware
    async def answer_lock_errors(request: web.Request, handler: Handle) -> web.StreamResponse:
        try:
            return await handler(request)
        except ANSWERED as exc:
            response = answer(mapping, exc)
            assert response is not None  # each of these has one
            started: web.StreamResponse | None = request.get(_PREPARED)
            if started is None or not started.prepared:
                body, status, headers = response.body, response.status, response.headers
                return web.json_response(body, status=status, headers=headers)
            if not isinstance(started, web.WebSocketResponse):
                # its status is sent: aiohttp logs the error and drops the connection,
                # so the client sees the body cut off, never a complete one
                raise
            # upgraded: an HTTP answer would be read as a broken frame
            reason = response.body["detail"].encode()
            await started.close(code=CLOSE_TRY_AGAIN_LATER, message=reason)
            return started

    app.cleanup_ctx.append(own_redlock)
    app.on_response_prepare.append(_note_prepared)
    app.middlewares.append(answer_lock_errors)


def _check_app(app: object) -> None:
    """Refuse what `setup` cannot equip, before anything is made or added.

    Raises:
        TypeError: ``app`` is not a ``web.Application``.
        RuntimeError: `setup` already equipped ``app`` (its signal handler is there).
    """
    if not isinstance(app, web.Application):
        raise TypeError(f"app must be an aiohttp web.Application, not {type(app).__name__}")
    if _note_prepared in app.on_response_prepare:
        raise RuntimeError(
            "asyncredlock.contrib.aiohttp.setup() was already called on this app: it"
            " has its AsyncRedlock (app[REDLOCK]) and middleware; call setup() once"
        )


async def _note_prepared(request: web.Request, response: web.StreamResponse) -> None:
    """Keep the response being prepared (by its handler, or by aiohttp with what a
    handler returned) where `setup`'s middleware finds it."""
    request[_PREPARED] = response


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
) -> Callable[[Handler], Handler]:
    """A decorator for a handler (``async def handler(request)``, or a method of a
    ``web.View``): it runs holding a lock, taken through the ``AsyncRedlock`` of
    the app `setup` was given (``request.config_dict[REDLOCK]``, so a route of a
    sub-application finds it too).

    ``name`` is filled with the route's ``match_info`` (``"orders:{order_id}"``);
    the other arguments are `AsyncRedlock.lock`'s. The handler finds its lease as
    ``request[LEASE]`` (the innermost's, under several ``@locked``). The lock is
    released when the handler returns, before aiohttp sends the response. A lease lost while the
    handler runs cancels it and raises `LockLostError` (503 through `setup`'s
    middleware, or, once the handler prepared its response, a WebSocket closed
    with 1013 or a connection dropped); so does a handler still running at
    ``max_hold`` (`HoldLimitError`).

    Raises:
        TypeError, ValueError: A bad template or setting, or a decorated object
            that is not a coroutine function. At a request, `ValueError` if a
            field is not a path parameter of the route (a 500); a path whose
            lock name the library refuses (a NUL in it) is the client's error,
            400 through `setup`'s middleware.
        RuntimeError: At a request, on an app `setup` was not called on (nor on
            the main app of a sub-application): there is no ``AsyncRedlock`` to
            lock with (a 500).
    """
    request_lock = RequestLock(
        name, LockOptions(ttl, timeout, auto_extend, fencing, fair, max_hold)
    )

    def decorate(handler: Handler) -> Handler:
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(f"locked() decorates async handlers, not {handler!r}")

        @functools.wraps(handler)
        async def run(arg: web.Request | web.View) -> web.StreamResponse:
            request = arg.request if isinstance(arg, web.View) else arg
            async with request_lock.held(_redlock_of(request), request.match_info) as lease:
                outer = request.get(LEASE)  # an enclosing @locked's, restored after
                request[LEASE] = lease
                try:
                    return await handler(arg)
                finally:
                    if outer is None:
                        del request[LEASE]
                    else:
                        request[LEASE] = outer

        return run  # type: ignore[return-value]  # same signature as the handler

    return decorate


def _redlock_of(request: web.Request) -> AsyncRedlock:
    """The ``AsyncRedlock`` of the app that ran `setup` (``config_dict``: also from a
    sub-application's route).

    Raises:
        RuntimeError: There is none: `setup` was not called on the app or on one
            it is a sub-application of.
    """
    redlock = request.config_dict.get(REDLOCK)
    if redlock is None:
        raise RuntimeError(
            "no AsyncRedlock for this request: call asyncredlock.contrib.aiohttp.setup()"
            " on the app (or on the main app of a sub-application) before it starts"
        )
    return redlock
