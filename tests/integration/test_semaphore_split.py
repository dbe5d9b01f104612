"""Semaphore waiters of separate clients whose attempts split the masters' grants:
each is granted the slot by one master only, all fail and give it back. The give-backs
are announced as undos: a waiter whose slot a quorum of masters then has free (given
back there, or granted to it) tries again after a short jittered backoff, instead of
sleeping its retry delay (or the TTL the refusing masters reported) with the slot free."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, whole_retry_delay
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import assert_every_key_expires

pytestmark = pytest.mark.anyio

GUARD = 6.0  # seconds: a waiter left asleep fails the test, never decides it
PATIENT = 120.0  # a retry delay no test waits out: only a wake-up moves a waiter


@asynccontextmanager
async def proxied(
    group: ServerGroup, direct: int, delay: float
) -> AsyncIterator[tuple[list[str], list[FaultProxy]]]:
    """The masters' URLs with every one but ``direct`` behind a proxy adding ``delay``,
    and those proxies."""
    async with AsyncExitStack() as stack:
        urls, proxies = [], []
        for i, server in enumerate(group):
            if i == direct:
                urls.append(server.url)
                continue
            proxy = await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
            proxy.delay = delay
            urls.append(proxy.url)
            proxies.append(proxy)
        yield urls, proxies


async def slot_exists(group: ServerGroup, key: str) -> list[bool]:
    found = []
    for server in group:
        client = Redis.from_url(server.url)
        try:
            found.append(bool(await client.exists(key)))
        finally:
            await client.aclose()
    return found


async def test_waiters_whose_attempts_split_the_grants_are_not_left_asleep(
    make_servers: MakeServers,
) -> None:
    """Three waiters of separate clients, each reaching one master first (the others
    through a 0.2 s proxy). A release wakes all three; each is granted the slot by its
    own master only, so all three fail and give it back. One of them must then get
    the slot, long before its two-minute retry delay or the slot's TTL."""
    group = make_servers(3)
    name = "sem:split"
    async with AsyncExitStack() as stack:
        waiters = []
        for i in range(3):
            urls, _ = await stack.enter_async_context(proxied(group, i, 0.2))
            waiters.append(
                await stack.enter_async_context(
                    AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=1.0)
                )
            )
        stack.enter_context(whole_retry_delay(*waiters))
        holder = await stack.enter_async_context(AsyncRedlock(group.urls))
        held = await holder.semaphore(name, 1, ttl=PATIENT, timeout=0).acquire()
        with Waits(*waiters) as waits:
            tasks = [
                asyncio.ensure_future(
                    each.semaphore(name, 1, ttl=PATIENT, timeout=PATIENT).acquire()
                )
                for each in waiters
            ]
            await waits.reach(3)
        await held.release()
        try:
            with anyio.move_on_after(GUARD):
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if not any(task.done() for task in tasks):  # the slot is free all along
                assert await slot_exists(group, f"{{{name}}}:sem:0") == [False] * 3
            assert sum(task.done() for task in tasks) == 1
            left = set(tasks)
            while left:  # each release wakes the next waiter
                with anyio.fail_after(GUARD):
                    done, left = await asyncio.wait(left, return_when=asyncio.FIRST_COMPLETED)
                assert len(done) == 1
                await done.pop().result().release()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        for client in (*waiters, holder):
            await client.settle()
    await assert_every_key_expires(group)
