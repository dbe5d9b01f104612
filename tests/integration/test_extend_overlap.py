"""Extension rounds that overlap: an explicit ``extend(ttl=...)`` sent while the
automatic round is out, and the other way round. Each master runs a lease's rounds in
the order they were sent (one connection), so the last round sent has the last word on
its PX: confirming an earlier round must never lift the validity past what a later,
shorter one may have set."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockNotOwnedError, QuorumUnavailableError
from asyncredlock.testing import FaultProxy, ServerGroup, hold_calls
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
NAME = "overlap"
TTL = 3.0  # the lease's: its first automatic round is due a second after acquisition


@asynccontextmanager
async def proxied(group: ServerGroup) -> AsyncIterator[list[FaultProxy]]:
    """A FaultProxy in front of each master."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]


async def pttls_when(
    direct: Masters, key: str, condition: Callable[[list[int]], bool]
) -> list[int]:
    """The key's PTTL on each master (read directly) once ``condition`` holds for them."""
    while True:
        ttls = [await client.pttl(key) for client in direct.clients]
        if condition(ttls):
            return ttls
        await anyio.sleep(0.01)


async def test_an_automatic_round_confirmed_after_a_shorter_one_was_sent_is_capped(
    make_servers: MakeServers,
) -> None:
    """Masters 0.4 s away each way (node_timeout 1 s: not silent while a round is out,
    so a second round is sent there). The automatic round (PX 3 s) lands; before its
    replies are back, extend(ttl=0.1) is sent. The automatic round's replies come
    next: the lease may not count on its 3 s, since every master runs the PX 100 after
    it. Once the shorter round has landed its validity is at most the masters' PTTL;
    its replies are then lost, and a rival that takes the expired lock finds the
    holder no longer valid (it counted on ~1 s more: two holders)."""
    short = 0.1
    group = make_servers(3)
    direct = Masters(group.urls)
    async with (
        proxied(group) as proxies,
        AsyncRedlock([p.url for p in proxies], node_timeout=1.0) as redlock,
        AsyncRedlock(group.urls, retry_delay=0.01) as other,
    ):
        lease = await redlock.lock(NAME, ttl=TTL).acquire()
        for proxy in proxies:
            proxy.delay = 0.4
        with anyio.fail_after(HANG_GUARD):
            with hold_calls(redlock, "extend") as automatic:
                await automatic.reached.wait()  # due, a third of its TTL used up
                before = await pttls_when(direct, lease.key, lambda ttls: min(ttls) > 0)
                automatic.let_go()
            # it landed (each PTTL back up to ~3 s); its replies are on their way
            await pttls_when(direct, lease.key, lambda ttls: all(map(int.__gt__, ttls, before)))
            assert lease.statistics().extensions == 0
            shorten = asyncio.create_task(lease.extend(ttl=short))
            assert await polled(lambda: lease.statistics().extensions == 1)  # its replies came
            ttls = await pttls_when(direct, lease.key, lambda ttls: max(ttls) <= short * 1000)
            validity = lease.validity  # the shorter round landed; its replies are not back
            assert not shorten.done()
            for proxy in proxies:
                proxy.blackhole = True  # they never will be
            with pytest.raises((LockNotOwnedError, QuorumUnavailableError)):
                await shorten
            rival = await other.lock(NAME, ttl=5.0, timeout=5.0).acquire()
            held, left = lease.held, lease.validity
            await rival.release()
        for proxy in proxies:
            proxy.heal()
        await redlock.settle()
    await direct.aclose()
    assert validity <= max(max(ttls), 0) / 1000, f"validity {validity:.3f} s, PTTLs {ttls} ms"
    assert not (held and left > 0), f"holder still valid for {left:.3f} s beside the rival"


async def test_an_automatic_round_sent_after_a_shorter_one_counts_in_full(
    make_servers: MakeServers,
) -> None:
    """The other order: extend(ttl=2) is out (its calls held back) when the automatic
    round (PX 3 s) is sent. Every master runs the shorter one first, then the automatic
    one: the key lives 3 s, and the lease, once both are confirmed, counts on the
    automatic round's expiry, past the shorter one's (never past the masters' PTTL)."""
    shorter = 2.0
    group = make_servers(3)
    direct = Masters(group.urls)
    async with AsyncRedlock(group.urls) as redlock:
        lease = await redlock.lock(NAME, ttl=TTL).acquire()
        with anyio.fail_after(HANG_GUARD):
            with hold_calls(redlock, "extend") as held:
                shorten = asyncio.create_task(lease.extend(ttl=shorter))
                await held.reached.wait()
                sent = time.monotonic()  # after the shorter round started
                assert await polled(lambda: held.held == 2 * len(group))  # the automatic one
                held.let_go()
                await shorten
            assert await polled(lambda: lease.statistics().extensions == 2)
        ttls = [await client.pttl(lease.key) for client in direct.clients]
        read = time.monotonic()
        until = time.monotonic() + lease.validity
        held_after = lease.held
        await lease.release()
    await direct.aclose()
    assert held_after
    assert min(ttls) > shorter * 1000, ttls  # the automatic round ran last everywhere
    assert until > sent + shorter  # its expiry counts, not the shorter round's
    assert until <= read + min(ttls) / 1000  # nor past the masters' expiry
