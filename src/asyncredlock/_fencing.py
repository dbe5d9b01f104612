"""Resource-side fencing guards: refuse writes that carry a superseded lease's token.

A lease's fencing token grows with every acquisition of its resource. A resource that
remembers the newest token it accepted and refuses older ones cannot be written by a
holder that was paused, delayed or partitioned past the end of its lease.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from ._config import check_text, plain_str
from ._errors import StaleTokenError
from ._scripts import FENCED_READ, FENCED_WRITE, evalsha
from ._sqlwords import RESERVED_WORDS

__all__ = [
    "FenceGuard",
    "FencedStore",
    "FencedValue",
    "check_identifier",
    "check_int64",
    "check_key",
    "check_str",
    "check_token",
    "stale",
]

_INT64_MAX = 2**63 - 1
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_token(token: object) -> int:
    """Check that ``token`` is a fencing token: a non-negative ``int``.

    Args:
        token: Typically ``lease.token``.

    Returns:
        The token, as an ``int``.

    Raises:
        TypeError: ``token`` is ``None`` (the lease has no token: it was taken with
            ``fencing=False``, or it is a reader's lease or a semaphore's, or it holds
            several resources, whose tokens are in ``lease.tokens``), a ``bool`` or
            not an ``int``.
        ValueError: ``token`` is negative.
    """
    if token is None:
        raise TypeError(
            "fencing token is None: the lease has no token (it was taken with fencing=False,"
            " or it is a reader's lease or a semaphore's), or it holds several resources:"
            " see lease.tokens"
        )
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"fencing token must be an int, not {type(token).__name__}")
    if token < 0:
        raise ValueError(f"fencing token must be >= 0, got {token}")
    return int(token)


def check_int64(token: object) -> int:
    """`check_token`, and the token must fit a signed 64-bit integer (``BIGINT``)."""
    checked = check_token(token)
    if checked > _INT64_MAX:
        raise ValueError(f"fencing token must be at most 2**63 - 1, got {checked}")
    return checked


def stale(resource: str, token: int, newest: int) -> StaleTokenError:
    where = f" for {resource!r}" if resource else ""
    return StaleTokenError(
        f"stale fencing token {token}{where}: the guard has seen {newest}",
        resource=resource,
        token=token,
        newest=newest,
    )


class FenceGuard:
    """An in-memory fencing guard, for resources inside one process and for tests.

    It remembers the newest token accepted for each resource name and refuses older
    ones. Under asyncio, call `check()` and do the write with no ``await`` between
    them: another task could otherwise check a newer token and write first, and the
    older write would then land after it. The guard itself is thread-safe (a
    `threading.Lock`); with threads, hold one lock of your own around `check()` and
    the write, for the same reason.

    ```python
    guard = FenceGuard()
    guard.check(check_token(lease.token), "orders:42")  # raises StaleTokenError
    orders[42] = new_order  # no await since the check
    ```

    It keeps one entry per resource name for as long as it lives.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._newest: dict[str, int] = {}

    def check(self, token: int, resource: str = "") -> None:
        """Accept a write with ``token`` to ``resource``, or refuse it.

        A token equal to the newest is accepted (the current holder writes again);
        an accepted token becomes the newest.

        Args:
            token: The writer's fencing token (``lease.token``).
            resource: Which resource is written; each has its own newest token.

        Raises:
            StaleTokenError: ``token`` is older than the newest seen for ``resource``.
            TypeError: ``token`` is not an ``int`` (or is ``None``), or ``resource``
                is not a ``str``.
            ValueError: ``token`` is negative.
        """
        token = check_token(token)
        resource = check_str(resource, "resource")  # kept by its characters
        with self._lock:
            newest = self._newest.get(resource)
            if newest is not None and token < newest:
                raise stale(resource, token, newest)
            self._newest[resource] = token

    def newest(self, resource: str = "") -> int | None:
        """The newest token accepted for ``resource``, or None if none was.

        Args:
            resource: The resource name.

        Raises:
            TypeError: ``resource`` is not a ``str``.
        """
        resource = check_str(resource, "resource")
        with self._lock:
            return self._newest.get(resource)


