"""A successful semaphore attempt granted another slot by a minority of masters gives
that slot back: the give-back is announced (as an undo, like a failed attempt's), so
that a waiter of another client refused only because of that extra grant tries again
at once instead of sleeping its retry delay (or the grant's TTL) with the slot free."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from asyncredlock import AsyncRedlock
from asyncredlock._keys import channel
from asyncredlock.testing import Waits, hold_calls, whole_retry_delay
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

GUARD = 6.0  # seconds: a waiter left asleep fails the test, never decides it
PATIENT = 120.0  # a retry delay (and ttl) no test waits out: only a wake-up moves a waiter


async def _full(clients: list[Redis], keys: tuple[str, ...]) -> list[bool]:
    """On each master, whether every one of ``keys`` (the slots) is taken."""
    return [all([await client.exists(key) for key in keys]) for client in clients]


async def _heard_before_mark(client: Redis, pubsub: PubSub, mark_on: str) -> list[bytes]:
    """The messages ``pubsub`` got before a mark the test publishes now."""
    await client.publish(mark_on, "mark")
    heard = []
    with anyio.fail_after(GUARD):
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=GUARD)
            if message is None:
                continue
            if message["data"] == b"mark":
                return heard
            heard.append(message["data"])


async def test_a_waiter_refused_by_a_successful_attempts_extra_grant_is_woken(
    make_servers: MakeServers,
) -> None:
    """Limit 2 on three masters; a stale key of another client holds slot 0 on the
    first master and slot 1 on the third. A's attempt is then granted slot 1 on the
    first, slot 0 on the third, and its preferred slot on the second: it holds that
    one (a quorum) and gives back the other, an extra grant on one master, whose
    give-back is held back. Meanwhile W (another client, two-minute retry delay, no
    jitter) is refused on the first and third masters (every slot taken) and waits.
    Once A's give-back runs, W must get the slot it frees: free on two masters."""
    group = make_servers(3)
    clients = [Redis.from_url(url) for url in group.urls]
    name = "sem:extra"
    try:
        async with (
            AsyncRedlock(group.urls) as a,
            AsyncRedlock(group.urls, retry_delay=PATIENT) as w,
        ):
            slots = a.semaphore(name, 2).slot_keys
            # (the preferred slot being random, each master's free one is fixed)
            await clients[0].set(slots[0], "stale", px=int(PATIENT * 1000))
            await clients[2].set(slots[1], "stale", px=int(PATIENT * 1000))
            with hold_calls(a, "sem_undo") as undos:
                lease = await a.semaphore(name, 2, ttl=PATIENT, timeout=0).acquire()
                with anyio.fail_after(GUARD):
                    await undos.reached.wait()
                assert undos.held == 1  # the extra grant's give-back alone
                assert await _full(clients, slots) == [True, False, True]
                with whole_retry_delay(w), Waits(w) as waits, anyio.fail_after(GUARD):
                    waiting = asyncio.ensure_future(
                        w.semaphore(name, 2, ttl=PATIENT, timeout=PATIENT).acquire()
                    )
                    await waits.reach(1)  # refused, enrolled, refused again: asleep
                assert not waiting.done()
                undos.let_go()
                # before the fix: nobody told W, asleep for its retry delay
                with anyio.fail_after(GUARD):
                    got = await waiting
            assert got.key != lease.key
            for each in (got, lease):
                await each.release()
            for client in (a, w):
                await client.settle()
        # the uncontended path: granted one slot everywhere, it announces nothing
        for client in clients:
            await client.delete(*slots)
        async with AsyncRedlock(group.urls) as alone:
            channels = [channel(key) for key in slots]
            listening = [client.pubsub() for client in clients]
            for pubsub in listening:
                await pubsub.subscribe(*channels)
            only = await alone.semaphore(name, 2, timeout=0).acquire()
            await alone.settle()  # its give-backs, if any, ran
            for client, pubsub in zip(clients, listening, strict=True):
                assert await _heard_before_mark(client, pubsub, channels[0]) == []
                await pubsub.aclose()
            await only.release()
            await alone.settle()
        assert [await client.keys("*") for client in clients] == [[], [], []]
    finally:
        for client in clients:
            await client.aclose()
