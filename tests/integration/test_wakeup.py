"""Waiters woken by the holder's release, against real servers.

Waiters here get a retry delay of an hour: a waiter that acquires within the hang
guard was woken, not its timer. The counters in ``statistics()`` say by what.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import anyio
import hiredis
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease
from asyncredlock._wire import Stream
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a retry delay no test waits out


class TestWakeUp:
    """A waiter goes when the holder's release is announced, not on its own timer."""

    async def test_a_waiter_acquires_on_release_not_on_its_timer(
        self, servers: ServerGroup
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            lease = await holder.lock("handoff", ttl=60.0).acquire()
            probe = Waits(waiter)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    got: list[int | None] = []

                    async def wait_for_it() -> None:
                        taken = await waiter.lock("handoff", timeout=HANG_GUARD).acquire()
                        got.append(taken.token)
                        await taken.release()

                    tg.start_soon(wait_for_it)
                    await probe.reach(1)
                    await lease.release()
            stats = waiter.statistics()
        assert len(got) == 1
        assert stats.wakeups == 1
        assert stats.notifications >= 3  # every master that deleted the key announced it
        # the first attempt, the one right after subscribing (which queued it on the
        # masters); the release handed it the lock
        assert stats.attempts == 2

    async def test_force_release_wakes_waiters(self, servers: ServerGroup) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            await holder.lock("forced", ttl=60.0, auto_extend=False).acquire()
            probe = Waits(waiter)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter.lock("forced", timeout=HANG_GUARD).acquire)
                    await probe.reach(1)
                    assert await holder.force_release("forced") == 5
            assert waiter.statistics().wakeups == 1

    async def test_an_expiring_lease_is_retried_at_its_ttl_not_the_retry_delay(
        self,
        servers: ServerGroup,
    ) -> None:
        """A holder that dies never announces a release; the waiter's pause is bounded
        by the holder's remaining TTL, as the masters reported it."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            await holder.lock("dies", ttl=0.5, auto_extend=False).acquire()
            with anyio.fail_after(HANG_GUARD):
                lease = await waiter.lock("dies", timeout=HANG_GUARD).acquire()
            stats = waiter.statistics()
            assert lease.held
            assert stats.wakeups == 0
            await lease.release()


class TestSubscriptions:
    """The subscriptions waiters listen through: shared, reopened, closed."""

    async def test_local_waiters_queue_behind_the_one_that_listens(
        self, servers: ServerGroup
    ) -> None:
        """Ten tasks of one process wait for a lock held elsewhere: only the first
        listens and retries; the release wakes it, and the others get the lock from it
        in turn (no timer to save them: a lost wake-up would hang the test)."""
        order: list[int] = []
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as redlock,
        ):
            lease = await holder.lock("queue", ttl=60.0).acquire()
            probe = Waits(redlock)

            async def worker(i: int) -> None:
                async with redlock.lock("queue", timeout=HANG_GUARD):
                    order.append(i)
                    await anyio.sleep(0.001)  # the work

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for i in range(10):
                        tg.start_soon(worker, i)
                    await probe.reach(1)
                    # it listens in its client's inbox: queued on the masters, it is the
                    # one a release names
                    assert client_state(redlock).addressed == 1
                    await lease.release()
            stats = redlock.statistics()
            state = client_state(redlock)
            assert (state.addressed, state.listening, state.slots) == (0, {}, {})
        assert order == list(range(10))
        assert stats.wakeups == 1
        assert (stats.acquisitions, stats.handoffs) == (1, 9)

    @pytest.mark.parametrize("fair", [False, True], ids=["default", "fair"])
    async def test_a_lost_subscription_still_acquires_and_listens_again(
        self, servers: ServerGroup, masters: Masters, fair: bool
    ) -> None:
        """The subscription connections are killed on every master while a waiter
        waits, with no retry timer to save it: the loss wakes it, and so does each
        new subscription once confirmed. The release here comes while nobody
        listens, and it hands the key to the queued waiter, whose announcement is
        lost: the waiter's next attempt finds the key handed to it ("already handed
        to this waiter", with the key's PTTL and fence count) and takes the lease
        from those answers, long before the handed key (its lock's ttl here, an
        hour) would expire."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            lease, handed = await _hand_over_unheard(
                holder, waiter, "killed", masters.clients, fair=fair
            )
            stats = waiter.statistics()
            assert stats.failed_attempts >= 2  # it did wait, and was woken without a timer
            assert handed.statistics().source == "hand-over"
            assert handed.token is not None
            assert lease.token is not None
            assert handed.token > lease.token
            values = [await client.get("killed") for client in masters.clients]
            assert values.count(handed.value.encode()) > len(values) // 2  # a quorum holds it
            await handed.release()
            await waiter.settle()  # release() returns at quorum: the others' replies too
            assert sum([await client.exists("killed") for client in masters.clients]) == 0

    async def test_a_hand_over_found_on_the_slow_masters_is_waited_for(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Four masters (a quorum of three), two of them 20 ms away: the attempt
        after the lost announcement is decided by the two quick ones' refusals
        ("already handed"), before the slow ones say the same. Their replies are
        waited for (they could make the quorum), or the waiter would miss the
        hand-over at every attempt, the quick masters answering first each time."""
        async with (
            FaultProxy("127.0.0.1", servers[2].port) as far,
            FaultProxy("127.0.0.1", servers[3].port) as farther,
        ):
            urls = [*servers.urls[:2], far.url, farther.url]
            async with (
                AsyncRedlock(servers.urls[:4]) as holder,
                # slow, never silent: a busy machine must not turn 20 ms into a skip
                AsyncRedlock(urls, retry_delay=NEVER, node_timeout=5.0) as waiter,
            ):

                def slow_down() -> None:
                    far.delay = farther.delay = 0.02

                _, handed = await _hand_over_unheard(
                    holder, waiter, "slow", masters.clients[:4], then=slow_down
                )
                assert handed.statistics().source == "hand-over"
                await handed.release()

    async def test_a_master_that_stays_down_wakes_its_waiters_once(
        self, make_servers: MakeServers
    ) -> None:
        """A master goes down while a waiter waits: losing its subscription wakes
        the waiter (a release may have gone unheard), but the reconnections that
        fail after it wake nobody, or the waiter would retry at each one (every
        0.2 s) instead of waiting for a release or its retry delay. (Counted by
        events, not by a window: the five failures are counted from the waiter's
        second wait, so a loop too busy to attempt within a second decides nothing.)"""
        group = make_servers(3)
        async with (
            AsyncRedlock(group.urls) as holder,
            AsyncRedlock(group.urls, retry_delay=NEVER) as waiter,
        ):
            probe = Waits(waiter)
            lease = await holder.lock("down", ttl=NEVER).acquire()
            got: list[Lease] = []

            async def wait() -> None:
                got.append(await waiter.lock("down", timeout=HANG_GUARD).acquire())

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await probe.reach(1)
                    # its subscription there confirmed (enroll waits for a quorum only): a
                    # connection lost before that lost nothing, and wakes nobody
                    listener: Any = waiter._core.waker.listeners[2]
                    assert await polled(
                        lambda: listener.connection is not None and listener.connection.subscribed
                    )
                    before = waiter.statistics().attempts
                    group[2].kill()
                    # retry_delay=NEVER: only a wake-up ends the first wait
                    await probe.reach(2)
                    woken = waiter.statistics().attempts - before
                    failures = _FailedReconnections(waiter, 2, count=5)
                    await failures.reached.wait()
                    attempts = waiter.statistics().attempts - before
                    waits = probe.waiting
                    await lease.release()
            assert woken == 1  # woken by the loss
            assert (attempts, waits) == (1, 2)  # and not by any failed reconnection
            assert len(got) == 1  # woken by the release on the other two
            await got[0].release()

    async def test_a_quiet_subscription_pings_and_stays(self, servers: ServerGroup) -> None:
        """Quiet for ``socket_timeout``, a subscription PINGs its master; answered,
        it stays open (a second PING comes after another quiet spell, on the same
        connection)."""
        async with (
            AsyncRedlock(servers.urls[:3]) as holder,
            AsyncRedlock(servers.urls[:3], socket_timeout=0.2) as waiter,
        ):
            await _subscribed(holder, waiter)
            before = _subscriptions(waiter)
            assert await polled(lambda: all(c.heartbeat.pings >= 2 for c in before))
            assert _subscriptions(waiter) == before

    async def test_a_subscription_cut_silently_is_reopened(self, make_servers: MakeServers) -> None:
        """A NAT or load balancer that forgets idle connections cuts the client's
        connections without a word to either end: each subscription's PING goes
        unanswered, and it is dropped and reopened (a release announced meanwhile
        would otherwise go unheard for as long as the client runs)."""
        group = make_servers(3)
        async with contextlib.AsyncExitStack() as stack:
            proxies = [
                await stack.enter_async_context(FaultProxy(server.host, server.port))
                for server in group
            ]
            holder = await stack.enter_async_context(AsyncRedlock(group.urls))
            waiter = await stack.enter_async_context(
                AsyncRedlock([p.url for p in proxies], socket_timeout=0.2)
            )
            await _subscribed(holder, waiter)
            await waiter.settle()  # its release returned at a quorum: one call may be out
            before = _subscriptions(waiter)
            # per master: the command connection and the subscription
            assert [proxy.forget_connections() for proxy in proxies] == [2, 2, 2]
            assert await polled(
                lambda: all(c not in (None, *before) for c in _subscriptions(waiter))
            )
            assert all(c.heartbeat.pings == 1 for c in before)  # one PING, unanswered
            assert [proxy.connections for proxy in proxies] == [3, 3, 3]  # + the new one

    async def test_closing_the_redlock_closes_its_subscriptions(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        direct: Redis = masters.clients[0]
        async with AsyncRedlock(servers.urls) as holder:
            lease = await holder.lock("closing", ttl=60.0).acquire()
            waiter = AsyncRedlock(servers.urls, retry_delay=NEVER)
            probe = Waits(waiter)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    scope = anyio.CancelScope()

                    async def wait() -> None:
                        with scope:
                            await waiter.lock("closing", timeout=HANG_GUARD).acquire()

                    tg.start_soon(wait)
                    await probe.reach(1)
                    clients = await direct.client_list(_type="pubsub")
                    assert len(clients) >= 1
                    scope.cancel()
            await waiter.aclose()
            assert await direct.client_list(_type="pubsub") == []
            await lease.release()

    async def test_a_closed_subscription_is_not_reopened(self, servers: ServerGroup) -> None:
        """aclose() closes the subscriptions one after the other; a waiter that enrolls
        meanwhile (its inbox still confirmed by the others) subscribes on each. A
        closed one must not open a connection again: its confirmation is cancelled."""
        redlock = AsyncRedlock(servers.urls)
        try:
            await (await redlock.lock("reopen").acquire()).release()
            listener: Any = redlock._core.waker.listeners[0]
            probe = listener.subscribe("reopen:probe")  # a subscription open, as a waiter's
            with anyio.fail_after(HANG_GUARD):
                await probe  # confirmed by the master: its connection is open
                assert listener.connection is not None
                await listener.aclose()
                late = listener.subscribe("reopen:late")
                assert late.cancelled()
                assert listener.task is None  # no task, so no connection opened again
        finally:
            await redlock.aclose()

    async def test_a_subscription_renewed_before_its_reply_waits_for_its_own(
        self, servers: ServerGroup
    ) -> None:
        """Subscribe, unsubscribe and subscribe again to one channel before the master's
        first reply is read (a waiter leaving and another enrolling at once): the
        first SUBSCRIBE's reply must not confirm the new subscription, which the master
        may not have made yet (a release published in between would go unheard).
        Only the third reply, the second SUBSCRIBE's, confirms it."""
        redlock = AsyncRedlock(servers.urls)
        try:
            await (await redlock.lock("renew").acquire()).release()
            listener: Any = redlock._core.waker.listeners[0]
            with anyio.fail_after(HANG_GUARD):
                await listener.subscribe("renew:open")  # the connection open
                connection = listener.connection
                held = _Held()  # the master's replies held back, as by a slow network
                deliver, connection.data_received = connection.data_received, held
                # uvloop binds data_received when the protocol is set: set it again
                connection.transport.set_protocol(connection)
                listener.subscribe("renew:ch")
                listener.unsubscribe("renew:ch")
                renewed = listener.subscribe("renew:ch")
                await held.complete.wait()  # all three answered by the master
                counted, read, confirmed_at = hiredis.Reader(), 0, None
                for i in range(len(held.data)):  # then read, one byte at a time
                    deliver(bytes(held.data[i : i + 1]))
                    counted.feed(bytes(held.data[i : i + 1]))
                    while counted.gets() is not False:
                        read += 1
                    if renewed.done():
                        confirmed_at = read
                        break
                assert confirmed_at == 3
        finally:
            await redlock.aclose()


class _Held:
    """Takes a subscription's incoming bytes instead of it; `complete` is set once
    they hold three replies."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.reader = hiredis.Reader()
        self.replies = 0
        self.complete = anyio.Event()

    def __call__(self, data: bytes) -> None:
        self.data += data
        self.reader.feed(data)
        while self.reader.gets() is not False:
            self.replies += 1
        if self.replies >= 3:
            self.complete.set()


class _FailedReconnections:
    """Counts the failed connection attempts of ``redlock``'s subscription to
    master ``index``; `reached` is set once ``count`` of them failed."""

    def __init__(self, redlock: AsyncRedlock, index: int, *, count: int) -> None:
        listener: Any = redlock._core.waker.listeners[index]
        self.opener, listener.opener = listener.opener, self
        self.left = count
        self.reached = anyio.Event()

    async def __call__(self, protocol: Stream) -> None:
        try:
            await self.opener(protocol)
        except Exception:
            self.left -= 1
            if self.left == 0:
                self.reached.set()
            raise


async def _hand_over_unheard(
    holder: AsyncRedlock,
    waiter: AsyncRedlock,
    name: str,
    clients: list[Redis],
    *,
    fair: bool = False,
    then: Callable[[], object] = lambda: None,
) -> tuple[Lease, Lease]:
    """``holder`` holds ``name``; a task of ``waiter`` (whose lock would live an
    hour) waits for it until refused once; ``then()``; the subscriptions are killed
    on the masters of ``clients``, and the release comes while nobody listens, so
    the hand-over's announcement is lost. The holder's lease and the waiter's."""
    probe = Waits(waiter)
    lease = await holder.lock(name, ttl=60.0).acquire()
    got: list[Lease] = []

    async def wait() -> None:
        lock = waiter.lock(name, ttl=NEVER, timeout=HANG_GUARD, fair=fair)
        got.append(await lock.acquire())

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await probe.reach(1)
            then()
            for client in clients:
                await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await lease.release()
        assert waiter.statistics().held == 1
    assert len(got) == 1
    return lease, got[0]


async def _subscribed(holder: AsyncRedlock, waiter: AsyncRedlock) -> None:
    """Make ``waiter`` subscribe on every master: it waits for ``holder``'s release
    once (its inbox then stays subscribed until it is closed)."""
    probe = Waits(waiter)
    lease = await holder.lock("subscribe", ttl=NEVER).acquire()
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                taken = await waiter.lock("subscribe", timeout=HANG_GUARD).acquire()
                await taken.release()

            tg.start_soon(wait)
            await probe.reach(1)
            await lease.release()
    assert client_state(waiter).subscribed == (True,) * len(client_state(waiter).subscribed)


def _subscriptions(redlock: AsyncRedlock) -> list[Any]:
    """The subscription connection of each master (None while reconnecting)."""
    return [
        None if listener is None else listener.connection
        for listener in redlock._core.waker.listeners
    ]