@dataclass(frozen=True, slots=True)
class FencedValue:
    """A value read from a `FencedStore`, and the token of the write that stored it.

    Attributes:
        value: The stored value, as bytes (``str`` values are stored UTF-8 encoded,
            numbers as their decimal text).
        token: The fencing token of the write that stored it.
    """

    value: bytes
    token: int


class FencedStore:
    """A fenced key/value store in Redis: each write is refused if its token is stale.

    Each record is a hash at ``prefix + key`` with the fields ``value``, ``fence``
    (the newest token that wrote, deleted or read it fenced) and ``writer`` (the
    token that wrote the value). A write, delete or fenced read compares its token
    with ``fence`` and applies, in one Lua script, only if the token is at least as
    new. Tokens are compared exactly (as decimal strings), up to ``2**63 - 1``. For
    a read-modify-write, read with the token (`read`) as well as write with it.

    A delete removes the value and keeps the fence (a tombstone), so a stale writer
    cannot write after it. Tombstones are never removed by the store.

    A refused call's `StaleTokenError` names the record by its full key, ``prefix +
    key`` (its ``resource``), as the server has it.

    A write cancelled while its call is out may or may not have been applied;
    repeating it with the same token is safe, an equal token is accepted.

    On a lock master, keep the records apart from the lock keys (a ``prefix`` that no
    lock name starts with): a record at a lock's key is refused while the lock is held
    (``ValueError``), and one written there first keeps that master from granting the
    lock.

    Args:
        client: A ``redis.asyncio`` ``Redis`` or ``RedisCluster`` client; the caller
            keeps ownership and closes it.
        prefix: Prepended to every key.

    Raises:
        TypeError: ``client`` is not a ``redis.asyncio`` client, or ``prefix`` is not
            a ``str``.
        ValueError: ``prefix`` cannot be encoded as UTF-8 (a lone surrogate).
    """

    def __init__(self, client: Redis | RedisCluster, *, prefix: str = "") -> None:
        if not isinstance(client, Redis | RedisCluster):
            raise TypeError(
                f"client must be a redis.asyncio Redis or RedisCluster, not {type(client).__name__}"
            )
        self._client = client
        self._prefix = check_text("prefix", check_str(prefix, "prefix"))

    async def write(self, key: str, value: bytes | str | int | float, token: int) -> None:
        """Store ``value`` at ``key`` unless a newer token has written or deleted it.

        Args:
            key: The record's key (without the prefix).
            value: The value; ``str`` is stored UTF-8 encoded, numbers as text.
            token: The writer's fencing token (``lease.token``).

        Raises:
            StaleTokenError: The record's fence is newer than ``token``; nothing was
                written.
            TypeError: ``key`` is not a ``str``, ``value`` not ``bytes``, ``str``,
                ``int`` or ``float``, or ``token`` not an ``int``.
            ValueError: ``key`` is empty or not UTF-8, a ``str`` ``value`` is not
                UTF-8, or ``token`` is negative or over ``2**63 - 1``; or ``prefix +
                key`` holds another type of value than a record (a lock's key, on a
                lock master), and nothing was written.
        """
        name = self._key(key)
        token = check_int64(token)
        if isinstance(value, bool) or not isinstance(value, bytes | str | int | float):
            raise TypeError(f"value must be bytes, str, int or float, not {type(value).__name__}")
        if isinstance(value, str):
            check_text("value", value)
        await self._fenced(name, token, value)

    async def read(self, key: str, token: int | None = None) -> FencedValue | None:
        """The value at ``key`` and the token that wrote it.

        With ``token`` (``lease.token``), a fenced read, for a read-modify-write:
        refused if a newer token has written, deleted or read the record this way;
        otherwise ``token`` becomes the record's fence, so that from then on an
        older holder cannot write it. Without it, an older holder that read before
        this one could still write between this read and this holder's write, and
        one update would be lost.

        Args:
            key: The record's key (without the prefix).
            token: The reader's fencing token, for a fenced read.

        Returns:
            None if there is no value (never written, or deleted).

        Raises:
            StaleTokenError: A fenced read whose ``token`` is older than the
                record's fence; nothing was read or changed.
            TypeError: ``key`` is not a ``str``, or ``token`` not an ``int``.
            ValueError: ``key`` is empty or not UTF-8, or ``token`` is negative or over
                ``2**63 - 1``; or ``prefix + key`` holds another type of value than a
                record (a lock's key, on a lock master).
        """
        name = self._key(key)
        if token is not None:
            return await self._fenced_read(name, check_int64(token))
        with _a_record(name):
            value, writer, fence = await self._client.hmget(name, ["value", "writer", "fence"])
        # A hash without a fence was not written here; writes to it are not refused.
        if value is None or fence is None:
            return None
        return _found(value, writer or fence)

    async def _fenced_read(self, name: str, token: int) -> FencedValue | None:
        with _a_record(name):
            reply = await evalsha(self._client, FENCED_READ, [name], [str(token)])
        if int(reply[0]) != 1:
            raise stale(name, token, int(reply[1]))
        value, writer = reply[1], reply[2]
        return None if value is None or writer is None else _found(value, writer)

    async def delete(self, key: str, token: int) -> None:
        """Delete the value at ``key``, keeping its fence, unless ``token`` is stale.

        The record's fence becomes ``token``, so older writers stay refused. Deleting
        a key that has no record leaves a tombstone with this token.

        Args:
            key: The record's key (without the prefix).
            token: The deleter's fencing token (``lease.token``).

        Raises:
            StaleTokenError: The record's fence is newer than ``token``; nothing was
                deleted.
            TypeError: ``key`` is not a ``str``, or ``token`` not an ``int``.
            ValueError: ``key`` is empty or not UTF-8, or ``token`` is negative or over
                ``2**63 - 1``; or ``prefix + key`` holds another type of value than a
                record (a lock's key, on a lock master), and nothing was deleted.
        """
        name = self._key(key)
        await self._fenced(name, check_int64(token))

    def _key(self, key: object) -> str:
        text = check_str(key, "key")
        if not text:
            raise ValueError("key must not be empty")
        return self._prefix + check_text("key", text)

    async def _fenced(self, name: str, token: int, *value: object) -> None:
        with _a_record(name):
            reply = await evalsha(self._client, FENCED_WRITE, [name], [str(token), *value])
        if int(reply[0]) != 1:
            raise stale(name, token, int(reply[1]))


