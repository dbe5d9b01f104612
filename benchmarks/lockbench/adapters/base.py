"""What every adapter is: a session per case, a handle per worker, and the helpers
that record their settings."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Mode:
    """How a session is used: whether acquires wait for another holder, and how many
    workers run at once (the thread pool of a synchronous library)."""

    name: str
    waiting: bool
    workers: int


class Handle(Protocol):
    """One worker's lock on one key."""

    async def acquire(self) -> None:
        """Take the lock; raise if not taken."""

    async def release(self) -> None:
        """Release the lock taken by the last `acquire`."""


class Session(Protocol):
    """One library's clients for one case."""

    def handle(self, key: str) -> Handle:
        """A lock on ``key`` for one worker."""

    def settings(self) -> dict[str, Any]:
        """Every setting in force, passed or default."""

    async def aclose(self) -> None:
        """Close every client."""


class NotAcquiredError(RuntimeError):
    """A library said no (``False`` or ``None``) instead of raising."""


def defaults(func: Callable[..., Any], **given: Any) -> dict[str, Any]:
    """The keyword defaults of ``func`` updated with ``given``, made JSON-safe."""
    params = inspect.signature(func).parameters.values()
    found = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return {k: jsonable(v) for k, v in (found | given).items()}


def jsonable(value: Any) -> Any:
    """``value`` if JSON can hold it, else its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return repr(value)


def redis_client_settings(client: Any) -> dict[str, Any]:
    """Socket timeouts, retry policy and pool size of a redis-py client, read from a
    connection object made as its pool would make one (not counted by the pool, never
    connected)."""
    pool = client.connection_pool
    conn = pool.connection_class(**pool.connection_kwargs)
    retry = conn.retry
    return {
        "socket_timeout": conn.socket_timeout,
        "socket_connect_timeout": conn.socket_connect_timeout,
        "retries": getattr(retry, "_retries", None),
        "backoff": type(getattr(retry, "_backoff", None)).__name__,
        "max_connections": pool.max_connections,
    }
