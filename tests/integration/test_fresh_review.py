"""A fresh user's review: what README.md and docs/ promise, done the way a service
would do it (several web workers, each its own client; a cron singleton; a rate
limiter; a read-write lock; fencing guards; configuration; the client's life), checked
against real servers. Only what the docs say is relied on."""

from __future__ import annotations

import asyncio
import gc
import inspect
import math
import os
import re
import sqlite3
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

import asyncredlock
from asyncredlock import (
    AsyncRedlock,
    HoldLimitError,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    LostLeaseError,
    MissingRecordError,
    QuorumUnavailableError,
    RedlockError,
    StaleTokenError,
)
from asyncredlock.contrib import aiohttp as contrib_aiohttp
from asyncredlock.contrib import fastapi as contrib_fastapi
from asyncredlock.fencing import FencedStore, FencedValue, FenceGuard, SQLFence, check_token
from asyncredlock.testing import ServerGroup, ServerProcess, Waits, whole_retry_delay
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, polled

pytestmark = pytest.mark.anyio

GUARD = 20.0  # seconds: only stops a hung test, never decides an outcome
ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def workers(urls: list[str], n: int, **settings: Any) -> AsyncIterator[list[AsyncRedlock]]:
    """``n`` web workers: one ``AsyncRedlock`` each, told apart by identity."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(AsyncRedlock(urls, identity=f"web-{i}", **settings))
            for i in range(n)
        ]


# -- N web workers on one resource -------------------------------------------------


@pytest.mark.timeout(60)
async def test_web_workers_serialize_a_read_modify_write(servers: ServerGroup) -> None:
    """Four workers, three POSTs each, a counter read and written back over the
    network inside ``async with redlock.lock(name)``: no update lost, one holder at a
    time, and each later holder's fencing token larger."""
    data = Redis.from_url(servers[0].url)
    inside = most = 0
    tokens: list[int] = []
    try:
        await data.set("data:items", 0)
        async with workers(servers.urls, 4) as web:

            async def post(redlock: AsyncRedlock) -> None:
                nonlocal inside, most
                async with redlock.lock("items:create", timeout=GUARD) as lease:
                    inside += 1
                    most = max(most, inside)
                    tokens.append(check_token(lease.token))
                    count = int(await data.get("data:items"))
                    await data.set("data:items", count + 1)
                    inside -= 1

            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    for redlock in web:
                        for _ in range(3):
                            tg.start_soon(post, redlock)
        assert int(await data.get("data:items")) == 12
        assert most == 1
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == 12
    finally:
        await data.delete("data:items")
        await data.aclose()


@pytest.mark.timeout(60)
async def test_timeout_errors_say_what_the_docs_show(servers: ServerGroup) -> None:
    """errors.md: ``could not lock 'orders:42' within one attempt: held by another
    holder [<master>: ...; ...]`` for ``timeout=0``, ``within <t> s`` otherwise;
    ``resource`` and one outcome per master, in the masters' order."""
    async with workers(servers.urls, 2) as (holder, other):
        lease = await holder.lock("orders:42").acquire()
        try:
            with pytest.raises(LockTimeoutError) as once:
                await other.lock("orders:42", timeout=0).acquire()
            message = str(once.value)
            assert message.startswith(
                "could not lock 'orders:42' within one attempt: held by another holder ["
            ), message
            assert once.value.resource == "orders:42"
            assert [o.node for o in once.value.outcomes] == list(other.masters)
            assert not any(o.ok for o in once.value.outcomes)
            held = [o for o in once.value.outcomes if o.detail.startswith("held by another")]
            assert len(held) >= other.quorum
            # the async with path, with a wait: the same error, its wait named
            with pytest.raises(
                LockTimeoutError, match=r"^could not lock 'orders:42' within 0\.2 s"
            ):
                async with other.lock("orders:42", timeout=0.2):
                    pytest.fail("entered a block held by another worker")
            assert isinstance(once.value, RedlockError)
            assert other.statistics().timeouts == 2
            # usage.md: "A lock is not reentrant": the holder waits for itself
            with pytest.raises(LockTimeoutError, match="held by another task"):
                await holder.lock("orders:42", timeout=0.2).acquire()
            # usage.md: what a lease tells
            assert lease.key == "orders:42"
            assert re.fullmatch(r"web-0:[0-9a-f]{32}", lease.value)
            assert lease.held
            assert not lease.lost
            assert 0 < lease.validity <= 10.0
        finally:
            await lease.release()


@pytest.mark.timeout(60)
async def test_a_waiting_worker_is_woken_by_the_release(servers: ServerGroup) -> None:
    """usage.md: a waiter listens for the holder's release instead of polling: with a
    30 s retry delay (testing.md's ``whole_retry_delay``) it still gets the lock in
    time, woken, with a larger token."""
    async with (
        AsyncRedlock(servers.urls, identity="web-0") as holder,
        AsyncRedlock(servers.urls, identity="web-1", retry_delay=30) as other,
    ):
        lease = await holder.lock("orders:42").acquire()
        got: list[Lease] = []

        async def wait_for_it() -> None:
            async with other.lock("orders:42", timeout=GUARD) as mine:
                got.append(mine)

        with Waits(other) as waits, whole_retry_delay(other), anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_it)
                await waits.reach(1)
                state = await other.inspect("orders:42")
                assert state.identity == "web-0"
                assert state.holder == lease.value
                await lease.release()
        assert waits.woken >= 1
        assert check_token(got[0].token) > check_token(lease.token)


