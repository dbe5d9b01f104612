"""What the frameworks' helpers share: the lock's errors as HTTP responses, and
the hint when a framework is missing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from .._config import LockOptions
from .._errors import (
    HoldLimitError,
    LockLostError,
    LockTimeoutError,
    LostLeaseError,
    QuorumUnavailableError,
    RedlockError,
    StaleTokenError,
)
from .._lease import Lease
from .._lock import Lock
from .._redlock import AsyncRedlock
from .._template import NameTemplate

__all__ = [
    "ANSWERED",
    "CLOSE_POLICY_VIOLATION",
    "CLOSE_TRY_AGAIN_LATER",
    "BadLockName",
    "ErrorResponse",
    "HTTPErrors",
    "RequestLock",
    "ShuttingDown",
    "answer",
    "check_redlock",
    "close_code",
    "errors_or_default",
    "missing_framework",
]


#: The WebSocket close code (RFC 6455, IANA registry: "Try Again Later") for a lock
#: error after the handshake: the counterpart of the 423 and 503 answers (each with
#: ``Retry-After``), a state of the lock that passes, not a fault of the server (1011).
CLOSE_TRY_AGAIN_LATER = 1013

#: The WebSocket close code (RFC 6455: "Policy Violation") for a refusal that trying
#: again does not mend: a path whose lock name the library refuses (the 400).
CLOSE_POLICY_VIOLATION = 1008


#: The ``detail`` answering `StaleTokenError`: a fenced write, delete or fenced read
#: refused, the guard having seen a newer token (under 123 bytes: a close reason too).
_STALE = "fenced write or read refused: a later holder of the lock had used the resource first"


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """One error's response: its status, headers and JSON body."""

    status: int
    headers: dict[str, str]
    body: dict[str, str]


@dataclass(frozen=True, slots=True)
class HTTPErrors:
    """How the lock's errors become HTTP responses.

    Attributes:
        busy: Status for `LockTimeoutError`, the lock held past the timeout
            (423 Locked): the client may try again.
        unavailable: Status for `QuorumUnavailableError`, a majority of masters
            unreachable (503 Service Unavailable); also for a request whose lock
            was refused because the app's ``AsyncRedlock`` was closing (the app
            shuts down: another instance may serve it).
        lost: Status for `LockLostError`, the lease lost while the handler ran
            (503): the handler was cancelled and its work is not to be trusted; also
            for `LostLeaseError`, a handler's ``release()`` or ``extend()`` of a
            lease that was lost, or the release after the handler finding it lost;
            and for `StaleTokenError`, a fenced write (or fenced read) of the
            handler's refused because a later holder of the lock had used the
            resource: the same for the client (its ``resource`` is the guarded key or
            record id, not the lock's name). `MissingRecordError` (a fenced update of
            a record that does not exist) is not answered: the app's bug (500).
        retry_after: Whole seconds sent in ``Retry-After`` with each of them (1).
    """

    busy: int = 423
    unavailable: int = 503
    lost: int = 503
    retry_after: int = 1

    def __post_init__(self) -> None:
        for name in ("busy", "unavailable", "lost"):
            status = getattr(self, name)
            if isinstance(status, bool) or not isinstance(status, int):
                raise TypeError(f"{name} must be an HTTP status code (int)")
            if not 400 <= status <= 599:
                raise ValueError(f"{name} must be an error status (400-599), got {status}")
        retry = self.retry_after
        if isinstance(retry, bool) or not isinstance(retry, int):
            raise TypeError("retry_after must be a whole number of seconds (int)")
        if retry < 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry}")

    def response(self, error: RedlockError) -> ErrorResponse | None:
        """The response for ``error``; ``None`` for an error that is a bug of the
        caller (`LockNotOwnedError` of a lease already released, `MissingRecordError`),
        left to the framework (500).

        The body says what happened and to which resource, not the error's text:
        that lists each master (host and port) with its answer, which is not for
        the client's eyes.
        """
        if isinstance(error, LockTimeoutError):
            status, why = self.busy, "locked: held by another holder past the timeout"
        elif isinstance(error, QuorumUnavailableError):
            status, why = self.unavailable, "lock service unavailable: too few masters answered"
        elif isinstance(error, HoldLimitError):
            status, why = self.lost, "lock lost: the handler ran past its max_hold"
        elif isinstance(error, LostLeaseError):
            status, why = self.lost, "lock lost while the handler ran: it held it no longer"
        elif isinstance(error, LockLostError):
            status, why = self.lost, "lock lost while the handler ran: its work was cancelled"
        elif isinstance(error, StaleTokenError):
            status, why = self.lost, _STALE
        else:
            return None
        body = {"detail": why, "resource": error.resource}
        return ErrorResponse(status, {"Retry-After": str(self.retry_after)}, body)


class BadLockName(ValueError):
    """The lock name filled from a request's path is one the library refuses (a
    NUL, text that is not UTF-8, a reserved key): the client's path is bad (400)."""


