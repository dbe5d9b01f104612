"""Extension rounds of a lease: what a round trusts while it is out, and how its end
is told (error, log, counts) when the lease ended while it ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockLostError, LockNotOwnedError, QuorumUnavailableError
from asyncredlock._keeping import RETRY_FLOOR
from asyncredlock.testing import FaultProxy, ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
NAME = "rounds"


@asynccontextmanager
async def proxied(group: ServerGroup) -> AsyncIterator[list[FaultProxy]]:
    """A FaultProxy in front of each master."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]


async def test_a_shorter_extend_is_not_trusted_past_what_the_masters_keep(
    make_servers: MakeServers,
) -> None:
    """extend(ttl=0.2) of a lease with ~10 s left, masters 0.5 s away each way: the
    PEXPIRE 200 lands at T+0.5 and the key is gone at T+0.7; the reply comes at T+1.0.
    A rival takes the lock at T+0.7: by then the holder no longer counts on its old
    validity (~9 s), only on what the round may have set."""
    group = make_servers(3)
    async with (
        proxied(group) as proxies,
        AsyncRedlock([p.url for p in proxies]) as redlock,
        AsyncRedlock(group.urls, retry_delay=0.01) as other,
    ):
        lease = await redlock.lock(NAME, ttl=10.0, auto_extend=False).acquire()
        for proxy in proxies:
            proxy.delay = 0.5
        seen: list[tuple[bool, float]] = []

        async def shorten() -> None:
            with pytest.raises(LockNotOwnedError):  # it comes back too late for 0.2 s
                await lease.extend(ttl=0.2)

        async def rival() -> None:
            taken = await other.lock(NAME, ttl=5.0, timeout=5.0).acquire()
            seen.append((lease.held, lease.validity))
            await taken.release()

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(shorten)
                tg.start_soon(rival)
        for proxy in proxies:
            proxy.heal()
        await redlock.settle()
    ((held, validity),) = seen
    assert not (held and validity > 0), f"holder still valid for {validity:.3f} s"


async def test_extend_of_a_lease_released_while_its_round_ran_raises_not_owned(
    make_servers: MakeServers,
) -> None:
    """A round that failed (two masters of three silent) for a lease released while it
    ran: `LockNotOwnedError`, not `QuorumUnavailableError` (which says the lease can be
    extended again)."""
    group = make_servers(3)
    async with (
        proxied(group) as proxies,
        AsyncRedlock([p.url for p in proxies], socket_timeout=0.5) as redlock,
    ):
        lease = await redlock.lock(NAME, ttl=5.0, auto_extend=False).acquire()
        for proxy in proxies[1:]:
            proxy.blackhole = True
        extending = asyncio.create_task(lease.extend())
        await asyncio.sleep(0)  # its round goes out
        with anyio.fail_after(HANG_GUARD):
            with pytest.raises(QuorumUnavailableError):
                await lease.release()
            assert not lease.held
            with pytest.raises(LockNotOwnedError, match="no longer held"):
                await extending
        for proxy in proxies:
            proxy.heal()
        await redlock.settle()


async def test_an_extension_of_a_released_lease_is_not_logged_or_counted_as_failed(
    servers: ServerGroup, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease released while its extend() round ran: that round did not fail on its
    own account (the lease had 30 s of validity), so no WARNING says "extending ...
    failed (too late ...)" and no failed extension is counted."""
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await redlock.lock(NAME, ttl=30, auto_extend=False).acquire()
        extending = asyncio.create_task(lease.extend())
        await asyncio.sleep(0)  # its round goes out
        await lease.release()
        with anyio.fail_after(HANG_GUARD), pytest.raises(LockNotOwnedError, match="no longer held"):
            await extending
        assert redlock.statistics().failed_extensions == 0
    assert lease.statistics().failed_extensions == 0
    failed = [
        r.getMessage()
        for r in caplog.records
        if r.name == "asyncredlock" and r.getMessage().startswith(f"extending {NAME!r} failed")
    ]
    assert failed == []


async def test_an_extension_confirmed_after_the_validity_ran_out_is_accepted(
    make_servers: MakeServers,
) -> None:
    """ "Too late" is after the expiry the round sets, not after the old validity: an
    extension a quorum confirms after the lease's validity ran out (by its clock), but
    before the new expiry, succeeds."""
    moved = [0.0]

    def clock() -> float:
        return asyncio.get_running_loop().time() + moved[0]

    group = make_servers(3)
    async with AsyncRedlock(group.urls, clock=clock) as redlock:
        lease = await redlock.lock(NAME, ttl=30.0, auto_extend=False).acquire()
        moved[0] += 31.0  # its validity ran out a second ago, by its clock
        assert lease.validity == 0
        with anyio.fail_after(HANG_GUARD):
            await lease.extend()
        assert lease.held
        assert lease.validity > 0
        await lease.release()


async def test_a_zero_retry_delay_does_not_make_the_extender_spin(
    make_servers: MakeServers,
) -> None:
    """retry_delay=0 and every master refusing connections: the extender pauses at
    least RETRY_FLOOR between failed rounds (it retried at once, over a thousand
    rounds a second), so from its first round to the end of the validity it runs
    no more rounds than that window holds pauses (and the lease ends lost)."""
    group = make_servers(3)
    ttl = 1.2
    async with (
        proxied(group) as proxies,
        AsyncRedlock([p.url for p in proxies], retry_delay=0) as redlock,
    ):
        with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError):
            async with redlock.lock(NAME, ttl=ttl) as lease:
                for proxy in proxies:
                    proxy.refuse = True
                    proxy.reset_connections()
                await anyio.sleep_forever()
        for proxy in proxies:
            proxy.refuse = False
        await redlock.settle()
    window = ttl - ttl / 3  # from the first automatic round to the end of the validity
    assert 0 < lease.statistics().failed_extensions <= window / RETRY_FLOOR + 2
