"""Bad method arguments get a clear, typed error at the boundary, before any I/O, and
lose nothing (from the review of method-level input validation)."""

from __future__ import annotations

import enum
import sqlite3

import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.fencing import FenceGuard, SQLFence, check_token
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio


async def _no_keys(masters: Masters) -> None:
    """Nothing written, not even a fence counter (``masters.keys()`` hides those)."""
    for client in masters.clients:
        assert await client.keys("*") == []


class _Col(str, enum.Enum):  # noqa: UP042 (not StrEnum: its format is the value)
    """Column and table names as a (str, Enum): a common way to spell them. On 3.11
    ``f"{_Col.STATUS}"`` is ``"_Col.STATUS"``, not ``"status"``."""

    ORDERS = "orders"
    STATUS = "status"


class _Slots(enum.IntEnum):
    FOUR = 4


class _Lenient(int):
    """An int whose comparisons accept any bound: ``1 <= x <= 1024`` holds for 5000."""

    def __ge__(self, other: object) -> bool:
        return True

    def __le__(self, other: object) -> bool:
        return True


class _Smuggler(str):
    """A str whose characters form an identifier but whose formatting does not."""

    def __format__(self, spec: str) -> str:
        return "status = 'forged', fence = 999999 --"


class TestSQLFenceStrSubclasses:
    """``SQLFence`` writes into the SQL text, and keys the named parameters by, the
    plain str it checked (``check_identifier``), not the caller's object (whose own
    ``__format__`` would be used by an f-string)."""

    @staticmethod
    def _db() -> sqlite3.Connection:
        db = sqlite3.connect(":memory:")
        db.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL,"
            " fence BIGINT NOT NULL DEFAULT 0)"
        )
        db.execute("INSERT INTO orders (id, status, fence) VALUES (7, 'new', 0)")
        return db

    async def test_an_enum_table_and_column_write_the_checked_names(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock, redlock.lock("orders:7") as lease:
            token = check_token(lease.token)
            db = self._db()
            try:
                SQLFence(_Col.ORDERS).update(db, 7, {_Col.STATUS: "paid"}, token)
                rows = db.execute("SELECT status, fence FROM orders").fetchall()
            finally:
                db.close()
        assert rows == [("paid", token)]

    @pytest.mark.parametrize("paramstyle", ["qmark", "named"])
    def test_the_statement_holds_the_validated_column_name(self, paramstyle: str) -> None:
        fence = SQLFence("orders", paramstyle=paramstyle)  # type: ignore[arg-type]
        sql, params = fence.update_statement(7, {_Col.STATUS: "paid"}, 5)
        assert "_Col" not in sql
        assert sql.startswith("UPDATE orders SET status = ")
        if isinstance(params, dict):
            assert all(type(name) is str for name in params)

    def test_a_str_subclass_cannot_smuggle_sql_past_the_identifier_check(self) -> None:
        """``_Smuggler("status")`` passes the check ("status" is an identifier); its
        ``__format__`` would write ``status = 'forged', fence = 999999 --`` into the
        UPDATE, commenting out the fence condition."""
        sql, _ = SQLFence("orders").update_statement(7, {_Smuggler("status"): "paid"}, 5)
        assert "forged" not in sql
        assert "--" not in sql

    def test_the_fence_keeps_its_names_as_plain_strs(self) -> None:
        fence = SQLFence(_Col.ORDERS, key_column=_Smuggler("id"))
        assert (type(fence.table), fence.table) == (str, "orders")
        assert (type(fence.key_column), fence.key_column) == (str, "id")
        sql, _ = fence.token_statement(7)
        assert sql == "SELECT fence FROM orders WHERE id = ?"


class _OneForAll(str):
    """A str subclass whose equality and hash make every instance one key."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)

    def __hash__(self) -> int:
        return 0


class TestFenceGuardResource:
    def test_a_str_subclass_resource_is_kept_by_its_characters(self) -> None:
        """``FenceGuard.check`` keys its table by the plain str ``check_str`` returns
        (as names are kept everywhere else), not by the caller's object, whose own
        ``__eq__`` / ``__hash__`` would make two resources share one newest token."""
        guard = FenceGuard()
        guard.check(5, _OneForAll("orders:1"))
        guard.check(3, _OneForAll("orders:2"))  # another resource: not stale
        assert guard.newest("orders:1") == 5
        assert guard.newest("orders:2") == 3

    def test_newest_refuses_a_resource_that_is_no_str(self) -> None:
        """``check(token, b"orders")`` is a TypeError; so is ``newest(b"orders")``
        (not ``None``, "never written", which would hide the caller's bug)."""
        guard = FenceGuard()
        guard.check(5, "orders")
        with pytest.raises(TypeError, match="resource"):
            guard.newest(b"orders")  # type: ignore[arg-type]


class TestRunSingleton:
    async def test_run_singleton_refuses_a_list_of_names(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """``run_singleton(name: str, ...)`` takes one resource name, whose lease's
        ``token`` fences the job's writes. A list would be taken by ``lock()`` as a
        multi-resource lock: the job would run with ``lease.token`` None though
        fencing is on, and the guard against a job waiting for itself would know
        only the first key. It is refused: ``TypeError`` before any I/O."""
        ran: list[Lease] = []

        async def job(lease: Lease) -> None:
            ran.append(lease)

        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(TypeError, match="name"):
                await redlock.run_singleton(["a", "b"], job)  # type: ignore[arg-type]
            await redlock.settle()
        assert ran == []
        await _no_keys(masters)


class TestManyResources:
    async def test_a_lock_on_more_resources_than_a_round_can_carry_is_refused(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """``lock(list)`` bounds the number of names at 1024, as ``semaphore`` bounds
        its slots ("each slot is a key, sent to every master in each attempt"). A lock
        on 20,000 names was made: every attempt's script outlasted ``node_timeout`` on
        every master, and ``acquire()`` ended in ``QuorumUnavailableError`` after
        counting up 20,000 fence counters on each master. It is a ``ValueError`` from
        ``lock()`` naming the bound, before any I/O."""
        names = [f"many:{i}" for i in range(20_000)]
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(ValueError, match=r"names|resources"):
                redlock.lock(names)
            await redlock.settle()
        await _no_keys(masters)

    async def test_the_bound_is_1024_names(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lock = redlock.lock([f"many:{i}" for i in range(1024)])
            assert len(lock.names) == 1024
            with pytest.raises(ValueError, match="at most 1024 resources, not 1025"):
                redlock.lock([f"many:{i}" for i in range(1025)])


class TestLockedTemplateFill:
    async def test_a_format_spec_the_value_refuses_names_the_template(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """``NameTemplate.fill`` wraps what formatting a value raises in a ValueError
        that names the template, the ValueError of a value's ``__format__``
        (``"{n:d}"`` filled with a str) included: bare, "Unknown format code 'd' for
        object of type 'str'" named neither the template nor the function."""

        async with AsyncRedlock(servers.urls) as redlock:

            @redlock.locked("job:{n:d}")
            async def run(n: object) -> None:
                raise AssertionError("ran without its lock")

            with pytest.raises(ValueError, match=r"job:\{n:d\}"):
                await run("seven")
            await redlock.settle()
        await _no_keys(masters)


class TestSemaphoreLimit:
    async def test_the_limit_is_kept_as_a_plain_int(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            semaphore = redlock.semaphore("crawl", _Slots.FOUR)
        assert (type(semaphore.limit), semaphore.limit) == (int, 4)
        assert len(semaphore.slot_keys) == 4

    async def test_an_int_subclass_cannot_pass_the_bound(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(ValueError, match="from 1 to 1024, got 5000"):
                redlock.semaphore("crawl", _Lenient(5000))