#: The answer to `BadLockName`: no ``Retry-After`` (the same path fails again), and
#: neither the name nor the refusal's text (the name is the client's, perhaps not
#: encodable; the text is for the logs).
BAD_LOCK_NAME = ErrorResponse(
    400, {}, {"detail": "bad path: the lock name it makes cannot be used"}
)


class ShuttingDown(RuntimeError):
    """The request's lock was refused because the app's ``AsyncRedlock`` was closing
    (``aclose()`` began: the app shuts down), as it waited or as it came. A
    `RuntimeError`, as the refusal it stands for (its cause): 503 with
    ``Retry-After``, where an app not shutting down may serve the request."""

    def __init__(self, resource: str) -> None:
        super().__init__(f"the lock {resource!r} was refused: its AsyncRedlock is closing")
        self.resource = resource


#: The errors the web helpers answer (`answer` has a response for each).
ANSWERED: tuple[type[Exception], ...] = (
    LockTimeoutError,
    QuorumUnavailableError,
    LockLostError,
    StaleTokenError,
    BadLockName,
    ShuttingDown,
)


def answer(errors: HTTPErrors, error: Exception) -> ErrorResponse | None:
    """The response for ``error``: `HTTPErrors.response` for a lock error, 400 for
    `BadLockName`, the ``unavailable`` status for `ShuttingDown`, ``None`` for
    anything else."""
    if isinstance(error, BadLockName):
        return BAD_LOCK_NAME
    if isinstance(error, ShuttingDown):
        body = {"detail": "lock service shutting down", "resource": error.resource}
        return ErrorResponse(errors.unavailable, {"Retry-After": str(errors.retry_after)}, body)
    if isinstance(error, RedlockError):
        return errors.response(error)
    return None


def close_code(response: ErrorResponse) -> int:
    """The WebSocket close code standing for ``response``: 1013 (Try Again Later) for
    an answer that says when to retry (``Retry-After``), 1008 (Policy Violation) for
    one that does not (a bad path)."""
    return CLOSE_TRY_AGAIN_LATER if "Retry-After" in response.headers else CLOSE_POLICY_VIOLATION


def missing_framework(module: str, framework: str, extra: str) -> ImportError:
    """The error raised by a contrib module imported without its framework."""
    return ImportError(
        f"asyncredlock.contrib.{module} needs {framework}: pip install 'asyncredlock[{extra}]'"
    )


def errors_or_default(errors: object) -> HTTPErrors:
    """``errors``, or `HTTPErrors`'s defaults for ``None``.

    Raises:
        TypeError: ``errors`` is something else.
    """
    if errors is None:
        return HTTPErrors()
    if not isinstance(errors, HTTPErrors):
        raise TypeError(f"errors must be an HTTPErrors, not {type(errors).__name__}")
    return errors


def check_redlock(masters: Sequence[Any], settings: dict[str, Any]) -> None:
    """Raise now what ``AsyncRedlock(masters, **settings)`` would raise at startup
    (it opens nothing, so the one made here needs no closing)."""
    AsyncRedlock(masters, **settings)


class RequestLock:
    """The lock of one request: a name template filled with the route's path
    parameters, and ``lock()``'s options, both checked when made."""

    __slots__ = ("options", "template")

    def __init__(self, name: str, options: LockOptions) -> None:
        self.template = NameTemplate(name)
        self.options = options

    def lock(self, redlock: AsyncRedlock, params: Mapping[str, object]) -> Lock:
        """The lock for a request with these path parameters.

        Raises:
            ValueError: A field of the template is not among ``params``, or an
                attribute or item of one is missing (the route's bug: a 500).
            BadLockName: The library refuses the name the path made (the
                client's: a 400).
        """
        self.template.require_fields(params, "path parameter", "of this route")
        name = self.template.fill(params)
        try:
            return redlock.lock(name, **self.options.kwargs())
        except ValueError as exc:
            # The options were checked when made, and one name is never refused for
            # spanning slots or being fair: lock() refuses the name.
            raise BadLockName(f"lock name {name!r} refused: {exc}") from exc

    @asynccontextmanager
    async def held(
        self, redlock: AsyncRedlock, params: Mapping[str, object]
    ) -> AsyncIterator[Lease]:
        """Hold the lock for a request with these path parameters (``async with``).

        Raises:
            ShuttingDown: ``redlock`` was closing when the lock was made or while it
                was acquired (the `RuntimeError` it raised is the cause). One raised
                later, by the block or the release, is raised as it is.
            ValueError, BadLockName: As `lock` raises.
        """
        entered = False
        try:
            async with self.lock(redlock, params) as lease:
                entered = True
                yield lease
        except RuntimeError as exc:
            if entered or not redlock._core.closing:
                raise
            raise ShuttingDown(self.template.fill(params)) from exc
