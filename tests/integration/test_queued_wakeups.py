"""Waiters of separate clients queue on the masters; a release wakes only the first.

Every test here has its waiters in separate ``AsyncRedlock`` clients (as separate
processes would be), or in a separate OS process: the in-process queue of one client
is tested in ``test_handoff.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from asyncredlock import AsyncRedlock, Lease, LockNotOwnedError
from asyncredlock._keys import aux_key, channel, queue_keys, readers_key, terms_key, undo_key
from asyncredlock._scripts import ACQUIRE, DEQUEUE, evalsha
from asyncredlock._wakeup import INBOX_PREFIX
from asyncredlock.testing import ServerGroup, client_state, whole_retry_delay
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, Waiting, clients, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
# Waiters that must not try again on their own within a test: only a wake-up moves them.
PATIENT = 60.0
#: node_timeout of a client that must be handed the key: a waiter sends hand-over terms
#: only once its inbox subscription is confirmed, which it waits for up to node_timeout
#: (0.1 s by default: missed now and then on a loaded machine, and it is announced to
#: instead of handed the key). Waited for only until confirmed.
CONFIRM = 5.0


class TestAnnouncement:
    """A release is announced on the first waiter's inbox, not to every client."""

    async def test_a_release_is_announced_to_the_first_waiter_only(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Three clients wait in line; each release hands the key to the first waiter and
        publishes one message per master, to the inbox of that waiter's client; the lock's
        own channel hears nothing."""
        spy = Redis.from_url(servers.urls[0])
        pubsub = spy.pubsub()
        await pubsub.psubscribe(INBOX_PREFIX + "*", "{line}:released", "test:sentinel")
        heard: list[tuple[bytes, bytes]] = []

        async def drain() -> None:
            """Everything published on master 0 before now (a sentinel closes the batch)."""
            await spy.publish("test:sentinel", "end")
            while True:
                message = await pubsub.get_message(timeout=HANG_GUARD)
                if message is None or message["type"] != "pmessage":
                    continue  # the confirmation of a subscription
                if message["channel"] == b"test:sentinel":
                    return
                heard.append((message["channel"], message["data"]))

        order: list[int] = []
        leases: dict[int, Lease] = {}
        got = {i: anyio.Event() for i in range(3)}
        try:
            async with (
                AsyncRedlock(servers.urls) as holder,
                # each waiter must be handed the key: its inbox confirmed in time (CONFIRM)
                clients(servers.urls, 3, retry_delay=PATIENT, node_timeout=CONFIRM) as waiters,
            ):
                held = await holder.lock("line").acquire()
                waiting = Waiting(waiters)
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        for i, redlock in enumerate(waiters):

                            async def take(i: int = i, redlock: AsyncRedlock = redlock) -> None:
                                leases[i] = await redlock.lock("line", timeout=HANG_GUARD).acquire()
                                order.append(i)
                                got[i].set()

                            tg.start_soon(take)
                            await waiting.reach(i + 1)  # queued before the next one comes
                        ids = list((await queues(masters, "line"))[0])
                        assert len(ids) == 3
                        assert all(each.startswith(b"w:") for each in ids)
                        await drain()
                        heard.clear()  # the subscriptions' own traffic
                        previous = held
                        for i, redlock in enumerate(waiters):
                            await previous.release()
                            await got[i].wait()
                            await drain()
                            inbox = (INBOX_PREFIX + client_state(redlock).client).encode()
                            # one message, to the first waiter's client, naming it: the
                            # master handed it the key
                            assert len(heard) == 1
                            assert heard[0][0] == inbox
                            assert heard[0][1].split(b" ")[:2][0] == ids[i]
                            assert heard[0][1].split(b" ")[1].startswith(b"handed:")
                            assert (
                                leases[i].value == (await masters.clients[0].get("line")).decode()
                            )
                            heard.clear()
                            previous = leases[i]
                        await previous.release()
                woken = [redlock.statistics().wakeups for redlock in waiters]
                attempts = [redlock.statistics().attempts for redlock in waiters]
                for redlock in waiters:
                    await redlock.settle()
        finally:
            await pubsub.aclose()
            await spy.aclose()
        assert order == [0, 1, 2]
        assert woken == [1, 1, 1]  # each woken once, by the release before its turn
        # per waiter: refused without a place in line, refused and queued; then handed the
        # lock by the release, without an attempt
        assert attempts == [2, 2, 2]
        assert await masters.keys() == [[]] * 5  # no key, no queue left

    async def test_a_waiter_leaving_first_in_line_announces_the_next(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The lock is free but a waiter of another client is first in line: the next
        waiter is refused; when the first one leaves (cancelled, or out of time), its
        dequeue wakes the next at once, not after its entry lapses."""
        ghost = "w:0badc0ffee00:0"
        for client in masters.clients:
            seconds, micros = await client.time()
            now_ms = seconds * 1000 + micros // 1000
            await client.zadd("{turn}:queue", {ghost: 0})
            await client.zadd("{turn}:queue:expiry", {ghost: now_ms + 1000 * PATIENT})
        async with AsyncRedlock(servers.urls, retry_delay=PATIENT) as redlock:
            waiting = Waiting([redlock])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    leases: list[Lease] = []

                    async def take() -> None:
                        leases.append(await redlock.lock("turn", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waiting.reach(1)
                    assert [q[0] for q in await queues(masters, "turn")] == [ghost.encode()] * 5
                    # the first waiter's client gives up: what its acquire() does on exit
                    keys = (*queue_keys("turn"), "turn", terms_key("turn"))
                    for client in masters.clients:
                        await evalsha(client, DEQUEUE, keys, (ghost, channel("turn"), ""))
            assert waiting.woken == 1
            await leases[0].release()
            await redlock.settle()
        assert await masters.keys() == [[]] * 5


class TestArrivalOrder:
    """Waiters of separate clients take the lock in the order they queued."""

    async def test_waiters_of_separate_clients_acquire_in_arrival_order(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Without fair=True: the waiters that try on their own timer meanwhile are refused
        while an earlier waiter is queued, so the order holds."""
        order: list[int] = []
        async with (
            AsyncRedlock(servers.urls) as holder,
            clients(servers.urls, 6, retry_delay=0.02) as waiters,
        ):
            held = await holder.lock("order").acquire()
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for i, redlock in enumerate(waiters):

                        async def take(i: int = i, redlock: AsyncRedlock = redlock) -> None:
                            async with redlock.lock("order", timeout=HANG_GUARD):
                                order.append(i)

                        waiting = Waiting([redlock])
                        tg.start_soon(take)
                        await waiting.reach(1)  # queued (on a quorum) before the next one comes
                    lengths = [len(q) for q in await queues(masters, "order")]
                    assert sum(length == 6 for length in lengths) >= 3
                    await held.release()
            for redlock in waiters:
                await redlock.settle()
        assert order == list(range(6))
        assert await masters.keys() == [[]] * 5

    async def test_a_key_queues_from_its_first_attempt_only_while_contended(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A client whose acquire() of a key had to wait brings its place in line from the
        next acquire()'s first attempt; one that then finds the lock free at once forgets
        that, and the one after it sends a plain attempt again."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=PATIENT) as redlock,
        ):
            held = await holder.lock("calm").acquire()
            waiting = Waiting([redlock])
            leases: list[Lease] = []
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        leases.append(await redlock.lock("calm", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waiting.reach(1)
                    await held.release()
            await leases[0].release()
            assert "calm" in client_state(redlock).contended
            lease = await redlock.lock("calm", timeout=0).acquire()  # free: granted at once
            assert "calm" not in client_state(redlock).contended
            await lease.release()
            await redlock.settle()
        assert await masters.keys() == [[]] * 5


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from asyncredlock import AsyncRedlock
    from asyncredlock.testing import Waits

    async def main() -> None:
        async with AsyncRedlock(sys.argv[1:]) as redlock:
            waits = Waits(redlock)
            waiter = asyncio.create_task(redlock.lock("killed", timeout=600).acquire())
            await waits.reach(1)
            print("queued", flush=True)  # its attempts queued it on the masters
            await waiter

    asyncio.run(main())
    """
)


class TestDeadWaiter:
    """A waiter that died delays the others by its queue entry, never by the TTL."""

    async def test_a_killed_process_delays_the_next_waiter_by_its_entry_not_the_ttl(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A waiter in another process, SIGKILLed while first in line: the release is
        announced to it and nobody else; the next waiter goes once its entry lapsed (1 s
        with the default settings), long before the holder's TTL would have run out."""
        async with (
            AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
            AsyncRedlock(servers.urls, retry_delay=0.05) as redlock,
        ):
            held = await holder.lock("killed").acquire()
            await holder.settle()  # on every master (acquire() returns at a quorum)
            async with await anyio.open_process(
                [sys.executable, "-c", CHILD, *servers.urls], stdout=subprocess.PIPE
            ) as child:
                assert child.stdout is not None
                with anyio.fail_after(HANG_GUARD):
                    assert (await child.stdout.receive()).startswith(b"queued")
                os.kill(child.pid, signal.SIGKILL)
                assert await child.wait() == -signal.SIGKILL
            (dead,) = (await queues(masters, "killed"))[0]
            assert [len(q) for q in await queues(masters, "killed")] == [1] * 5
            await held.release()
            await holder.settle()  # every master ran it (release() returns at a quorum)
            # the release handed the key to the dead waiter, for its entry's time only
            assert await masters.holding("killed") == 5
            assert all([0 < await c.pttl("killed") <= 1000 for c in masters.clients])
            # The entry lapses within a second; the acquisition's own timeout is the bound
            # (far below the holder's TTL, which never comes into play).
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("killed", timeout=10).acquire()
            assert lease.validity > 0
            assert all(dead not in q for q in await queues(masters, "killed"))
            await lease.release()
            await redlock.settle()


async def take_turns(
    servers: ServerGroup,
    masters: Masters,
    name: str,
    tamper: Callable[[list[bytes]], Awaitable[None]],
    *,
    ttl: float = 10.0,
    node_timeout: float = 0.1,
    retry_delay: float = 0.05,
    waiting: int = 3,
) -> list[int]:
    """A holder, then ``waiting`` waiters of separate clients queued behind it;
    ``tamper`` (given the waiters' ids) breaks the queue on the masters; the holder
    releases. Every waiter must get the lock, one at a time, each finding it on a
    quorum of ``masters`` (those checked: all, or the ones left running): the order
    they got it in."""
    order: list[int] = []
    holding = 0
    async with (
        AsyncRedlock(servers.urls) as holder,
        clients(
            servers.urls, waiting, retry_delay=retry_delay, node_timeout=node_timeout
        ) as waiters,
    ):
        held = await holder.lock(name, ttl=ttl).acquire()
        queued = Waiting(waiters)
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                for i, redlock in enumerate(waiters):

                    async def take(i: int = i, redlock: AsyncRedlock = redlock) -> None:
                        nonlocal holding
                        async with redlock.lock(name, ttl=ttl, timeout=HANG_GUARD):
                            holding += 1
                            assert holding == 1  # never two holders at once
                            assert await masters.holding(name) >= 3
                            order.append(i)
                            holding -= 1

                    tg.start_soon(take)
                    await queued.reach(queued.entered + 1)
                ids = (await queues(masters, name))[-1]
                assert len(ids) == waiting
                await tamper(ids)
                await held.release()
        for redlock in waiters:
            await redlock.settle()
    assert await masters.holding(name) == 0
    return order


class TestQueueUnderFaults:
    """The queue when masters lose it, or only some of them have an entry."""

    async def test_a_master_restarted_without_its_data_mid_queue(
        self, servers: ServerGroup, masters: Masters, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        async def restart(ids: list[bytes]) -> None:
            servers[0].restart(kill=True)  # no save on the way down: it comes back empty
            # it came back empty: no key, no queue (the waiters' attempts may write there
            # again at once, so that is not checked here)
            await masters.clients[0].connection_pool.disconnect()  # this test's own client

        order = await take_turns(servers, masters, "restarted", restart)
        assert order == [0, 1, 2]  # the four others still hold the line

    async def test_a_minority_of_masters_lost_the_queue(
        self, servers: ServerGroup, masters: Masters, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        async def lose(ids: list[bytes]) -> None:
            for client in masters.clients[:2]:
                await client.delete("{lost}:queue", "{lost}:queue:expiry")

        order = await take_turns(servers, masters, "lost", lose)
        assert order == [0, 1, 2]

    async def test_a_waiter_queued_on_a_minority_only(
        self, servers: ServerGroup, masters: Masters, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The first waiter's entry is on two masters only (its other enqueues were
        lost): those two announce it, the three others the second waiter, who goes
        first or after it; nobody is stranded and nothing is granted twice."""

        async def strand(ids: list[bytes]) -> None:
            for client in masters.clients[2:]:
                await client.zrem("{minority}:queue", ids[0])
                await client.zrem("{minority}:queue:expiry", ids[0])

        order = await take_turns(servers, masters, "minority", strand)
        assert sorted(order) == [0, 1, 2]


def split_three(masters: Masters, name: str) -> Callable[[list[bytes]], Awaitable[None]]:
    """A ``tamper`` for `take_turns`: the first waiter missing from the queues of
    masters 0, 1 and 4, the second from that of master 4 (as if their attempts came
    after the release there). The release then hands masters 2 and 3 to the first
    waiter, 0 and 1 to the second, 4 to the third: none of them on a quorum."""

    async def split(ids: list[bytes]) -> None:
        for client in masters.clients[:2]:
            await client.zrem(f"{{{name}}}:queue", ids[0])
        await masters.clients[4].zrem(f"{{{name}}}:queue", ids[0], ids[1])

    return split


class TestSplitHandOvers:
    """Masters that heard the waiters in different orders hand the key to different
    waiters, none of them on a quorum: all but the earliest give their keys back."""

    async def test_keys_handed_to_three_waiters_none_on_a_quorum_are_given_back(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The key handed on 2, 2 and 1 masters (`split_three`). The handed keys live
        the entry TTL: 60 s here (a node timeout of 20 s, never reached by healthy
        masters), past the test's hang guard, so no waiter may wait for another's
        handed keys to expire: the later waiters, seeing the first queued ahead of
        them, give theirs back. (Most often the first then collects them; the second
        goes first when it takes masters 0, 1 and 4 before the first's next attempt
        lists it there again.)"""
        order = await take_turns(
            servers, masters, "split", split_three(masters, "split"), ttl=120, node_timeout=20
        )
        assert sorted(order) == [0, 1, 2]

    async def test_the_holder_still_listed_is_not_an_earlier_waiter(self, masters: Masters) -> None:
        """A writer granted the lock stays first in the queue while it holds it: a
        later waiter's refusal must not say an earlier waiter is ahead of it (it
        would give back keys handed to it while the holder's release is on its way
        to the other masters); an earlier waiter, queued before the holder, does."""
        client, key = masters.clients[0], "ahead"

        async def attempt(waiter: str, score: int) -> list[int]:
            keys = (key, undo_key(key, waiter), aux_key(key, "fence"), readers_key(key))
            keys += (*queue_keys(key), terms_key(key))
            args = (f"value-{waiter}", 10_000, "0", waiter, score, 10_000)
            return [int(each) for each in await evalsha(client, ACQUIRE, keys, args)]

        assert await attempt("w:holder:1", 20) == [1]  # granted, and listed
        assert (await attempt("w:later:1", 30))[2:] == [1, 1, 0]  # queued, none ahead
        assert (await attempt("w:earlier:1", 10))[2:] == [1, 1, 0]  # first in line
        assert (await attempt("w:later:1", 30))[2:] == [1, 1, 1]  # now one is ahead
        await client.delete(key, *queue_keys(key), terms_key(key))

    async def test_waiters_that_never_retry_are_woken_to_give_way(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The same split, but the waiters never try again on their own (retry delay
        60 s): each, handed the key by fewer than a quorum of masters, is woken a
        quarter of ``node_timeout`` (1.25 s here) after the first hand-over to attempt,
        and so finds out it must give way. The handed keys live the lock's TTL
        (120 s), past the test's hang guard, and so does the holder's key (a waiter
        refused by it would try again when it expires)."""
        order = await take_turns(
            servers,
            masters,
            "stuck",
            split_three(masters, "stuck"),
            ttl=120,
            node_timeout=CONFIRM,
            retry_delay=PATIENT,
        )
        assert sorted(order) == [0, 1, 2]

    async def test_a_two_way_split_with_a_master_down_is_settled(
        self, make_servers: MakeServers
    ) -> None:
        """Master 4 down, two waiters: the key handed to the first on masters 0 and 1,
        to the second on 2 and 3 (the first missing from their queues, as if its
        attempts came after the release there), neither on a quorum. On 0 and 1 the
        first is the noted holder, which the masters do not count as a waiter ahead;
        on 2 and 3 the first's attempts list it again, ahead of the second, whose
        attempts there find the key handed to it: that reply must say an earlier
        waiter is ahead, or the second never gives way and the lock sits idle until
        the handed keys expire (their PX, the entry TTL: 60 s here, past the hang
        guard). Both get the lock, one at a time, on a quorum of the live masters."""
        group = make_servers(5)
        live = Masters(group.urls[:4])
        spies = [client.pubsub() for client in live.clients]
        queued: list[bytes] = []

        async def split(ids: list[bytes]) -> None:
            queued.extend(ids)
            for client in live.clients[2:]:
                await client.zrem("{split2}:queue", ids[0])
            group[4].stop()

        try:
            for spy in spies:
                await spy.psubscribe(INBOX_PREFIX + "*")
            order = await take_turns(
                group, live, "split2", split, ttl=120, node_timeout=20, waiting=2
            )
            assert sorted(order) == [0, 1]
            with anyio.fail_after(HANG_GUARD):  # the release's hand-overs, master by master
                handed = [await first_handed(spy, live.clients[i]) for i, spy in enumerate(spies)]
            assert handed == [queued[0], queued[0], queued[1], queued[1]]
        finally:
            for spy in spies:
                await spy.aclose()
            await live.aclose()


async def first_handed(spy: PubSub, client: Redis) -> bytes | None:
    """The waiter id of the first hand-over ``spy`` heard on its master's inboxes
    (a message published after them closes the batch)."""
    await client.publish(INBOX_PREFIX + "test:end", "end")
    first = None
    while True:
        message = await spy.get_message(timeout=HANG_GUARD)
        if message is None or message["type"] != "pmessage":
            continue  # a subscription's confirmation
        if message["data"] == b"end":
            return first
        waiter, cause = message["data"].split(b" ")[:2]
        if first is None and cause.startswith(b"handed:"):
            first = waiter


class TestHandOver:
    """A release hands the key to the first queued writer: how long the key lives,
    and where the entry goes."""

    async def test_a_handed_key_lives_the_entry_ttl_until_the_lease_extends_it(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, node_timeout=CONFIRM) as redlock,
        ):
            held = await holder.lock("handed").acquire()
            waiting = Waiting([redlock])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    leases: list[Lease] = []

                    async def take() -> None:
                        leases.append(await redlock.lock("handed", ttl=30).acquire())

                    tg.start_soon(take)
                    await waiting.reach(1)
                    await held.release()
            await holder.settle()  # handed over on every master (release() returns at a quorum)
            (lease,) = leases
            # the key lives the waiter's entry TTL (3 x (retry_delay + node_timeout): 15.6 s
            # here, against a TTL of 30 s), counted from its last attempt; the lease
            # extends it a third of the way through
            entry = 3 * (0.2 + CONFIRM)
            assert all([0 < await c.pttl("handed") <= entry * 1000 for c in masters.clients])
            assert 0 < lease.validity <= entry
            assert lease.token is not None
            await lease.extend()
            await redlock.settle()  # on every master (extend() returns at a quorum)
            assert lease.validity > 20
            assert all([await c.pttl("handed") > 20_000 for c in masters.clients])
            await lease.release()
            await redlock.settle()
        assert await masters.keys() == [[]] * 5

    async def test_a_handed_key_names_the_waiter_it_was_handed_to(
        self, servers: ServerGroup
    ) -> None:
        async with (
            AsyncRedlock(servers.urls, identity="holder-1") as holder,
            AsyncRedlock(servers.urls, identity="waiter-2", node_timeout=CONFIRM) as redlock,
        ):
            held = await holder.lock("named").acquire()
            waiting = Waiting([redlock])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    leases: list[Lease] = []

                    async def take() -> None:
                        leases.append(await redlock.lock("named").acquire())

                    tg.start_soon(take)
                    await waiting.reach(1)
                    assert (await holder.inspect("named")).identity == "holder-1"
                    await held.release()
            (lease,) = leases
            assert lease.statistics().source == "hand-over"
            assert lease.value.startswith("waiter-2:")
            state = await redlock.inspect("named")
            assert (state.holder, state.identity) == (lease.value, "waiter-2")
            await lease.release()

    async def test_a_lease_handed_over_takes_its_entry_out_with_its_release(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """One master cannot hand the key over (the holder's key there is gone): the
        waiter takes the lease from the other four. Its entry stays listed on all
        five (the masters that handed it the key too) and leaves with its release,
        not with a call of its own right away."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            held = await holder.lock("partly").acquire()
            waiting = Waiting([waiter])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    got: list[Lease] = []

                    async def take() -> None:
                        got.append(await waiter.lock("partly", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waiting.reach(1)
                    await masters.clients[4].delete("partly")  # master 4 has nothing to hand
                    await held.release()
            (lease,) = got
            assert lease.held
            await waiter.settle()
            listed = [len(queue) for queue in await queues(masters, "partly")]
            assert listed == [1, 1, 1, 1, 1]  # handed over on 0-3, queued on 4: listed
            await lease.release()
            await waiter.settle()
            assert await queues(masters, "partly") == [[]] * 5
        assert await masters.keys() == [[]] * 5


@asynccontextmanager
async def waiting_in_line(
    redlock: AsyncRedlock, name: str, **settings: bool
) -> AsyncIterator[tuple[Waiting, list[Lease]]]:
    """An ``acquire()`` of ``name`` by ``redlock`` in a task, once it waits (two
    attempts failed); the block's end waits for it to get the lock (the lease is
    then in the list)."""
    waiting = Waiting([redlock])
    leases: list[Lease] = []
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                leases.append(await redlock.lock(name, timeout=HANG_GUARD, **settings).acquire())

            tg.start_soon(take)
            await waiting.reach(1)
            yield waiting, leases


class TestInLine:
    """A writer queued by a quorum of masters, its inbox heard, waits for the release
    that tells it: its attempts only keep its entry fresh (docs/algorithm.md, waiting
    in line)."""

    async def test_a_waiter_in_line_does_not_poll_at_the_retry_delay(
        self, servers: ServerGroup
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=0.01, node_timeout=CONFIRM) as redlock,
        ):
            held = await holder.lock("inline").acquire()
            async with waiting_in_line(redlock, "inline") as (_, leases):
                # The holder keeps the lock a second: a waiter retrying every 0-10 ms
                # would send about a hundred attempts meanwhile.
                await anyio.sleep(1.0)
                attempts = redlock.statistics().attempts
                await held.release()
            (lease,) = leases
            assert lease.statistics().source == "hand-over"
            # refused without a place in line, refused and queued; then at most one
            # refresh (its entry lives 15.03 s, a handed key 10 s: refreshed every
            # 1.7-3.3 s)
            assert attempts <= 3
            await lease.release()
            await redlock.settle()

    async def test_a_release_announced_by_a_minority_wakes_the_waiter_soon(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A waiter without hand-over terms (its lease does not extend itself) is
        told of a release by an announcement. Heard from fewer than a quorum of
        masters (the others lost the holder's key), it is woken a quarter of a node
        timeout later to try, not at its next refresh (its retry delay and the
        holder's TTL a minute here)."""
        async with (
            AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as redlock,
        ):
            held = await holder.lock("minority").acquire()
            with whole_retry_delay(redlock):
                async with waiting_in_line(redlock, "minority", auto_extend=False) as in_line:
                    for client in masters.clients[2:]:
                        await client.delete("minority")  # gone there, unannounced
                    with pytest.raises(LockNotOwnedError):
                        await held.release()  # announced by masters 0 and 1 only
            waiting, (lease,) = in_line
            assert waiting.woken == 1
            assert lease.statistics().source == "attempt"
            await lease.release()
            await redlock.settle()

    async def test_its_own_undo_does_not_wake_a_waiter_in_line(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Two masters lost the holder's key: they grant the waiter's attempts, whose
        undo there announces the waiter (first in line) to itself. That tells it
        nothing: it stays in line until the release, instead of being woken a quarter
        of a node timeout after each attempt while the holder keeps the lock."""
        async with (
            AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
            AsyncRedlock(servers.urls, node_timeout=CONFIRM) as redlock,
        ):
            held = await holder.lock("own").acquire()
            for client in masters.clients[3:]:
                await client.delete("own")
            async with waiting_in_line(redlock, "own", auto_extend=False) as (_, leases):
                # two nudges' time (its refresh pause is 2.6-5.2 s here)
                await anyio.sleep(2 * CONFIRM / 4)
                woken = redlock.statistics().wakeups
                await held.release()
            assert woken == 0
            (lease,) = leases
            await lease.release()
            await redlock.settle()
