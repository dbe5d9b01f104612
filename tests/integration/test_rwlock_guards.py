"""Read-write locks under contention of several clients: exclusion, wake-ups,
inspection, statistics, cancellation and closing at every step (beside
test_rwlock.py and test_rwlock_model.py)."""

from __future__ import annotations

import contextlib
import math
import random
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError
from asyncredlock.testing import ServerGroup, Waits, client_state, whole_retry_delay

from .conftest import Masters, Waiting, clients, library_tasks, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "patience 0": {"patience": 0},
    "fair": {"fair": True},
    "readers first": {"patience": math.inf},
}


class Inside:
    """Who is inside the critical section right now, and every violation seen."""

    def __init__(self) -> None:
        self.readers = 0
        self.writers = 0
        self.violations: list[str] = []
        self.reads = 0
        self.writes = 0

    def enter(self, write: bool) -> None:
        if write:
            if self.readers or self.writers:
                self.violations.append(f"writer with {self.readers} r / {self.writers} w")
            self.writers += 1
            self.writes += 1
        else:
            if self.writers:
                self.violations.append(f"reader with {self.writers} writers")
            self.readers += 1
            self.reads += 1

    def leave(self, write: bool) -> None:
        if write:
            self.writers -= 1
        else:
            self.readers -= 1


class TestExclusionUnderContention:
    @pytest.mark.parametrize("mode", list(MODES), ids=list(MODES))
    async def test_several_clients_with_extending_readers_never_mix(
        self, servers: ServerGroup, masters: Masters, mode: str
    ) -> None:
        """Four clients read and write one lock at once; readers' leases are short
        (0.2 s) and extend themselves while they hold several times longer than
        their TTL now and then. Nobody ever writes alongside anyone."""
        rng = random.Random(mode)
        inside = Inside()
        async with clients(servers.urls, 4, retry_delay=0.02) as redlocks:

            async def one(i: int) -> None:
                rw = redlocks[i % 4].rwlock("hot", **MODES[mode])
                write = rng.random() < 0.3
                hold = rng.choice([0, 0, 0.005, 0.5]) if not write else rng.choice([0, 0.005])
                lock = (rw.write if write else rw.read)(ttl=0.2, timeout=HANG_GUARD)
                async with lock as lease:
                    inside.enter(write)
                    try:
                        await anyio.sleep(hold)
                        assert lease.held
                    finally:
                        inside.leave(write)

            with anyio.fail_after(HANG_GUARD * 2):
                for wave in range(6):
                    async with anyio.create_task_group() as tg:
                        for i in range(16):
                            tg.start_soon(one, wave * 16 + i)
            for redlock in redlocks:
                await redlock.settle()
            stats = [redlock.statistics() for redlock in redlocks]
        assert inside.violations == []
        assert inside.reads > 0
        assert inside.writes > 0
        assert sum(s.lost for s in stats) == 0
        assert sum(s.extensions for s in stats) > 0  # the long reads extended
        assert await masters.keys() == [[]] * len(masters)


class TestWakeUps:
    @pytest.mark.parametrize("mode", ["default", "fair"])
    async def test_a_writers_release_lets_other_clients_readers_in_together_not_the_writer(
        self, servers: ServerGroup, mode: str
    ) -> None:
        """A writer holds; readers of three clients wait, then a second writer
        queues behind them. The first writer's release lets all three readers in
        by that one release (no retry before the hang guard); the second writer
        gets in only after the last of them left, woken by that release."""
        options = MODES[mode] if mode == "fair" else {"patience": 0}
        async with AsyncRedlock(servers.urls) as holder, contextlib.AsyncExitStack() as stack:
            writer = await holder.rwlock("shelf", **options).write(ttl=HANG_GUARD).acquire()
            readers = [
                await stack.enter_async_context(AsyncRedlock(servers.urls, retry_delay=HANG_GUARD))
                for _ in range(3)
            ]
            late = await stack.enter_async_context(
                AsyncRedlock(servers.urls, retry_delay=HANG_GUARD)
            )
            waiting = Waiting(readers)
            late_waits = Waiting([late])
            got: list[Lease] = []
            wrote: list[Lease] = []
            order: list[str] = []
            all_in = anyio.Event()

            async def read(redlock: AsyncRedlock) -> None:
                lease = await redlock.rwlock("shelf", **options).read(timeout=HANG_GUARD).acquire()
                got.append(lease)
                order.append("read")
                if len(got) == 3:
                    all_in.set()

            async def write() -> None:
                lease = await late.rwlock("shelf", **options).write(timeout=HANG_GUARD).acquire()
                order.append("write")
                wrote.append(lease)

            with whole_retry_delay(*readers, late), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for each in readers:
                        tg.start_soon(read, each)
                    await waiting.reach(3)
                    tg.start_soon(write)
                    await late_waits.reach(1)
                    await writer.release()
                    await all_in.wait()
                    assert wrote == []
                    assert all(lease.held for lease in got)  # together
                    for lease in got[:2]:
                        await lease.release()
                    assert wrote == []  # one reader is still in
                    await got[2].release()
            assert order == ["read"] * 3 + ["write"]
            assert waiting.woken == 3
            await wrote[0].release()


