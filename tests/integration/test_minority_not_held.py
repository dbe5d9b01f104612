"""A lease's round where a minority of masters answer that they no longer hold it (one
restarted empty, or its key deleted) and another master fails: no quorum said so, and
one may still hold the lease, so it is not taken for lost (docs/algorithm.md,
"Extension and loss"): the extender retries as for an outage, an explicit ``extend()``
or ``release()`` raises `QuorumUnavailableError`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockLostError, QuorumUnavailableError
from asyncredlock.testing import FaultProxy
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


@asynccontextmanager
async def three_masters(make_servers: MakeServers) -> AsyncIterator[tuple[FaultProxy, Masters]]:
    """Three masters, the second behind a proxy (to refuse it), and direct clients."""
    group = make_servers(3)
    async with FaultProxy("127.0.0.1", group[1].port) as proxy:
        masters = Masters([group[0].url, proxy.url, group[2].url])
        try:
            yield proxy, masters
        finally:
            await masters.aclose()


def refuse(proxy: FaultProxy, refused: bool) -> None:
    proxy.refuse = refused
    if refused:
        proxy.reset_connections()


async def test_the_extender_rides_through_a_master_restarted_empty_and_a_blip(
    make_servers: MakeServers,
) -> None:
    """Master 0 restarts empty (*not held*) and master 1 refuses connections for a
    round (failed): masters 1 and 2 still hold the key. The extender retries, and the
    block runs on."""
    group = make_servers(3)
    async with FaultProxy("127.0.0.1", group[1].port) as proxy:
        urls = [group[0].url, proxy.url, group[2].url]
        masters = Masters(urls)
        try:
            async with AsyncRedlock(urls, ttl=3.0) as holder:
                with anyio.fail_after(HANG_GUARD):
                    async with holder.lock("restarted") as lease:
                        await holder.settle()  # every master set it (the third reply may be out)
                        group[0].restart(kill=True)  # comes back empty
                        refuse(proxy, True)
                        # (no event tells an extension round ended: its count is polled)
                        assert await polled(lambda: lease.statistics().failed_extensions >= 1)
                        refuse(proxy, False)
                        for client in masters.clients[1:]:  # a quorum holds it
                            assert await client.get("restarted") == lease.value.encode()
                        extended = lease.statistics().extensions
                        assert await polled(lambda: lease.statistics().extensions > extended)
                        assert lease.held
                assert holder.statistics().lost == 0
        finally:
            await masters.aclose()


async def test_an_explicit_extend_raises_quorum_unavailable_and_keeps_the_lease(
    make_servers: MakeServers,
) -> None:
    async with (
        three_masters(make_servers) as (proxy, masters),
        AsyncRedlock(masters.given) as redlock,
    ):
        lease = await redlock.lock("extend", ttl=30, auto_extend=False).acquire()
        await redlock.settle()  # master 1 set it too (acquire() returns at a quorum)
        await masters.clients[0].delete("extend")  # as a restart without persistence
        refuse(proxy, True)
        with anyio.fail_after(HANG_GUARD), pytest.raises(QuorumUnavailableError):
            await lease.extend()
        assert lease.held
        assert not lease.lost
        refuse(proxy, False)
        with anyio.fail_after(HANG_GUARD):
            await lease.extend()  # masters 1 and 2: a quorum
        await lease.release()
        assert redlock.statistics().lost == 0


async def test_a_release_raises_quorum_unavailable_not_lost(make_servers: MakeServers) -> None:
    async with (
        three_masters(make_servers) as (proxy, masters),
        AsyncRedlock(masters.given) as redlock,
    ):
        lease = await redlock.lock("release", ttl=30, auto_extend=False).acquire()
        await redlock.settle()  # master 1 set it too (acquire() returns at a quorum)
        await masters.clients[0].delete("release")
        refuse(proxy, True)
        with anyio.fail_after(HANG_GUARD), pytest.raises(QuorumUnavailableError):
            await lease.release()
        assert not lease.lost
        assert redlock.statistics().lost == 0
        refuse(proxy, False)
        await redlock.settle()


async def test_a_majority_not_held_is_still_a_loss(make_servers: MakeServers) -> None:
    """Two of three masters lost the key: a quorum cannot hold it, so the lease is
    lost at once, its block cancelled."""
    async with (
        three_masters(make_servers) as (_, masters),
        AsyncRedlock(masters.given) as redlock,
    ):
        with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError):
            async with redlock.lock("gone", ttl=30) as lease:
                for client in (masters.clients[0], masters.clients[2]):
                    await client.delete("gone")
                await lease.extend()
        assert lease.lost
        assert redlock.statistics().lost == 1
