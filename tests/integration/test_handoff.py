"""Tasks of one AsyncRedlock that want the same key: a queue in arrival order, and
leases passed from one task to the next without calls to the masters."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import pytest

from asyncredlock import AsyncRedlock, Lease, Lock, LockLostError, LockTimeoutError
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock.testing import ServerGroup, client_state

from .conftest import Masters, Queue

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome

T = TypeVar("T")


async def queue_behind(
    redlock: AsyncRedlock,
    queue: Queue,
    tg: anyio.abc.TaskGroup,
    name: str,
    count: int,
    record: list[Lease],
    **options: Any,
) -> None:
    """Start ``count`` tasks that each take ``name`` once (recording their lease
    in arrival order) and release it; return once all of them queued."""
    lock = redlock.lock(name, timeout=HANG_GUARD, **options)
    base = queue.queued

    async def take() -> None:
        lease = await lock.acquire()
        record.append(lease)
        await lease.release()

    for _ in range(count):
        tg.start_soon(take)
    await queue.reach(base + count)


class TestPassingOn:
    """A released lease goes to the next task with no call to the masters, when it fits."""

    async def test_waiters_get_the_lease_in_arrival_order_with_no_call_to_the_masters(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        leases: list[Lease] = []
        async with AsyncRedlock(servers.urls) as redlock, AsyncRedlock(servers.urls) as other:
            queue = Queue(redlock)
            first = await redlock.lock("relay").acquire()
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    await queue_behind(redlock, queue, tg, "relay", 5, leases)
                    before = redlock.statistics()
                    await first.release()
            stats = redlock.statistics()
            after = await other.lock("relay", timeout=0).acquire()
            await after.release()
            await redlock.settle()
            assert await masters.keys() == [[]] * 5
        assert (before.attempts, before.releases) == (1, 0)
        assert (stats.attempts, stats.acquisitions, stats.handoffs, stats.releases) == (1, 1, 5, 1)
        assert [lease.value for lease in leases] == [first.value] * 5  # the same key, passed on
        tokens = [first.token, *(lease.token for lease in leases)]
        assert first.token is not None
        assert tokens == list(range(first.token, first.token + 6))
        assert after.token is not None
        assert after.token >= first.token + TOKEN_BLOCK  # past the whole block

    async def test_a_chain_goes_back_to_the_masters_when_its_tokens_run_out(
        self,
        servers: ServerGroup,
    ) -> None:
        leases: list[Lease] = []
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            first = await redlock.lock("long chain").acquire()
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    await queue_behind(redlock, queue, tg, "long chain", TOKEN_BLOCK + 5, leases)
                    await first.release()
            stats = redlock.statistics()
        # 70 holds: the first acquisition passed on 63 times, the second 5 times
        assert (stats.acquisitions, stats.handoffs) == (2, (TOKEN_BLOCK - 1) + 5)
        tokens = [first.token, *(lease.token for lease in leases)]
        assert all(isinstance(token, int) for token in tokens)
        assert tokens == sorted(set(tokens))  # strictly increasing, in holding order
        second = leases[TOKEN_BLOCK - 1]  # the first lease of the second acquisition
        assert second.value != first.value
        assert first.token is not None
        assert second.token is not None
        assert second.token >= first.token + TOKEN_BLOCK

    @pytest.mark.parametrize(
        ("holder", "waiter"),
        [
            pytest.param({}, {"auto_extend": False}, id="waiter does not extend its leases"),
            pytest.param({"ttl": 1.0}, {"ttl": 10.0}, id="less than half the waiter's ttl left"),
            pytest.param({"fencing": False}, {}, id="fenced waiter, unfenced lease"),
        ],
    )
    async def test_a_lease_that_does_not_fit_the_waiter_is_released_and_taken_anew(
        self,
        servers: ServerGroup,
        holder: dict[str, Any],
        waiter: dict[str, Any],
    ) -> None:
        leases: list[Lease] = []
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            first = await redlock.lock("misfit", **holder).acquire()
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    await queue_behind(redlock, queue, tg, "misfit", 1, leases, **waiter)
                    await first.release()
            stats = redlock.statistics()
        assert (stats.acquisitions, stats.handoffs, stats.releases) == (2, 0, 2)
        assert leases[0].value != first.value
        assert (leases[0].token is None) == (waiter.get("fencing") is False)

    async def test_an_unfenced_waiter_in_a_fenced_chain_gets_no_token_and_skips_none(
        self,
        servers: ServerGroup,
    ) -> None:
        leases: list[Lease] = []
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            first = await redlock.lock("mixed").acquire()
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    await queue_behind(redlock, queue, tg, "mixed", 1, leases, fencing=False)
                    await queue_behind(redlock, queue, tg, "mixed", 1, leases)
                    await first.release()
            assert redlock.statistics().handoffs == 2
        assert first.token is not None
        assert [lease.token for lease in leases] == [None, first.token + 2]


class TestLeavingTheQueue:
    """Tasks that give up, leases that run out or are forced free: the queue goes on."""

    async def test_a_waiter_that_gives_up_in_the_queue_gets_a_timeout(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            lease = await redlock.lock("busy").acquire()
            with pytest.raises(LockTimeoutError, match="held by another task of this AsyncRedlock"):
                await redlock.lock("busy", timeout=0).acquire()  # no attempt: it is held here
            with pytest.raises(LockTimeoutError, match=r"within 0\.05 s: held by another task"):
                await redlock.lock("busy", timeout=0.05).acquire()
            stats = redlock.statistics()
            assert queue.queued == 1  # timeout=0 did not even queue
            assert (stats.attempts, stats.timeouts) == (1, 2)
            assert client_state(redlock).slots == {"busy": 0}  # nobody queued behind it
            await lease.release()
            assert client_state(redlock).slots == {}
            await redlock.settle()
            assert await masters.keys() == [[]] * 5

    async def test_a_lease_that_runs_out_unreleased_lets_the_next_task_acquire(
        self,
        servers: ServerGroup,
    ) -> None:
        """A lease that does not extend itself is never told that it ran out; the
        task queued behind it takes the slot back when its validity ends."""
        async with AsyncRedlock(servers.urls) as redlock:
            forgotten = await redlock.lock("forgotten", ttl=0.3, auto_extend=False).acquire()
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("forgotten", timeout=HANG_GUARD).acquire()
            assert forgotten.validity == 0
            assert lease.value != forgotten.value
            assert redlock.statistics().handoffs == 0
            await lease.release()

    async def test_a_lease_that_ran_out_unreleased_does_not_refuse_one_attempt(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A lease that does not extend itself and ran out holds nothing: a later
        ``timeout=0`` acquire() of the same client makes its one attempt on the
        masters. Before, it raised "held by another task of this AsyncRedlock" at
        once (only a task queued with a timeout looked at the holder's validity),
        though the key was gone from every master."""
        now = [1000.0]  # this client's clock, moved by the test
        async with (
            AsyncRedlock(servers.urls, clock=lambda: now[0]) as redlock,
            AsyncRedlock(servers.urls) as other,
        ):
            stale = await redlock.lock("expiring", ttl=0.3, auto_extend=False).acquire()
            await redlock.settle()
            now[0] += 1.0  # its validity runs out ...
            for client in masters.clients:  # ... and its key expires on the masters
                await client.delete(stale.key)
            assert stale.validity == 0
            # another client takes (and gives back) the free lock with one attempt
            lease = await other.lock("expiring", timeout=0).acquire()
            await lease.release()
            # this client too: the lock is free everywhere
            mine = await redlock.lock("expiring", timeout=0).acquire()
            assert client_state(redlock).slots == {"expiring": 0}  # the new lease's
            await mine.release()
            assert client_state(redlock).slots == {}

    @pytest.mark.parametrize("patience", [math.inf, HANG_GUARD])
    async def test_a_task_queued_while_the_slot_was_acquiring_sees_the_lease_run_out(
        self, servers: ServerGroup, patience: float
    ) -> None:
        """A task that queued while the slot's task was still acquiring waited with
        no limit but its own timeout (there was no holder's validity to wait for);
        the lease that task then got, not extending itself and never released,
        woke nobody when it came to hold the slot. The waiter took the slot only
        at its timeout (with ``math.inf``: never), though the lock was free once
        that lease ran out. Now `Gates.hold` wakes the waiters to wait for the new
        holder's validity."""
        async with AsyncRedlock(servers.urls) as redlock:
            events: list[str] = []
            redlock._core.watchers.append(events.append)
            leases: dict[str, Lease] = {}

            async def forget() -> None:  # takes the lock and never releases it
                lock = redlock.lock("forgotten-late", ttl=0.3, auto_extend=False)
                leases["forgotten"] = await lock.acquire()
                events.append("first acquired")

            async def wait_behind() -> None:
                lock = redlock.lock("forgotten-late", timeout=patience)
                leases["next"] = await lock.acquire()

            with anyio.fail_after(HANG_GUARD * 2):  # only a hang (or the bug) trips it
                async with anyio.create_task_group() as tg:
                    tg.start_soon(forget)
                    await anyio.lowlevel.checkpoint()  # forget() holds the slot, acquiring
                    tg.start_soon(wait_behind)
            assert events.index("queued") < events.index("first acquired")
            assert leases["forgotten"].validity == 0
            assert leases["next"].value != leases["forgotten"].value
            assert redlock.statistics().handoffs == 0
            await leases["next"].release()

    async def test_the_tasks_behind_a_lease_that_runs_out_unreleased_take_the_slot(
        self, servers: ServerGroup
    ) -> None:
        """A released lease gives the slot to the first waiter, whose lease does not
        extend itself and is never released; the second waiter, asleep until the
        released lease's validity would have ended (far off), is woken when the
        new lease comes to hold the slot, and takes the slot once that lease ran
        out (before, it slept to its timeout)."""
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            leases: dict[str, Lease] = {}

            async def take(label: str, **options: Any) -> None:
                lock = redlock.lock("relay-late", timeout=HANG_GUARD, **options)
                leases[label] = await lock.acquire()

            with anyio.fail_after(HANG_GUARD * 2):  # only a hang (or the bug) trips it
                # not due for an extension before the hang guard
                first = await redlock.lock("relay-late", ttl=HANG_GUARD * 10).acquire()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(take, "forgotten", ttl=0.3, auto_extend=False))
                    await queue.reach(1)
                    tg.start_soon(take, "next")
                    await queue.reach(2)
                    await first.release()  # no hand-off: the first waiter's lease
            assert leases["forgotten"].validity == 0  # taken from the masters, forgotten
            assert leases["next"].value not in (first.value, leases["forgotten"].value)
            assert redlock.statistics().handoffs == 0
            await leases["next"].release()

    async def test_force_release_in_the_same_process_ends_its_leases_and_serves_the_queue(
        self,
        servers: ServerGroup,
    ) -> None:
        leases: list[Lease] = []
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            entered = anyio.Event()
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def stuck() -> None:
                        with pytest.raises(LockLostError):
                            # not due for an extension before the hang guard
                            async with redlock.lock("stuck", ttl=HANG_GUARD * 10):
                                entered.set()
                                await anyio.sleep_forever()

                    tg.start_soon(stuck)
                    await entered.wait()
                    await queue_behind(redlock, queue, tg, "stuck", 1, leases)
                    assert await redlock.force_release("stuck") == 5
            stats = redlock.statistics()
        assert (stats.lost, stats.acquisitions, stats.handoffs) == (1, 2, 0)
        assert len(leases) == 1  # the queued task acquired on the masters


