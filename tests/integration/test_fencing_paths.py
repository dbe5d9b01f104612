"""One resource taken through every grant path in turn: a direct attempt, a server-side
hand-over to another client's waiter (counters in step, and apart so that the
hand-over needs its commit round), an in-process hand-off, a waiter that adopts keys
handed back to itself, a read-write lock's writer after readers, a set of resources;
and each token checked against the one before and against the fence counters on
every master."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock._keys import aux_key, readers_key
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock.testing import ServerGroup

from .conftest import ABOVE_CLOCK, Masters, Queue, Waiting, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class Ledger:
    """Every grant of one resource in grant order: its path, its token, and the fence
    counters on each master just after it."""

    def __init__(self, masters: Masters, quorum: int, name: str) -> None:
        self.masters = masters
        self.fence = aux_key(name, "fence")
        self.quorum = quorum
        self.rows: list[tuple[str, int, list[int | None]]] = []

    async def add(self, path: str, token: int | None, *, committed: bool = True) -> None:
        assert isinstance(token, int), (path, token)
        fences = await self.fences()
        if self.rows:
            last_path, last, _ = self.rows[-1]
            assert token > last, (path, token, last_path, last, self.rows)
        if committed:
            # the masters committed (or counted exactly) this token on a quorum
            assert fences.count(token) >= self.quorum, (path, token, fences)
        else:
            # a hand-off within a process: the masters still say the acquisition's
            # token, and their next acquisition counts past the whole block
            assert max(f for f in fences if f is not None) + TOKEN_BLOCK > token, (path, fences)
        self.rows.append((path, token, fences))

    async def fences(self) -> list[int | None]:
        values = [await client.get(self.fence) for client in self.masters.clients]
        return [None if value is None else int(value) for value in values]


async def _settled(*redlocks: AsyncRedlock) -> None:
    for redlock in redlocks:
        await redlock.settle()


class TestEveryGrantPath:
    @pytest.mark.parametrize("name", ["paths", "{user:7}:cart", "a}b"])
    @pytest.mark.parametrize("apart", [False, True], ids=["counters in step", "counters apart"])
    async def test_tokens_increase_and_are_the_committed_ones(
        self, servers: ServerGroup, masters: Masters, apart: bool, name: str
    ) -> None:
        NAME = name
        async with (
            AsyncRedlock(servers.urls) as a,
            AsyncRedlock(servers.urls, retry_delay=0.05) as b,
            AsyncRedlock(servers.urls) as readers,
        ):
            ledger = Ledger(masters, a.quorum, NAME)

            # 1. a direct attempt
            lease = await a.lock(NAME).acquire()
            await _settled(a)
            assert lease.statistics().source == "attempt"
            await ledger.add("attempt", lease.token)

            # 2. a server-side hand-over to another client's waiter
            got: list[Lease] = []
            waiting = Waiting([b])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def wait_in_b() -> None:
                        got.append(await b.lock(NAME, timeout=HANG_GUARD).acquire())

                    tg.start_soon(wait_in_b)
                    await waiting.reach(2)  # refused, enrolled, refused again: in line
                    if apart:  # each master counts its own
                        for i, client in enumerate(masters.clients):
                            await client.set(ledger.fence, ABOVE_CLOCK + 1 + i)
                    commits = b.statistics().commits
                    await lease.release()
            handed = got[0]
            await _settled(a, b)
            assert handed.statistics().source == "hand-over"
            if apart:
                assert b.statistics().commits == commits + 1  # the hand-over's commit round
            await ledger.add("hand-over", handed.token)

            # 3. an in-process hand-off between two tasks of b (once the handed
            # lease extended its short hand-over PX: a hand-off needs half a TTL left)
            with anyio.fail_after(HANG_GUARD):
                assert await polled(lambda: handed.statistics().extensions >= 1)
            passed: list[Lease] = []
            queue = Queue(b)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def behind_in_b() -> None:
                        passed.append(await b.lock(NAME, timeout=HANG_GUARD).acquire())

                    tg.start_soon(behind_in_b)
                    await queue.reach(1)
                    await handed.release()
            assert passed[0].statistics().source == "hand-off"
            assert handed.token is not None
            assert passed[0].token == handed.token + 1
            await ledger.add("hand-off", passed[0].token, committed=False)
            await passed[0].release()
            await _settled(a, b)

            # 4. a writer that waited adopts the keys handed back to itself
            rw = readers.rwlock(NAME)
            reads = [await rw.read(ttl=HANG_GUARD).acquire() for _ in range(2)]
            await _settled(readers)
            for client in masters.clients[:2]:  # the readers' entries lapsed there
                await client.delete(readers_key(NAME))
            if apart:
                # the masters that will grant the winning attempt count far above
                # the two that hand the writer its key back: adopt.lua must raise those
                for client in masters.clients[2:]:
                    await client.set(ledger.fence, ABOVE_CLOCK + 10**9)
            got = []
            waiting = Waiting([b])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def write_in_b() -> None:
                        got.append(await b.lock(NAME, ttl=1.5, timeout=HANG_GUARD).acquire())

                    tg.start_soon(write_in_b)
                    await waiting.reach(2)
                    for read in reads:
                        await read.release()
            adopted = got[0]
            await _settled(b, readers)
            assert adopted.statistics().source == "attempt"
            state = await b.inspect(NAME)
            assert [node.holder for node in state.nodes] == [adopted.value] * len(masters)
            await ledger.add("adoption", adopted.token)
            fences = ledger.rows[-1][2]
            assert all(f is not None and f >= adopted.token for f in fences), fences
            assert [node.fence for node in state.nodes] == fences
            # 4b. the adopted lease passed on to another task of b
            passed = []
            queue = Queue(b)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def after_adoption() -> None:
                        passed.append(await b.lock(NAME, ttl=1.5, timeout=HANG_GUARD).acquire())

                    tg.start_soon(after_adoption)
                    await queue.reach(queue.queued + 1)
                    await adopted.release()
            assert passed[0].statistics().source == "hand-off"
            await ledger.add("hand-off after adoption", passed[0].token, committed=False)
            await passed[0].release()
            await _settled(b)

            # 5. a read-write lock's writer after readers (another client)
            reads = [await rw.read(ttl=HANG_GUARD).acquire() for _ in range(2)]
            got = []
            waiting = Waiting([a])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def rw_write() -> None:
                        got.append(await a.rwlock(NAME).write(timeout=HANG_GUARD).acquire())

                    tg.start_soon(rw_write)
                    await waiting.reach(1)
                    for read in reads:
                        await read.release()
            await _settled(a, readers)
            await ledger.add("rw writer", got[0].token)
            await got[0].release()
            await _settled(a)

            # 6. a set of resources, then the resource alone again
            multi = await a.lock([NAME, "other"]).acquire()
            await _settled(a)
            assert multi.token is None
            assert multi.tokens is not None
            await ledger.add("set", multi.tokens[NAME])
            await multi.release()
            again = await b.lock(NAME).acquire()
            await _settled(b)
            await ledger.add("attempt again", again.token)
            await again.release()

            # a semaphore has no tokens
            async with a.semaphore(NAME, limit=2) as slot:
                assert slot.token is None
                assert slot.tokens is None


class TestUnfencedGrantPaths:
    async def test_a_hand_over_between_unfenced_locks_leaves_the_counters_alone(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with (
            AsyncRedlock(servers.urls, fencing=False) as a,
            AsyncRedlock(servers.urls, fencing=False, retry_delay=0.05) as b,
        ):
            fenced = await a.lock("plain", fencing=True).acquire()
            await fenced.release()
            await _settled(a)
            before = await masters.fences("plain")
            held = await a.lock("plain").acquire()
            got: list[Lease] = []
            waiting = Waiting([b])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await b.lock("plain", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waiting.reach(2)
                    await held.release()
            assert got[0].statistics().source == "hand-over"
            assert got[0].token is None
            await got[0].release()
            await _settled(a, b)
            assert await masters.fences("plain") == before
            after = await a.lock("plain", fencing=True).acquire()
            assert after.token is not None
            assert fenced.token is not None
            assert after.token >= fenced.token + TOKEN_BLOCK
            await after.release()

    @pytest.mark.parametrize(("holder", "waiter"), [(True, False), (False, True)])
    async def test_a_hand_over_between_a_fenced_and_an_unfenced_lock(
        self, servers: ServerGroup, masters: Masters, holder: bool, waiter: bool
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as a,
            AsyncRedlock(servers.urls, retry_delay=0.05) as b,
        ):
            first = await a.lock("mixed-fencing").acquire()
            await first.release()
            await _settled(a)
            held = await a.lock("mixed-fencing", fencing=holder).acquire()
            await _settled(a)
            before = await masters.fences("mixed-fencing")
            got: list[Lease] = []
            waiting = Waiting([b])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        lock = b.lock("mixed-fencing", fencing=waiter, timeout=HANG_GUARD)
                        got.append(await lock.acquire())

                    tg.start_soon(take)
                    await waiting.reach(2)
                    await held.release()
            handed = got[0]
            await _settled(a, b)
            assert handed.statistics().source == "hand-over"
            fences = await masters.fences("mixed-fencing")
            tokens = [t for t in (first.token, held.token, handed.token) if t is not None]
            assert tokens == sorted(set(tokens))
            if waiter:
                assert handed.token is not None
                assert fences.count(handed.token) >= b.quorum
            else:
                assert handed.token is None
                assert fences == before  # the hand-over counted nothing
            await handed.release()
            after = await a.lock("mixed-fencing").acquire()
            assert after.token is not None
            assert after.token > max(tokens)
            await after.release()