@pytest.mark.timeout(60)
async def test_a_caller_side_deadline_leaves_nothing_behind(
    servers: ServerGroup, masters: Masters
) -> None:
    """usage.md: ``async with asyncio.timeout(t)`` around ``timeout=math.inf``: the
    caller's TimeoutError comes through unchanged, and whatever the interrupted attempt
    took is released: the masters keep only the holder's key."""
    async with workers(servers.urls, 2) as (holder, other):
        lease = await holder.lock("orders:42").acquire()
        deadlines: list[asyncio.Timeout] = []

        async def enter() -> None:
            async with asyncio.timeout(GUARD) as deadline:
                deadlines.append(deadline)
                async with other.lock("orders:42", timeout=math.inf):
                    pytest.fail("entered a block held by another worker")

        with Waits(other) as waits, anyio.fail_after(GUARD):
            task = asyncio.get_running_loop().create_task(enter())
            await waits.reach(1)
            deadlines[0].reschedule(asyncio.get_running_loop().time())  # due now
            with pytest.raises(TimeoutError):
                await task
        await other.settle()
        assert await masters.keys() == [[b"orders:42"]] * len(servers)
        await lease.release()
        await holder.settle()
        assert await masters.keys() == [[]] * len(servers)


# -- a cron-like singleton --------------------------------------------------------


@pytest.mark.timeout(60)
async def test_singleton_runs_on_one_worker_then_the_other(servers: ServerGroup) -> None:
    """singleton.md: every process calls ``run_singleton``; one leads (``inspect``
    names it); when its job returns, ``run_singleton`` returns that value and a
    waiting process runs the job too."""
    running = 0
    leaders: list[int] = []
    led = [anyio.Event(), anyio.Event()]
    finish = [anyio.Event(), anyio.Event()]
    results: dict[int, str] = {}

    def job_of(i: int) -> Callable[[Lease], Any]:
        async def job(lease: Lease) -> str:
            nonlocal running
            running += 1
            assert running == 1, "two leaders at once"
            turn = len(leaders)
            leaders.append(i)
            assert isinstance(lease.token, int)
            led[turn].set()
            await finish[turn].wait()
            running -= 1
            return f"done by web-{i}"

        return job

    async with workers(servers.urls, 2, ttl=2.0) as web:

        async def run(i: int) -> None:
            results[i] = await web[i].run_singleton("scheduler", job_of(i))

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(run, i)
                await led[0].wait()
                state = await web[0].inspect("scheduler")
                assert state.identity == f"web-{leaders[0]}"
                finish[0].set()
                await led[1].wait()
                finish[1].set()
    assert sorted(leaders) == [0, 1]
    assert results == {0: "done by web-0", 1: "done by web-1"}


@pytest.mark.timeout(60)
async def test_singleton_leader_closing_hands_over(servers: ServerGroup) -> None:
    """singleton.md: closing the leader's ``AsyncRedlock`` cancels its job and its
    ``run_singleton()`` raises ``RuntimeError``; the other process takes over."""
    first = AsyncRedlock(servers.urls, identity="web-0")
    led = [anyio.Event(), anyio.Event()]
    cancelled = anyio.Event()

    async def lead_forever(lease: Lease) -> None:
        led[0 if not led[0].is_set() else 1].set()
        try:
            await anyio.sleep_forever()
        except BaseException:
            cancelled.set()
            raise

    async with AsyncRedlock(servers.urls, identity="web-1") as second:
        with Waits(second) as waits, anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                outcome: list[BaseException] = []

                async def run_first() -> None:
                    try:
                        await first.run_singleton("scheduler", lead_forever)
                    except RuntimeError as error:
                        outcome.append(error)

                tg.start_soon(run_first)
                await led[0].wait()
                tg.start_soon(second.run_singleton, "scheduler", lead_forever)
                await waits.reach(1)  # the second is waiting to lead
                await first.aclose()
                await cancelled.wait()
                await led[1].wait()
                assert (await second.inspect("scheduler")).identity == "web-1"
                tg.cancel_scope.cancel()
        assert len(outcome) == 1
        assert "closed" in str(outcome[0])


@pytest.mark.timeout(60)
async def test_singleton_ignores_the_clients_max_hold(servers: ServerGroup) -> None:
    """configuration.md: ``run_singleton()`` does not apply the ``AsyncRedlock``'s
    ``max_hold`` (a leader's job may run forever), while a plain lock of the same
    client, taken after the leader's, ends at it with ``HoldLimitError``; a job that
    raises ends ``run_singleton()`` with its error and frees the lock."""
    async with AsyncRedlock(servers.urls, max_hold=0.3) as redlock:
        outlived = anyio.Event()
        kept: list[bool] = []

        async def job(lease: Lease) -> str:
            with pytest.raises(HoldLimitError):
                async with redlock.lock("jobs:bounded"):
                    await anyio.sleep_forever()
            kept.append(lease.held)  # past the client's max_hold, later than the other
            outlived.set()
            raise ValueError("the job failed")

        with anyio.fail_after(GUARD), pytest.raises(ValueError, match="the job failed"):
            await redlock.run_singleton("scheduler", job)
        assert kept == [True]
        assert (await redlock.inspect("scheduler")).holder is None