class TestPassedOnAsItCloses:
    """A lease passed to a waiting task, and aclose() (or a loss) before that task
    runs: the new lease ends lost, released on the masters, while its task has not
    entered its block, so nothing would cancel that block."""

    async def test_the_block_is_not_entered(self, servers: ServerGroup) -> None:
        entered: list[Lease] = []
        errors: list[BaseException] = []
        redlock = AsyncRedlock(servers.urls)

        async def waiter(lock: Lock) -> None:
            try:
                async with lock as lease:
                    entered.append(lease)
            except Exception as exc:
                errors.append(exc)

        try:
            with anyio.fail_after(HANG_GUARD):
                task = await passed_on(redlock, "closing", waiter)
                await redlock.aclose()  # the waiter's task has not run since
                await task
        finally:
            await redlock.aclose()
        assert entered == []  # its body never ran on a lease the masters no longer hold
        (error,) = errors
        assert isinstance(error, RuntimeError)
        assert "closed while acquire() waited" in str(error)

    async def test_a_waiting_acquire_ends_with_the_closing_error(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        redlock = AsyncRedlock(servers.urls)
        try:
            with anyio.fail_after(HANG_GUARD):
                task = await passed_on(redlock, "closing", lambda lock: lock.acquire())
                await redlock.aclose()
                with pytest.raises(RuntimeError, match=r"closed while acquire\(\) waited"):
                    await task
        finally:
            await redlock.aclose()
        assert await masters.holding("closing") == 0

    async def test_a_passed_lease_lost_before_its_task_ran_is_acquired_again(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The same moment with a loss instead of aclose() (a failed extension, a
        max_hold bound or force_release() could bring it then; made at once here):
        the waiting task does not get the lost lease, it acquires on the masters; the
        lease no task took counts as neither a hand-off nor a loss."""
        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                task = await passed_on(redlock, "relost", lambda lock: lock.acquire())
                (passed,) = redlock._core.held  # the lease passed on, its task not run yet
                passed._lose(None, "lost before its task ran")
                lease = await task
            assert lease is not passed
            assert (lease.held, lease.statistics().source) == (True, "attempt")
            await redlock.settle()  # the masters beyond the quorum have answered too
            assert await masters.holding("relost") == 5
            await lease.release()
            stats = redlock.statistics()
        # two holds: the first lease's and the one acquired anew, not the passed one
        assert (stats.handoffs, stats.lost, stats.hold.count) == (0, 0, 2)


async def passed_on(
    redlock: AsyncRedlock, name: str, waiting: Callable[[Lock], Coroutine[Any, Any, T]]
) -> asyncio.Task[T]:
    """A task of ``redlock`` running ``waiting(lock)``, queued behind a lease of
    ``name`` that is then released: passed on to it, its task not run since."""
    queue, lock = Queue(redlock), redlock.lock(name, timeout=HANG_GUARD)
    first = await lock.acquire()
    task = asyncio.get_running_loop().create_task(waiting(lock))
    await queue.reach(1)
    await first.release()  # passed on at once, no await inside
    assert (first.held, redlock.statistics().held) == (False, 1)  # the task's, untaken
    return task


class TestPassedToACancelledTask:
    async def test_is_neither_a_hand_off_nor_a_hold(self, servers: ServerGroup) -> None:
        """The task a lease was passed to is cancelled before it runs: it passes the
        lease on (here released, nobody else waits), which counts no hand-off and
        no hold: one lease was held, the first."""

        async def waiter(lock: Lock) -> None:
            async with lock:
                pytest.fail("the task was cancelled before it ran")

        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                task = await passed_on(redlock, "cancelled", waiter)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await redlock.settle()
            stats = redlock.statistics()
            assert (stats.handoffs, stats.hold.count, stats.held) == (0, 1, 0)
            assert redlock.resource_statistics()["cancelled"].hold.count == 1

    async def test_released_and_found_gone_is_no_loss(
        self, servers: ServerGroup, masters: Masters, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The key vanished from the masters (expired, evicted, deleted by an
        operator) before the release that passed the lease on; the task is cancelled
        before it runs, and the lease, released in the background, is found gone:
        nobody's loss (no count, no warning), as for a lease lost before its task ran."""

        async def waiter(lock: Lock) -> None:
            async with lock:
                pytest.fail("the task was cancelled before it ran")

        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                lock = redlock.lock("gone", timeout=HANG_GUARD)
                first = await lock.acquire()
                task = asyncio.get_running_loop().create_task(waiter(lock))
                await Queue(redlock).reach(1)
                for client in masters.clients:
                    await client.delete("gone")
                with caplog.at_level(logging.WARNING, logger="asyncredlock"):
                    await first.release()  # passed on: no call to the masters
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    await redlock.settle()  # its background release found it gone
            stats = redlock.statistics()
        assert (stats.handoffs, stats.lost, stats.hold.count) == (0, 0, 1)
        assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == []


class TestAcrossProcesses:
    """The in-process queue never lets two processes hold at once."""

    async def test_tasks_of_two_processes_never_hold_at_once(self, servers: ServerGroup) -> None:
        """Chains in two AsyncRedlocks on one key: the masters still decide between
        them, and tokens increase in the order the lock was held."""
        holding = 0
        tokens: list[int] = []
        async with AsyncRedlock(servers.urls) as one, AsyncRedlock(servers.urls) as two:

            async def worker(redlock: AsyncRedlock) -> None:
                nonlocal holding
                for _ in range(30):
                    async with redlock.lock("shared", timeout=HANG_GUARD) as lease:
                        holding += 1
                        assert holding == 1
                        assert lease.token is not None
                        tokens.append(lease.token)
                        await anyio.lowlevel.checkpoint()  # let the others run while it is held
                        holding -= 1

            with anyio.fail_after(HANG_GUARD * 4):
                async with anyio.create_task_group() as tg:
                    for redlock in (one, two):
                        for _ in range(4):
                            tg.start_soon(worker, redlock)
            handoffs = one.statistics().handoffs + two.statistics().handoffs
        assert len(tokens) == 240
        assert tokens == sorted(set(tokens))
        assert handoffs > 0
