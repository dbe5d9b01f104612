"""Resource-side fencing guards: refuse writes that carry a superseded lease's token.

A lease's fencing token grows with every acquisition of its resource. A resource that
remembers the newest token it accepted and refuses older ones cannot be written by a
holder that was paused, delayed or partitioned past the end of its lease.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from redis.asyncio import Redis, RedisCluster

from ._errors import MissingRecordError, StaleTokenError
from ._scripts import FENCED_WRITE, evalsha

__all__ = [
    "FenceGuard",
    "FencedStore",
    "FencedValue",
    "SQLFence",
    "check_token",
]

_INT64_MAX = 2**63 - 1
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Paramstyle = Literal["qmark", "named", "format", "pyformat", "numeric", "dollar"]
SQLParams = tuple[object, ...] | dict[str, object]


def check_token(token: object) -> int:
    """Check that ``token`` is a fencing token: a non-negative ``int``.

    Args:
        token: Typically ``lease.token``.

    Returns:
        The token, as an ``int``.

    Raises:
        TypeError: ``token`` is ``None`` (the lease was taken with ``fencing=False``),
            a ``bool`` or not an ``int``.
        ValueError: ``token`` is negative.
    """
    if token is None:
        raise TypeError(
            "fencing token is None: the lease was taken with fencing=False and has no token"
        )
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"fencing token must be an int, not {type(token).__name__}")
    if token < 0:
        raise ValueError(f"fencing token must be >= 0, got {token}")
    return int(token)


def _check_int64(token: object) -> int:
    """`check_token`, and the token must fit a signed 64-bit integer (``BIGINT``)."""
    checked = check_token(token)
    if checked > _INT64_MAX:
        raise ValueError(f"fencing token must be at most 2**63 - 1, got {checked}")
    return checked


def _stale(resource: str, token: int, newest: int) -> StaleTokenError:
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
        _check_str(resource, "resource")
        with self._lock:
            newest = self._newest.get(resource)
            if newest is not None and token < newest:
                raise _stale(resource, token, newest)
            self._newest[resource] = token

    def newest(self, resource: str = "") -> int | None:
        """The newest token accepted for ``resource``, or None if none was.

        Args:
            resource: The resource name.
        """
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

    Each record is a hash at ``prefix + key`` with the fields ``value`` and ``fence``.
    A write or delete compares its token with ``fence`` and applies, in one Lua
    script, only if the token is at least as new. Tokens are compared exactly (as
    decimal strings), up to ``2**63 - 1``.

    A delete removes the value and keeps the fence (a tombstone), so a stale writer
    cannot write after it. Tombstones are never removed by the store.

    A write cancelled while its call is out may or may not have been applied;
    repeating it with the same token is safe, an equal token is accepted.

    Args:
        client: A ``redis.asyncio`` ``Redis`` or ``RedisCluster`` client; the caller
            keeps ownership and closes it.
        prefix: Prepended to every key.

    Raises:
        TypeError: ``client`` is not a ``redis.asyncio`` client, or ``prefix`` is not
            a ``str``.
    """

    def __init__(self, client: Redis | RedisCluster, *, prefix: str = "") -> None:
        if not isinstance(client, Redis | RedisCluster):
            raise TypeError(
                f"client must be a redis.asyncio Redis or RedisCluster, not {type(client).__name__}"
            )
        _check_str(prefix, "prefix")
        self._client = client
        self._prefix = prefix

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
            ValueError: ``key`` is empty, or ``token`` is negative or over
                ``2**63 - 1``.
        """
        name = self._key(key)
        token = _check_int64(token)
        if isinstance(value, bool) or not isinstance(value, bytes | str | int | float):
            raise TypeError(f"value must be bytes, str, int or float, not {type(value).__name__}")
        await self._fenced(key, name, token, value)

    async def read(self, key: str) -> FencedValue | None:
        """The value at ``key`` and the token that wrote it.

        Args:
            key: The record's key (without the prefix).

        Returns:
            None if there is no value (never written, or deleted).

        Raises:
            TypeError: ``key`` is not a ``str``.
            ValueError: ``key`` is empty.
        """
        value, fence = await self._client.hmget(self._key(key), ["value", "fence"])
        # A hash without a fence was not written here; writes to it are not refused.
        if value is None or fence is None:
            return None
        # A client made with decode_responses=True answers str.
        data = value.encode() if isinstance(value, str) else value
        return FencedValue(data, int(fence))

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
            ValueError: ``key`` is empty, or ``token`` is negative or over
                ``2**63 - 1``.
        """
        name = self._key(key)
        await self._fenced(key, name, _check_int64(token))

    def _key(self, key: object) -> str:
        text = _check_str(key, "key")
        if not text:
            raise ValueError("key must not be empty")
        return self._prefix + text

    async def _fenced(self, key: str, name: str, token: int, *value: object) -> None:
        reply = await evalsha(self._client, FENCED_WRITE, [name], [str(token), *value])
        if int(reply[0]) != 1:
            raise _stale(key, token, int(reply[1]))