async def test_singleton_refuses_bad_jobs_before_any_io() -> None:
    """singleton.md: a job that is not an async function taking the lease, or a list
    of names, is a ``TypeError`` before any I/O (the master here does not exist)."""
    async with AsyncRedlock(["redis://127.0.0.1:1"]) as redlock:

        async def no_lease() -> None: ...

        def not_async(lease: Lease) -> None: ...

        async def fine(lease: Lease) -> None: ...

        for name, job in (("cron", no_lease), ("cron", not_async), (["a", "b"], fine)):
            with pytest.raises(TypeError):
                await redlock.run_singleton(name, job)  # type: ignore[arg-type]


# -- a semaphore as a cross-client rate limiter -----------------------------------


@pytest.mark.timeout(60)
async def test_semaphore_lets_two_of_five_clients_in(servers: ServerGroup) -> None:
    """usage.md: ``redlock.semaphore(name, 2)`` across five clients: two inside at
    once, never three; a ``timeout=0`` try while both slots are held is refused;
    semaphore leases carry no token."""
    inside = most = 0
    done = 0
    two_in = anyio.Event()
    data = Redis.from_url(servers[1].url)
    async with workers(servers.urls, 6) as web:
        probe = web[5]

        async def crawl(redlock: AsyncRedlock) -> None:
            nonlocal inside, most, done
            for _ in range(3):
                async with redlock.semaphore("crawl:example.com", 2, timeout=GUARD) as lease:
                    assert lease.token is None
                    inside += 1
                    most = max(most, inside)
                    if inside == 2 and not two_in.is_set():
                        with pytest.raises(LockTimeoutError):
                            await probe.semaphore("crawl:example.com", 2, timeout=0).acquire()
                        two_in.set()
                    await two_in.wait()  # the first in waits for the second
                    await data.incr("data:crawled")  # the work: a call over the network
                    inside -= 1
                done += 1

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                for redlock in web[:5]:
                    tg.start_soon(crawl, redlock)
    assert int(await data.getdel("data:crawled")) == 15
    await data.aclose()
    assert (most, done) == (2, 15)


# -- a read-write lock across clients ----------------------------------------------


@pytest.mark.timeout(60)
async def test_rwlock_readers_of_three_clients_then_a_writer(servers: ServerGroup) -> None:
    """rwlock.md: readers of different clients hold together; a writer of a fourth
    waits for the last of them and then holds alone, with a token; readers have
    none and ``lease.shared``."""
    readers_in = 0
    all_in = anyio.Event()
    writer_waits = anyio.Event()
    order: list[str] = []
    async with workers(servers.urls, 4) as web:

        async def read(redlock: AsyncRedlock) -> None:
            nonlocal readers_in
            async with redlock.rwlock("doc:7").read(timeout=GUARD) as lease:
                assert lease.shared
                assert lease.token is None
                readers_in += 1
                if readers_in == 3:
                    all_in.set()
                await writer_waits.wait()
                readers_in -= 1
                order.append("read")

        async def write() -> None:
            async with web[3].rwlock("doc:7").write(timeout=GUARD) as lease:
                assert readers_in == 0
                assert not lease.shared
                assert isinstance(lease.token, int)
                order.append("write")

        with Waits(web[3]) as waits, anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                for redlock in web[:3]:
                    tg.start_soon(read, redlock)
                await all_in.wait()
                tg.start_soon(write)
                await waits.reach(1)
                writer_waits.set()
    assert order == ["read", "read", "read", "write"]


@pytest.mark.timeout(60)
async def test_rwlock_a_patient_writer_holds_back_later_readers(servers: ServerGroup) -> None:
    """rwlock.md: a writer past its patience (``patience=0``: at once) queues on the
    masters, and a reader of another client that comes after it waits for it."""
    async with workers(servers.urls, 3) as (reader, writer, late):
        first = await reader.rwlock("doc:8").read().acquire()
        got: list[Lease] = []

        async def write() -> None:
            got.append(await writer.rwlock("doc:8", patience=0).write(timeout=GUARD).acquire())

        with Waits(writer) as waits, anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write)
                await waits.reach(1)  # queued on the masters by then (testing.md)
                with pytest.raises(LockTimeoutError):
                    await late.rwlock("doc:8").read(timeout=0).acquire()
                await first.release()
        assert got[0].held
        assert not got[0].shared
        await got[0].release()


@pytest.mark.timeout(60)
async def test_rwlock_write_side_is_the_exclusive_lock(servers: ServerGroup) -> None:
    """rwlock.md: ``lock(name)`` and ``rwlock(name).write()`` exclude each other and
    readers: a plain lock of another client is refused ``held by readers``, and the
    fencing tokens of both sides come from one counter."""
    async with workers(servers.urls, 2) as (web0, web1):
        reader = await web0.rwlock("doc:10").read().acquire()
        with pytest.raises(LockTimeoutError, match="held by readers"):
            await web1.lock("doc:10", timeout=0).acquire()
        await reader.release()
        async with web1.lock("doc:10") as plain:
            pass
        async with web0.rwlock("doc:10").write() as written:
            pass
        assert check_token(written.token) > check_token(plain.token)


