"""Cancellation and closing on the newest paths, swept over the loop steps at which
they strike: a waiter the masters hand the key to, cancelled or closed while it
confirms (also with a task of its client queued behind it); a writer adopting keys
handed back to itself; writers, readers, sets and semaphores closed with another
client waiting; a block cancelled, or its client closed, while its lease's
extension is out.

Each test checks what the contract promises (docs/guarantees.md, docs/algorithm.md
"Closing", "Failure cleanup"): nothing left on the masters, no task or connection of
the library, and every other waiter served at once, never after a holder's TTL. The
sweeps take every third or fourth step (each step is a full hand-over on five
masters), but for the cheapest; they passed over every step when written."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockLostError, LockTimeoutError
from asyncredlock.testing import ServerGroup, Waits, client_state, hold_calls, whole_retry_delay

from .conftest import Masters, Waiting, library_tasks, queues

pytestmark = pytest.mark.anyio

GUARD = 10.0
PATIENT = 120.0
CONFIRM = 2.0


#: How the fence counters stand before the release: skewed (a commit round while the
#: handed waiter confirms), or no fencing at all (counts that agree, "lined up", take
#: the unfenced path: no commit round).
FENCES = ["skewed", "unfenced"]


async def _held(holders: AsyncRedlock, masters: Masters, name: str, fences: str) -> Lease:
    """``name`` held by ``holders`` (every master's reply in), its fence counters
    then lined up, skewed, or left as they are (unfenced)."""
    held = await holders.lock(name, ttl=PATIENT, fencing=fences != "unfenced").acquire()
    await holders.settle()
    if fences == "lined up":
        await masters.line_up_fences(name)
    elif fences == "skewed":
        await masters.skew_fences(name)
    return held


class TestHandedWaiterCancelledAtEveryStep:
    """H holds "k"; W (in line, its hand-over terms on every master) and then N (of
    other clients, patient) wait. H releases (the masters hand W the key), and W is
    cancelled after k loop steps, k = 0..39: before it hears, while it confirms
    (the commit round, when the counts differ), or after it holds the lease. N must
    get the lock at once (W's leaving gives the key back and names N; or W's lease,
    released, hands it to N), never after a retry delay or a TTL; nothing of W is
    left in its client or on the masters."""

    STEPS = range(0, 40)  # every step (cheap): W must take the lease at some k

    @pytest.mark.parametrize("fences", FENCES)
    async def test_the_next_waiter_goes_at_once_and_nothing_is_left(
        self, servers: ServerGroup, masters: Masters, fences: str
    ) -> None:
        fencing = fences != "unfenced"
        taken = 0
        sources: list[str] = []
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as holders,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as waiters,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as nexts,
        ):
            for steps in self.STEPS:
                held = await _held(holders, masters, "k", fences)
                got: list[Lease] = []
                order: list[str] = []
                with whole_retry_delay(waiters, nexts), anyio.fail_after(GUARD):
                    w_waits, n_waits = Waiting([waiters]), Waiting([nexts])
                    async with anyio.create_task_group() as tg:

                        async def next_one(out: list[str] = order) -> None:
                            async with nexts.lock("k", timeout=PATIENT, fencing=fencing):
                                out.append("next")

                        w_scope = anyio.CancelScope()
                        w_done = anyio.Event()

                        async def doomed(
                            sc: anyio.CancelScope = w_scope,
                            out: list[Lease] = got,
                            done: anyio.Event = w_done,
                        ) -> None:
                            try:
                                with sc:
                                    lock = waiters.lock("k", timeout=PATIENT, fencing=fencing)
                                    out.append(await lock.acquire())
                            finally:
                                done.set()

                        tg.start_soon(doomed)
                        await w_waits.reach(1)  # in line, its terms left
                        tg.start_soon(next_one)
                        await n_waits.reach(1)  # queued behind W
                        await waiters.settle()
                        await nexts.settle()
                        tg.start_soon(held.release)
                        for _ in range(steps):
                            await anyio.lowlevel.checkpoint()
                        w_scope.cancel()
                        await w_done.wait()  # W left, or holds the lease
                        for lease in got:
                            taken += 1
                            sources.append(lease.statistics().source)
                            await lease.release()
                    await holders.settle()
                    await waiters.settle()
                    await nexts.settle()
                assert order == ["next"], steps
                keys = await masters.keys()
                assert keys == [[]] * len(masters), (steps, keys)
                state = client_state(waiters)
                assert (state.held, state.addressed, dict(state.listening)) == (0, 0, {}), steps
                assert dict(state.slots) == {}, steps
            stats = waiters.statistics()
            assert (stats.held, stats.in_flight, stats.background_tasks) == (0, 0, 0)
        assert set(sources) == {"hand-over"}  # the masters handed W the key each time
        assert 0 < taken < len(self.STEPS)  # both sides covered
        assert library_tasks() == []


async def _connections(masters: Masters) -> list[int]:
    """How many client connections each master has (CLIENT LIST)."""
    return [len(await client.client_list()) for client in masters.clients]


class TestHandedWaiterClosedAtEveryStep:
    """As above, but W's client is closed (``aclose()``) after k loop steps instead:
    W's acquire() ends (the closing error, or a lease that aclose() ends lost), N gets
    the lock at once, nothing of W is left on the masters, and W's client leaves no
    connection open on any master (CLIENT LIST)."""

    STEPS = range(0, 40, 4)

    @pytest.mark.parametrize("fences", ["skewed"])
    async def test_the_next_waiter_goes_at_once_and_no_connection_is_left(
        self, servers: ServerGroup, masters: Masters, fences: str
    ) -> None:
        fencing = fences != "unfenced"
        outcomes: dict[str, int] = {}
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as holders,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as nexts,
        ):
            # N's subscriptions opened once, before any count of connections
            warm = await holders.lock("warm").acquire()
            with pytest.raises(LockTimeoutError):
                await nexts.lock("warm", timeout=0.5).acquire()
            await warm.release()
            for steps in self.STEPS:
                held = await _held(holders, masters, "k", fences)
                await nexts.settle()
                before = await _connections(masters)
                waiters = AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM)
                got: list[object] = []
                order: list[str] = []
                try:
                    with whole_retry_delay(waiters, nexts), anyio.fail_after(GUARD):
                        w_waits, n_waits = Waiting([waiters]), Waiting([nexts])
                        async with anyio.create_task_group() as tg:

                            async def next_one(out: list[str] = order) -> None:
                                async with nexts.lock("k", timeout=PATIENT, fencing=fencing):
                                    out.append("next")

                            async def doomed(
                                client: AsyncRedlock = waiters, out: list[object] = got
                            ) -> None:
                                lock = client.lock("k", timeout=PATIENT, fencing=fencing)
                                try:
                                    out.append(await lock.acquire())
                                except Exception as exc:
                                    out.append(exc)

                            tg.start_soon(doomed)
                            await w_waits.reach(1)
                            tg.start_soon(next_one)
                            await n_waits.reach(1)
                            await waiters.settle()
                            await nexts.settle()
                            tg.start_soon(held.release)
                            for _ in range(steps):
                                await anyio.lowlevel.checkpoint()
                            await waiters.aclose()
                            assert got, "acquire() ended within aclose()"
                        await holders.settle()
                        await nexts.settle()
                finally:
                    await waiters.aclose()
                (result,) = got
                kind = type(result).__name__
                if isinstance(result, Lease):
                    kind += " lost" if result.lost else " held?"
                outcomes[kind] = outcomes.get(kind, 0) + 1
                assert not (isinstance(result, Lease) and result.held), steps
                assert isinstance(result, Lease | RuntimeError), (steps, result)
                assert order == ["next"], steps
                keys = await masters.keys()
                assert keys == [[]] * len(masters), (steps, keys)
                assert [len(q) for q in await queues(masters, "k")] == [0] * len(masters)
                assert await _connections(masters) == before, steps
                assert [t for t in library_tasks() if _of(t, waiters)] == [], steps
        assert library_tasks() == []


def _of(task: asyncio.Task[object], client: AsyncRedlock) -> bool:
    """Whether ``task`` runs code of ``client`` (its coroutine's frame holds it)."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    return frame is not None and any(
        v is client or v is client._core for v in frame.f_locals.values()
    )


#: Kinds of lease, each made by one client's ``async with`` (name "x"): how, and the
#: script its extension runs.
def _lock(redlock: AsyncRedlock) -> Any:
    return redlock.lock("x", ttl=0.6, timeout=GUARD)


def _reader(redlock: AsyncRedlock) -> Any:
    return redlock.rwlock("x").read(ttl=0.6, timeout=GUARD)


#: (A set's, a semaphore's and a writer's lease extend as a lock's does.)
LEASES = {
    "lock": (_lock, "extend"),
    "reader": (_reader, "extend_read"),
}


class TestBlockCancelledWhileItsExtensionIsOut:
    """The automatic extension of a lease is out (its calls held before they are
    sent, then let go after the block ended): the block is cancelled, or its client
    closed. The release must leave no key (the late extension finds none to
    extend), no task of the library (the extender is gone), and the lock free."""

    @pytest.mark.parametrize("how", ["cancelled", "aclose"])
    @pytest.mark.parametrize("kind", list(LEASES))
    async def test_nothing_is_left_and_the_lock_is_free(
        self, servers: ServerGroup, masters: Masters, kind: str, how: str
    ) -> None:
        make, script = LEASES[kind]
        async with AsyncRedlock(servers.urls) as other:
            redlock = AsyncRedlock(servers.urls)
            try:
                before = await _connections(masters)
                entered = asyncio.Event()
                with hold_calls(redlock, script) as calls, anyio.fail_after(GUARD):
                    async with anyio.create_task_group() as tg:

                        async def hold() -> None:
                            try:
                                async with make(redlock) as lease:
                                    entered.set()
                                    assert lease.held
                                    await anyio.sleep_forever()
                            except LockLostError:  # documented: aclose() ends it lost
                                assert how == "aclose"

                        tg.start_soon(hold)
                        await entered.wait()
                        await calls.reached.wait()  # its extension is out
                        if how == "cancelled":
                            tg.cancel_scope.cancel()
                        else:
                            await redlock.aclose()
                            tg.cancel_scope.cancel()
                    if how == "cancelled":
                        await redlock.settle()
                        assert [t for t in library_tasks() if _of(t, redlock)] == []
                calls.let_go()
                if how == "cancelled":
                    await redlock.settle()
                    assert redlock.statistics().held == 0
                    assert redlock.statistics().background_tasks == 0
            finally:
                await redlock.aclose()
            await other.settle()
            assert await masters.keys() == [[]] * len(masters)
            assert await _connections(masters) == before  # the closed client's are gone
            async with make(other) as again:  # free at once
                assert again.held
            await other.settle()
        assert library_tasks() == []


class TestAdoptingWriterCancelledAtEveryStep:
    """test_self_handover's setting: readers hold "doc", their entries gone on two
    masters of five, so a writer's attempts are granted there, undone, and the key
    handed back to the writer itself. The readers release, and the writer is
    cancelled (or its client closed) after k loop steps: before its winning attempt,
    while it is out, or after it took the lease and adopted the handed keys. Nothing
    may be left on any master (no handed key, no adopted key, no entry), and the
    lock is free at once."""

    STEPS = range(0, 30, 3)

    @pytest.mark.parametrize(
        ("mode", "how"),
        [
            ({"fair": True}, "cancelled"),
            ({"patience": 0}, "aclose"),
            ({"exclusive": True}, "cancelled"),
        ],
        ids=["fair-cancelled", "patience 0-aclose", "lock(name)-cancelled"],
    )
    async def test_nothing_is_left_and_the_lock_is_free(
        self, servers: ServerGroup, masters: Masters, mode: dict[str, Any], how: str
    ) -> None:
        mode = dict(mode)
        exclusive = bool(mode.pop("exclusive", False))
        outcomes: dict[str, int] = {}
        async with AsyncRedlock(servers.urls) as readers:
            rw = readers.rwlock("doc", **mode)
            for steps in self.STEPS:
                leases = [await rw.read(ttl=PATIENT).acquire() for _ in range(2)]
                await readers.settle()
                for client in masters.clients[:2]:
                    await client.delete("{doc}:readers")
                writers = AsyncRedlock(servers.urls, retry_delay=0.05)
                got: list[object] = []
                try:
                    if exclusive:
                        lock = writers.lock("doc", ttl=1.5, timeout=GUARD)
                    else:
                        lock = writers.rwlock("doc", **mode).write(ttl=1.5, timeout=GUARD)
                    waiting = Waiting([writers])
                    with anyio.fail_after(GUARD):
                        async with anyio.create_task_group() as tg:
                            scope = anyio.CancelScope()

                            async def write(
                                lk: Any = lock, sc: Any = scope, out: list[object] = got
                            ) -> None:
                                with sc:
                                    try:
                                        out.append(await lk.acquire())
                                    except Exception as exc:
                                        out.append(exc)

                            tg.start_soon(write)
                            await waiting.reach(2)  # refused, undone, handed back: twice
                            for lease in leases:
                                tg.start_soon(lease.release)
                            for _ in range(steps):
                                await anyio.lowlevel.checkpoint()
                            if how == "cancelled":
                                scope.cancel()
                            else:
                                await writers.aclose()
                        for each in got:
                            if isinstance(each, Lease) and each.held:
                                await each.release()
                        await writers.settle()
                        await readers.settle()
                finally:
                    await writers.aclose()
                kind = type(got[0]).__name__ if got else "cancelled"
                outcomes[kind] = outcomes.get(kind, 0) + 1
                keys = await masters.keys()
                assert keys == [[]] * len(masters), (steps, got, keys)
                async with readers.rwlock("doc", **mode).write(timeout=0):
                    pass  # free at once
                await readers.settle()
        assert library_tasks() == []


#: name: (how H holds "j" at once, how a waiter waits for it); every waiter patient.
CLOSE_KINDS: dict[str, tuple[Any, Any]] = {
    "writer fair": (
        lambda r: r.rwlock("j", fair=True).write(ttl=PATIENT, timeout=0).acquire(),
        lambda r: r.rwlock("j", fair=True).write(timeout=PATIENT).acquire(),
    ),
    "writer default": (
        lambda r: r.rwlock("j").write(ttl=PATIENT, timeout=0).acquire(),
        lambda r: r.rwlock("j").write(timeout=PATIENT).acquire(),
    ),
    "reader fair": (
        lambda r: r.rwlock("j", fair=True).write(ttl=PATIENT, timeout=0).acquire(),
        lambda r: r.rwlock("j", fair=True).read(timeout=PATIENT).acquire(),
    ),
    "reader default": (
        lambda r: r.rwlock("j").write(ttl=PATIENT, timeout=0).acquire(),
        lambda r: r.rwlock("j").read(timeout=PATIENT).acquire(),
    ),
    "set": (
        lambda r: r.lock("j", ttl=PATIENT, timeout=0).acquire(),
        lambda r: r.lock(["i", "j"], timeout=PATIENT).acquire(),
    ),
    "semaphore unfair": (
        lambda r: r.semaphore("j", 1, ttl=PATIENT, timeout=0).acquire(),
        lambda r: r.semaphore("j", 1, ttl=PATIENT, timeout=PATIENT).acquire(),
    ),
    "semaphore fair": (
        lambda r: r.semaphore("j", 1, ttl=PATIENT, fair=True, timeout=0).acquire(),
        lambda r: r.semaphore("j", 1, ttl=PATIENT, fair=True, timeout=PATIENT).acquire(),
    ),
}


class TestClosedAtEveryStepWithAnotherWaiter:
    """H holds "j"; W (its own client) and then N (another client) wait, both with
    a retry delay no test waits out. H releases, and W's client is closed after k
    loop steps (W may be woken, attempting, or holding by then). N must get the lock
    at once, nothing may be left on the masters, and W's client must leave no
    connection and no task."""

    STEPS = range(0, 30, 4)

    @pytest.mark.parametrize("kind", list(CLOSE_KINDS))
    async def test_the_other_waiter_goes_at_once(
        self, servers: ServerGroup, masters: Masters, kind: str
    ) -> None:
        hold, wait = CLOSE_KINDS[kind]
        urls = servers.urls
        stranded: list[tuple[int, str]] = []
        outcomes: dict[str, int] = {}
        async with (
            AsyncRedlock(urls) as holder,
            AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=CONFIRM) as nexts,
        ):
            warm = await holder.lock("warm").acquire()
            with pytest.raises(LockTimeoutError):  # N's subscriptions, opened once
                await nexts.lock("warm", timeout=0.3).acquire()
            await warm.release()
            await holder.settle()
            for steps in self.STEPS:
                held = await hold(holder)
                await holder.settle()
                await nexts.settle()
                before = await _connections(masters)
                waiters = AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=CONFIRM)
                got: list[object] = []
                try:
                    with whole_retry_delay(waiters, nexts):
                        async with asyncio.timeout(GUARD):
                            w_waits, n_waits = Waiting([waiters]), Waiting([nexts])

                            async def w_take(
                                client: AsyncRedlock = waiters, out: list[object] = got
                            ) -> None:
                                try:
                                    out.append(await wait(client))
                                except Exception as exc:
                                    out.append(exc)

                            w = asyncio.ensure_future(w_take())
                            await w_waits.reach(1)
                            n = asyncio.ensure_future(wait(nexts))
                            await n_waits.reach(1)
                            await waiters.settle()
                            await nexts.settle()
                            release = asyncio.ensure_future(held.release())
                            for _ in range(steps):
                                await asyncio.sleep(0)
                            await waiters.aclose()
                            await w
                            await release
                        try:
                            async with asyncio.timeout(3.0):  # << PATIENT
                                lease = await n
                        except TimeoutError:
                            stranded.append((steps, type(got[0]).__name__))
                            n.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await n
                        else:
                            await lease.release()
                finally:
                    await waiters.aclose()
                await holder.settle()
                await nexts.settle()
                (result,) = got
                name = type(result).__name__
                outcomes[name] = outcomes.get(name, 0) + 1
                assert isinstance(result, Lease | RuntimeError), (steps, result)
                keys = await masters.keys()
                assert keys == [[]] * len(masters), (steps, keys)
                assert await _connections(masters) == before, steps
                assert [t for t in library_tasks() if _of(t, waiters)] == [], steps
        assert stranded == []
        assert library_tasks() == []