class _Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def execute(self, operation: str, parameters: Any, /) -> object: ...

    def fetchone(self) -> Any: ...

    def close(self) -> object: ...


class _Connection(Protocol):
    def cursor(self) -> _Cursor: ...


@dataclass(frozen=True, slots=True)
class SQLFence:
    """Fenced writes to a SQL table whose rows carry a ``fence`` column.

    The update applies only where the row's fence is not newer than the token:

    ```sql
    UPDATE orders SET status = ?, fence = ? WHERE id = ? AND fence <= ?
    ```

    and the upsert inserts a missing row or updates an existing one on the same
    condition (``ON CONFLICT ... DO UPDATE ... WHERE``, SQLite >= 3.24 and
    PostgreSQL). The fence column must be ``BIGINT NOT NULL`` and the key column
    unique (the upsert's conflict target).

    The statement builders (`update_statement`, `upsert_statement`,
    `token_statement`) suit any driver, sync or async; `update` and `upsert` run
    them on a DB-API 2 connection (e.g. ``sqlite3``). None of them commits: the
    write is part of the caller's transaction, which the caller commits.

    Args:
        table: The table, optionally schema-qualified (``schema.table``).
        key_column: The column that identifies a record.
        fence_column: The column that holds the record's newest token.
        paramstyle: The driver's placeholder style: ``"qmark"`` (``?``, sqlite3),
            ``"named"`` (``:name``), ``"format"`` (``%s``) or ``"pyformat"``
            (``%(name)s``, psycopg), ``"numeric"`` (``:1``), ``"dollar"`` (``$1``,
            asyncpg). Named styles take a ``dict`` of parameters, the others a
            ``tuple``.

    Raises:
        ValueError: A name is not an identifier (``[A-Za-z_][A-Za-z0-9_]*``), the
            key and fence columns are the same, or ``paramstyle`` is unknown.
        TypeError: A name is not a ``str``.
    """

    table: str
    key_column: str = field(default="id", kw_only=True)
    fence_column: str = field(default="fence", kw_only=True)
    paramstyle: Paramstyle = field(default="qmark", kw_only=True)

    def __post_init__(self) -> None:
        _check_identifier(self.table, "table", dotted=True)
        _check_identifier(self.key_column, "key_column")
        _check_identifier(self.fence_column, "fence_column")
        if self.key_column.lower() == self.fence_column.lower():
            raise ValueError("key_column and fence_column must be different columns")
        if self.paramstyle not in get_args(Paramstyle):
            raise ValueError(
                f"paramstyle must be one of {', '.join(get_args(Paramstyle))}, "
                f"not {self.paramstyle!r}"
            )

    def update_statement(
        self, key: object, values: Mapping[str, object], token: int
    ) -> tuple[str, SQLParams]:
        """The fenced ``UPDATE`` of one record, and its parameters.

        It changes one row if the record exists and its fence is not newer than
        ``token``, and no row otherwise: check the driver's row count.

        Args:
            key: The record's id (the key column's value).
            values: The new value of each column to change.
            token: The writer's fencing token (``lease.token``).

        Returns:
            The SQL text and its parameters in the configured paramstyle.

        Raises:
            TypeError: ``key`` is None, ``values`` not a mapping of ``str``, or
                ``token`` not an ``int``.
            ValueError: ``values`` is empty, names a column that is not an
                identifier, the key or the fence column, or names one column twice;
                ``token`` is negative or over ``2**63 - 1``.
        """
        return self._update(*self._check(key, values, token))

    def upsert_statement(
        self, key: object, values: Mapping[str, object], token: int
    ) -> tuple[str, SQLParams]:
        """The fenced ``INSERT ... ON CONFLICT DO UPDATE`` of one record.

        It inserts the record if it is missing, updates it if its fence is not
        newer than ``token``, and changes no row otherwise.

        Args:
            key: The record's id (the key column's value).
            values: The value of each column to set besides the key and the fence.
            token: The writer's fencing token (``lease.token``).

        Returns:
            The SQL text and its parameters in the configured paramstyle.

        Raises:
            TypeError: As `update_statement`.
            ValueError: As `update_statement`.
        """
        return self._upsert(*self._check(key, values, token))

    def token_statement(self, key: object) -> tuple[str, SQLParams]:
        """The ``SELECT`` of one record's fence, and its parameters.

        Args:
            key: The record's id.

        Returns:
            The SQL text and its parameters; the query returns no row if the record
            does not exist.

        Raises:
            TypeError: ``key`` is None.
        """
        _check_key(key)
        params = _Placeholders(self.paramstyle)
        where = params(self.key_column, key)
        # S608: the SQL text holds only validated identifiers and placeholders.
        sql = f"SELECT {self.fence_column} FROM {self.table} WHERE {self.key_column} = {where}"  # noqa: S608
        return sql, params.collected()

    def update(
        self, connection: _Connection, key: object, values: Mapping[str, object], token: int
    ) -> None:
        """Run the fenced update on a DB-API 2 connection, without committing.

        Args:
            connection: A DB-API 2 connection (``sqlite3``, psycopg, ...) whose
                cursors report ``rowcount``.
            key: The record's id.
            values: The new value of each column to change.
            token: The writer's fencing token (``lease.token``).

        Raises:
            StaleTokenError: The record's fence is newer than ``token``; the row is
                unchanged.
            MissingRecordError: No record has this key.
            TypeError: As `update_statement`, before any statement runs.
            ValueError: As `update_statement`, before any statement runs.
        """
        checked = self._check(key, values, token)
        self._run(connection, self._update(*checked), key, checked[2])

    def upsert(
        self, connection: _Connection, key: object, values: Mapping[str, object], token: int
    ) -> None:
        """Run the fenced upsert on a DB-API 2 connection, without committing.

        Args:
            connection: A DB-API 2 connection whose cursors report ``rowcount``.
            key: The record's id.
            values: The value of each column to set besides the key and the fence.
            token: The writer's fencing token (``lease.token``).

        Raises:
            StaleTokenError: The record exists and its fence is newer than ``token``;
                the row is unchanged.
            MissingRecordError: Only if another transaction deleted the record
                between the refused upsert and the read of its fence.
            TypeError: As `update_statement`, before any statement runs.
            ValueError: As `update_statement`, before any statement runs.
        """
        checked = self._check(key, values, token)
        self._run(connection, self._upsert(*checked), key, checked[2])

    def _check(
        self, key: object, values: Mapping[str, object], token: object
    ) -> tuple[object, dict[str, object], int]:
        _check_key(key)
        token = _check_int64(token)
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping, not {type(values).__name__}")
        if not values:
            raise ValueError("values must name at least one column to write")
        reserved = {self.key_column.lower(), self.fence_column.lower()}
        seen: set[str] = set()
        for column in values:
            _check_identifier(column, "column name")
            if column.lower() in reserved:
                raise ValueError(
                    f"values must not set {column!r}: the guard writes the key and "
                    "fence columns itself"
                )
            if column.lower() in seen:
                raise ValueError(f"values name the column {column!r} twice")
            seen.add(column.lower())
        return key, dict(values), token

    def _update(self, key: object, values: dict[str, object], token: int) -> tuple[str, SQLParams]:
        params = _Placeholders(self.paramstyle)
        sets = [f"{column} = {params(column, value)}" for column, value in values.items()]
        sets.append(f"{self.fence_column} = {params(self.fence_column, token)}")
        where_key = params(self.key_column, key)
        where_fence = params(self.fence_column, token)
        sql = (  # S608: the SQL text holds only validated identifiers and placeholders
            f"UPDATE {self.table} SET {', '.join(sets)} "  # noqa: S608
            f"WHERE {self.key_column} = {where_key} AND {self.fence_column} <= {where_fence}"
        )
        return sql, params.collected()

    def _upsert(self, key: object, values: dict[str, object], token: int) -> tuple[str, SQLParams]:
        params = _Placeholders(self.paramstyle)
        row = {self.key_column: key, **values, self.fence_column: token}
        placeholders = ", ".join(params(column, value) for column, value in row.items())
        sets = ", ".join(f"{column} = excluded.{column}" for column in [*values, self.fence_column])
        fence = self.fence_column
        sql = (  # S608: the SQL text holds only validated identifiers and placeholders
            f"INSERT INTO {self.table} ({', '.join(row)}) VALUES ({placeholders}) "  # noqa: S608
            f"ON CONFLICT ({self.key_column}) DO UPDATE SET {sets} "
            f"WHERE {self.table}.{fence} <= excluded.{fence}"
        )
        return sql, params.collected()

    def _run(
        self, connection: _Connection, statement: tuple[str, SQLParams], key: object, token: int
    ) -> None:
        cursor = connection.cursor()
        try:
            cursor.execute(*statement)
            if cursor.rowcount > 0:
                return
            cursor.execute(*self.token_statement(key))
            row = cursor.fetchone()
        finally:
            cursor.close()
        newest = None if row is None else int(row[0])
        if newest is not None and newest > token:
            raise _stale(str(key), token, newest)
        # No row matched and the fence, which only grows, does not refuse the token
        # now: the record was missing when the statement ran.
        raise MissingRecordError(
            f"fenced write to {self.table}: no record with {self.key_column} = {key!r}",
            resource=str(key),
        )


