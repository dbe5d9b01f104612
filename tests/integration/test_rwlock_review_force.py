"""Review (rrw): force_release() of a read-write lock while this client's reader
or writer is being acquired: no lease of this client outlives the force held
while its keys are gone from the masters."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio
HANG_GUARD = 20


async def _holding(masters: Masters, lease: Lease) -> int:
    if lease.shared:
        return sum(
            [await c.zscore("{f}:readers", lease.value) is not None for c in masters.clients]
        )
    return sum([await c.get("f") == lease.value.encode() for c in masters.clients])


@pytest.mark.parametrize("side", ["read", "write"])
@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_force_release_during_an_acquisition_of_this_client(
    servers: ServerGroup, masters: Masters, side: str, fair: bool
) -> None:
    bad = []
    async with AsyncRedlock(servers.urls) as rl:
        for steps in range(0, 30):
            got: list[Lease] = []
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        rw = rl.rwlock("f", fair=fair)
                        lock = rw.read(timeout=0) if side == "read" else rw.write(timeout=0)
                        with contextlib.suppress(Exception):
                            got.append(await lock.acquire())  # noqa: B023

                    tg.start_soon(take)
                    for _ in range(steps):
                        await anyio.lowlevel.checkpoint()
                    await rl.force_release("f")
            for lease in got:
                if lease.held and await _holding(masters, lease) < rl.quorum:
                    bad.append((steps, await _holding(masters, lease)))
                if lease.held:
                    await lease.release()
            await rl.settle()
    assert bad == []