class TestHandedSlotHolderCancelledWithATaskBehind:
    """W's client has two tasks on "g": T1 holds the client's slot and waits on the
    masters, in line; T2 queues behind it in the process. N (another client) is queued
    on the masters after T1. H releases (the masters hand T1 the key) and T1 is
    cancelled after k loop steps. T2 and N must both get the lock, one after the
    other, at once: no retry delay, no TTL."""

    STEPS = range(0, 30, 3)

    @pytest.mark.parametrize("fences", FENCES)
    async def test_both_others_get_the_lock_at_once(
        self, servers: ServerGroup, masters: Masters, fences: str
    ) -> None:
        fencing = fences != "unfenced"
        stranded: list[tuple[int, list[str]]] = []
        async with (
            AsyncRedlock(servers.urls, retry_delay=0.02) as holders,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as waiters,
            AsyncRedlock(servers.urls, retry_delay=PATIENT, node_timeout=CONFIRM) as nexts,
        ):
            for steps in self.STEPS:
                held = await _held(holders, masters, "g", fences)
                order: list[str] = []
                with whole_retry_delay(waiters, nexts):
                    w_waits, n_waits = Waiting([waiters]), Waiting([nexts])
                    queued = Waits(waiters)

                    async def take(client: AsyncRedlock, who: str, out: list[str] = order) -> None:
                        async with client.lock("g", timeout=PATIENT, fencing=fencing):
                            out.append(who)

                    async with asyncio.timeout(GUARD):
                        t1 = asyncio.ensure_future(take(waiters, "t1"))
                        await w_waits.reach(1)
                        t2 = asyncio.ensure_future(take(waiters, "t2"))
                        await queued.reach(queued=1)
                        n = asyncio.ensure_future(take(nexts, "n"))
                        await n_waits.reach(1)
                        await waiters.settle()
                        await nexts.settle()
                        release = asyncio.ensure_future(held.release())
                        for _ in range(steps):
                            await asyncio.sleep(0)
                        t1.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await t1
                        await release
                    try:
                        async with asyncio.timeout(3.0):  # << PATIENT
                            await asyncio.gather(t2, n)
                    except TimeoutError:
                        stranded.append((steps, list(order)))
                        for task in (t2, n):
                            task.cancel()
                        await asyncio.gather(t2, n, return_exceptions=True)
                    queued.close()
                for client in (holders, waiters, nexts):
                    await client.settle()
                keys = await masters.keys()
                assert keys == [[]] * len(masters), (steps, keys)
                state = client_state(waiters)
                assert (state.held, state.addressed, dict(state.slots)) == (0, 0, {}), steps
        assert stranded == []
