"""Review (semaphores): a process SIGKILLed while it holds a slot, or while it is
first in a fair semaphore's queue with a slot free, blocks the others only until its
slot's TTL, or its queue entry, lapses: nothing stays taken (guards; no existing
semaphore test kills a process)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import anyio
import pytest

from asyncredlock import AsyncRedlock

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 15.0

CHILD = """
import asyncio, json, sys
from asyncredlock import AsyncRedlock
urls, name, fair, wait = json.loads(sys.argv[1])
async def main():
    redlock = AsyncRedlock(urls, retry_delay=0.2)
    await redlock.__aenter__()
    semaphore = redlock.semaphore(name, 1, ttl=1.0, fair=fair, timeout=3600)
    if wait:  # parked in the queue, first in line: say so once its entry is on
        task = asyncio.ensure_future(semaphore.acquire())
        await asyncio.sleep(0)
        while redlock.statistics().attempts < 2:
            await asyncio.sleep(0.01)
        print("queued", flush=True)
        await task
    else:
        lease = await semaphore.acquire()
        await redlock.settle()
        print("held", lease.key, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _child(urls: list[str], name: str, fair: bool, wait: bool) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        json.dumps([urls, name, fair, wait]),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ},
    )


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_killed_holder_s_slot_frees_itself(masters: Masters, fair: bool) -> None:
    name = f"sem:review-killed-holder:{fair}"
    proc = await _child(masters.urls, name, fair, wait=False)
    try:
        assert proc.stdout is not None
        with anyio.fail_after(GUARD):
            line = await proc.stdout.readline()
        assert line.startswith(b"held "), line
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    async with AsyncRedlock(masters.urls, retry_delay=0.05) as redlock:
        with anyio.fail_after(GUARD):
            lease = await redlock.semaphore(name, 1, fair=fair, timeout=GUARD).acquire()
        assert lease.key == line.split()[1].decode()
        await lease.release()
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_killed_fair_waiter_first_in_line_stops_blocking(masters: Masters) -> None:
    name = "sem:review-killed-waiter"
    async with AsyncRedlock(masters.urls, retry_delay=0.05) as redlock:
        held = await redlock.semaphore(name, 1, fair=True, timeout=0).acquire()
        proc = await _child(masters.urls, name, True, wait=True)
        try:
            assert proc.stdout is not None
            with anyio.fail_after(GUARD):
                line = await proc.stdout.readline()
            assert line == b"queued\n", line
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        queued = [await client.zcard(f"{{{name}}}:sem:queue") for client in masters.clients]
        assert queued == [1] * len(masters.clients)  # the dead waiter is first in line
        await held.release()
        with anyio.fail_after(GUARD):
            lease = await redlock.semaphore(name, 1, fair=True, timeout=GUARD).acquire()
        await lease.release()
        await redlock.settle()
    # the dead waiter's entry lapses (about a second after its last attempt); no event tells
    with anyio.fail_after(GUARD):
        while await masters.keys() != [[] for _ in masters.urls]:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