class _Placeholders:
    """Placeholders of one statement in one paramstyle, and the parameters they take.

    A column's name is its parameter's name, so a value used twice (the token) is one
    named or numbered parameter, or repeated for ``?`` and ``%s``.
    """

    def __init__(self, style: Paramstyle) -> None:
        self._style = style
        self._named: dict[str, object] = {}
        self._positional: list[object] = []

    def __call__(self, name: str, value: object) -> str:
        self._named.setdefault(name, value)
        style = self._style
        if style == "qmark" or style == "format":
            self._positional.append(value)
            return "?" if style == "qmark" else "%s"
        if style == "named":
            return f":{name}"
        if style == "pyformat":
            return f"%({name})s"
        number = list(self._named).index(name) + 1
        return f":{number}" if style == "numeric" else f"${number}"

    def collected(self) -> SQLParams:
        if self._style in ("named", "pyformat"):
            return dict(self._named)
        if self._style in ("qmark", "format"):
            return tuple(self._positional)
        return tuple(self._named.values())


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _check_identifier(name: object, what: str, *, dotted: bool = False) -> None:
    text = _check_str(name, what)
    parts = text.split(".") if dotted else [text]
    if not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ValueError(f"{what} {text!r} is not a SQL identifier ([A-Za-z_][A-Za-z0-9_]*)")


def _check_key(key: object) -> None:
    if key is None:
        raise TypeError("key must not be None")
