"""Review probes (rrw): read-write locks."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

import anyio
import anyio.lowlevel
import pytest

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError
from asyncredlock.testing import ServerGroup, whole_retry_delay

from .conftest import Masters, Waiting, clients, polled

pytestmark = pytest.mark.anyio
HANG_GUARD = 30


async def test_tokens_increase_across_mixed_writers(servers: ServerGroup, masters: Masters) -> None:
    order: list[int] = []
    inside = {"r": 0, "w": 0}
    bad: list[str] = []
    rng = random.Random(7)
    async with clients(servers.urls, 3, retry_delay=0.02) as rls:

        async def one(i: int) -> None:
            rl = rls[i % 3]
            kind = rng.choice(["fair-w", "w", "lock", "r", "fr"])
            if kind == "fair-w":
                lock = rl.rwlock("tok", fair=True).write(timeout=HANG_GUARD)
            elif kind == "w":
                lock = rl.rwlock("tok", patience=0.05).write(timeout=HANG_GUARD)
            elif kind == "lock":
                lock = rl.lock("tok", timeout=HANG_GUARD)
            elif kind == "r":
                lock = rl.rwlock("tok", patience=0.05).read(timeout=HANG_GUARD)
            else:
                lock = rl.rwlock("tok", fair=True).read(timeout=HANG_GUARD)
            async with lock as lease:
                w = not lease.shared
                if w:
                    if inside["r"] or inside["w"]:
                        bad.append(f"writer with {inside}")
                    order.append(lease.token)
                elif inside["w"]:
                    bad.append(f"reader with {inside}")
                inside["w" if w else "r"] += 1
                await anyio.sleep(rng.choice([0, 0.002]))
                inside["w" if w else "r"] -= 1

        with anyio.fail_after(HANG_GUARD * 2):
            async with anyio.create_task_group() as tg:
                for i in range(90):
                    tg.start_soon(one, i)
        for rl in rls:
            await rl.settle()
    assert bad == []
    assert all(a < b for a, b in itertools.pairwise(order)), order
    assert await masters.keys() == [[]] * len(masters)


@pytest.mark.parametrize("fair", [True, False])
async def test_force_release_of_read_lock_wakes_queued_writer(
    servers: ServerGroup, masters: Masters, fair: bool
) -> None:
    async with (
        AsyncRedlock(servers.urls) as readers,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as writers,
    ):
        leases = [
            await readers.rwlock("fr", fair=fair).read(ttl=HANG_GUARD).acquire() for _ in range(2)
        ]
        waiting = Waiting([writers])
        got: list[Lease] = []
        with whole_retry_delay(writers), anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def write() -> None:
                    got.append(
                        await writers.rwlock("fr", fair=fair, patience=0)
                        .write(timeout=HANG_GUARD)
                        .acquire()
                    )

                tg.start_soon(write)
                await waiting.reach(1)
                await readers.force_release("fr")
        assert all(lease.lost for lease in leases)
        assert got[0].held
        await got[0].release()
        await readers.settle()
        await writers.settle()
    assert await masters.keys() == [[]] * len(masters)


@pytest.mark.parametrize("steps", range(0, 12))
async def test_cancelled_reader_release_leaves_no_entry(
    servers: ServerGroup, masters: Masters, steps: int
) -> None:
    async with AsyncRedlock(servers.urls) as rl, AsyncRedlock(servers.urls) as other:
        lease = await rl.rwlock("cr").read(ttl=HANG_GUARD).acquire()
        async with anyio.create_task_group() as tg:

            async def rel() -> None:
                await lease.release()

            tg.start_soon(rel)
            for _ in range(steps):
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
        with anyio.fail_after(HANG_GUARD):
            assert await lease.wait_lost() is False
        await rl.settle()
        w = await other.rwlock("cr").write(timeout=0).acquire()
        await w.release()
        await other.settle()
    assert await masters.keys() == [[]] * len(masters)


@pytest.mark.parametrize("fair", [True, False])
async def test_writer_max_hold_wakes_readers(
    servers: ServerGroup, masters: Masters, fair: bool
) -> None:
    async with (
        AsyncRedlock(servers.urls) as writers,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as readers,
    ):
        writer = await writers.rwlock("mh", fair=fair).write(ttl=1, max_hold=1.0).acquire()
        waiting = Waiting([readers])
        got: list[Lease] = []
        with whole_retry_delay(readers), anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def read() -> None:
                    got.append(
                        await readers.rwlock("mh", fair=fair).read(timeout=HANG_GUARD).acquire()
                    )

                for _ in range(3):
                    tg.start_soon(read)
                await waiting.reach(3)
        assert writer.lost
        assert len(got) == 3
        assert all(lease.held for lease in got)
        for lease in got:
            await lease.release()
        await readers.settle()
        await writers.settle()
    assert await masters.keys() == [[]] * len(masters)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
@pytest.mark.parametrize("fair", [True, False])
async def test_readers_behind_a_writer_that_gives_up_go(
    servers: ServerGroup, masters: Masters, fair: bool, how: str
) -> None:
    async with (
        AsyncRedlock(servers.urls) as holders,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as writers,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as readers,
    ):
        held = await holders.rwlock("gu", fair=fair).read(ttl=HANG_GUARD).acquire()
        wwait = Waiting([writers])
        rwait = Waiting([readers])
        got: list[Lease] = []
        with whole_retry_delay(readers, writers), anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                wscope = anyio.CancelScope()

                async def write() -> None:
                    with wscope, contextlib.suppress(LockTimeoutError):
                        await (
                            writers.rwlock("gu", fair=fair, patience=0)
                            .write(timeout=2.0 if how == "timeout" else HANG_GUARD)
                            .acquire()
                        )

                async def read() -> None:
                    got.append(
                        await readers.rwlock("gu", fair=fair).read(timeout=HANG_GUARD).acquire()
                    )

                tg.start_soon(write)
                await wwait.reach(1)
                for _ in range(2):
                    tg.start_soon(read)
                await rwait.reach(2)
                assert got == []
                if how == "cancel":
                    wscope.cancel()
        assert len(got) == 2
        for lease in [held, *got]:
            await lease.release()
        for rl in (holders, writers, readers):
            await rl.settle()
    assert await masters.keys() == [[]] * len(masters)


@pytest.mark.parametrize("fair", [True, False])
async def test_aclose_with_readers_and_writers_pending(
    servers: ServerGroup, masters: Masters, fair: bool
) -> None:
    outcomes: list[object] = []
    async with AsyncRedlock(servers.urls) as other:
        blocker = await other.rwlock("ac", fair=fair).read(ttl=HANG_GUARD).acquire()
        rl = AsyncRedlock(servers.urls, retry_delay=HANG_GUARD)
        held_r = [await rl.rwlock("ac", fair=fair).read(ttl=HANG_GUARD).acquire() for _ in range(2)]
        waiting = Waiting([rl])
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def go(kind: str) -> None:
                    rw = rl.rwlock("ac", fair=fair, patience=0)
                    lock = {"w": rw.write, "r": rw.read}[kind](timeout=HANG_GUARD)
                    try:
                        outcomes.append(await lock.acquire())
                    except BaseException as exc:
                        outcomes.append(exc)

                for kind in ["w", "w", "w", "r", "r"]:
                    tg.start_soon(go, kind)
                    await anyio.sleep(0.01)
                await waiting.reach(3)
                await rl.aclose()
        assert all(isinstance(o, RuntimeError) for o in outcomes), outcomes
        assert all(lease.lost for lease in held_r)
        await other.settle()
        await blocker.release()
        await other.settle()
    assert await masters.keys() == [[]] * len(masters)


async def test_a_handed_writer_keeps_readers_out_past_its_entry_ttl(
    servers: ServerGroup, masters: Masters
) -> None:
    async with (
        AsyncRedlock(servers.urls) as first,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as second,
        AsyncRedlock(servers.urls, retry_delay=0.05) as third,
    ):
        w1 = await first.rwlock("hw", fair=True).write(ttl=HANG_GUARD).acquire()
        waiting = Waiting([second])
        got: list[Lease] = []
        rgot: list[Lease] = []
        with whole_retry_delay(second), anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def write() -> None:
                    got.append(
                        await second.rwlock("hw", fair=True)
                        .write(ttl=3, timeout=HANG_GUARD)
                        .acquire()
                    )

                async def read() -> None:
                    rgot.append(
                        await third.rwlock("hw", fair=True).read(timeout=HANG_GUARD).acquire()
                    )

                tg.start_soon(write)
                await waiting.reach(1)
                await second.settle()
                await w1.release()
                assert await polled(lambda: bool(got))  # the task took its lease
                w2 = got[0]
                assert w2.statistics().source == "hand-over"
                tg.start_soon(read)
                await anyio.sleep(2.5)  # the hold: past the handed key's first PX
                assert rgot == []
                assert w2.held
                assert sum([await c.get("hw") == w2.value.encode() for c in masters.clients]) >= 3
                await w2.release()
        assert len(rgot) == 1
        await rgot[0].release()
        for rl in (first, second, third):
            await rl.settle()
    assert await masters.keys() == [[]] * len(masters)


@pytest.mark.parametrize("fair", [True, False])
@pytest.mark.parametrize("holder", ["writer", "readers"])
async def test_closing_the_holders_client_wakes_the_waiters(
    servers: ServerGroup, masters: Masters, fair: bool, holder: str
) -> None:
    async with AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as waiters:
        holders = AsyncRedlock(servers.urls)
        rw = holders.rwlock("cw", fair=fair)
        if holder == "writer":
            held = [await rw.write(ttl=HANG_GUARD).acquire()]
        else:
            held = [await rw.read(ttl=HANG_GUARD).acquire() for _ in range(2)]
        waiting = Waiting([waiters])
        got: list[Lease] = []
        with whole_retry_delay(waiters), anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def go(write: bool) -> None:
                    wrw = waiters.rwlock("cw", fair=fair, patience=0)
                    got.append(
                        await (wrw.write if write else wrw.read)(timeout=HANG_GUARD).acquire()
                    )

                if holder == "writer":
                    for _ in range(2):
                        tg.start_soon(go, False)
                    await waiting.reach(2)
                else:
                    tg.start_soon(go, True)
                    await waiting.reach(1)
                await waiters.settle()
                await holders.aclose()
        assert all(lease.lost for lease in held)
        assert len(got) == (2 if holder == "writer" else 1)
        for lease in got:
            await lease.release()
        await waiters.settle()
    assert await masters.keys() == [[]] * len(masters)


async def test_a_readers_block_exited_in_another_task_releases_its_entry(
    servers: ServerGroup, masters: Masters
) -> None:
    async with AsyncRedlock(servers.urls) as rl, AsyncRedlock(servers.urls) as other:
        lock = rl.rwlock("ex").read(ttl=HANG_GUARD)
        holder = {"lease": await asyncio.create_task(lock.__aenter__())}
        with pytest.raises(RuntimeError, match="another task"):
            await asyncio.create_task(lock.__aexit__(None, None, None))
        lease = holder["lease"]
        assert isinstance(lease, Lease)
        assert not lease.held
        assert not lease.lost
        await rl.settle()
        async with other.rwlock("ex").write(timeout=0):
            pass
        await other.settle()
    assert await masters.keys() == [[]] * len(masters)


async def test_inspect_lists_the_waiters_not_the_holder_of_a_fair_rwlock(
    servers: ServerGroup, masters: Masters
) -> None:
    async with (
        AsyncRedlock(servers.urls) as holders,
        AsyncRedlock(servers.urls, retry_delay=HANG_GUARD) as waiters,
    ):
        readers = [
            await holders.rwlock("in", fair=True).read(ttl=HANG_GUARD).acquire() for _ in range(2)
        ]
        waiting = Waiting([waiters])
        got: list[Lease] = []
        with whole_retry_delay(waiters), anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def go(write: bool) -> None:
                    rw = waiters.rwlock("in", fair=True)
                    got.append(await (rw.write if write else rw.read)(timeout=HANG_GUARD).acquire())

                tg.start_soon(go, True)
                await waiting.reach(1)
                tg.start_soon(go, False)
                await waiting.reach(2)
                await waiters.settle()
                state = await holders.inspect("in")
                for node in state.nodes:
                    assert [w[:2] for w in node.queue] == ["w:", "r:"], node
                    assert sorted(v for v, _ in node.readers) == sorted(r.value for r in readers)
                    assert node.holder is None
                for lease in readers:
                    await lease.release()
                assert await polled(lambda: bool(got))  # the task took its lease
                await waiters.settle()
                state = await holders.inspect("in")
                assert state.holder == got[0].value
                for node in state.nodes:
                    # the writer holds (left out), the reader still waits behind it
                    assert [w[:2] for w in node.queue] == ["r:"], node
                    assert node.readers == ()
                await got[0].release()
        assert len(got) == 2
        assert got[1].shared
        await got[1].release()
        for rl in (holders, waiters):
            await rl.settle()
    assert await masters.keys() == [[]] * len(masters)