# -- fencing, as fencing.md shows it -----------------------------------------------


@pytest.mark.timeout(60)
async def test_fenced_store_refuses_a_deposed_holder(
    servers: ServerGroup, make_servers: MakeServers
) -> None:
    """fencing.md's FencedStore example on a data server of its own; then a holder
    whose lock was forced free writes late with its old token: ``StaleTokenError``
    with ``token`` and ``newest``, nothing written; the read-modify-write example."""
    (data_server,) = make_servers(1)
    client = Redis.from_url(data_server.url)
    store = FencedStore(client, prefix="data:orders:")
    try:
        async with workers(servers.urls, 2) as (web0, web1):
            async with web0.lock("orders:42") as lease:
                token = check_token(lease.token)
                await store.write("42", b'{"status": "paid"}', token)
                found = await store.read("42")
                assert found == FencedValue(value=b'{"status": "paid"}', token=token)
                await store.delete("42", token)
                assert await store.read("42") is None

            old = await web0.lock("orders:42").acquire()
            assert await web1.force_release("orders:42") == len(servers)  # an operator
            async with web1.lock("orders:42") as newer:
                await store.write("42", b"new", check_token(newer.token))
            with pytest.raises(StaleTokenError) as stale:
                await store.write("42", b"late", check_token(old.token))
            assert (stale.value.token, stale.value.newest) == (old.token, newer.token)
            assert stale.value.outcomes == ()  # errors.md: the fencing errors' are empty
            assert stale.value.resource == "data:orders:42"  # the full key, as stored
            assert re.fullmatch(
                rf"stale fencing token {old.token} for 'data:orders:42':"
                rf" the guard has seen {newer.token}",
                str(stale.value),
            ), str(stale.value)
            assert (await store.read("42")) == FencedValue(b"new", check_token(newer.token))
            with pytest.raises(LostLeaseError):
                await old.release()

            # read-modify-write, fenced on the read too
            async with web0.lock("stock:42") as lease:
                token = check_token(lease.token)
                await store.write("42", 10, token)
                found = await store.read("42", token)
                count = 0 if found is None else int(found.value)
                await store.write("42", count - 1, token)
            assert (await store.read("42")) == FencedValue(b"9", token)
    finally:
        await client.aclose()


