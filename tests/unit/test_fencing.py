"""The resource-side guards: in memory, and SQL statements run on stdlib sqlite3."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator

import pytest

from asyncredlock import RedlockError
from asyncredlock.fencing import (
    FenceGuard,
    MissingRecordError,
    SQLFence,
    StaleTokenError,
    check_token,
)

BAD_TOKENS = [
    pytest.param(None, TypeError, "fencing=False", id="None"),
    pytest.param(True, TypeError, "not bool", id="bool"),
    pytest.param(7.0, TypeError, "not float", id="float"),
    pytest.param("7", TypeError, "not str", id="str"),
    pytest.param(-1, ValueError, ">= 0", id="negative"),
]


class TestCheckToken:
    def test_returns_the_token(self) -> None:
        assert check_token(0) == 0
        assert check_token(2**70) == 2**70

    @pytest.mark.parametrize(("token", "error", "match"), BAD_TOKENS)
    def test_refuses(self, token: object, error: type[Exception], match: str) -> None:
        with pytest.raises(error, match=match):
            check_token(token)


class TestFenceGuard:
    def test_accepts_increasing_and_equal_tokens(self) -> None:
        guard = FenceGuard()
        assert guard.newest() is None
        for token in [1, 2, 2, 10, 10**20]:
            guard.check(token)
            assert guard.newest() == token

    def test_refuses_an_older_token(self) -> None:
        guard = FenceGuard()
        guard.check(23, "orders:42")
        with pytest.raises(StaleTokenError) as caught:
            guard.check(17, "orders:42")
        error = caught.value
        assert (error.token, error.newest, error.resource) == (17, 23, "orders:42")
        assert error.outcomes == ()
        assert str(error) == "stale fencing token 17 for 'orders:42': the guard has seen 23"
        assert isinstance(error, RedlockError)
        assert guard.newest("orders:42") == 23

    def test_message_without_resource(self) -> None:
        guard = FenceGuard()
        guard.check(2)
        with pytest.raises(StaleTokenError, match=r"^stale fencing token 1: the guard has seen 2$"):
            guard.check(1)

    def test_resources_are_independent(self) -> None:
        guard = FenceGuard()
        guard.check(100, "a")
        guard.check(1, "b")
        assert (guard.newest("a"), guard.newest("b"), guard.newest("c")) == (100, 1, None)
        with pytest.raises(StaleTokenError):
            guard.check(0, "b")

    @pytest.mark.parametrize(("token", "error", "match"), BAD_TOKENS)
    def test_bad_token_loses_nothing(
        self, token: object, error: type[Exception], match: str
    ) -> None:
        guard = FenceGuard()
        guard.check(3, "r")
        with pytest.raises(error, match=match):
            guard.check(token, "r")  # type: ignore[arg-type]
        assert guard.newest("r") == 3

    def test_bad_resource(self) -> None:
        with pytest.raises(TypeError, match="resource must be a str"):
            FenceGuard().check(1, 42)  # type: ignore[arg-type]

    def test_threads(self) -> None:
        """Threads racing on one resource: the newest ends as the largest token."""
        guard = FenceGuard()
        threads = 8
        tokens = 2000
        start = threading.Barrier(threads)
        refused: list[StaleTokenError] = []
        accepted = [0] * threads

        def writer(index: int) -> None:
            start.wait()
            for token in range(index, tokens, threads):
                guard.check(token, f"own:{index}")
                try:
                    guard.check(token, "shared")
                except StaleTokenError as exc:
                    refused.append(exc)
                else:
                    accepted[index] += 1

        workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert guard.newest("shared") == tokens - 1
        assert sum(accepted) + len(refused) == tokens
        assert all(error.newest > error.token for error in refused)
        assert [guard.newest(f"own:{i}") for i in range(threads)] == [
            max(range(i, tokens, threads)) for i in range(threads)
        ]


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    """An in-memory database with one committed order, id 42, at fence 5."""
    connection = sqlite3.connect(":memory:")
    connection.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, total REAL, "
        "fence BIGINT NOT NULL)"
    )
    connection.execute("INSERT INTO orders VALUES (42, 'new', 10.0, 5)")
    connection.commit()
    yield connection
    connection.close()


def row(db: sqlite3.Connection, key: int = 42) -> tuple[object, ...] | None:
    found: tuple[object, ...] | None = db.execute(
        "SELECT status, total, fence FROM orders WHERE id = ?", (key,)
    ).fetchone()
    return found


@pytest.fixture(params=["qmark", "named"])
def fence(request: pytest.FixtureRequest) -> SQLFence:
    """The guard of the orders table, in each paramstyle that sqlite3 accepts."""
    return SQLFence("orders", paramstyle=request.param)


class TestSQLFenceOnSQLite:
    @pytest.mark.parametrize("token", [5, 6, 2**63 - 1])
    def test_update_accepts_equal_and_newer(
        self, db: sqlite3.Connection, fence: SQLFence, token: int
    ) -> None:
        fence.update(db, 42, {"status": "paid", "total": 12.5}, token)
        assert row(db) == ("paid", 12.5, token)

    def test_update_refuses_older(self, db: sqlite3.Connection, fence: SQLFence) -> None:
        with pytest.raises(StaleTokenError) as caught:
            fence.update(db, 42, {"status": "paid"}, 4)
        assert (caught.value.token, caught.value.newest, caught.value.resource) == (4, 5, "42")
        assert str(caught.value) == "stale fencing token 4 for '42': the guard has seen 5"
        assert row(db) == ("new", 10.0, 5)

    @pytest.mark.parametrize("method", ["update", "upsert"])
    def test_a_write_counted_as_no_change_is_done(
        self, db: sqlite3.Connection, fence: SQLFence, method: str
    ) -> None:
        """MySQL (PyMySQL without CLIENT.FOUND_ROWS) counts the rows a statement
        changed, not those it matched: a retried write, same token and values, reports
        0 rows. A trigger that skips such an update gives sqlite3 the same count."""
        db.execute(
            "CREATE TRIGGER unchanged BEFORE UPDATE ON orders WHEN NEW.status IS OLD.status "
            "AND NEW.total IS OLD.total AND NEW.fence IS OLD.fence BEGIN SELECT RAISE(IGNORE); END"
        )
        write = getattr(fence, method)
        write(db, 42, {"status": "paid"}, 6)
        sql, params = fence.update_statement(42, {"status": "paid"}, 6)
        assert db.execute(sql, params).rowcount == 0  # the retry counts no row
        write(db, 42, {"status": "paid"}, 6)
        assert row(db) == ("paid", 10.0, 6)
        with pytest.raises(StaleTokenError):
            write(db, 42, {"status": "paid"}, 5)
        with pytest.raises(MissingRecordError):
            fence.update(db, 7, {"status": "paid"}, 6)

    def test_update_of_a_missing_record(self, db: sqlite3.Connection, fence: SQLFence) -> None:
        with pytest.raises(MissingRecordError, match="no record with id = 7") as caught:
            fence.update(db, 7, {"status": "paid"}, 9)
        assert isinstance(caught.value, LookupError)
        assert caught.value.resource == "7"
        assert row(db, 7) is None

    @pytest.mark.parametrize("token", [5, 6])
    def test_upsert_accepts_equal_and_newer(
        self, db: sqlite3.Connection, fence: SQLFence, token: int
    ) -> None:
        fence.upsert(db, 42, {"status": "paid"}, token)
        assert row(db) == ("paid", 10.0, token)

    def test_upsert_refuses_older(self, db: sqlite3.Connection, fence: SQLFence) -> None:
        with pytest.raises(StaleTokenError) as caught:
            fence.upsert(db, 42, {"status": "paid", "total": 0.0}, 4)
        assert (caught.value.token, caught.value.newest) == (4, 5)
        assert row(db) == ("new", 10.0, 5)

    def test_upsert_inserts_a_missing_record(self, db: sqlite3.Connection, fence: SQLFence) -> None:
        fence.upsert(db, 7, {"status": "new", "total": 1.0}, 3)
        assert row(db, 7) == ("new", 1.0, 3)

    def test_schema_qualified_table(self, db: sqlite3.Connection) -> None:
        fence = SQLFence("main.orders")
        fence.upsert(db, 42, {"status": "paid"}, 6)
        with pytest.raises(StaleTokenError):
            fence.upsert(db, 42, {"status": "late"}, 5)
        assert row(db) == ("paid", 10.0, 6)

    def test_custom_columns(self) -> None:
        connection = sqlite3.connect(":memory:")
        connection.execute("CREATE TABLE jobs (name TEXT PRIMARY KEY, state TEXT, epoch BIGINT)")
        fence = SQLFence("jobs", key_column="name", fence_column="epoch")
        fence.upsert(connection, "nightly", {"state": "running"}, 2)
        with pytest.raises(StaleTokenError):
            fence.update(connection, "nightly", {"state": "done"}, 1)
        assert connection.execute("SELECT * FROM jobs").fetchall() == [("nightly", "running", 2)]
        connection.close()

    def test_does_not_commit(self, db: sqlite3.Connection, fence: SQLFence) -> None:
        fence.update(db, 42, {"status": "paid"}, 6)
        assert db.in_transaction
        db.rollback()
        assert row(db) == ("new", 10.0, 5)

    @pytest.mark.parametrize(("token", "error", "match"), BAD_TOKENS)
    @pytest.mark.parametrize("method", ["update", "upsert"])
    def test_bad_token_loses_nothing(
        self,
        db: sqlite3.Connection,
        fence: SQLFence,
        method: str,
        token: object,
        error: type[Exception],
        match: str,
    ) -> None:
        with pytest.raises(error, match=match):
            getattr(fence, method)(db, 42, {"status": "paid"}, token)
        assert not db.in_transaction
        assert row(db) == ("new", 10.0, 5)

    @pytest.mark.parametrize("method", ["update", "upsert"])
    def test_token_beyond_bigint(self, db: sqlite3.Connection, method: str) -> None:
        with pytest.raises(ValueError, match=r"at most 2\*\*63 - 1"):
            getattr(SQLFence("orders"), method)(db, 42, {"status": "paid"}, 2**63)
        assert row(db) == ("new", 10.0, 5)

    def test_reads_the_fence(self, db: sqlite3.Connection, fence: SQLFence) -> None:
        assert db.execute(*fence.token_statement(42)).fetchall() == [(5,)]
        assert db.execute(*fence.token_statement(7)).fetchall() == []


UPDATE_SQL = {
    "qmark": (
        "UPDATE orders SET status = ?, fence = ? WHERE id = ? AND fence <= ?",
        ("paid", 7, 42, 7),
    ),
    "named": (
        "UPDATE orders SET status = :status, fence = :fence WHERE id = :id AND fence <= :fence",
        {"status": "paid", "fence": 7, "id": 42},
    ),
    "format": (
        "UPDATE orders SET status = %s, fence = %s WHERE id = %s AND fence <= %s",
        ("paid", 7, 42, 7),
    ),
    "pyformat": (
        "UPDATE orders SET status = %(status)s, fence = %(fence)s "
        "WHERE id = %(id)s AND fence <= %(fence)s",
        {"status": "paid", "fence": 7, "id": 42},
    ),
    "numeric": (
        "UPDATE orders SET status = :1, fence = :2 WHERE id = :3 AND fence <= :2",
        ("paid", 7, 42),
    ),
    "dollar": (
        "UPDATE orders SET status = $1, fence = $2 WHERE id = $3 AND fence <= $2",
        ("paid", 7, 42),
    ),
}


class TestSQLFenceStatements:
    @pytest.mark.parametrize("paramstyle", list(UPDATE_SQL))
    def test_update(self, paramstyle: str) -> None:
        fence = SQLFence("orders", paramstyle=paramstyle)  # type: ignore[arg-type]
        assert fence.update_statement(42, {"status": "paid"}, 7) == UPDATE_SQL[paramstyle]

    def test_upsert_dollar(self) -> None:
        fence = SQLFence("shop.orders", paramstyle="dollar")
        assert fence.upsert_statement(42, {"status": "paid", "total": 3}, 7) == (
            "INSERT INTO shop.orders (id, status, total, fence) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (id) DO UPDATE SET status = excluded.status, total = excluded.total, "
            "fence = excluded.fence WHERE shop.orders.fence <= excluded.fence",
            (42, "paid", 3, 7),
        )

    def test_upsert_pyformat(self) -> None:
        fence = SQLFence("orders", paramstyle="pyformat")
        assert fence.upsert_statement("a", {"status": "paid"}, 7) == (
            "INSERT INTO orders (id, status, fence) VALUES (%(id)s, %(status)s, %(fence)s) "
            "ON CONFLICT (id) DO UPDATE SET status = excluded.status, fence = excluded.fence "
            "WHERE orders.fence <= excluded.fence",
            {"id": "a", "status": "paid", "fence": 7},
        )

    def test_token_statement(self) -> None:
        fence = SQLFence("jobs", key_column="name", fence_column="epoch", paramstyle="dollar")
        assert fence.token_statement("nightly") == (
            "SELECT epoch FROM jobs WHERE name = $1",
            ("nightly",),
        )

    def test_repr(self) -> None:
        assert repr(SQLFence("orders")) == (
            "SQLFence(table='orders', key_column='id', fence_column='fence', paramstyle='qmark')"
        )


class TestSQLFenceValidation:
    @pytest.mark.parametrize(
        "kwargs",
        [
            {"table": "orders; DROP TABLE orders"},
            {"table": ""},
            {"table": "1orders"},
            {"table": "shop..orders"},
            {"table": "orders."},
            {"table": "or-ders"},
            {"key_column": "id desc"},
            {"fence_column": "fence)"},
            {"fence_column": "shop.fence"},
            {"key_column": "fence"},
            {"key_column": "FENCE"},
        ],
    )
    def test_bad_identifiers(self, kwargs: dict[str, str]) -> None:
        options = {"table": "orders", **kwargs}
        with pytest.raises(ValueError, match=r"identifier|different"):
            SQLFence(**options)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"table": "order"},  # SQLite and PostgreSQL
            {"table": "Group"},
            {"table": "user"},  # PostgreSQL only
            {"table": "main.order"},
            {"table": "order.items"},
            {"key_column": "values"},  # SQLite only
            {"fence_column": "current_date"},  # would read the date, not the column
        ],
    )
    def test_reserved_words_are_refused(self, kwargs: dict[str, str]) -> None:
        """Names are written unquoted: a reserved word would fail only when a statement
        runs (or mean something else), so it is refused at construction."""
        options = {"table": "orders", **kwargs}
        with pytest.raises(ValueError, match="reserved word"):
            SQLFence(**options)  # type: ignore[arg-type]

    def test_keywords_that_can_be_names_stay_accepted(self) -> None:
        """Keywords that SQLite (and PostgreSQL) take as names work as before."""
        connection = sqlite3.connect(":memory:")
        connection.execute(
            "CREATE TABLE key (name TEXT PRIMARY KEY, date TEXT, value TEXT, version BIGINT)"
        )
        fence = SQLFence("key", key_column="name", fence_column="version")
        fence.upsert(connection, "a", {"date": "d1", "value": "v1"}, 1)
        fence.update(connection, "a", {"value": "v2"}, 2)
        with pytest.raises(StaleTokenError):
            fence.update(connection, "a", {"value": "late"}, 1)
        assert connection.execute("SELECT * FROM key").fetchall() == [("a", "d1", "v2", 2)]

    def test_identifier_not_a_str(self) -> None:
        with pytest.raises(TypeError, match="table must be a str"):
            SQLFence(b"orders")  # type: ignore[arg-type]

    def test_bad_paramstyle(self) -> None:
        with pytest.raises(ValueError, match="paramstyle must be one of"):
            SQLFence("orders", paramstyle="percent")  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("values", "error", "match"),
        [
            pytest.param({}, ValueError, "at least one column", id="empty"),
            pytest.param({"id": 1, "status": "x"}, ValueError, "must not set 'id'", id="key"),
            pytest.param({"fence": 9}, ValueError, "must not set 'fence'", id="fence"),
            pytest.param({"Fence": 9}, ValueError, "must not set 'Fence'", id="fence-case"),
            pytest.param({"status = 1; --": 1}, ValueError, "not a SQL identifier", id="inject"),
            pytest.param({"status": 1, "STATUS": 2}, ValueError, "twice", id="twice"),
            pytest.param({"order": 1}, ValueError, "reserved word", id="reserved"),
            pytest.param({1: "x"}, TypeError, "column name must be a str", id="not-str"),
            pytest.param([("status", "x")], TypeError, "must be a mapping", id="not-mapping"),
        ],
    )
    @pytest.mark.parametrize("method", ["update", "upsert"])
    def test_bad_values_lose_nothing(
        self,
        db: sqlite3.Connection,
        method: str,
        values: object,
        error: type[Exception],
        match: str,
    ) -> None:
        with pytest.raises(error, match=match):
            getattr(SQLFence("orders"), method)(db, 42, values, 6)
        assert not db.in_transaction
        assert row(db) == ("new", 10.0, 5)

    @pytest.mark.parametrize("method", ["update_statement", "upsert_statement", "token_statement"])
    def test_key_none(self, method: str) -> None:
        builder = getattr(SQLFence("orders"), method)
        with pytest.raises(TypeError, match="key must not be None"):
            builder(None) if method == "token_statement" else builder(None, {"status": 1}, 6)
