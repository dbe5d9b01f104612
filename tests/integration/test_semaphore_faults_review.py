"""Review (semaphores under faults): masters restarted empty while slots are held or
waiters queued, a minority that lost the slot set, a grant whose reply was lost, a
holder SIGKILLed or SIGSTOPped (waiters whose attempts split the grants:
``test_semaphore_split.py``).

Checked: never more than ``limit`` valid leases, nothing left past its TTL, no waiter
left asleep while a slot is free (bounded waits), the docs' claims."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from contextlib import AsyncExitStack

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError, QuorumUnavailableError
from asyncredlock.testing import ServerGroup, Waits, hold_calls
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, assert_every_key_expires
from .test_semaphore_split import proxied, slot_exists

pytestmark = pytest.mark.anyio

GUARD = 15.0  # seconds: a hang fails the test, never decides it
PATIENT = 120.0  # a retry delay no test waits out: only a wake-up (or free_in) moves a waiter


async def _keys(group: ServerGroup) -> list[list[bytes]]:
    masters = Masters(group.urls)
    try:
        return await masters.keys()
    finally:
        await masters.aclose()


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
@pytest.mark.parametrize("n", [3, 5])
async def test_a_minority_restarted_empty_while_every_slot_is_held_admits_nobody_more(
    make_servers: MakeServers, n: int, fair: bool
) -> None:
    """Both slots held on every master; (n-1)//2 masters crash and come back empty. A
    quorum still holds each slot: another client is refused (its grants on the empty
    masters are given back), the leases still extend, and a waiter of that client gets
    the slot given back by a release (woken, not after its retry delay)."""
    group = make_servers(n)
    name, limit = "sem:review-restart", 2
    async with (
        AsyncRedlock(group.urls) as holder,
        AsyncRedlock(group.urls, retry_delay=PATIENT) as other,
    ):
        taking = holder.semaphore(name, limit, ttl=30, fair=fair, timeout=0)
        leases = [await taking.acquire() for _ in range(limit)]
        await holder.settle()
        for server in list(group)[: (n - 1) // 2]:
            server.restart(kill=True)
        refused = other.semaphore(name, limit, fair=fair, timeout=0)
        for _ in range(limit + 1):
            with pytest.raises(LockTimeoutError):
                await refused.acquire()
        for lease in leases:
            await lease.extend()
        with Waits(other) as waiting:
            task = asyncio.ensure_future(
                other.semaphore(name, limit, fair=fair, timeout=GUARD).acquire()
            )
            await waiting.reach(1)
            await leases[0].release()
            with anyio.fail_after(GUARD):
                lease = await task
        assert lease.key == leases[0].key
        for each in (lease, leases[1]):
            await each.release()
        for client in (holder, other):
            await client.settle()
    # a call cut by the crash leaves its undo marker there (with a TTL), nothing else
    await assert_every_key_expires(group)
    assert all(b":undo:" in key for keys in await _keys(group) for key in keys)


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_minority_restarted_empty_lets_no_attempt_through_on_it_alone(
    make_servers: MakeServers, fair: bool
) -> None:
    """Five masters, both slots held on all five; two crash and come back empty (a
    minority lost the slot set). An attempt is granted a slot there alone: refused,
    its grants given back there; the leases still extend on the other three."""
    group = make_servers(5)
    name, limit = "sem:review-minority", 2
    async with AsyncRedlock(group.urls) as holder, AsyncRedlock(group.urls) as other:
        taking = holder.semaphore(name, limit, ttl=30, fair=fair, timeout=0)
        leases = [await taking.acquire() for _ in range(limit)]
        await holder.settle()
        group[0].restart(kill=True)
        group[1].restart(kill=True)
        with pytest.raises(LockTimeoutError):
            await other.semaphore(name, limit, fair=fair, timeout=0).acquire()
        await other.settle()
        for server in (group[0], group[1]):
            client = Redis.from_url(server.url)
            try:  # the attempt's grants there were given back; only its marker may stay
                assert not await client.exists(*(f"{{{name}}}:sem:{i}" for i in range(limit)))
            finally:
                await client.aclose()
        for lease in leases:
            await lease.extend()
            await lease.release()
        for client in (holder, other):
            await client.settle()
    await assert_every_key_expires(group)


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_fair_waiters_keep_their_order_through_a_master_restarted_empty(
    make_servers: MakeServers, fair: bool
) -> None:
    """A holder and two waiters queued (of separate clients); master 0 crashes and
    comes back empty (the slot and the queue gone there). The release still wakes the
    waiters: the first gets the slot (fair: in arrival order), the second the next."""
    group = make_servers(3)
    name = f"sem:review-queue-restart:{fair}"
    got: list[str] = []

    async def wait(client: AsyncRedlock, label: str) -> Lease:
        lease = await client.semaphore(name, 1, ttl=30, fair=fair, timeout=GUARD).acquire()
        got.append(label)
        return lease

    async with AsyncExitStack() as stack:
        holder, first, second = [
            await stack.enter_async_context(AsyncRedlock(group.urls, retry_delay=PATIENT))
            for _ in range(3)
        ]
        held = await holder.semaphore(name, 1, ttl=30, fair=fair, timeout=0).acquire()
        with Waits(first, second) as waits:
            a = asyncio.ensure_future(wait(first, "first"))
            await waits.reach(1)
            b = asyncio.ensure_future(wait(second, "second"))
            await waits.reach(2)
        group[0].restart(kill=True)
        await held.release()
        with anyio.fail_after(GUARD):
            done, _ = await asyncio.wait([a, b], return_when=asyncio.FIRST_COMPLETED)
        winner = done.pop()
        assert got == ["first"] if fair else len(got) == 1
        await winner.result().release()
        with anyio.fail_after(GUARD):
            last = await (b if winner is a else a)
        await last.release()
        for client in (holder, first, second):
            await client.settle()
    # a call cut by the crash leaves its undo marker there (with a TTL), nothing else
    await assert_every_key_expires(group)
    assert all(b":undo:" in key for keys in await _keys(group) for key in keys)


CHILD = """
import asyncio, json, sys
from asyncredlock import AsyncRedlock, LockLostError
urls, name, fair = json.loads(sys.argv[1])
async def main():
    async with AsyncRedlock(urls) as redlock:
        try:
            async with redlock.semaphore(name, 1, ttl=1.0, fair=fair) as lease:
                await redlock.settle()
                print("held", lease.key, flush=True)
                await asyncio.Event().wait()
        except LockLostError:
            print("lost", flush=True)