#: The ``FencedStore(..., prefix=...)`` of each page's example, as written.
STORE_PREFIX = re.compile(r"FencedStore\(\w+, prefix=\"([^\"]*)\"\)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("page", ["docs/fencing.md", "docs/usage.md"])
async def test_fenced_store_example_on_a_lock_master(servers: ServerGroup, page: str) -> None:
    """fencing.md: the store's server 'can be any Redis or Valkey server, including
    one that is not a lock master', so a master too; each page's example prefix, as
    written: record "42" written before and under ``lock("orders:42")``, and the
    master still grants that lock (no record at the lock's key)."""
    prefixes = STORE_PREFIX.findall((ROOT / page).read_text())
    assert prefixes
    client = Redis.from_url(servers[0].url)
    try:
        async with AsyncRedlock(servers.urls) as redlock:
            for prefix in prefixes:
                store = FencedStore(client, prefix=prefix)
                await store.write("42", b'{"status": "new"}', 1)  # before any lock
                async with redlock.lock("orders:42", timeout=0) as lease:
                    await store.write("42", b'{"status": "paid"}', check_token(lease.token))
                state = await redlock.inspect("orders:42")
                assert [node.error for node in state.nodes] == [None] * len(servers)
                await client.delete(prefix + "42")
    finally:
        await client.delete("orders:42")
        await client.aclose()


@pytest.mark.timeout(60)
async def test_fence_guard_and_sqlfence_examples(servers: ServerGroup) -> None:
    """fencing.md's FenceGuard and SQLFence (sqlite3) examples, with a later holder's
    token, then the former holder's: refused with ``StaleTokenError``; ``update()`` of
    a missing record: ``MissingRecordError``, a ``LookupError``."""
    guard = FenceGuard()
    orders: dict[int, str] = {}
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE TABLE IF NOT EXISTS orders ("
        "id INTEGER PRIMARY KEY, status TEXT NOT NULL, fence BIGINT NOT NULL DEFAULT 0)"
    )
    fence = SQLFence("orders")
    async with workers(servers.urls, 2) as (web0, web1):
        first = await web0.lock("orders:42").acquire()
        await first.release()
        async with web1.lock("orders:42") as lease:
            token = check_token(lease.token)
            guard.check(token, "orders:42")
            orders[42] = "paid"
            fence.upsert(db, 42, {"status": "new"}, token)
            fence.update(db, 42, {"status": "paid"}, token)
            db.commit()
        old = check_token(first.token)
        with pytest.raises(StaleTokenError) as stale:
            guard.check(old, "orders:42")
        assert (stale.value.token, stale.value.newest) == (old, token)
        assert guard.newest("orders:42") == token
        with pytest.raises(StaleTokenError):
            fence.update(db, 42, {"status": "refunded"}, old)
        db.rollback()
        with pytest.raises(MissingRecordError) as missing:
            fence.update(db, 43, {"status": "paid"}, token)
        assert isinstance(missing.value, LookupError)
    assert db.execute("SELECT status, fence FROM orders").fetchall() == [("paid", token)]
    db.close()


async def test_check_token_names_the_leases_without_one(servers: ServerGroup) -> None:
    """fencing.md: ``fencing=False``, a reader's and a semaphore's lease have no token
    and ``check_token`` turns that into ``TypeError``; a lock on several resources has
    one per name in ``lease.tokens``."""
    async with AsyncRedlock(servers.urls) as redlock:
        for lock in (
            redlock.lock("cache:warmup", fencing=False),
            redlock.rwlock("doc:9").read(),
            redlock.semaphore("crawl:x", 2),
        ):
            async with lock as lease:
                assert lease.token is None
                with pytest.raises(TypeError):
                    check_token(lease.token)
        async with redlock.lock(["account:7", "account:9"]) as lease:
            assert lease.token is None
            assert set(lease.tokens) == {"account:7", "account:9"}
            assert all(isinstance(t, int) for t in lease.tokens.values())


# -- configuration ------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_urls_with_parameters_and_a_password(make_servers: MakeServers) -> None:
    """usage.md / configuration.md: URLs with a database and ``client_name``: the
    connections carry the name, ``masters`` shows no query; a password URL works and
    is shown without it; a wrong password ends ``acquire()`` after one attempt with
    ``refused by the masters' AUTH``, never quoting the password."""
    group = make_servers(3)
    urls = [f"{url}/0?client_name=web-3&socket_timeout=2" for url in group.urls]
    async with AsyncRedlock(urls) as redlock:
        assert list(redlock.masters) == [f"{url}/0" for url in group.urls]
        assert redlock.quorum == 2
        async with redlock.lock("orders:42", timeout=0):
            direct = Redis.from_url(group[0].url)
            try:
                names = [c["name"] for c in await direct.client_list()]
            finally:
                await direct.aclose()
            assert "web-3" in names

    with ServerProcess(password="s3cret") as server:
        good = server.url
        assert "s3cret" in good
        async with AsyncRedlock([good]) as redlock:
            assert "s3cret" not in redlock.masters[0]
            async with redlock.lock("orders:42", timeout=0):
                pass
        bad = good.replace("s3cret", "wrong-pw")
        async with AsyncRedlock([bad], timeout=GUARD) as redlock:
            lock = redlock.lock("orders:42")
            with pytest.raises(QuorumUnavailableError) as refused:
                await lock.acquire()
            assert "refused by the masters' AUTH (user or password)" in str(refused.value)
            assert "wrong-pw" not in str(refused.value)
            assert lock.statistics().attempts == 1


@pytest.mark.timeout(60)
async def test_a_ready_client_as_a_master(servers: ServerGroup) -> None:
    """usage.md: a ``redis.asyncio`` client works as a master beside URLs; it is never
    closed by ``aclose()`` (its pool stays yours); the same server as a client and a
    URL is refused with ``ValueError``, and so is a client's bad setting."""
    first = servers[0]
    mine = Redis(host=first.host, port=first.port)
    try:
        async with AsyncRedlock([mine, *servers.urls[1:3]]) as redlock:
            assert redlock.quorum == 2
            async with redlock.lock("orders:42", timeout=0):
                assert await mine.exists("orders:42") == 1
        assert await mine.ping()  # still open
        with pytest.raises(ValueError, match="twice"):
            AsyncRedlock([mine, first.url, servers.urls[1]])
        with pytest.raises(ValueError, match="port"):
            AsyncRedlock([Redis(host="127.0.0.1", port=0)])
    finally:
        await mine.aclose()


BAD_CONFIGS: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
    ("redis://h1", {}, TypeError, "not str: pass the URLs in a list ([url] for one"),
    ([], {}, ValueError, "at least one"),
    (["http://h1"], {}, ValueError, "must start with redis://"),
    (["h1:6379"], {}, ValueError, "must start with redis://"),
    (["redis://h1,redis://h2"], {}, ValueError, "one host per URL"),
    (["redis://h1", "redis://h1:6379/1"], {}, ValueError, "given twice"),
    (["redis://h1:99999"], {}, ValueError, "invalid port"),
    (["redis://h1?ssl=true"], {}, ValueError, "unknown parameter 'ssl'"),
    (["redis://u:pa#ss@h1"], {}, ValueError, "fragment"),
    ([6379], {}, TypeError, "not int"),
    (["redis://h1"], {"ttl": 0.005}, ValueError, "ttl must be at least 0.01"),
    (["redis://h1"], {"ttl": "10"}, TypeError, "ttl must be a number"),
    (["redis://h1"], {"timeout": True}, TypeError, "not bool"),
    (["redis://h1"], {"timeout": -1}, ValueError, "timeout must be >= 0"),
    (["redis://h1"], {"drift_factor": 0.5}, ValueError, "drift_factor"),
    (["redis://h1"], {"identity": "web 3"}, ValueError, "identity"),
    (["redis://h1"], {"prefix": "a\0"}, ValueError, "NUL"),
    (["redis://h1"], {"busy_poll": 0.01}, ValueError, "busy_poll must be at most 0.001"),
]


