"""Review (rrw): readers woken by a writer's release that reaches the masters
at different times."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import FaultProxy, ServerGroup, whole_retry_delay

from .conftest import Masters, Waiting

pytestmark = pytest.mark.anyio
HANG_GUARD = 20


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_readers_all_go_when_a_writers_release_reaches_a_quorum_late(
    servers: ServerGroup, masters: Masters, fair: bool
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        proxies = [
            await stack.enter_async_context(FaultProxy("127.0.0.1", servers[i].port))
            for i in (2, 3, 4)
        ]
        writers = await stack.enter_async_context(
            AsyncRedlock([*servers.urls[:2], *(p.url for p in proxies)])
        )
        readers = await stack.enter_async_context(
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD)
        )
        writer = await writers.rwlock("wk", fair=fair).write(ttl=HANG_GUARD).acquire()
        waiting = Waiting([readers])
        got: list[Lease] = []

        async def read() -> None:
            got.append(await readers.rwlock("wk", fair=fair).read(timeout=HANG_GUARD).acquire())

        with whole_retry_delay(readers), anyio.move_on_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(read)
                await waiting.reach(3)
                for proxy in proxies:
                    proxy.delay = 0.3  # the release reaches masters 2-4 later
                await writer.release()
        # every reader went on the release (none may sleep out its retry delay)
        assert len(got) == 3, (
            f"{len(got)} of 3 readers got in; wakeups={readers.statistics().wakeups}"
        )
        for lease in got:
            await lease.release()
        for proxy in proxies:
            proxy.delay = 0
        await readers.settle()
        await writers.settle()
