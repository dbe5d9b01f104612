"""Read-write locks: readers together, writers alone, and writers not starved."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import pytest

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    RWLock,
)
from asyncredlock.testing import ServerGroup, Waits, client_state, whole_retry_delay

from .conftest import Masters, Queue, Waiting, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


def _details(caught: pytest.ExceptionInfo[LockTimeoutError]) -> list[str]:
    return [outcome.detail for outcome in caught.value.outcomes]


async def _first(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as one of ``waits`` returns."""
    async with anyio.create_task_group() as tg:

        async def run(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in waits:
            tg.start_soon(run, wait)


class TestExclusion:
    async def test_readers_share_the_lock_and_keep_writers_out(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            rw = redlock.rwlock("doc")
            first = await rw.read().acquire()
            second = await rw.read(timeout=0).acquire()
            assert first.shared
            assert second.shared
            assert (first.token, first.tokens) == (None, None)
            refusals = len(masters) - redlock.quorum + 1  # enough to end a round
            with pytest.raises(LockTimeoutError) as caught:
                await rw.write(timeout=0).acquire()
            assert sum("held by readers" in d for d in _details(caught)) >= refusals
            # the write side is the exclusive lock on the name
            with pytest.raises(LockTimeoutError) as caught:
                await redlock.lock("doc", timeout=0).acquire()
            assert sum("held by readers" in d for d in _details(caught)) >= refusals
            await redlock.settle()  # the masters beyond the quorum have answered too
            state = await redlock.inspect("doc")
            for node in state.nodes:
                assert sorted(value for value, _ in node.readers) == sorted(
                    [first.value, second.value]
                )
                assert node.holder is None
            await first.release()
            await second.release()
            async with rw.write(timeout=0) as writer:
                assert not writer.shared
                assert writer.token is not None
                with pytest.raises(LockTimeoutError) as caught:
                    await rw.read(timeout=0).acquire()
                assert sum("held by another holder" in d for d in _details(caught)) >= refusals
                await redlock.settle()  # the masters beyond the quorum have answered too
                state = await redlock.inspect("doc")
                assert state.holder == writer.value
                assert [node.readers for node in state.nodes] == [()] * len(masters)
            await redlock.settle()
        assert await masters.keys() == [[]] * len(masters)

    async def test_an_exclusive_holder_keeps_readers_out_and_tokens_are_shared(
        self, masters: Masters
    ) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            rw = redlock.rwlock("ledger")
            async with redlock.lock("ledger", timeout=0) as exclusive:
                with pytest.raises(LockTimeoutError):
                    await rw.read(timeout=0).acquire()
            async with rw.write(timeout=0) as writer:
                pass
            async with redlock.lock("ledger", timeout=0) as after:
                pass
        assert exclusive.token is not None
        assert writer.token is not None
        assert after.token is not None
        assert exclusive.token < writer.token < after.token

    async def test_a_writer_waits_for_the_last_reader_and_is_woken_by_its_release(
        self, servers: ServerGroup
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as readers,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as writers,
        ):
            leases = [await readers.rwlock("page").read(ttl=HANG_GUARD).acquire() for _ in range(3)]
            waiting = Waiting([writers])
            # no retry before the hang guard: only the release's announcement wakes it
            with whole_retry_delay(writers), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    got: list[Lease] = []

                    async def write() -> None:
                        got.append(await writers.rwlock("page").write(timeout=HANG_GUARD).acquire())

                    tg.start_soon(write)
                    await waiting.reach(1)
                    for lease in leases[:2]:
                        await lease.release()
                    assert got == []  # one reader is left
                    await leases[2].release()
            # without the announcement it would have slept out the reader's TTL
            assert writers.statistics().wakeups >= 1
            await got[0].release()

    @pytest.mark.parametrize("side", ["lock", "fair write"])
    async def test_a_queued_writer_is_woken_by_the_last_readers_release(
        self, servers: ServerGroup, side: str
    ) -> None:
        """The exclusive lock (the write side of the read-write lock) and a fair
        writer wait in the masters' queue, listening on their inbox only: the last
        reader's release is announced there."""
        async with (
            AsyncRedlock(servers.urls) as readers,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as writers,
        ):
            leases = [await readers.rwlock("page").read(ttl=HANG_GUARD).acquire() for _ in range(2)]
            waiting = Waiting([writers])
            lock = (
                writers.lock("page", timeout=HANG_GUARD)
                if side == "lock"
                else writers.rwlock("page", fair=True).write(timeout=HANG_GUARD)
            )
            with whole_retry_delay(writers), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    got: list[Lease] = []

                    async def write() -> None:
                        got.append(await lock.acquire())

                    tg.start_soon(write)
                    await waiting.reach(1)
                    assert client_state(writers).listening == {}  # the inbox only
                    for lease in leases:
                        await lease.release()
            assert waiting.woken == 1
            await got[0].release()

    async def test_readers_waiting_for_a_writer_all_go_at_its_release(
        self, servers: ServerGroup
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as writers,
            AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as readers,
        ):
            writer = await writers.rwlock("page").write(ttl=HANG_GUARD).acquire()
            waiting = Waiting([readers])
            got: list[Lease] = []

            async def read() -> None:
                got.append(await readers.rwlock("page").read(timeout=HANG_GUARD).acquire())

            # no retry before the hang guard: only the release's announcement wakes them
            with whole_retry_delay(readers), anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(read)
                    await waiting.reach(3)
                    await writer.release()
            assert len(got) == 3
            assert all(lease.held for lease in got)
            assert waiting.woken == 3  # all of them by the one release
            for lease in got:
                await lease.release()

    async def test_readers_of_separate_clients_queued_behind_a_writer_go_together(
        self, servers: ServerGroup
    ) -> None:
        """Fair: the readers of three clients queue behind the writer on the masters;
        its release (readers first in line) is announced to all of them at once, and
        they hold the lock together."""
        async with AsyncRedlock(servers.urls) as writers:
            writer = await writers.rwlock("shelf", fair=True).write(ttl=HANG_GUARD).acquire()
            async with contextlib.AsyncExitStack() as stack:
                readers = [
                    await stack.enter_async_context(
                        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD)
                    )
                    for _ in range(3)
                ]
                waiting = Waiting(readers)
                got: list[Lease] = []

                async def read(redlock: AsyncRedlock) -> None:
                    rw = redlock.rwlock("shelf", fair=True)
                    got.append(await rw.read(timeout=HANG_GUARD).acquire())

                with whole_retry_delay(*readers), anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        for each in readers:
                            tg.start_soon(read, each)
                        await waiting.reach(3)
                        await writer.release()
                assert len(got) == 3
                assert all(lease.held for lease in got)  # together
                assert waiting.woken == 3  # all by the one release
                for lease in got:
                    await lease.release()

    async def test_writers_of_one_process_never_pass_the_lease_on(self, masters: Masters) -> None:
        """They queue in the process, but each write goes back to the masters, where
        readers elsewhere may take the lock (a run of hand-offs would starve them)."""
        async with AsyncRedlock(masters.given) as redlock:
            rw = redlock.rwlock("doc", patience=math.inf)
            queue = Queue(redlock)
            first = await rw.write().acquire()
            writes = 1

            async def write() -> None:
                nonlocal writes
                async with rw.write(timeout=HANG_GUARD):
                    writes += 1

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(write)
                    await queue.reach(3)  # all three wait behind the first, in the process
                    await first.release()
            stats = redlock.statistics()
        assert writes == 4
        assert stats.handoffs == 0
        assert stats.acquisitions == 4


class TestReaderLeases:
    async def test_a_reader_extends_its_own_entry(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.rwlock("doc").read(ttl=5, auto_extend=False).acquire()
            await lease.extend(ttl=600)
            await redlock.settle()  # the masters beyond the quorum have answered too
            state = await redlock.inspect("doc")
            for node in state.nodes:
                ((value, left),) = node.readers
                assert value == lease.value
                assert left > 5  # only the extension can have set it past the TTL
            await lease.release()

    async def test_a_reader_whose_entries_are_gone_cannot_extend_and_is_lost(
        self, masters: Masters
    ) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.rwlock("doc").read(auto_extend=False).acquire()
            await redlock.settle()  # the entries are made on every master
            for client in masters.clients[: redlock.quorum]:
                await client.zrem("{doc}:readers", lease.value)
            with pytest.raises(LockNotOwnedError):
                await lease.extend()
            assert lease.lost
            await redlock.settle()
        assert await masters.keys() == [[]] * len(masters)  # the rest was removed on loss

    async def test_a_lost_reader_lease_cancels_its_block(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            with pytest.raises(LockLostError):
                async with redlock.rwlock("doc").read(ttl=1.0) as lease:
                    for client in masters.clients:
                        await client.zrem("{doc}:readers", lease.value)
                    await anyio.sleep_forever()  # cancelled when the extension fails
            assert lease.lost

    async def test_a_reader_that_stops_extending_lapses_on_the_masters_clock(
        self, masters: Masters
    ) -> None:
        """Its entry lapses by the masters' time: a writer gets in (told how long to
        wait by the readers' remaining time), and the reader cannot extend any more."""
        async with (
            AsyncRedlock(masters.given) as readers,
            AsyncRedlock(masters.given, retry_delay=HANG_GUARD) as writers,
        ):
            reader = await readers.rwlock("doc").read(ttl=0.3, auto_extend=False).acquire()
            with anyio.fail_after(HANG_GUARD):
                writer = await writers.rwlock("doc").write(timeout=HANG_GUARD).acquire()
            with pytest.raises(LockNotOwnedError):
                await reader.extend()
            await writer.release()
            await readers.settle()
            await writers.settle()
        assert await masters.keys() == [[]] * len(masters)

    async def test_force_release_removes_readers_and_loses_their_leases(
        self, masters: Masters
    ) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            rw = redlock.rwlock("doc")
            leases = [await rw.read().acquire() for _ in range(2)]
            assert await redlock.force_release("doc") == len(masters)
            assert all(lease.lost for lease in leases)
            await redlock.settle()
            assert await masters.keys() == [[]] * len(masters)
            async with rw.write(timeout=0):
                pass


class TestFairness:
    async def test_a_free_lock_with_a_queued_reader_refuses_the_exclusive_lock(
        self, masters: Masters
    ) -> None:
        """``lock(name)`` on a read-write lock's resource heeds its queue: with the
        lock free and a fair reader queued, an attempt without a place in line is
        refused, and the error says why (not "held by another holder")."""
        patient = 60.0  # a retry delay the reader never reaches: it stays queued
        async with (
            AsyncRedlock(masters.urls) as writer,
            AsyncRedlock(masters.urls, retry_delay=patient) as reader,
            AsyncRedlock(masters.urls) as other,
        ):
            await writer.rwlock("doc").write(auto_extend=False).acquire()
            await writer.settle()
            with whole_retry_delay(reader), Waits(reader) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    read = reader.rwlock("doc", fair=True).read(timeout=patient)
                    tg.start_soon(read.acquire)
                    await waits.reach(1)
                    await reader.settle()
                    assert all(len(queue) == 1 for queue in await queues(masters, "doc"))
                    for client in masters.clients:
                        await client.delete("doc")  # the writer's key gone: the lock is free
                    with pytest.raises(LockTimeoutError) as caught:
                        await other.lock("doc", timeout=0).acquire()
                    tg.cancel_scope.cancel()
        assert "within one attempt: free, but another waiter is first in line" in str(caught.value)
        refused = "free, but an earlier waiter is first in the queue"
        assert _details(caught).count(refused) >= 3  # a quorum said so (the rest: not yet)

    async def _scenario(self, urls: Sequence[str], **options: Any) -> list[str]:
        """Two readers hold; a writer arrives and waits; a third reader arrives and
        waits or reads; then the first readers leave. The order of the last two."""
        order: list[str] = []
        async with (
            AsyncRedlock(urls) as first,
            AsyncRedlock(urls, retry_delay=0.05) as second,
            AsyncRedlock(urls, retry_delay=0.05) as third,
        ):
            held = [await first.rwlock("doc", **options).read().acquire() for _ in range(2)]
            writer_waits = Waiting([second])
            reader_waits = Waiting([third])

            async def write() -> None:
                async with second.rwlock("doc", **options).write(timeout=HANG_GUARD):
                    order.append("writer")

            async def read(done: anyio.Event) -> None:
                async with third.rwlock("doc", **options).read(timeout=HANG_GUARD):
                    order.append("reader")
                    done.set()

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write)
                    await writer_waits.reach(1)
                    read_done = anyio.Event()
                    tg.start_soon(read, read_done)
                    # the late reader either waits, or reads with the first ones
                    await _first(lambda: reader_waits.reach(1), read_done.wait)
                    for lease in held:
                        await lease.release()
        return order

    async def test_fair_a_writer_goes_before_readers_that_came_after_it(
        self, servers: ServerGroup
    ) -> None:
        assert await self._scenario(servers.urls, fair=True) == [
            "writer",
            "reader",
        ]

    async def test_unfair_a_writer_out_of_patience_goes_before_later_readers(
        self, servers: ServerGroup
    ) -> None:
        assert await self._scenario(servers.urls, patience=0) == [
            "writer",
            "reader",
        ]

    async def test_without_patience_readers_overtake_a_waiting_writer(
        self, servers: ServerGroup
    ) -> None:
        assert await self._scenario(servers.urls, patience=math.inf) == [
            "reader",
            "writer",
        ]

    async def _stream(
        self,
        urls: Sequence[str],
        options: dict[str, Any],
        limit: float = math.inf,
    ) -> list[tuple[str, int]]:
        """Readers keep the lock read without a gap (each leaves only once the next
        one reads or waits) until the writer, arriving while the lock is read, has
        written, or ``limit`` readers came. What happened, in order: ("arrive", i)
        before reader i's acquire(), ("read", i), the writer's first queued
        attempt ("queued", -1) and its write ("write", -1)."""
        events: list[tuple[str, int]] = []
        async with (
            AsyncRedlock(urls, retry_delay=0.05) as readers,
            AsyncRedlock(urls, retry_delay=0.05) as writers,
        ):
            reader_waits = Waiting([readers])
            writer_waits = Waits(writers)
            write_lock = writers.rwlock("doc", **options).write(timeout=HANG_GUARD)

            def log(event: tuple[str, int]) -> None:
                # the writer's first attempt that queued it ahead of later readers
                # was decided before this event
                if writer_waits.ahead and ("queued", -1) not in events:
                    events.append(("queued", -1))
                events.append(event)

            read_once = anyio.Event()
            written = anyio.Event()

            async def write() -> None:
                await read_once.wait()
                async with write_lock:
                    log(("write", -1))
                written.set()

            async def stream() -> None:
                rw = readers.rwlock("doc", **options)
                previous = await rw.read().acquire()
                read_once.set()
                i = 0
                while not written.is_set() and i < limit:
                    i += 1
                    log(("arrive", i))
                    waits = reader_waits.entered
                    got: list[Lease] = []
                    reading = anyio.Event()

                    async def read(n: int, out: list[Lease] = got, done: Any = reading) -> None:
                        out.append(await rw.read(timeout=HANG_GUARD).acquire())
                        log(("read", n))
                        done.set()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(read, i)
                        # leave once the next reader reads, or waits (for the writer)
                        await _first(lambda n=waits: reader_waits.reach(n + 1), reading.wait)
                        await previous.release()
                    previous = got[0]
                await previous.release()

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream)
                    tg.start_soon(write)
        return events

    @pytest.mark.parametrize("options", [{"fair": True}, {}], ids=["fair", "default patience"])
    async def test_a_stream_of_overlapping_readers_does_not_starve_a_writer(
        self, servers: ServerGroup, options: dict[str, Any]
    ) -> None:
        """The writer gets in while readers keep coming, and no reader that arrived
        after the writer queued reads before it (counted, not timed)."""
        events = await self._stream(servers.urls, options)
        queued = events.index(("queued", -1))
        wrote = events.index(("write", -1))
        late = {n for kind, n in events[queued:] if kind == "arrive"}
        assert not late & {n for kind, n in events[queued:wrote] if kind == "read"}
        if not options:  # unfair: readers went first until the writer's patience ran out
            assert any(kind == "read" for kind, _ in events[:queued])

    async def test_without_patience_a_stream_of_readers_starves_the_writer(
        self, servers: ServerGroup
    ) -> None:
        """The control: readers first (``patience=inf``), the writer gets in only
        once the stream of 30 readers has ended."""
        events = await self._stream(servers.urls, {"patience": math.inf}, limit=30)
        assert ("queued", -1) not in events
        reads = [i for i, (kind, _) in enumerate(events) if kind == "read"]
        assert len(reads) == 30
        assert events.index(("write", -1)) > max(reads)


class TestValidation:
    async def test_bad_arguments_are_refused_at_the_boundary(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(ValueError, match="empty"):
                redlock.rwlock("")
            with pytest.raises(TypeError, match="str"):
                redlock.rwlock(7)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="fair must be a bool"):
                redlock.rwlock("doc", fair="yes")  # type: ignore[arg-type]
            for bad in (-1, math.nan):
                with pytest.raises(ValueError, match="patience"):
                    redlock.rwlock("doc", patience=bad)
            with pytest.raises(TypeError, match="patience"):
                redlock.rwlock("doc", patience="1")  # type: ignore[arg-type]
            rw = redlock.rwlock("doc")
            with pytest.raises(AttributeError):
                rw.patience = -5  # type: ignore[misc]
            assert isinstance(rw, RWLock)
            assert rw.patience == 1.0
            assert not rw.fair
            with pytest.raises(ValueError, match="ttl"):
                rw.read(ttl=0)
            with pytest.raises(TypeError, match="auto_extend"):
                rw.read(auto_extend=1)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                rw.read(fencing=True)  # type: ignore[call-arg]
            with pytest.raises(ValueError, match="timeout"):
                rw.write(timeout=-1)
            with pytest.raises(TypeError, match="fencing"):
                rw.write(fencing="no")  # type: ignore[arg-type]
            assert rw.read().shared
            assert not rw.write().shared
        with pytest.raises(RuntimeError, match="closed"):
            redlock.rwlock("doc")
        with pytest.raises(RuntimeError, match="closed"):
            rw.read()

    async def test_the_read_side_says_it_is_shared_in_its_repr(self, servers: ServerGroup) -> None:
        """A read lock is told from a write lock (the exclusive lock) by its repr, as
        in the WARNING of a block left open by its task."""
        async with AsyncRedlock(servers.urls, ttl=5, timeout=2) as redlock:
            rw = redlock.rwlock("doc")
            assert repr(rw.read()) == "<Lock 'doc' shared ttl=5s timeout=2s>"
            assert repr(rw.write()) == "<Lock 'doc' ttl=5s timeout=2s>"
            assert repr(redlock.lock("doc")) == repr(rw.write())

    async def test_a_reader_lease_says_it_is_shared_in_its_repr(self, servers: ServerGroup) -> None:
        """A reader's lease is told from a writer's by its repr, as its lock is."""
        async with AsyncRedlock(servers.urls, ttl=5, timeout=2) as redlock:
            rw = redlock.rwlock("doc")
            async with rw.read() as reading:
                assert re.fullmatch(r"<Lease 'doc' shared held validity=[\d.]+s>", repr(reading))
            assert repr(reading).startswith("<Lease 'doc' shared released ")
            async with rw.write() as writing:
                assert re.fullmatch(r"<Lease 'doc' held validity=[\d.]+s>", repr(writing))