@pytest.mark.parametrize(("masters", "settings", "kind", "says"), BAD_CONFIGS)
def test_bad_configs_are_refused_at_construction(
    masters: Any, settings: dict[str, Any], kind: type[Exception], says: str
) -> None:
    """configuration.md: a wrong type is ``TypeError``, a value out of range
    ``ValueError``, at construction (no loop runs here, so no I/O could), the message
    naming the setting or the URL without its password."""
    with pytest.raises(kind, match=re.escape(says)) as refused:
        AsyncRedlock(masters, **settings)
    assert "pa#ss" not in str(refused.value)


@pytest.mark.timeout(60)
async def test_operator_inspect_from_the_environment(servers: ServerGroup) -> None:
    """usage.md: the command line reads its masters from ``REDLOCK_MASTERS`` (the
    library documents no environment settings of its own); ``inspect`` exits 1 for a
    free lock, 0 for a held one, and names the holder's identity."""
    env = dict(os.environ)
    env["REDLOCK_MASTERS"] = ",".join(servers.urls)
    env["PYTHONPATH"] = str(ROOT / "src")
    command = [sys.executable, "-m", "asyncredlock", "inspect", "orders:42"]
    with anyio.fail_after(GUARD):
        free = await anyio.run_process(command, env=env, check=False)
        assert free.returncode == 1, free.stderr
        async with (
            AsyncRedlock(servers.urls, identity="web-7") as redlock,
            redlock.lock("orders:42"),
        ):
            held = await anyio.run_process(command, env=env, check=False)
    assert held.returncode == 0, held.stderr
    assert b"web-7" in held.stdout


