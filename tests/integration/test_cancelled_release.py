"""A cancelled ``release()`` that finds the lock gone.

docs/usage.md: "Cancelling ``release()`` does not stop the release", and "A release
that finds the lock gone on a majority [...] marks the lease lost too;
``wait_lost()`` wakes once the release's outcome is known and then returns
``True``"; ``statistics().lost`` counts "releases that found the lock gone", and
loss callbacks run on a loss. The release, cancelled, goes on in the background and
ends the lease by its outcome: it announced the end (*released*) at the cancellation,
and dropped the outcome (``wait_lost()`` said released, ``lost`` stayed 0, the
callbacks never ran).
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome


async def test_a_cancelled_release_that_finds_the_lock_gone_ends_the_lease_lost(
    servers: ServerGroup, masters: Masters
) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await redlock.lock("cancelled-release").acquire()
        for client in masters.clients:  # expired under it (or freed by an operator)
            await client.delete("cancelled-release")
        called: list[Lease] = []
        lease.add_lost_callback(called.append)
        watcher = asyncio.get_running_loop().create_task(lease.wait_lost())
        await asyncio.sleep(0)  # (the watcher waits)
        releasing = asyncio.get_running_loop().create_task(lease.release())
        await asyncio.sleep(0)  # the release round is sent
        releasing.cancel()  # (a shutdown deadline, say): the release goes on
        with anyio.fail_after(HANG_GUARD):
            await asyncio.wait([releasing])
            await redlock.settle()  # every master has answered "not held"
            lost = await watcher
        assert releasing.cancelled()
        assert (lost, lease.lost) == (True, True), (
            f"wait_lost() returned {lost}, lease.lost is {lease.lost}: the release found the"
            " lock gone on every master"
        )
        await asyncio.sleep(0)
        assert called == [lease]
        assert redlock.statistics().lost == 1