class TestHandedWriterWakesReaders:
    async def test_a_writer_handed_the_key_lets_the_readers_behind_it_in_together(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Fair: W1 holds; W2 queues, then readers of three clients behind it.
        W1's release hands the key to W2 (readers stay out); W2's release lets the
        three readers in together, by that one release."""
        async with contextlib.AsyncExitStack() as stack:
            one = await stack.enter_async_context(AsyncRedlock(servers.urls))
            two = await stack.enter_async_context(
                AsyncRedlock(servers.urls, retry_delay=HANG_GUARD)
            )
            readers = [
                await stack.enter_async_context(AsyncRedlock(servers.urls, retry_delay=HANG_GUARD))
                for _ in range(3)
            ]
            w1 = await one.rwlock("shelf", fair=True).write(ttl=HANG_GUARD).acquire()
            two_waits = Waiting([two])
            reader_waits = Waiting(readers)
            got: list[Lease] = []
            handed: list[Lease] = []
            all_in = anyio.Event()
            handed_event = anyio.Event()

            async def write() -> None:
                handed.append(
                    await two.rwlock("shelf", fair=True).write(timeout=HANG_GUARD).acquire()
                )
                handed_event.set()

            async def read(redlock: AsyncRedlock) -> None:
                got.append(
                    await redlock.rwlock("shelf", fair=True).read(timeout=HANG_GUARD).acquire()
                )
                if len(got) == 3:
                    all_in.set()

            with whole_retry_delay(two, *readers), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write)
                    await two_waits.reach(1)
                    for each in readers:
                        tg.start_soon(read, each)
                    await reader_waits.reach(3)
                    await w1.release()
                    await handed_event.wait()
                    assert handed[0].statistics().source == "hand-over"
                    assert got == []
                    await handed[0].release()
                    await all_in.wait()
            assert all(lease.held for lease in got)
            assert reader_waits.woken == 3
            for lease in got:
                await lease.release()
            for each in [one, two, *readers]:
                await each.settle()
        assert await masters.keys() == [[]] * len(masters)


class TestInspectAndStatistics:
    async def test_inspect_and_statistics_count_the_readers(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as first,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as second,
        ):
            rw = first.rwlock("doc")
            leases = [await rw.read().acquire() for _ in range(3)]
            other = await second.rwlock("doc").read().acquire()
            await first.settle()
            await second.settle()
            state = await first.inspect("doc")
            values = sorted(lease.value for lease in [*leases, other])
            for node in state.nodes:
                assert sorted(v for v, _ in node.readers) == values
                assert node.holder is None
            assert state.holder is None
            assert first.statistics().held == 3
            assert second.statistics().held == 1
            assert rw.statistics().read.acquisitions == 3
            # a writer of the second client waits: counted as waiting, and queued
            waits = Waits(second)
            wrw = second.rwlock("doc", patience=0)
            async with anyio.create_task_group() as tg:

                async def write() -> None:
                    with contextlib.suppress(LockTimeoutError):
                        async with wrw.write(timeout=HANG_GUARD):
                            pass

                tg.start_soon(write)
                with anyio.fail_after(HANG_GUARD):
                    await waits.reach(1)
                assert wrw.statistics().write.waiting == 1
                assert wrw.statistics().read.waiting == 0
                await second.settle()
                state = await second.inspect("doc")
                for node in state.nodes:
                    assert [w[:2] for w in node.queue] == ["w:"]
                for lease in [*leases, other]:
                    await lease.release()
            assert wrw.statistics().write.waiting == 0
            assert wrw.statistics().write.acquisitions == 1
            assert first.statistics().held == 0
            await first.settle()
            await second.settle()
        assert await masters.keys() == [[]] * len(masters)


class TestClosing:
    @pytest.mark.parametrize("mode", ["default", "fair"])
    async def test_closing_with_readers_holding_and_waiting_leaves_nothing(
        self, servers: ServerGroup, masters: Masters, mode: str
    ) -> None:
        """A client closes while three of its readers hold and, on another lock, three
        wait behind a writer of another client: the holders end lost, the waiters
        with the closing error, and no reader entry, queue entry, task or connection
        is left."""
        options = MODES[mode]
        outcomes: list[BaseException | Lease] = []
        async with AsyncRedlock(servers.urls) as other:
            writer = await other.rwlock("b", **options).write(ttl=HANG_GUARD).acquire()
            redlock = AsyncRedlock(servers.urls, retry_delay=HANG_GUARD)
            waiting = Waiting([redlock])
            holders = [await redlock.rwlock("a", **options).read().acquire() for _ in range(3)]
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def read() -> None:
                        try:
                            outcomes.append(
                                await redlock.rwlock("b", **options)
                                .read(timeout=HANG_GUARD)
                                .acquire()
                            )
                        except BaseException as exc:
                            outcomes.append(exc)

                    for _ in range(3):
                        tg.start_soon(read)
                    await waiting.reach(3)
                    await redlock.aclose()
            assert all(isinstance(o, RuntimeError) for o in outcomes), outcomes
            assert all(lease.lost for lease in holders)
            state = client_state(redlock)
            assert (state.held, state.listening) == (0, {})
            assert library_tasks() == [] or all(t.done() for t in library_tasks())
            await other.settle()
            # only the writer's key, and (fair) its own entry, listed until its release
            left = [
                [k for k in keys if not k.startswith(b"{b}:queue")] for keys in await masters.keys()
            ]
            assert left == [[b"b"]] * len(masters)
            assert all(
                [entry[:2] for entry in line] in ([], [b"w:"])
                for line in await queues(masters, "b")
            )
            await writer.release()
        assert await masters.keys() == [[]] * len(masters)


async def _cancel_after(steps: int, got: list[Lease], acquire: Any, then: Any = None) -> None:
    """Run ``acquire()`` (appending its lease to ``got``), run ``then()`` beside it,
    and cancel the acquisition after ``steps`` passes of the event loop."""
    async with anyio.create_task_group() as tg:

        async def take() -> None:
            got.append(await acquire())

        tg.start_soon(take)
        if then is not None:
            tg.start_soon(then)
        for _ in range(steps):
            await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()


class TestCancelledAtEveryStep:
    """One waiter cancelled after 0, 2, 4 ... passes of the event loop (covering
    every await of its acquire(): its rounds, enrolment, pause, wake-up, undo and
    dequeue), while the holder releases at the same time."""

    STEPS = range(0, 40)

    @pytest.mark.parametrize("mode", ["patience 0", "fair", "default"])
    @pytest.mark.parametrize(
        "waiter", ["reader behind writer", "writer behind writer", "writer behind readers"]
    )
    async def test_a_waiter_cancelled_as_the_holder_releases_leaves_nothing(
        self, servers: ServerGroup, masters: Masters, mode: str, waiter: str
    ) -> None:
        options = MODES[mode]
        taken = 0
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as holders,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as waiters,
        ):
            for steps in self.STEPS:
                hrw = holders.rwlock("c", **options)
                wrw = waiters.rwlock("c", **options)
                if waiter == "writer behind readers":
                    held = [await hrw.read(ttl=HANG_GUARD).acquire() for _ in range(2)]
                else:
                    held = [await hrw.write(ttl=HANG_GUARD).acquire()]
                lock = (
                    wrw.read(timeout=HANG_GUARD)
                    if waiter.startswith("reader")
                    else wrw.write(timeout=HANG_GUARD)
                )
                waiting = Waiting([waiters])
                got: list[Lease] = []
                with whole_retry_delay(waiters), anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as releases:

                        async def take(out: list[Lease] = got, lk: Any = lock) -> None:
                            out.append(await lk.acquire())

                        async with anyio.create_task_group() as tg:
                            tg.start_soon(take)
                            await waiting.reach(1)  # parked, queued where it queues
                            for lease in held:
                                releases.start_soon(lease.release)
                            for _ in range(steps):
                                await anyio.lowlevel.checkpoint()
                            tg.cancel_scope.cancel()  # the waiter, unless it has its lease
                    for lease in held:
                        if lease.held:
                            await lease.release()
                    for lease in got:
                        taken += 1
                        await lease.release()
                    await holders.settle()
                    await waiters.settle()
                keys = await masters.keys()
                assert keys == [[]] * len(masters), (steps, keys)
                # the lock is free for anyone, at once
                async with hrw.write(timeout=0):
                    pass
                await holders.settle()
            stats = waiters.statistics()
            assert (stats.held, stats.in_flight, stats.background_tasks) == (0, 0, 0)
            assert wrw.statistics().read.waiting == 0
            assert wrw.statistics().write.waiting == 0
            assert client_state(waiters).listening == {}
        # the steps cover both sides: cancelled before its lease, and after
        assert 0 < taken < len(self.STEPS)
        assert library_tasks() == []


class TestClosedAtEveryStep:
    """``aclose()`` after 0, 1, 2 ... passes of the event loop while a reader of the
    client acquires (the lock free, or held by a writer of another client): no
    reader entry or queue entry of it is left on any master, with every master up
    and answering (nothing is cut short)."""

    @pytest.mark.parametrize("mode", ["default", "fair"])
    @pytest.mark.parametrize("held", [False, True], ids=["free", "writer holds"])
    async def test_closing_while_a_reader_acquires_leaves_no_entry(
        self, servers: ServerGroup, masters: Masters, mode: str, held: bool
    ) -> None:
        options = MODES[mode]
        async with AsyncRedlock(servers.urls) as other:
            writer = (
                await other.rwlock("z", **options).write(ttl=HANG_GUARD).acquire() if held else None
            )
            await other.settle()
            for steps in range(0, 40):
                redlock = AsyncRedlock(servers.urls, retry_delay=0.02)
                outcome: list[object] = []

                async def read(rl: AsyncRedlock = redlock, out: list[object] = outcome) -> None:
                    try:
                        out.append(
                            await rl.rwlock("z", **options).read(timeout=HANG_GUARD).acquire()
                        )
                    except Exception as exc:
                        out.append(exc)

                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(read)
                        for _ in range(steps):
                            await anyio.lowlevel.checkpoint()
                        await redlock.aclose()
                assert client_state(redlock).held == 0
                readers = [await c.zrange("{z}:readers", 0, -1) for c in masters.clients]
                lines = await queues(masters, "z")
                assert readers == [[]] * len(masters), (steps, outcome, readers)
                assert all(not any(e.startswith(b"r:") for e in line) for line in lines), (
                    steps,
                    lines,
                )
            if writer is not None:
                await writer.release()
            await other.settle()
        assert library_tasks() == []


class TestEarlyWakeUps:
    @pytest.mark.parametrize("mode", ["patience 0", "fair"])
    async def test_a_writer_woken_while_readers_hold_stays_out_and_is_woken_again(
        self, servers: ServerGroup, mode: str
    ) -> None:
        """Readers hold; two writers queue. The first gives up (its leaving is
        announced to the second while readers still hold): the second stays out,
        stays out when one of two readers leaves, and gets in at the last reader's
        release, woken by it (no retry before the hang guard)."""
        options = MODES[mode]
        async with (
            AsyncRedlock(servers.urls) as readers,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as first,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as second,
        ):
            leases = [
                await readers.rwlock("p", **options).read(ttl=HANG_GUARD).acquire()
                for _ in range(2)
            ]
            first_waits, second_waits = Waiting([first]), Waiting([second])
            got: list[Lease] = []
            with whole_retry_delay(first, second), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def write() -> None:
                        got.append(
                            await second.rwlock("p", **options).write(timeout=HANG_GUARD).acquire()
                        )

                    with anyio.CancelScope() as gone:
                        async with anyio.create_task_group() as inner:
                            inner.start_soon(
                                first.rwlock("p", **options).write(timeout=HANG_GUARD).acquire
                            )
                            await first_waits.reach(1)
                            tg.start_soon(write)
                            await second_waits.reach(1)
                            gone.cancel()
                    await first.settle()
                    assert got == []
                    await leases[0].release()
                    await readers.settle()
                    assert got == []
                    await leases[1].release()
            assert got[0].held
            assert lock_attempts_ok(second)
            await got[0].release()


def lock_attempts_ok(redlock: AsyncRedlock) -> bool:
    """Its acquisitions took no more than a handful of attempts (no storm)."""
    return redlock.statistics().attempts <= 8
