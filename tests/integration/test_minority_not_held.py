"""A lease's round where a minority of masters answer that they no longer hold it (one
restarted empty, or its key deleted) and another master fails: no quorum said so, and
one may still hold the lease, so it is not taken for lost (docs/algorithm.md,
"Extension and loss"): the extender retries as for an outage, an explicit ``extend()``
or ``release()`` raises `QuorumUnavailableError`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockLostError, QuorumUnavailableError
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


@asynccontextmanager
async def five_proxied(
    make_servers: MakeServers,
) -> AsyncIterator[tuple[list[FaultProxy], Masters]]:
    """Five masters, each behind a proxy, and direct clients (to delete keys)."""
    group = make_servers(5)
    async with AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]
        masters = Masters(group.urls)
        stack.push_async_callback(masters.aclose)
        yield proxies, masters


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "asyncredlock" and r.getMessage().startswith(start)
    ]


async def on_every_master(redlock: AsyncRedlock, lease: Lease) -> None:
    """Every master holds ``lease``: acquire() returns at a quorum, and a SET still out
    (in a proxy, say) could land after a test's DELETE, or be cut off by its fault.
    inspect() reads every master after the SET, in order on each connection."""
    state = await redlock.inspect(lease.resource)
    assert [node.holder for node in state.nodes] == [lease.value] * len(state.nodes)


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
                await on_every_master(redlock, lease)
                for client in (masters.clients[0], masters.clients[2]):
                    await client.delete("gone")
                await lease.extend()
        assert lease.lost
        assert redlock.statistics().lost == 1


async def test_a_minority_not_held_and_the_rest_silent_end_the_lease_at_its_validity(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    """Five masters: two answer *not held*, three are cut off. Not refuted, so the
    extender retries until the validity runs out; then one loss, as expired, the block
    cancelled, and a waiting rival gets the lock only once the holder no longer
    believes it holds it."""
    async with (
        five_proxied(make_servers) as (proxies, masters),
        AsyncRedlock([p.url for p in proxies]) as redlock,
        AsyncRedlock(masters.given) as other,
    ):
        leases: list[Lease] = []
        seen: list[tuple[bool, float]] = []
        started = anyio.Event()

        async def holder() -> None:
            with pytest.raises(LockLostError):
                async with redlock.lock("silent", ttl=1.5) as lease:
                    await on_every_master(redlock, lease)
                    leases.append(lease)
                    for client in masters.clients[:2]:
                        await client.delete("silent")
                    for proxy in proxies[2:]:
                        proxy.blackhole = True
                    started.set()
                    await anyio.sleep_forever()

        async def rival() -> None:
            await started.wait()
            taken = await other.lock("silent", ttl=1.5, timeout=10).acquire()
            seen.append((leases[0].held, leases[0].validity))
            await taken.release()

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(holder)
                tg.start_soon(rival)
        assert leases[0].lost
        assert seen == [(False, 0.0)]
        assert redlock.statistics().lost == 1
        for proxy in proxies:
            proxy.heal()
        await redlock.settle()
    (lost,) = lines(caplog, "lease on 'silent' lost")
    assert lost.getMessage().startswith(
        "lease on 'silent' lost: not extended before its validity ran out"
    )
    failed = lines(caplog, "extending 'silent' failed")
    assert failed
    assert all("(too many masters failed or did not answer)" in r.getMessage() for r in failed)


async def test_a_quorum_refuting_with_the_rest_silent_ends_the_lease_at_once(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    """Three of five answer *not held*, two are cut off: the first automatic round is
    refuted, and the lease ends then (gone), not after retries until its validity."""
    async with (
        five_proxied(make_servers) as (proxies, masters),
        AsyncRedlock([p.url for p in proxies]) as redlock,
    ):
        with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError):
            async with redlock.lock("refuted", ttl=1.5) as lease:
                await on_every_master(redlock, lease)
                for client in masters.clients[:3]:
                    await client.delete("refuted")
                for proxy in proxies[3:]:
                    proxy.blackhole = True
                await anyio.sleep_forever()
        assert lease.statistics().failed_extensions == 1
        for proxy in proxies:
            proxy.heal()
        await redlock.settle()
    (lost,) = lines(caplog, "lease on 'refuted' lost")
    assert "a majority of masters no longer hold it" in lost.getMessage()
