"""Counting semaphores: up to ``limit`` leases at once over the quorum, each a slot
held like a lock (extended, lost, released), waiters woken when a slot is given
back, nothing left on the masters."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from asyncredlock import (
    AsyncRedlock,
    HoldLimitError,
    Lease,
    LockLostError,
    LockTimeoutError,
    Semaphore,
)
from asyncredlock.testing import ServerGroup, Waits, deafened, whole_retry_delay

from .conftest import Masters

pytestmark = pytest.mark.anyio

GUARD = 10.0  # seconds: a hang fails the test instead of blocking CI
PATIENT = 120.0  # a retry delay no test waits out: only a wake-up moves a waiter


async def test_up_to_limit_holders_then_refused(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as first, AsyncRedlock(masters.urls) as second:
        semaphores = [client.semaphore("sem:basic", 3, timeout=0) for client in (first, second)]
        leases = [await semaphores[i % 2].acquire() for i in range(3)]
        assert len({lease.key for lease in leases}) == 3  # three slots, one each
        assert {lease.key for lease in leases} == set(semaphores[0].slot_keys)
        assert all(lease.token is None and lease.resource == "sem:basic" for lease in leases)
        for semaphore in semaphores:
            with pytest.raises(LockTimeoutError, match="semaphore 'sem:basic'"):
                await semaphore.acquire()
        # a quorum of masters holds each slot for its holder (once every call is
        # answered; the others may have granted the attempt another slot, given back,
        # when the two clients' attempts reached them in the other order)
        for client in (first, second):
            await client.settle()
        for lease in leases:
            values = [await client.get(lease.key) for client in masters.clients]
            assert values.count(lease.value.encode()) >= first.quorum
        await leases[1].release()
        again = await semaphores[1].acquire()
        assert again.key == leases[1].key
        for lease in (leases[0], leases[2], again):
            await lease.release()
        for client in (first, second):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_waiter_is_woken_when_a_slot_is_given_back(masters: Masters) -> None:
    """retry_delay is an hour: only the announcement of the release can wake it."""
    async with (
        AsyncRedlock(masters.urls) as holder,
        AsyncRedlock(masters.urls, retry_delay=3600) as waiter,
    ):
        held = [await holder.semaphore("sem:wake", 2).acquire() for _ in range(2)]
        with Waits(waiter) as waits:
            waiting = asyncio.create_task(waiter.semaphore("sem:wake", 2, timeout=GUARD).acquire())
            with anyio.fail_after(GUARD):
                await waits.reach(waiting=1)  # refused, enrolled, refused again: parked
        assert not waiting.done()
        await held[0].release()
        with anyio.fail_after(GUARD):
            lease = await waiting
        assert lease.key == held[0].key
        await lease.release()
        await held[1].release()
        for client in (holder, waiter):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_async_with_holds_a_slot_and_gives_it_back(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        semaphore = redlock.semaphore("sem:block", 2)
        async with semaphore as a, semaphore as b:
            assert a.held
            assert b.held
            assert a.key != b.key
            with pytest.raises(LockTimeoutError):
                await redlock.semaphore("sem:block", 2, timeout=0).acquire()
        assert not a.held
        assert not b.held
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_many_tasks_never_exceed_the_limit(masters: Masters) -> None:
    """30 tasks of 3 clients, 40 passes each, a limit of 4: never more than 4 inside."""
    inside, most, passes = 0, 0, 0

    async def worker(semaphore: Semaphore) -> None:
        nonlocal inside, most, passes
        for _ in range(40):
            async with semaphore:
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0)
                inside -= 1
                passes += 1

    async with (
        AsyncRedlock(masters.urls, retry_delay=0.01) as a,
        AsyncRedlock(masters.urls, retry_delay=0.01) as b,
        AsyncRedlock(masters.urls, retry_delay=0.01) as c,
    ):
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(30):
                    tg.start_soon(worker, (a, b, c)[i % 3].semaphore("sem:many", 4, timeout=60))
        for client in (a, b, c):
            await client.settle()
    assert passes == 30 * 40
    assert 1 <= most <= 4
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_lost_slot_cancels_its_block(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        with anyio.fail_after(GUARD), pytest.raises(LockLostError):
            async with redlock.semaphore("sem:lost", 2, ttl=0.3) as lease:
                for client in masters.clients:
                    await client.delete(lease.key)  # as if it had expired everywhere
                await anyio.sleep_forever()
        with anyio.fail_after(GUARD), pytest.raises(HoldLimitError):
            async with redlock.semaphore("sem:lost", 2, ttl=0.3, max_hold=0.5):
                await anyio.sleep_forever()
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_cancelled_acquisitions_leave_nothing(masters: Masters) -> None:
    """A storm of acquisitions cancelled at random points: no slot, marker or task
    left behind once settled, and the semaphore still gives all its slots."""
    async with AsyncRedlock(masters.urls, retry_delay=0.01) as redlock:
        semaphore = redlock.semaphore("sem:storm", 3, timeout=GUARD)
        held: list[Lease] = []

        async def take() -> None:
            held.append(await semaphore.acquire())

        for round_ in range(10):
            tasks = [asyncio.create_task(take()) for _ in range(12)]
            for _ in range(round_):
                await asyncio.sleep(0)
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            # each took its lease or was cancelled: nothing else went wrong
            assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
            for lease in held:
                await lease.release()
            held.clear()
        await redlock.settle()
        assert await masters.keys() == [[] for _ in masters.urls]
        leases = [await semaphore.acquire() for _ in range(3)]
        for lease in leases:
            await lease.release()
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_minority_down_is_tolerated(servers: ServerGroup, masters: Masters) -> None:
    servers[0].pause()
    try:
        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(GUARD):
                lease = await redlock.semaphore("sem:minority", 2).acquire()
                assert lease.held
                await lease.release()
    finally:
        servers[0].resume()


@pytest.mark.parametrize(
    ("limit", "kwargs", "error", "pattern"),
    [
        (0, {}, ValueError, r"^limit must be from 1 to 1024, got 0"),
        (1025, {}, ValueError, r"^limit must be from 1 to 1024"),
        (2.0, {}, TypeError, r"^limit must be an int, not float"),
        (True, {}, TypeError, r"^limit must be an int, not bool"),
        ("3", {}, TypeError, r"^limit must be an int, not str"),
        (2, {"ttl": 0}, ValueError, r"^ttl must be > 0"),
        (2, {"timeout": -1}, ValueError, r"^timeout must be >= 0"),
        (2, {"max_hold": 0}, ValueError, r"^max_hold must be > 0"),
        (2, {"auto_extend": "no"}, TypeError, r"^auto_extend must be a bool"),
    ],
)
async def test_bad_settings_are_refused_before_any_io(
    masters: Masters, limit: Any, kwargs: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        with pytest.raises(error, match=pattern):
            redlock.semaphore("sem:bad", limit, **kwargs)
        with pytest.raises(TypeError, match="must be a str"):
            redlock.semaphore(7, 2)  # type: ignore[arg-type]
        assert redlock.statistics().attempts == 0
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_tasks_of_one_client_take_turns_to_ask_the_masters(masters: Masters) -> None:
    """At most ``limit`` tasks of one AsyncRedlock attempt at once; the others wait
    their turn in the process (timing out with that said), and one cancelled while
    waiting leaves no turn taken."""
    async with (
        AsyncRedlock(masters.urls) as other,
        AsyncRedlock(masters.urls, retry_delay=3600) as redlock,
    ):
        held = await other.semaphore("sem:turns", 1).acquire()
        with Waits(redlock) as waits:
            first = asyncio.create_task(redlock.semaphore("sem:turns", 1).acquire())
            with anyio.fail_after(GUARD):
                await waits.reach(waiting=1)  # asking the masters, parked
        attempts = redlock.statistics().attempts
        with pytest.raises(LockTimeoutError, match="turn"):
            await redlock.semaphore("sem:turns", 1, timeout=0.05).acquire()
        with Waits(redlock) as waits:
            cancelled = asyncio.create_task(redlock.semaphore("sem:turns", 1).acquire())
            with anyio.fail_after(GUARD):
                await waits.reach(queued=1)  # waiting for its turn
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert redlock.statistics().attempts == attempts  # neither asked the masters
        assert not first.done()
        await held.release()
        with anyio.fail_after(GUARD):
            lease = await first
        await lease.release()
        # the turns are all free again: the next task asks at once
        again = await redlock.semaphore("sem:turns", 1, timeout=GUARD).acquire()
        await again.release()
        for client in (other, redlock):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_no_acquisition_ends_held_by_a_closed_redlock(masters: Masters, kind: str) -> None:
    """aclose() while acquisitions are out, after 1 to 8 loop iterations (three
    times each: the window is a matter of which task the loop resumes first): each
    acquire() returns a lease that aclose() then ends (lost), or raises RuntimeError;
    none returns a lease still held on a closed AsyncRedlock (whose release would
    never be sent)."""
    for iterations in [*range(1, 9)] * 3:
        redlock = AsyncRedlock(masters.urls, fencing=False)
        warm = await redlock.lock("close:warm").acquire()  # connections open
        await warm.release()
        if kind == "lock":
            tasks = [
                asyncio.create_task(redlock.lock(f"close:lock:{i}").acquire()) for i in range(20)
            ]
        else:
            semaphore = redlock.semaphore("close:sem", 50)
            tasks = [asyncio.create_task(semaphore.acquire()) for _ in range(20)]
        for _ in range(iterations):
            await asyncio.sleep(0)
        await redlock.aclose()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Lease):
                assert result.lost
            else:
                assert isinstance(result, RuntimeError), repr(result)


async def test_a_fair_semaphore_serves_waiters_of_other_clients_in_arrival_order(
    masters: Masters,
) -> None:
    """A, B and C (three clients) wait, in that order, for a full semaphore; each slot
    given back goes to the first of them still waiting, whatever wakes first."""
    async with (
        AsyncRedlock(masters.urls) as holder,
        AsyncRedlock(masters.urls, retry_delay=0.01) as a,
        AsyncRedlock(masters.urls, retry_delay=0.01) as b,
        AsyncRedlock(masters.urls, retry_delay=0.01) as c,
    ):
        held = [await holder.semaphore("sem:fair", 2, fair=True).acquire() for _ in range(2)]
        took: asyncio.Queue[tuple[str, Lease]] = asyncio.Queue()

        async def wait(name: str, client: AsyncRedlock) -> None:
            lease = await client.semaphore("sem:fair", 2, fair=True, timeout=GUARD).acquire()
            await took.put((name, lease))

        tasks = []
        for name, client in (("a", a), ("b", b), ("c", c)):
            with Waits(client) as waits:
                tasks.append(asyncio.create_task(wait(name, client)))
                with anyio.fail_after(GUARD):
                    await waits.reach(waiting=1)  # queued on the masters, parked
        order: list[str] = []
        leases: dict[str, Lease] = {}
        with anyio.fail_after(GUARD):
            for given_back in (held[0], held[1], None):
                await (given_back or leases["a"]).release()
                name, lease = await took.get()
                order.append(name)
                leases[name] = lease
            await asyncio.gather(*tasks)
        assert order == ["a", "b", "c"]
        for name in ("b", "c"):
            await leases[name].release()
        for client in (holder, a, b, c):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]  # no queue entry left


async def test_a_fair_waiter_that_gives_up_leaves_the_queue(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls) as redlock:
        held = await redlock.semaphore("sem:fair-leave", 1, fair=True).acquire()
        with pytest.raises(LockTimeoutError, match="semaphore 'sem:fair-leave'"):
            await redlock.semaphore("sem:fair-leave", 1, fair=True, timeout=0.05).acquire()
        await redlock.settle()
        queued = [await client.zcard("{sem:fair-leave}:sem:queue") for client in masters.clients]
        assert queued == [0] * len(masters.clients)
        await held.release()
        await redlock.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_fair_waiter_leaving_the_head_of_the_queue_wakes_the_next(
    masters: Masters,
) -> None:
    """A fair semaphore (limit 1): W1 (client `first`) is first in the masters' queue,
    W2 (client `second`) behind it. The holder releases; W2 hears it but is refused (W1
    is ahead: with one slot free only the first entry may take it) and waits again. W1
    never heard the release (its client is deaf) and is cancelled: taking its entry out
    of the queue must announce the free slot to W2 (`sem_dequeue.lua`), or W2 sleeps its
    whole retry delay (two minutes here) while the slot is free."""
    async with (
        AsyncRedlock(masters.urls) as holder,
        AsyncRedlock(masters.urls, retry_delay=PATIENT) as first,
        AsyncRedlock(masters.urls, retry_delay=PATIENT) as second,
    ):
        lease = await holder.semaphore("sem:head-leaves", 1, fair=True, timeout=0).acquire()
        await holder.settle()
        got: list[Lease] = []
        with (
            whole_retry_delay(first, second),
            deafened(first),
            Waits(first) as waits1,
            Waits(second) as waits2,
            anyio.fail_after(GUARD),
        ):
            head = asyncio.ensure_future(
                first.semaphore("sem:head-leaves", 1, fair=True, timeout=PATIENT).acquire()
            )
            await waits1.reach(1)  # queued first on the masters, waiting
            await first.settle()

            async def take() -> None:
                semaphore = second.semaphore("sem:head-leaves", 1, fair=True, timeout=PATIENT)
                got.append(await semaphore.acquire())

            nxt = asyncio.ensure_future(take())
            await waits2.reach(1)
            await second.settle()
            await lease.release()
            await waits2.reach(2)  # woken by the release, refused: W1 is ahead
            await second.settle()
            assert got == []
            head.cancel()
            with pytest.raises(asyncio.CancelledError):
                await head
            await nxt  # woken by W1 leaving the head of the queue
        assert len(got) == 1
        await got[0].release()
        for client in (holder, first, second):
            await client.settle()
    assert await masters.keys() == [[] for _ in masters.urls]


async def test_a_fair_waiter_leaving_while_every_slot_is_held_announces_nothing(
    masters: Masters,
) -> None:
    """The first waiter of a full fair semaphore is cancelled: no slot is free, so its
    leaving the queue wakes nobody. On each master, the first message on the slot's
    channel after it left is the holder's release."""
    name, channel = "sem:leave-full", "{sem:leave-full}:sem:0:released"
    subscriptions = [client.pubsub() for client in masters.clients]
    try:
        for pubsub in subscriptions:
            await pubsub.subscribe(channel)
            with anyio.fail_after(GUARD):
                assert (await pubsub.get_message(timeout=GUARD))["type"] == "subscribe"
        async with (
            AsyncRedlock(masters.urls) as holder,
            AsyncRedlock(masters.urls, retry_delay=PATIENT) as waiter,
        ):
            lease = await holder.semaphore(name, 1, fair=True, timeout=0).acquire()
            with Waits(waiter) as waits, anyio.fail_after(GUARD):
                waiting = asyncio.ensure_future(
                    waiter.semaphore(name, 1, fair=True, timeout=PATIENT).acquire()
                )
                await waits.reach(1)  # queued first on the masters, waiting
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                await waiter.settle()  # its entry is out of every master's queue
            await lease.release()
            await holder.settle()
        for pubsub in subscriptions:
            with anyio.fail_after(GUARD):
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=GUARD)
            assert message is not None
            assert message["data"] == lease.value.encode()
    finally:
        for pubsub in subscriptions:
            await pubsub.aclose()
    assert await masters.keys() == [[] for _ in masters.urls]


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_slot_granted_by_a_minority_is_given_back(masters: Masters, fair: bool) -> None:
    """Another holder's key on slot 0 on three masters: the attempt is granted the slot
    on the other two only, fails, and gives it back there (and a fair one leaves its
    queue intact and then empty)."""
    for client in masters.clients:
        await client.config_resetstat()
    slot = "{sem:minority-grant}:sem:0"
    queue, expiry = "{sem:minority-grant}:sem:queue", "{sem:minority-grant}:sem:queue:expiry"
    for client in masters.clients[:3]:
        await client.set(slot, "someone-else", px=60_000)
    if fair:  # a later waiter queued everywhere: the queue stays while the attempt runs
        for client in masters.clients:
            await client.zadd(queue, {"s:later:0": 2**50})
            await client.zadd(expiry, {"s:later:0": 2**50})
    async with AsyncRedlock(masters.urls) as redlock:
        semaphore = redlock.semaphore("sem:minority-grant", 1, fair=fair, timeout=0)
        with pytest.raises(LockTimeoutError) as caught:
            await semaphore.acquire()
        assert sum(outcome.ok for outcome in caught.value.outcomes) <= 2
        await redlock.settle()
    values = [await client.get(slot) for client in masters.clients]
    assert values == [b"someone-else"] * 3 + [None] * 2  # given back where granted
    if fair:  # the later waiter is still queued; this one's entry is gone
        for client in masters.clients:
            assert await client.zrange(queue, 0, -1) == [b"s:later:0"]
    for client in masters.clients:  # and no script failed on the way
        assert not any(key.startswith("errorstat_") for key in await client.info("errorstats"))
    for client in masters.clients:
        await client.delete(slot, queue, expiry)
    assert await masters.keys() == [[] for _ in masters.urls]
