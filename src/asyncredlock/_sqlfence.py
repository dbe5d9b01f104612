"""``SQLFence``: fencing for a SQL table whose rows keep the newest token that wrote
them; statements built for the caller's DB-API paramstyle, or run on its connection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from ._errors import MissingRecordError
from ._fencing import check_identifier, check_int64, check_key, stale

__all__ = ["Paramstyle", "SQLFence", "SQLParams"]

Paramstyle = Literal["qmark", "named", "format", "pyformat", "numeric", "dollar"]
SQLParams = tuple[object, ...] | dict[str, object]


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
        ValueError: A name is not an identifier (``[A-Za-z_][A-Za-z0-9_]*``) or is
            a word reserved in SQLite or PostgreSQL (``order``, ``user``: names are
            written unquoted), the key and fence columns are the same, or
            ``paramstyle`` is unknown.
        TypeError: A name is not a ``str``.
    """

    table: str
    key_column: str = field(default="id", kw_only=True)
    fence_column: str = field(default="fence", kw_only=True)
    paramstyle: Paramstyle = field(default="qmark", kw_only=True)

    def __post_init__(self) -> None:
        # Kept as the plain strs checked: the SQL text is built from them.
        for name in ("table", "key_column", "fence_column"):
            text = check_identifier(getattr(self, name), name, dotted=name == "table")
            object.__setattr__(self, name, text)
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
                identifier or is a reserved word (as the class's names), the key or
                the fence column, or names one column twice;
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
        check_key(key)
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

        A record whose fence equals ``token`` when the statement counted no row was
        written with this token already (a driver that counts only changed rows,
        such as PyMySQL without ``CLIENT.FOUND_ROWS``, counts none for a retry that
        changes nothing): the call returns.

        Raises:
            StaleTokenError: The record's fence is newer than ``token``; the row is
                unchanged.
            MissingRecordError: No record has this key.
            TypeError: As `update_statement`, or ``connection`` has no ``cursor()``,
                before any statement runs.
            ValueError: As `update_statement`, before any statement runs.
        """
        _check_connection(connection)
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
            TypeError: As `update_statement`, or ``connection`` has no ``cursor()``,
                before any statement runs.
            ValueError: As `update_statement`, before any statement runs.
        """
        _check_connection(connection)
        checked = self._check(key, values, token)
        self._run(connection, self._upsert(*checked), key, checked[2])

    def _check(
        self, key: object, values: Mapping[str, object], token: object
    ) -> tuple[object, dict[str, object], int]:
        check_key(key)
        token = check_int64(token)
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping, not {type(values).__name__}")
        if not values:
            raise ValueError("values must name at least one column to write")
        reserved = {self.key_column.lower(), self.fence_column.lower()}
        plain: dict[str, object] = {}  # keyed by the checked plain strs, as written
        seen: set[str] = set()
        for name, value in values.items():
            column = check_identifier(name, "column name")
            if column.lower() in reserved:
                raise ValueError(
                    f"values must not set {column!r}: the guard writes the key and "
                    "fence columns itself"
                )
            if column.lower() in seen:
                raise ValueError(f"values name the column {column!r} twice")
            seen.add(column.lower())
            plain[column] = value
        return key, plain, token

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
            raise stale(str(key), token, newest)
        if newest == token:
            # Written with this very token, which no other lease holds: by this
            # statement, on a driver that counts only the rows it changed (PyMySQL
            # without CLIENT.FOUND_ROWS, for a retry that changed nothing).
            return
        # No row counted, and the fence, which only grows, is below the token: the
        # record was missing when the statement ran.
        raise MissingRecordError(
            f"fenced write to {self.table}: no record with {self.key_column} = {key!r}",
            resource=str(key),
        )


def _check_connection(connection: object) -> None:
    """Refuse, before any statement, a ``connection`` that cannot make a cursor."""
    if not callable(getattr(connection, "cursor", None)):
        raise TypeError(
            "connection must be a DB-API 2 connection (with a cursor() method),"
            f" not {type(connection).__name__}"
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
