"""The busy poll on real masters: a call sent on an idle connection is followed by a
poll for its reply (on asyncio's own loops; one poller for all the masters), never
with ``busy_poll=0`` or on uvloop, and no poll holds up a loop with other work."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock._config import MAX_BUSY_POLL
from asyncredlock._spin import Spin
from asyncredlock._transport import Link
from asyncredlock.testing import ServerGroup
from tests import loops

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
CYCLES = 50


def links(redlock: AsyncRedlock) -> Iterator[Link]:
    for node in redlock._core.nodes:
        assert node.link is not None
        yield node.link


async def cycles(redlock: AsyncRedlock, name: str) -> None:
    with anyio.fail_after(HANG_GUARD):
        for _ in range(CYCLES):
            async with redlock.lock(name, timeout=0):
                pass


def counts(spin: Spin) -> tuple[int, int, int, int]:
    return spin.caught, spin.missed, spin.passed, spin.gave_way


async def test_replies_on_an_idle_loop_are_polled_for_on_asyncio_only(
    servers: ServerGroup,
) -> None:
    """Each cycle on one master sends its acquisition and its release alone, each on
    an idle connection: each is followed by a poll (which, by how soon the reply
    comes, catches it, finds it there already, misses it or lets its chance pass:
    that split is the host's timing, so it is tested on sockets, where the test
    decides it, in tests/unit/test_spin.py: a reply caught only on the sockets
    written to)."""
    async with AsyncRedlock(servers.urls[:1], busy_poll=MAX_BUSY_POLL) as redlock:
        await cycles(redlock, "poll:idle")  # connected
        spins = {link.spin for link in links(redlock)}
        if loops.selected() != "asyncio":
            assert spins == {None}  # uvloop shows no queue of callbacks to run
            return
        (spin,) = spins
        assert spin is not None
        before = counts(spin)
        await cycles(redlock, "poll:idle")
        after = counts(spin)
        assert sum(after) - sum(before) >= 2 * CYCLES


async def test_one_poller_serves_every_master(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        await cycles(redlock, "poll:all")
        spins = {link.spin for link in links(redlock)}
        assert len(spins) == 1
        assert (spins.pop() is None) == (loops.selected() != "asyncio")


async def test_busy_poll_zero_never_polls(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls, busy_poll=0) as redlock:
        await cycles(redlock, "poll:off")
        assert {link.spin for link in links(redlock)} == {None}


async def test_a_loop_with_other_work_is_never_held_up(servers: ServerGroup) -> None:
    """While a chain of callbacks keeps the loop busy, every poll gives way at once:
    none catches, misses or lets a chance pass (the loop would not sleep anyway)."""
    loop = asyncio.get_running_loop()
    busy = True
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        if busy:
            loop.call_soon(tick)

    async with AsyncRedlock(servers.urls[:1], busy_poll=MAX_BUSY_POLL) as redlock:
        await cycles(redlock, "poll:busy")  # connected
        (spin,) = {link.spin for link in links(redlock)}
        if spin is None:
            assert loops.selected() != "asyncio"
            return
        before = counts(spin)
        loop.call_soon(tick)
        try:
            await cycles(redlock, "poll:busy")
        finally:
            busy = False
        after = counts(spin)
        assert after[:3] == before[:3]
        assert after[3] - before[3] >= 2 * CYCLES
        assert ticks > CYCLES  # the chain ran all along