asyncio.run(main())
"""


async def _holder(urls: list[str], name: str, fair: bool) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        json.dumps([urls, name, fair]),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ},
    )


async def _line(proc: asyncio.subprocess.Process) -> bytes:
    assert proc.stdout is not None
    with anyio.fail_after(GUARD):
        return await proc.stdout.readline()


async def _holding(masters: Masters, lease: Lease) -> list[bool]:
    """On which masters ``lease``'s slot key holds its value."""
    value = lease.value.encode()
    return [await client.get(lease.key) == value for client in masters.clients]


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
@pytest.mark.parametrize("how", ["killed", "stopped"])
async def test_a_waiter_gets_the_slot_of_a_killed_or_frozen_holder_when_it_expires(
    masters: Masters, fair: bool, how: str
) -> None:
    """A process holds the only slot (ttl 1 s) and is SIGKILLed or SIGSTOPped; a waiter
    whose retry delay is two minutes gets the slot once its key expires (it sleeps no
    longer than the refusing masters' TTL). A frozen holder, continued, finds its lease
    lost (its block cancelled) and leaves the new holder's slot alone."""
    name = f"sem:review-frozen:{how}:{fair}"
    proc = await _holder(masters.urls, name, fair)
    try:
        line = await _line(proc)
        assert line.startswith(b"held "), line
        async with AsyncRedlock(masters.urls, retry_delay=PATIENT) as redlock:
            proc.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            with anyio.fail_after(GUARD):
                lease = await redlock.semaphore(name, 1, fair=fair, timeout=GUARD).acquire()
            assert lease.key == line.split()[1].decode()
            if how == "stopped":
                await redlock.settle()
                before = await _holding(masters, lease)
                assert sum(before) >= redlock.quorum
                proc.send_signal(signal.SIGCONT)
                assert await _line(proc) == b"lost\n"
                with anyio.fail_after(GUARD):
                    await proc.wait()
                # its extension, release and leaving the queue touched nothing here
                assert await _holding(masters, lease) == before
                await lease.extend()
            await lease.release()
            await redlock.settle()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_grant_whose_reply_was_lost_is_given_back_before_its_ttl(
    make_servers: MakeServers,
) -> None:
    """Masters 1 and 2 are slow (past node_timeout): the attempt fails on master 0's
    grant alone, while its SETs still reach 1 and 2; their replies are then lost (the
    connections go dead). The give-back is sent again with the marker once those calls
    fail: the slot is free everywhere long before its 60 s TTL, and taken at once."""
    group = make_servers(3)
    name = "sem:review-lost-reply"
    key = f"{{{name}}}:sem:0"
    async with (
        proxied(group, 0, 0.0) as (urls, proxies),
        AsyncRedlock(urls, socket_timeout=1.0) as redlock,
    ):
        semaphore = redlock.semaphore(name, 1, ttl=60, timeout=0)
        await (await semaphore.acquire()).release()  # connections open, scripts loaded
        await redlock.settle()
        with hold_calls(redlock, "sem_undo") as undos:
            for proxy in proxies:
                proxy.delay = 0.5
            with pytest.raises((LockTimeoutError, QuorumUnavailableError)):
                await semaphore.acquire()
            with anyio.fail_after(GUARD):
                while await slot_exists(group, key) != [True] * 3:  # noqa: ASYNC110
                    await anyio.sleep(0.025)
            for proxy in proxies:
                proxy.forget_connections()  # the replies (and what follows) are lost
                proxy.delay = 0.0
            undos.let_go()
        with anyio.fail_after(GUARD):  # the marked give-back, once the calls fail
            while any(await slot_exists(group, key)):  # noqa: ASYNC110
                await anyio.sleep(0.025)
        async with AsyncRedlock(group.urls) as other:
            lease = await other.semaphore(name, 1, timeout=0).acquire()
            await lease.release()
        await redlock.settle()
    await assert_every_key_expires(group)