def test_documented_settings_warn_or_refuse() -> None:
    """configuration.md: ``max_connections`` is deprecated and warns; per-lock
    overrides and names are checked at ``lock()``/``rwlock()``/``semaphore()``."""
    with pytest.warns(DeprecationWarning, match="max_connections"):
        AsyncRedlock(["redis://h1"], max_connections=10)
    redlock = AsyncRedlock(["redis://h1"], max_hold=5.0)
    assert redlock.lock("a", ttl=60.0).ttl == 5.0  # cut to max_hold
    with pytest.raises(ValueError, match="empty"):
        redlock.lock("")
    with pytest.raises(TypeError):
        redlock.lock(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved"):
        redlock.lock("{orders:42}:fence")
    with pytest.raises(ValueError, match="one resource"):
        redlock.lock(["a", "b"], fair=True)
    with pytest.raises(ValueError, match="limit"):
        redlock.semaphore("a", 0)
    with pytest.raises(TypeError):
        redlock.rwlock("doc").read(fencing=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="patience"):
        redlock.rwlock("doc", patience=-1)


def test_configuration_masters_names_what_usage_passes() -> None:
    """configuration.md's ``masters`` and usage.md's "Masters: URLs or ready clients"
    agree: every URL scheme of usage.md's example, and the client kinds it passes
    (Valkey's too), are named in configuration.md."""
    usage = (ROOT / "docs/usage.md").read_text()
    example = usage[usage.index("## Masters: URLs or ready clients") :].split("```")[1]
    schemes = set(re.findall(r'"([a-z-]+)://', example))
    assert {"redis", "rediss", "unix", "redis-sentinel"} <= schemes
    config = (ROOT / "docs/configuration.md").read_text()
    section = config[config.index("## `masters`") :].split("\n#")[0]  # to its first subsection
    assert [s for s in sorted(schemes) if f"`{s}://`" not in section] == []
    for kind in ("Redis", "RedisCluster", "Valkey", "ValkeyCluster"):
        assert f"`{kind}`" in section, kind


@pytest.mark.timeout(60)
async def test_readme_usage_runs_as_a_program(servers: ServerGroup) -> None:
    """README.md's Usage block is a whole program: run as it is, with the masters'
    URLs in place of h1..h3, it exits 0 (no top-level ``await``, no name left for the
    reader to define)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index("## Usage")) + len("```python\n")
    code = text[start : text.index("```", start)]
    for i, url in enumerate(servers.urls[:3]):
        code = code.replace(f"redis://h{i + 1}:6379", url)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with anyio.fail_after(GUARD):
        done = await anyio.run_process([sys.executable, "-c", code], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()


SIGNATURES = [
    ("docs/usage.md", "`redlock.lock(name", AsyncRedlock.lock),
    ("docs/usage.md", "`redlock.semaphore(name", AsyncRedlock.semaphore),
    ("docs/singleton.md", "`run_singleton(name", AsyncRedlock.run_singleton),
    ("docs/rwlock.md", "`rwlock(name", AsyncRedlock.rwlock),
    ("docs/usage.md", "`redlock.locked(name", AsyncRedlock.locked),
    ("docs/fastapi.md", "`locked(name", contrib_fastapi.locked),
    ("docs/fastapi.md", "`lifespan(masters", contrib_fastapi.lifespan),
    ("docs/aiohttp.md", "`@locked(name", contrib_aiohttp.locked),
    ("docs/aiohttp.md", "`setup(app", contrib_aiohttp.setup),
]


@pytest.mark.parametrize(("page", "opening", "function"), SIGNATURES)
def test_signatures_as_written_with_their_markers(
    page: str, opening: str, function: Callable[..., Any]
) -> None:
    """A signature the docs write out, ``*`` and ``/`` included, is the function's:
    a reader who passes ``fair`` positionally, or ``name=`` by keyword, as the page
    allows, is not refused."""
    text = " ".join((ROOT / page).read_text().split())
    start = text.index("(", text.index(opening)) + 1
    written = [p.strip() for p in text[start : text.index(")", start)].split(",")]
    shown: list[str] = []
    previous = None
    for param in inspect.signature(function).parameters.values():
        if param.name == "self":
            continue
        if previous is param.POSITIONAL_ONLY and param.kind is not param.POSITIONAL_ONLY:
            shown.append("/")
        if param.kind is param.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        default = "" if param.default is param.empty else f"={param.default!r}"
        stars = "**" if param.kind is param.VAR_KEYWORD else ""
        shown.append(stars + param.name + default)
        previous = param.kind
    assert written == shown


# -- the client's life --------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_construction_does_no_io_and_a_majority_down_is_an_outage(
    make_servers: MakeServers,
) -> None:
    """index.md / errors.md: constructing does no I/O (the masters may be down); with
    two of three down, ``acquire()`` raises ``QuorumUnavailableError`` whose outcomes
    name each master's failure."""
    group = make_servers(3)
    group[0].kill()
    group[1].kill()
    redlock = AsyncRedlock(group.urls)  # nothing sent
    try:
        with pytest.raises(QuorumUnavailableError) as outage:
            await redlock.lock("orders:42", timeout=0).acquire()
        failed = [o for o in outage.value.outcomes if not o.ok]
        assert len(failed) >= 2
        assert all("ConnectionError" in o.detail or "refused" in o.detail for o in failed[:2])
        with pytest.raises(QuorumUnavailableError):  # it retries through it, then says so
            await redlock.lock("orders:42", timeout=0.3).acquire()
    finally:
        await redlock.aclose()


@pytest.mark.timeout(60)
async def test_closing_ends_leases_waiters_and_later_calls(servers: ServerGroup) -> None:
    """usage.md ``aclose()``: a held lease ends lost (its release then a
    ``LostLeaseError``), an ``async with`` block is cancelled with ``LockLostError``, a
    waiting ``acquire()`` ends with ``RuntimeError`` ("closed while acquire()
    waited"); afterwards the documented calls raise ``RuntimeError`` at once; closing
    twice is fine."""
    redlock = AsyncRedlock(servers.urls, identity="web-0")
    async with AsyncRedlock(servers.urls, identity="web-1") as other:
        lease = await redlock.lock("held").acquire()
        busy = await other.lock("wanted").acquire()
        entered = anyio.Event()
        ends: dict[str, BaseException] = {}

        async def in_block() -> None:
            try:
                async with redlock.lock("block"):
                    entered.set()
                    await anyio.sleep_forever()
            except LockLostError as error:
                ends["block"] = error

        async def waiting() -> None:
            try:
                await redlock.lock("wanted", timeout=GUARD).acquire()
            except RuntimeError as error:
                ends["waiter"] = error

        with Waits(redlock) as waits, anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(in_block)
                tg.start_soon(waiting)
                await entered.wait()
                await waits.reach(1)
                await redlock.aclose()
        assert "closed while acquire() waited" in str(ends["waiter"])
        assert isinstance(ends["block"], LockLostError)
        assert lease.lost
        with pytest.raises(LostLeaseError):
            await lease.release()
        await busy.release()

    calls: list[Callable[[], Any]] = [
        lambda: redlock.lock("x"),
        lambda: redlock.rwlock("x"),
        lambda: redlock.semaphore("x", 2),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="closed"):
            call()
    for awaited in (
        lambda: redlock.inspect("x"),
        lambda: redlock.force_release("x"),
        lambda: redlock.run_singleton("x", _job),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            await awaited()
    with pytest.raises(RuntimeError, match="closed"):
        async with redlock:
            pass

    @redlock.locked("jobs:{job_id}")
    async def run_job(job_id: int) -> None: ...

    with pytest.raises(RuntimeError, match="closed"):
        await run_job(7)
    await redlock.aclose()  # twice: fine


async def _job(lease: Lease) -> None: ...


@pytest.mark.timeout(60)
async def test_a_client_used_from_a_second_loop_in_a_thread(servers: ServerGroup) -> None:
    """usage.md: an ``AsyncRedlock`` belongs to the loop it was first used on; from
    another (a thread's ``asyncio.run``) it raises ``RuntimeError`` saying so, before
    anything is sent; on its own loop it goes on working."""
    async with AsyncRedlock(servers.urls) as redlock:
        async with redlock.lock("orders:1", timeout=0):
            pass

        async def elsewhere() -> str:
            try:
                await redlock.lock("orders:2", timeout=0).acquire()
            except RuntimeError as error:
                return str(error)
            return "no error"

        said = await anyio.to_thread.run_sync(asyncio.run, elsewhere())
        assert "another event loop" in said
        assert (await redlock.inspect("orders:2")).holder is None  # nothing was sent
        async with redlock.lock("orders:2", timeout=0):
            pass


def test_asyncio_run_twice(make_servers: MakeServers) -> None:
    """usage.md: a second ``asyncio.run()`` with the same client raises
    ``RuntimeError`` before anything is sent; one client per ``asyncio.run()`` (the
    docs' advice) works each time."""
    group = make_servers(3)
    shared = [AsyncRedlock(group.urls)]

    async def use_shared() -> None:
        async with shared[0].lock("orders:42", timeout=0):
            pass

    asyncio.run(use_shared())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(use_shared())

    async def own_client() -> None:
        async with AsyncRedlock(group.urls) as redlock, redlock.lock("orders:42", timeout=0):
            pass

    asyncio.run(own_client())
    asyncio.run(own_client())
    with warnings.catch_warnings():  # the unclosed client's, and its sockets'
        warnings.simplefilter("ignore", ResourceWarning)
        shared.clear()  # never closed: it cannot be, from another loop
        gc.collect()


def test_forgetting_aclose_a_lease_outlives_its_loop(make_servers: MakeServers) -> None:
    """Forgetting ``await redlock.aclose()`` at the end of ``asyncio.run()`` with a
    lease held: its extension stops with the loop, its key expires with the TTL
    (checked on the masters). guarantees (README): "A lease that cannot be extended
    in time is reported lost ..., never silently kept"."""
    group = make_servers(3)
    redlock = AsyncRedlock(group.urls, ttl=0.5)
    lease = asyncio.run(redlock.lock("orders:42").acquire())
    direct = [SyncRedis.from_url(url) for url in group.urls]
    try:
        gone = asyncio.run(polled(lambda: not any(c.exists("orders:42") for c in direct)))
        assert gone
        assert lease.validity == 0.0
        assert lease.lost
        assert not lease.held
    finally:
        for client in direct:
            client.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del redlock, lease
            gc.collect()


# -- the errors' promises -----------------------------------------------------------


def test_the_error_tree_is_the_documented_one() -> None:
    """errors.md's tree, all nine importable from ``asyncredlock`` (the two fencing
    errors from ``asyncredlock.fencing`` too, the same classes)."""
    import asyncredlock.fencing as fencing

    tree = {
        "LockTimeoutError": (RedlockError,),
        "QuorumUnavailableError": (RedlockError,),
        "LockLostError": (RedlockError,),
        "HoldLimitError": (LockLostError,),
        "LostLeaseError": (LockLostError, LockNotOwnedError),
        "LockNotOwnedError": (RedlockError,),
        "StaleTokenError": (RedlockError,),
        "MissingRecordError": (RedlockError, LookupError),
    }
    assert issubclass(RedlockError, Exception)
    for name, bases in tree.items():
        cls = getattr(asyncredlock, name)
        assert all(issubclass(cls, base) for base in bases), name
    assert not issubclass(LockNotOwnedError, LockLostError)
    assert fencing.StaleTokenError is StaleTokenError
    assert fencing.MissingRecordError is MissingRecordError


@pytest.mark.timeout(60)
async def test_catching_losses_as_the_docs_say(servers: ServerGroup) -> None:
    """errors.md: ``max_hold`` ends a block with ``HoldLimitError``, caught by ``except
    LockLostError``; a lease an operator forced free gives ``LostLeaseError`` on
    ``release()``, caught by either ``except``; a second ``release()`` of a released
    lease is a plain ``LockNotOwnedError``; the ``except RedlockError`` example reads
    each master's outcome."""
    async with workers(servers.urls, 2) as (web0, web1):
        with anyio.fail_after(GUARD), pytest.raises(LockLostError) as bounded:
            async with web0.lock("jobs:stuck", max_hold=0.3) as lease:
                await anyio.sleep_forever()
        assert isinstance(bounded.value, HoldLimitError)
        assert lease.lost

        lease = await web0.lock("orders:42").acquire()
        await web1.force_release("orders:42")  # an operator frees it behind its back
        with pytest.raises(LockNotOwnedError) as gone:  # caught "as before"
            await lease.release()
        assert isinstance(gone.value, LockLostError)
        assert isinstance(gone.value, LostLeaseError)
        assert lease.lost

        lease = await web0.lock("orders:43").acquire()
        await lease.release()
        with pytest.raises(LockNotOwnedError) as twice:
            await lease.release()
        assert not isinstance(twice.value, LockLostError)
        with pytest.raises(LockNotOwnedError):
            await lease.extend()
        assert lease.validity == 0.0  # "0.0 once lost or released"

        held = await web1.lock("orders:44").acquire()
        with pytest.raises(RedlockError) as caught:
            async with web0.lock("orders:44", timeout=0):
                pytest.fail("entered a held lock")
        await held.release()
        assert len(caught.value.outcomes) == len(servers)
        for outcome in caught.value.outcomes:
            assert outcome.node in web0.masters
            assert not outcome.ok
