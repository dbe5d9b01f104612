"""The known ways Redlock's mutual exclusion breaks, reproduced, and fencing stopping
the lost update in each (Kleppmann's critique, seed 004).

In every scenario client A holds a lease with token ``t1`` and, by the fault, client B
acquires the same resource while A still believes in its lease, with ``t2 > t1``.
B writes through each guard; then A writes with ``t1``: every guard refuses A and
B's data is intact.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, StaleTokenError
from asyncredlock.fencing import FencedStore, FenceGuard, SQLFence, check_token
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

NAME = "account:7"


@dataclass
class Resource:
    """One resource behind each of the three guards."""

    memory: dict[str, str]
    guard: FenceGuard
    store: FencedStore
    db: sqlite3.Connection
    table: SQLFence

    async def write(self, owner: str, token: int | None) -> None:
        """Write ``owner`` through every guard; the first refusal propagates."""
        checked = check_token(token)
        self.guard.check(checked, NAME)
        self.memory[NAME] = owner
        await self.store.write(NAME, owner, checked)
        self.table.upsert(self.db, NAME, {"owner": owner}, checked)
        self.db.commit()

    async def refusals(self, owner: str, token: int | None) -> list[StaleTokenError]:
        """Write through each guard separately; what each raised."""
        checked = check_token(token)
        refused: list[StaleTokenError] = []
        try:
            self.guard.check(checked, NAME)
            self.memory[NAME] = owner
        except StaleTokenError as exc:
            refused.append(exc)
        try:
            await self.store.write(NAME, owner, checked)
        except StaleTokenError as exc:
            refused.append(exc)
        try:
            self.table.upsert(self.db, NAME, {"owner": owner}, checked)
            self.db.commit()
        except StaleTokenError as exc:
            refused.append(exc)
        return refused

    async def owners(self) -> tuple[str, bytes | None, str]:
        stored = await self.store.read(NAME)
        (row,) = self.db.execute("SELECT owner FROM accounts WHERE id = ?", (NAME,))
        return self.memory[NAME], None if stored is None else stored.value, row[0]


@pytest.fixture
async def resource(make_servers: MakeServers) -> AsyncIterator[Resource]:
    """The resource lives apart from the lock masters: its own server and database."""
    data = make_servers(1)
    client = Redis.from_url(data.urls[0])
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, owner TEXT, fence BIGINT NOT NULL)")
    yield Resource({}, FenceGuard(), FencedStore(client), db, SQLFence("accounts"))
    db.close()
    await client.aclose()


async def assert_fencing_stops_the_lost_update(resource: Resource, a: Lease, b: Lease) -> None:
    assert a.token is not None
    assert b.token is not None
    assert b.token > a.token
    await resource.write("B", b.token)
    refused = await resource.refusals("A", a.token)
    assert len(refused) == 3
    assert all((e.token, e.newest) == (a.token, b.token) for e in refused)
    assert await resource.owners() == ("B", b"B", "B")


async def test_client_paused_past_its_ttl(servers: ServerGroup, resource: Resource) -> None:
    """A stops extending (a GC pause, a stalled VM) and sleeps past its TTL."""
    async with AsyncRedlock(servers.urls) as client_a, AsyncRedlock(servers.urls) as client_b:
        a = await client_a.lock(NAME, ttl=0.5, auto_extend=False).acquire()
        await resource.write("A", a.token)
        # B's acquisition waits for A's keys to expire: that wait is A's pause.
        b = await client_b.lock(NAME, ttl=10.0, timeout=10.0, auto_extend=False).acquire()
        assert a.held  # A, paused, never learned that its lease ended
        assert a.validity == 0  # had it looked at its clock, it would know
        await assert_fencing_stops_the_lost_update(resource, a, b)
        await b.release()


async def test_master_restarted_without_persistence(
    make_servers: MakeServers, resource: Resource
) -> None:
    """A holds the lock on a majority of 3 that includes b; b crashes and comes back
    empty (no AOF), so B gets a majority while A's lease is still valid."""
    group = make_servers(3)
    async with AsyncRedlock(group.urls) as client_a, AsyncRedlock(group.urls) as client_b:
        a = await client_a.lock(NAME, ttl=30.0, auto_extend=False).acquire()
        await client_a.settle()
        await resource.write("A", a.token)
        c = Redis.from_url(group.urls[2])
        await c.delete(NAME)  # c never had A's key (it was unreachable for A)
        await c.aclose()
        group[1].restart(kill=True)  # b crashes and restarts empty
        b = await client_b.lock(NAME, ttl=30.0, timeout=0, auto_extend=False).acquire()
        assert a.held
        assert a.validity > 0  # both leases are valid: mutual exclusion is broken
        await assert_fencing_stops_the_lost_update(resource, a, b)


async def test_clock_jump_on_one_master(servers: ServerGroup, resource: Resource) -> None:
    """Kleppmann's example on 5 masters: A gets a, b, c (d and e busy); c's clock
    jumps forward and A's key there expires early; B then gets c, d and e."""
    urls = servers.urls
    direct = [Redis.from_url(url) for url in urls]
    try:
        async with AsyncRedlock(urls) as client_a, AsyncRedlock(urls) as client_b:
            for d_or_e in direct[3:]:
                await d_or_e.set(NAME, "another holder")
            a = await client_a.lock(NAME, ttl=30.0, timeout=0, auto_extend=False).acquire()
            for d_or_e in direct[3:]:
                await d_or_e.pexpire(NAME, 300)  # the other holder's keys expire
            await resource.write("A", a.token)
            await direct[2].delete(NAME)  # the clock jump on c: A's key expires there
            b = await client_b.lock(NAME, ttl=30.0, timeout=10.0, auto_extend=False).acquire()
            assert a.held
            assert a.validity > 0
            holders = [await client.get(NAME) for client in direct]
            assert holders == [a.value.encode()] * 2 + [b.value.encode()] * 3
            await assert_fencing_stops_the_lost_update(resource, a, b)
    finally:
        for client in direct:
            await client.aclose()