@contextmanager
def _a_record(name: str) -> Iterator[None]:
    """Say what a WRONGTYPE reply for the record ``name`` means: its key holds a value
    that is not a hash, most likely a lock's key on a lock master."""
    try:
        yield
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        raise ValueError(
            f"FencedStore: the key {name!r} holds another type of value, not a record (a hash):"
            " a lock's key? On a lock master, give the store a prefix no lock name starts with"
        ) from exc


def _found(value: bytes | str, writer: bytes | str | int) -> FencedValue:
    # A client made with decode_responses=True answers str.
    data = value.encode() if isinstance(value, str) else value
    return FencedValue(data, int(writer))


def check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return plain_str(value)


def check_identifier(name: object, what: str, *, dotted: bool = False) -> str:
    """Validate a SQL name, and return it as the plain ``str`` to write (`plain_str`:
    a subclass's own ``__format__`` or ``__str__`` must not change what is sent)."""
    text = check_str(name, what)
    parts = text.split(".") if dotted else [text]
    if not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ValueError(f"{what} {text!r} is not a SQL identifier ([A-Za-z_][A-Za-z0-9_]*)")
    for part in parts:
        if part.lower() in RESERVED_WORDS:
            raise ValueError(
                f"{what} {text!r}: {part!r} is a reserved word in SQLite or PostgreSQL, "
                "which SQLFence cannot write unquoted"
            )
    return text


def check_key(key: object) -> None:
    if key is None:
        raise TypeError("key must not be None")
