"""Review (rrw): a writer queued between a holder and readers, cancelled at every
step of the holder's release: the readers behind it get in on announcements
alone, and nothing is left."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerGroup, whole_retry_delay

from .conftest import Masters, Waiting

pytestmark = pytest.mark.anyio
HANG_GUARD = 20
MODES: dict[str, dict[str, Any]] = {"patience 0": {"patience": 0}, "fair": {"fair": True}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("holder", ["writer", "lock"])
async def test_readers_behind_a_writer_cancelled_as_the_holder_releases(
    servers: ServerGroup, masters: Masters, mode: str, holder: str
) -> None:
    options = MODES[mode]
    async with (
        AsyncRedlock(servers.urls, retry_delay=0.02) as holders,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as writers,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as readers,
    ):
        for steps in range(0, 40, 2):
            if holder == "lock":
                held = await holders.lock("s", ttl=HANG_GUARD).acquire()
            else:
                held = await holders.rwlock("s", **options).write(ttl=HANG_GUARD).acquire()
            wwait, rwait = Waiting([writers]), Waiting([readers])
            wgot: list[Lease] = []
            rgot: list[Lease] = []
            with whole_retry_delay(writers, readers), anyio.move_on_after(HANG_GUARD):
                async with anyio.create_task_group() as outer:

                    async def read() -> None:
                        rgot.append(  # noqa: B023
                            await readers.rwlock("s", **options).read(timeout=HANG_GUARD).acquire()
                        )

                    async with anyio.create_task_group() as tg:

                        async def write() -> None:
                            wgot.append(  # noqa: B023
                                await writers.rwlock("s", **options)
                                .write(timeout=HANG_GUARD)
                                .acquire()
                            )

                        tg.start_soon(write)
                        await wwait.reach(1)
                        await writers.settle()
                        for _ in range(2):
                            outer.start_soon(read)
                        await rwait.reach(2)
                        await readers.settle()
                        outer.start_soon(held.release)
                        for _ in range(steps):
                            await anyio.lowlevel.checkpoint()
                        tg.cancel_scope.cancel()
                    for lease in wgot:
                        await lease.release()
            assert len(rgot) == 2, (steps, len(wgot), len(rgot))
            for lease in rgot:
                await lease.release()
            for rl in (holders, writers, readers):
                await rl.settle()
            assert await masters.keys() == [[]] * len(masters), steps
