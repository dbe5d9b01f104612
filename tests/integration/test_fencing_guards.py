"""The guards fed with real leases' tokens
-- a holder superseded by another client's direct attempt, by a server-side hand-over,
and by an in-process hand-off -- refuse the former holder and accept the current one;
bad input is refused with a typed error before any I/O."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.fencing import (
    FencedStore,
    FencedValue,
    FenceGuard,
    MissingRecordError,
    SQLFence,
    StaleTokenError,
    check_token,
)
from asyncredlock.testing import ServerGroup

from .conftest import Masters, Queue, Waiting

pytestmark = pytest.mark.anyio

HANG_GUARD = 30


class Guards:
    """The three guards on one record."""

    def __init__(self, store: FencedStore) -> None:
        self.store = store
        self.memory = FenceGuard()
        self.db = sqlite3.connect(":memory:")
        self.db.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL,"
            " fence BIGINT NOT NULL DEFAULT 0)"
        )
        self.sql = SQLFence("orders")

    async def write(self, lease: Lease, status: str) -> None:
        token = check_token(lease.token)
        self.memory.check(token, "orders:42")
        await self.store.write("42", status, token)
        self.sql.upsert(self.db, 42, {"status": status}, token)
        self.sql.update(self.db, 42, {"status": status}, token)
        self.db.commit()

    async def refused(self, late: Lease, newest: Lease) -> None:
        token, top = check_token(late.token), check_token(newest.token)
        assert token < top
        with pytest.raises(StaleTokenError) as memory:
            self.memory.check(token, "orders:42")
        with pytest.raises(StaleTokenError) as store:
            await self.store.write("42", "late", token)
        with pytest.raises(StaleTokenError) as read:
            await self.store.read("42", token)
        with pytest.raises(StaleTokenError) as delete:
            await self.store.delete("42", token)
        with pytest.raises(StaleTokenError) as update:
            self.sql.update(self.db, 42, {"status": "late"}, token)
        with pytest.raises(StaleTokenError) as upsert:
            self.sql.upsert(self.db, 42, {"status": "late"}, token)
        for caught in (memory, store, read, delete, update, upsert):
            assert (caught.value.token, caught.value.newest) == (token, top)
        assert (store.value.resource, update.value.resource) == ("data:42", "42")
        for caught in (store, read, delete):  # the store's full key, as the server has it
            assert f"for 'data:42': the guard has seen {top}" in str(caught.value)
        assert await self.store.read("42") == FencedValue(b"current", top)
        assert self.db.execute("SELECT status, fence FROM orders").fetchall() == [("current", top)]


@pytest.fixture
async def guards(servers: ServerGroup) -> AsyncIterator[Guards]:
    client = Redis.from_url(servers.urls[0])  # a data server (also a lock master here)
    made = Guards(FencedStore(client, prefix="data:"))
    yield made
    made.db.close()
    await client.aclose()


class TestSupersededHolders:
    async def test_by_another_client_s_attempt(
        self, servers: ServerGroup, masters: Masters, guards: Guards
    ) -> None:
        async with AsyncRedlock(servers.urls) as a, AsyncRedlock(servers.urls) as b:
            late = await a.lock("orders:42", auto_extend=False).acquire()
            await guards.write(late, "first")
            await a.settle()
            for client in masters.clients:  # A pauses past its lease: its keys expire
                await client.delete("orders:42")
            newest = await b.lock("orders:42").acquire()
            await guards.write(newest, "current")
            await guards.refused(late, newest)
            await guards.write(newest, "current")  # the same token again: accepted
            await newest.release()

    async def test_by_a_hand_over(self, servers: ServerGroup, guards: Guards) -> None:
        async with AsyncRedlock(servers.urls) as a, AsyncRedlock(servers.urls) as b:
            late = await a.lock("orders:42").acquire()
            await guards.write(late, "first")
            got: list[Lease] = []
            waiting = Waiting([b])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await b.lock("orders:42", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waiting.reach(2)
                    await late.release()
            newest = got[0]
            assert newest.statistics().source == "hand-over"
            await guards.write(newest, "current")
            await guards.refused(late, newest)
            await newest.release()

    async def test_by_an_in_process_hand_off(self, servers: ServerGroup, guards: Guards) -> None:
        async with AsyncRedlock(servers.urls) as a:
            late = await a.lock("orders:42").acquire()
            await guards.write(late, "first")
            got: list[Lease] = []
            queue = Queue(a)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await a.lock("orders:42", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await queue.reach(1)
                    await late.release()
            newest = got[0]
            assert newest.statistics().source == "hand-off"
            await guards.write(newest, "current")
            await guards.refused(late, newest)
            await newest.release()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestLeasesWithoutAToken:
    """``check_token()`` on the token of a lease that has none by design names why."""

    async def test_a_reader_s_lease(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as rl, rl.rwlock("tokenless").read() as lease:
            with pytest.raises(TypeError, match="a reader's lease"):
                check_token(lease.token)

    async def test_a_lock_on_several_resources(self, servers: ServerGroup) -> None:
        names = ["tokenless:a", "tokenless:b"]
        async with AsyncRedlock(servers.urls) as rl, rl.lock(names) as lease:
            with pytest.raises(TypeError, match=r"several resources: see lease\.tokens"):
                check_token(lease.token)
            assert lease.tokens is not None


class TestBeforeAnyIO:
    """A client to a port nobody listens on: any call would raise ConnectionError."""

    @pytest.fixture
    async def dead(self) -> AsyncIterator[FencedStore]:
        client = Redis(
            host="127.0.0.1",
            port=_closed_port(),
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        yield FencedStore(client)
        await client.aclose()

    @pytest.mark.parametrize(
        ("call", "error"),
        [
            (lambda s: s.write("k", "v", None), TypeError),
            (lambda s: s.write("k", "v", True), TypeError),
            (lambda s: s.write("k", "v", 1.0), TypeError),
            (lambda s: s.write("k", "v", -1), ValueError),
            (lambda s: s.write("k", "v", 2**63), ValueError),
            (lambda s: s.write("k", None, 1), TypeError),
            (lambda s: s.write("k", "\ud800", 1), ValueError),
            (lambda s: s.write("", "v", 1), ValueError),
            (lambda s: s.write(b"k", "v", 1), TypeError),
            (lambda s: s.read("k", False), TypeError),
            (lambda s: s.read("k", -1), ValueError),
            (lambda s: s.read("k", 2**63), ValueError),
            (lambda s: s.read("k\ud800"), ValueError),
            (lambda s: s.delete("k", None), TypeError),
            (lambda s: s.delete("k", 2**63), ValueError),
        ],
    )
    async def test_the_store(self, dead: FencedStore, call: Any, error: type[Exception]) -> None:
        with pytest.raises(error):
            await call(dead)

    async def test_the_store_does_reach_the_server_otherwise(self, dead: FencedStore) -> None:
        with pytest.raises(RedisConnectionError):
            await dead.write("k", "v", 1)

    @pytest.mark.parametrize(
        ("args", "error"),
        [
            ((None, {"status": "x"}, 1), TypeError),
            ((1, {"status": "x"}, None), TypeError),
            ((1, {"status": "x"}, 2**63), ValueError),
            ((1, {"status": "x"}, -5), ValueError),
            ((1, {"status": "x"}, True), TypeError),
            ((1, [("status", "x")], 1), TypeError),
            ((1, {}, 1), ValueError),
            ((1, {"fence": 2}, 1), ValueError),
            ((1, {"ID": 2}, 1), ValueError),
            ((1, {"status": 1, "STATUS": 2}, 1), ValueError),
            ((1, {"bad name": 1}, 1), ValueError),
            ((1, {"order": 1}, 1), ValueError),
            ((1, {3: 1}, 1), TypeError),
        ],
    )
    @pytest.mark.parametrize("method", ["update", "upsert"])
    def test_the_sql_fence(
        self, args: tuple[Any, ...], error: type[Exception], method: str
    ) -> None:
        class Untouchable:
            def cursor(self) -> None:
                raise AssertionError("a statement ran")

        with pytest.raises(error):
            getattr(SQLFence("orders"), method)(Untouchable(), *args)


class TestMissingAndRetried:
    async def test_sql_missing_record_and_an_equal_token_retry(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lease = await redlock.lock("orders:7").acquire()
            token = check_token(lease.token)
            db = sqlite3.connect(":memory:")
            db.execute(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL,"
                " fence BIGINT NOT NULL DEFAULT 0)"
            )
            fence = SQLFence("orders")
            with pytest.raises(MissingRecordError):
                fence.update(db, 7, {"status": "x"}, token)
            fence.upsert(db, 7, {"status": "x"}, token)
            fence.upsert(db, 7, {"status": "x"}, token)  # a retry: accepted
            fence.update(db, 7, {"status": "y"}, token)
            assert db.execute("SELECT status, fence FROM orders").fetchall() == [("y", token)]
            db.close()
            await lease.release()
