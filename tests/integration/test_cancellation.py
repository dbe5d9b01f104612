"""Cancellation at any point, and what it must leave behind: no key on the masters,
no queue entry, no task, no extra connection, and no caller stranded.

Storms cancel hundreds of acquisitions and blocks at random points; the other tests
cancel one acquisition, block or waiter at a chosen point."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import ServerGroup, Waits, client_state, deafened, hold_calls

from .conftest import Masters, Queue, Waiting, clients, library_tasks, queues
from .test_rwlock_model import MODES

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
# Waiters that must not try again on their own within a test: only a wake-up moves them.
PATIENT = 60.0
NEVER = 3600.0  # a retry delay no test waits out
# A node timeout that only bounds a wait for the masters (a subscription's
# confirmation): long enough for a loaded machine, never waited out when all is well.
CONFIRM_GUARD = 5.0


class TestStorms:
    """Hundreds of acquisitions and blocks cancelled at random points."""

    async def test_cancellation_storm_leaves_nothing_behind(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        rng = random.Random(20261123)
        names = [f"storm:{i}" for i in range(64)]
        # Two clients, as two processes would be: tasks of one client queue for a
        # name locally, so only between clients do attempts meet a held lock on
        # the masters and waiters subscribe.
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as first,
            AsyncRedlock(servers.urls, retry_delay=0.02) as second,
        ):
            redlocks = (first, second)
            for redlock in redlocks:
                await _warm_up(redlock, 50)

            async def one(i: int) -> None:
                # A third unfenced: one round per attempt, so that even on a loaded
                # machine some acquisitions finish and their leases get cancelled.
                redlock = redlocks[i % 2]
                lock = redlock.lock(rng.choice(names), ttl=2.0, timeout=5.0, fencing=i % 3 != 0)
                with anyio.move_on_after(rng.uniform(0, 0.3)):
                    if i % 3 == 0:
                        lease = await lock.acquire()
                        try:
                            await anyio.sleep(rng.uniform(0, 0.01))
                        finally:
                            await lease.release()  # cancel-safe: goes on shielded
                    else:
                        async with lock:
                            await anyio.sleep(rng.uniform(0, 0.01))

            # Five waves of 100: a wave of 500 would spend its first 0.5 s of
            # client CPU sending, and every cancellation would land in round one.
            await _waves(one, 5, 100)
            for redlock in redlocks:
                await redlock.settle()
            stats = [redlock.statistics() for redlock in redlocks]
            # one command connection per master, opened once for the whole storm
            opened = [list(client_state(r).connections) for r in redlocks]
            # the one standing subscription per master that waiters listen through
            listening = [[int(up) for up in client_state(r).subscribed] for r in redlocks]
            gates = [client_state(r).slots for r in redlocks]
            running = [t for t in library_tasks() if not _is_listener(t)]
        assert library_tasks() == []  # after aclose()
        assert [1] * 5 in listening  # contention between the clients: waiters subscribed
        assert sum(s.attempts for s in stats) > 100  # the warm-up, then first in line
        assert sum(s.acquisitions + s.handoffs for s in stats) > 100  # leases cancelled
        assert sum(s.failed_attempts for s in stats) > 0  # and contended attempts
        assert [s.timeouts for s in stats] == [0, 0]  # each acquire() cancelled or leased
        assert gates == [{}, {}]  # no task left queued or holding a slot
        assert [(s.held, s.in_flight, s.background_tasks) for s in stats] == [(0, 0, 0)] * 2
        assert opened == [[1] * 5] * 2
        assert running == []
        assert await masters.keys() == [[]] * 5

    async def test_1000_cancelled_acquisitions_across_3_clients_leave_nothing(
        self, servers: ServerGroup
    ) -> None:
        rng = random.Random(1000)
        names = [f"storm3:{i}" for i in range(8)]
        async with (
            AsyncRedlock(servers.urls, ttl=2.0) as a,
            AsyncRedlock(servers.urls, ttl=2.0) as b,
            AsyncRedlock(servers.urls, ttl=2.0) as c,
        ):
            redlocks = (a, b, c)

            async def one(i: int) -> None:
                redlock = redlocks[i % 3]
                lock = redlock.lock(rng.choice(names), timeout=5.0, fencing=i % 4 != 0)
                with anyio.move_on_after(rng.uniform(0, 0.2)):
                    if i % 2:
                        async with lock:
                            await anyio.sleep(rng.uniform(0, 0.005))
                    else:
                        lease = await lock.acquire()
                        try:
                            await anyio.sleep(rng.uniform(0, 0.005))
                        finally:
                            await lease.release()

            with anyio.fail_after(HANG_GUARD):
                await _waves(one, 5, 200)  # waves of 200: every round is not the first
                for redlock in redlocks:
                    await redlock.settle()
            stats = [redlock.statistics() for redlock in redlocks]
            opened = [list(client_state(r).connections) for r in redlocks]
            gates = [client_state(r).slots for r in redlocks]
        assert sum(s.acquisitions + s.handoffs for s in stats) > 0
        assert sum(s.timeouts for s in stats) == 0  # each acquire() cancelled or leased
        assert [(s.held, s.in_flight, s.background_tasks) for s in stats] == [(0, 0, 0)] * 3
        assert opened == [[1] * 5] * 3  # no connection lost or reopened
        assert gates == [{}, {}, {}]
        assert library_tasks() == []
        masters = Masters(servers.urls)
        try:
            assert await masters.keys() == [[]] * 5
        finally:
            await masters.aclose()

    @pytest.mark.parametrize("mode", list(MODES), ids=list(MODES))
    async def test_cancellation_storm_over_reads_and_writes_leaves_nothing(
        self, servers: ServerGroup, masters: Masters, mode: str
    ) -> None:
        rng = random.Random(mode)
        names = [f"rw:{i}" for i in range(8)]
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as first,
            AsyncRedlock(servers.urls, retry_delay=0.02) as second,
        ):
            pair = (first, second)
            held = 0
            for client in pair:
                await _warm_up(client, 40)

            async def one(i: int) -> None:
                nonlocal held
                rw = pair[i % 2].rwlock(rng.choice(names), **MODES[mode])
                lock = rw.read(ttl=2.0, timeout=5.0) if i % 3 else rw.write(ttl=2.0, timeout=5.0)
                with anyio.move_on_after(rng.uniform(0, 0.3)):
                    async with lock:
                        held += 1
                        await anyio.sleep(rng.uniform(0, 0.01))

            await _waves(one, 3, 80)
            for client in pair:
                await client.settle()
            stats = [client.statistics() for client in pair]
            gates = [client_state(client).slots for client in pair]
        assert held > 0  # some cancellations hit held leases
        assert sum(s.failed_attempts for s in stats) > 0  # and some hit waiting ones
        assert gates == [{}, {}]
        assert [(s.held, s.in_flight, s.background_tasks) for s in stats] == [(0, 0, 0)] * 2
        assert library_tasks() == []
        assert await masters.keys() == [[]] * 5  # no reader entry, writer key or queue entry

    async def test_cancelled_set_acquisitions_leave_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        rng = random.Random(7)
        async with AsyncRedlock(servers.urls, retry_delay=0.02) as redlock:

            async def one(_: int) -> None:
                names = rng.sample(["m1", "m2", "m3", "m4"], 2)
                with anyio.move_on_after(rng.uniform(0, 0.2)):
                    async with redlock.lock(names, ttl=2.0, timeout=5.0):
                        await anyio.sleep(rng.uniform(0, 0.01))

            await _waves(one, 3, 60)
            await redlock.settle()
            stats = redlock.statistics()
            assert (stats.held, stats.background_tasks, stats.in_flight) == (0, 0, 0)
            state = client_state(redlock)
            assert (state.slots, state.listening) == ({}, {})
        assert await masters.keys() == [[]] * 5


class TestCancelledAcquire:
    """One acquire() cancelled at a chosen point."""

    @pytest.mark.parametrize("how", ["asyncio.timeout", "anyio.fail_after"])
    async def test_timeout_from_outside_cleans_up_like_the_timeout_argument(
        self, servers: ServerGroup, masters: Masters, how: str
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as waiter:
            lease = await holder.lock("outside").acquire()
            with pytest.raises(TimeoutError):
                if how == "asyncio.timeout":
                    async with asyncio.timeout(0.3):
                        await waiter.lock("outside", timeout=30).acquire()
                else:
                    with anyio.fail_after(0.3):
                        await waiter.lock("outside", timeout=30).acquire()
            await waiter.settle()
            assert waiter.statistics().attempts >= 1
            assert waiter.statistics().held == 0
            keys = await masters.keys()
            assert keys == [[b"outside"]] * 5
            await lease.release()

    async def test_cancel_after_the_first_phase_leaves_nothing_that_blocks(
        self,
        servers: ServerGroup,
        masters: Masters,
    ) -> None:
        """Commits are held back until the acquirer is cancelled, then let through:
        the lock key is undone, the late commits change nothing, the next acquirer
        gets the lock at once with a larger token."""
        async with (
            AsyncRedlock(servers.urls) as redlock,
            AsyncRedlock(servers.urls) as other,
        ):
            previous = await other.lock("phases").acquire()
            await previous.release()
            await other.settle()
            await masters.skew_fences("phases")  # so that the commit round runs
            with hold_calls(redlock, "commit") as commits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(redlock.lock("phases").acquire)
                    await commits.reached.wait()  # the first phase won; a commit is due
                    assert await masters.holding("phases") >= 3
                    tg.cancel_scope.cancel()
                commits.let_go()
                await redlock.settle()
            assert await masters.keys() == [[]] * 5
            assert redlock.statistics().held == 0
            nxt = await other.lock("phases", timeout=0).acquire()
            await other.settle()
            assert previous.token is not None
            assert nxt.token is not None
            assert nxt.token > previous.token
            assert (await masters.fences("phases")).count(nxt.token) >= 3
            await nxt.release()


class TestCancelledBlock:
    """An async with block cancelled while it holds the lease."""

    async def test_cancelled_block_releases_its_lease(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            entered = anyio.Event()

            async def hold() -> None:
                async with redlock.lock("cancelled"):
                    entered.set()
                    await anyio.sleep_forever()

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await entered.wait()
                tg.cancel_scope.cancel()
            await redlock.settle()
            assert redlock.statistics().held == 0
        assert await masters.keys() == [[]] * 5


class TestCancelledWaiter:
    """A waiter cancelled in a queue: in the process, or on the masters."""

    async def test_a_waiter_cancelled_as_it_is_handed_the_lease_passes_it_on(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            lock = redlock.lock("handed", timeout=HANG_GUARD)
            first = await lock.acquire()
            doomed = asyncio.create_task(lock.acquire())
            await queue.reach(1)
            patient = asyncio.create_task(lock.acquire())
            await queue.reach(2)
            await first.release()  # hands the lease to doomed, which has not run yet:
            doomed.cancel()  # cancelled now, it must pass the lease on
            with anyio.fail_after(HANG_GUARD):
                lease = await patient
            with pytest.raises(asyncio.CancelledError):
                await doomed
            assert lease.held
            # passed to doomed, then from it to patient: one task took a passed lease
            assert redlock.statistics().handoffs == 1
            assert first.token is not None
            assert lease.token == first.token + 2  # each passing takes a token of the block
            await lease.release()
            await redlock.settle()
            stats = redlock.statistics()
            assert (stats.held, stats.background_tasks) == (0, 0)
            assert client_state(redlock).slots == {}
            assert await masters.keys() == [[]] * 5

    async def test_a_cancelled_waiter_passes_its_turn_to_the_next_in_line(
        self, servers: ServerGroup
    ) -> None:
        # A loaded machine may take longer than the default node_timeout to confirm
        # the subscriptions (enroll waits for them to confirm); the patient waiter's
        # wake-up would then be lost, and with retry_delay=NEVER it would sleep out
        # the doomed attempt's TTL.
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER, node_timeout=5.0) as waiter,
        ):
            lease = await holder.lock("cancelled", ttl=60.0).acquire()
            probe = Waits(waiter)
            queue = Queue(waiter)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    first = anyio.CancelScope()

                    async def doomed() -> None:
                        with first:
                            await waiter.lock("cancelled", timeout=HANG_GUARD).acquire()

                    got: list[bool] = []

                    async def patient() -> None:
                        taken = await waiter.lock("cancelled", timeout=HANG_GUARD).acquire()
                        got.append(taken.held)
                        await taken.release()

                    tg.start_soon(doomed)
                    await probe.reach(1)  # doomed listens for the release
                    tg.start_soon(patient)
                    await queue.reach(1)  # patient waits behind it
                    assert client_state(waiter).addressed == 1
                    # Doomed, the one listening, is cancelled: it gives its turn to patient
                    # as it leaves. (Cancelled after the release instead, it may already
                    # hold the lease: the release hands it the key, and acquire() returns
                    # with no call to the masters left to cancel.)
                    first.cancel()
                    await lease.release()
            assert got == [True]
            state = client_state(waiter)
            assert (state.addressed, state.listening, state.slots) == (0, {}, {})

    async def test_a_cancelled_waiter_leaves_the_line_and_the_next_goes(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        order: list[str] = []
        async with (
            AsyncRedlock(servers.urls) as holder,
            clients(servers.urls, 2, retry_delay=PATIENT) as (first, second),
        ):
            held = await holder.lock("leave").acquire()
            waiting = Waiting([first, second])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    doomed = anyio.CancelScope()

                    async def cancelled() -> None:
                        with doomed:
                            await first.lock("leave", timeout=HANG_GUARD).acquire()
                            order.append("first")

                    tg.start_soon(cancelled)
                    await waiting.reach(1)

                    async def take() -> None:
                        async with second.lock("leave", timeout=HANG_GUARD):
                            order.append("second")

                    tg.start_soon(take)
                    await waiting.reach(2)
                    doomed.cancel()
                    await first.settle()  # its dequeue reached every master
                    assert [len(q) for q in await queues(masters, "leave")] == [1] * 5
                    await held.release()
            await second.settle()
        assert order == ["second"]
        assert await masters.keys() == [[]] * 5

    async def test_a_waiter_cancelled_after_it_was_handed_the_key_gives_it_back(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The masters hand the key over while the waiter is being cancelled (here: its
        inbox misses the news): leaving, it deletes the key it was handed, and the next
        waiter goes at once, not when the handed key expires.

        A waiter leaves hand-over terms with the masters only once its inbox
        subscription is confirmed, which its client awaits for up to ``node_timeout``
        (0.1 s by default) the first time: on a loaded machine, a fresh client missed
        that, queued without terms, and the release announced instead of handing the
        key over. Hence a wider ``node_timeout`` here (awaited only until confirmed)."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            clients(servers.urls, 2, retry_delay=PATIENT, node_timeout=CONFIRM_GUARD) as (
                deaf,
                next_one,
            ),
        ):
            held = await holder.lock("giveback").acquire()
            waiting = Waiting([deaf, next_one])
            order: list[str] = []
            with deafened(deaf), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    doomed = anyio.CancelScope()

                    async def cancelled() -> None:
                        with doomed:
                            await deaf.lock("giveback", timeout=HANG_GUARD).acquire()
                            order.append("deaf")

                    async def take() -> None:
                        async with next_one.lock("giveback", timeout=HANG_GUARD):
                            order.append("next")

                    tg.start_soon(cancelled)
                    await waiting.reach(1)
                    tg.start_soon(take)
                    await waiting.reach(2)
                    await held.release()  # hands the key to the deaf waiter
                    await holder.settle()  # on every master (release() returns at a quorum)
                    handed = [await c.get("giveback") for c in masters.clients]
                    assert len(set(handed)) == 1
                    assert handed[0] is not None
                    doomed.cancel()
            await deaf.settle()
            await next_one.settle()
        assert order == ["next"]
        assert await masters.keys() == [[]] * 5

    async def test_cancelled_and_timed_out_waiters_leave_no_queue_entry(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=0.05, node_timeout=0.1) as redlock,
        ):
            held = await holder.lock("crowd").acquire()
            waiting = Waiting([redlock])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for _ in range(5):
                        tg.start_soon(redlock.lock("crowd", timeout=HANG_GUARD, fair=True).acquire)
                    await waiting.reach(5)
                    assert [await c.zcard("{crowd}:queue") for c in masters.clients] == [5] * 5
                    # the queue keys expire with their latest entry, should all waiters die
                    entry_ms = 1000 * max(1.0, 3 * (0.05 + 0.1))  # 3 x (retry_delay + node_timeout)
                    for c in masters.clients:
                        for key in ("{crowd}:queue", "{crowd}:queue:expiry"):
                            assert 0 < await c.pttl(key) <= entry_ms
                    tg.cancel_scope.cancel()
                with pytest.raises(LockTimeoutError):
                    await redlock.lock("crowd", timeout=0.1, fair=True).acquire()
            await redlock.settle()
            assert await masters.keys() == [[b"crowd"]] * 5  # the holder's key, no queue
            await held.release()


async def _waves(one: Callable[[int], Awaitable[None]], waves: int, size: int) -> None:
    """``waves`` waves of ``size`` concurrent ``one(i)``, numbered across the waves;
    each wave ends before the next starts."""
    for wave in range(waves):
        async with anyio.create_task_group() as tg:
            for i in range(size):
                tg.start_soon(one, wave * size + i)


def _is_listener(task: asyncio.Task[object]) -> bool:
    return getattr(task.get_coro(), "__qualname__", "") == "Listener._run"


async def _warm_up(redlock: AsyncRedlock, n: int) -> None:
    """Open connections first, so the storm is not all spent connecting."""

    async def cycle(i: int) -> None:
        lease = await redlock.lock(f"warm:{i}", auto_extend=False).acquire()
        await lease.release()

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(cycle, i)
