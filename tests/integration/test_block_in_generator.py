"""An ``async with lock`` block whose exit runs in another task: Python closes an
abandoned async generator in a task of its own (asyncio's finaliser hook runs
``agen.aclose()`` in a new task), so a lock's block inside a generator (a streaming
response, a consumer that breaks out of its loop) exits in a task other than the one
that entered it. The lease is released (and the exit raises ``RuntimeError``): it
was never released and went on extending itself for as long as the process lived
(``Lock.__aexit__`` raised ``KeyError``)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerGroup, client_state

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome


async def test_an_abandoned_generator_holding_a_lock_does_not_hold_it_forever(
    servers: ServerGroup, masters: Masters
) -> None:
    """The generator is dropped mid-iteration (a streaming response whose client went
    away, a consumer that breaks out of its loop): asyncio's finaliser hook closes it
    in a new task, where the block exits. That task's RuntimeError, which nobody
    awaits, goes to the loop's exception handler (caught here: pytest's anyio runner
    would raise it in whichever test the task is collected)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        await _abandon_a_generator(servers, masters)
        gc.collect()  # the finaliser's task, ended: its exception is reported now
    finally:
        loop.set_exception_handler(previous)
    assert [type(context.get("exception")) for context in reported] == [RuntimeError]


async def _abandon_a_generator(servers: ServerGroup, masters: Masters) -> None:
    async with AsyncRedlock(servers.urls, ttl=1.0) as redlock:
        leases: list[Lease] = []
        closed = anyio.Event()

        async def rows() -> AsyncIterator[int]:
            try:
                async with redlock.lock("generator-held") as lease:
                    leases.append(lease)
                    for i in range(10):
                        yield i
            finally:
                closed.set()  # the block has exited, as it could

        async def consume() -> None:
            async for _ in rows():
                break  # the generator is dropped: asyncio's hook closes it in a new task

        # (in a task of its own: the block's cancel scope, entered there, is left open)
        await asyncio.get_running_loop().create_task(consume())
        with anyio.fail_after(HANG_GUARD):
            await closed.wait()
            await redlock.settle()
        (lease,) = leases
        extensions = lease.statistics().extensions
        assert not lease.held, f"the lease is still held after its block ended: {lease!r}"
        assert client_state(redlock).held == 0
        assert await masters.keys() == [[]] * 5
        assert lease.statistics().extensions == extensions


async def test_a_block_closed_from_another_task_does_not_hold_the_lock_forever(
    servers: ServerGroup, masters: Masters
) -> None:
    async with AsyncRedlock(servers.urls, ttl=1.0) as redlock:
        leases: list[Lease] = []

        async def rows() -> AsyncIterator[int]:
            async with redlock.lock("generator-closed") as lease:
                leases.append(lease)
                for i in range(10):
                    yield i

        agen = rows()

        async def consume() -> None:
            async for _ in agen:
                break  # abandoned mid-iteration

        # (in a task of its own: the block's cancel scope, entered there, is left open)
        await asyncio.get_running_loop().create_task(consume())
        # what asyncio's finaliser hook does with an abandoned generator
        closing = asyncio.get_running_loop().create_task(agen.aclose())
        with anyio.fail_after(HANG_GUARD):
            await asyncio.wait([closing])
            await redlock.settle()
        (lease,) = leases
        assert not lease.held, (
            f"the lease is still held after its block ended ({lease!r});"
            f" the exit raised {closing.exception()!r}"
        )
        assert isinstance(closing.exception(), RuntimeError)  # says why
        assert client_state(redlock).held == 0
        assert await masters.keys() == [[]] * 5
