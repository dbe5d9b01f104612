"""A master whose connections are accepted then reset at once (a proxy or load balancer
whose backend is down, a master at ``maxclients``): its wake-up subscription never comes
up, so each reconnection loses nothing and wakes nobody. Its waiters keep their retry
delay, and are still woken by a release."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock.testing import FaultProxy, ServerGroup, Waits

from .. import loops

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
RECONNECTIONS = 8  # about 1.6 s of them, RECONNECT_DELAY apart


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops, asyncio and uvloop, whatever ``ASYNCREDLOCK_TEST_LOOP`` says."""
    return loops.BACKENDS[request.param]


async def test_a_subscription_that_never_comes_up_does_not_wake_waiters_over_and_over(
    servers: ServerGroup,
) -> None:
    async with (
        FaultProxy("127.0.0.1", servers[2].port) as proxy,
        AsyncRedlock(servers.urls[:3]) as holder,
        AsyncRedlock([*servers.urls[:2], proxy.url], retry_delay=3600.0) as waiter,
    ):
        lease = await holder.lock("flap", ttl=60.0).acquire()
        proxy.refuse = True  # the waiter's subscription to it is opened now: refused
        listener = waiter._core.waker.listeners[2]
        assert listener is not None
        opened = 0
        enough = asyncio.Event()
        original = listener.opener

        async def counting(protocol: Any) -> None:
            nonlocal opened
            opened += 1
            if opened >= RECONNECTIONS:
                enough.set()
            await original(protocol)

        listener.opener = counting
        probe = Waits(waiter)
        task = asyncio.create_task(waiter.lock("flap", timeout=HANG_GUARD).acquire())
        try:
            with anyio.fail_after(HANG_GUARD):
                await probe.reach(1)
                await enough.wait()
            attempts = waiter.statistics().attempts
            proxy.refuse = False
            await lease.release()  # announced by the other two masters
            with anyio.fail_after(HANG_GUARD):  # well short of the retry delay
                taken = await task
            assert taken.held
            await taken.release()
        finally:
            task.cancel()
            proxy.refuse = False
    # the first attempt (one more at most); before the fix, one more per reconnection
    assert attempts <= 2, f"{attempts} attempts while nothing was released"
