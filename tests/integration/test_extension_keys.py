"""Extension only ever prolongs a key the holder still has: it never re-creates an
expired (or deleted) key, on any master, whether or not a quorum is left."""

from __future__ import annotations

import pytest

from asyncredlock import AsyncRedlock, LockNotOwnedError

from .conftest import Masters

pytestmark = pytest.mark.anyio


async def test_a_key_gone_everywhere_is_not_recreated(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("ext:gone", ttl=30.0, auto_extend=False).acquire()
        # acquire() returns at a quorum: a SET still out could land after the DELETE
        # below. inspect() reads every master after it, in order on each connection.
        state = await redlock.inspect("ext:gone")
        assert [node.holder for node in state.nodes] == [lease.value] * len(masters.urls)
        for client in masters.clients:
            await client.delete(lease.key)  # as if it had expired on every master
        with pytest.raises(LockNotOwnedError):
            await lease.extend()
        assert lease.lost
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_key_gone_on_a_minority_stays_gone_there(masters: Masters) -> None:
    """Extended on the majority that still holds it; not re-created on the two that
    lost it (only a new acquisition may write a key)."""
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("ext:minority", ttl=30.0, auto_extend=False).acquire()
        await redlock.settle()
        for client in masters.clients[:2]:
            await client.delete(lease.key)
        await lease.extend(ttl=60.0)
        await redlock.settle()
        ttls = [await client.pttl(lease.key) for client in masters.clients]
        values = [await client.get(lease.key) for client in masters.clients]
        await lease.release()
    assert ttls[:2] == [-2, -2]  # still no key there
    assert all(30_000 < ttl <= 60_000 for ttl in ttls[2:])  # extended to the new TTL
    assert values[2:] == [lease.value.encode()] * (len(values) - 2)
