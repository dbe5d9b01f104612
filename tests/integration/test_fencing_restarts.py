"""A minority of masters restarted empty (the fence counter, the queue and the holder's
key lost there) while a lease is held and a waiter is in line, handed over, adopting,
or passed on within a process: every later token is larger, and is the one a quorum
of masters holds."""

from __future__ import annotations

import itertools

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, Queue, Waiting, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30
POLLS = HANG_GUARD * 40


async def committed(
    masters: Masters, name: str, token: int | None, quorum: int
) -> list[int | None]:
    assert isinstance(token, int)
    fences = await masters.fences(name)
    assert fences.count(token) >= quorum, (token, fences)
    return fences


async def reconnect(masters: Masters, group: ServerGroup, which: range) -> None:
    for i in which:
        await masters.clients[i].connection_pool.disconnect()


class TestHandOverAcrossAMinorityRestart:
    async def test_the_handed_token_is_above_the_holder_s_and_committed(
        self, make_servers: MakeServers
    ) -> None:
        """A holds on five; B is in line; masters 0 and 1 restart empty (A's key,
        B's entry and the counter gone there). B's attempts are granted there, from
        fresh counters (the clock in µs, far above A's counts), and its undos hand
        it the key back there; A's release hands it the key on 2, 3 and 4 counting
        from A's token. B's token is the largest count, committed on a quorum."""
        group = make_servers(5)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls) as a,
                AsyncRedlock(group.urls, retry_delay=0.05) as b,
            ):
                held = await a.lock("k").acquire()
                await a.settle()
                got: list[Lease] = []
                waiting = Waiting([b])
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            got.append(await b.lock("k", timeout=HANG_GUARD).acquire())

                        tg.start_soon(take)
                        await waiting.reach(2)
                        for server in group[:2]:
                            server.restart()
                        await reconnect(masters, group, range(2))
                        # B attempts again (a refresh pause): granted on 0 and 1 only
                        assert await polled(lambda: waiting.entered >= 4, POLLS)
                        assert held.held
                        await held.release()
                lease = got[0]
                await b.settle()
                assert held.token is not None
                assert lease.token is not None
                assert lease.token > held.token
                await committed(masters, "k", lease.token, b.quorum)
                await lease.release()
                after = await a.lock("k").acquire()
                assert after.token is not None
                assert after.token > lease.token + TOKEN_BLOCK - 1
                await after.release()
        finally:
            await masters.aclose()


class TestAdoptionAcrossAMinorityRestart:
    async def test_the_writer_s_token_orders_with_the_writers_before_and_after(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls, retry_delay=0.05) as readers,
                AsyncRedlock(group.urls, retry_delay=0.05) as writers,
            ):
                first = await writers.lock("doc").acquire()
                await first.release()
                await writers.settle()
                rw = readers.rwlock("doc")
                leases = [await rw.read(ttl=1.0).acquire() for _ in range(2)]
                await readers.settle()
                for server in group[:2]:
                    server.restart()
                await reconnect(masters, group, range(2))
                got: list[Lease] = []
                waiting = Waiting([writers])
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def write() -> None:
                            got.append(
                                await writers.lock("doc", ttl=1.5, timeout=HANG_GUARD).acquire()
                            )

                        tg.start_soon(write)
                        await waiting.reach(2)
                        for lease in leases:
                            await lease.release()
                writer = got[0]
                await writers.settle()
                state = await writers.inspect("doc")
                fences = await masters.fences("doc")
                assert [n.holder for n in state.nodes] == [writer.value] * 5
                assert first.token is not None
                assert writer.token is not None
                assert writer.token > first.token
                await committed(masters, "doc", writer.token, writers.quorum)
                assert all(f is not None and f >= writer.token for f in fences)
                # two other masters restart empty: the writer still holds three, and
                # the next holder, after it, gets a larger token
                for server in group[2:4]:
                    server.restart()
                await reconnect(masters, group, range(2, 4))
                with pytest.raises(LockTimeoutError):
                    await readers.lock("doc", timeout=0).acquire()
                start = writers.statistics().extensions
                assert await polled(lambda: writers.statistics().extensions >= start + 2, POLLS)
                assert writer.held
                await writer.release()
                after = await readers.lock("doc", timeout=5).acquire()
                assert after.token is not None
                assert after.token >= writer.token + TOKEN_BLOCK
                await after.release()
        finally:
            await masters.aclose()


class TestChainAcrossAMinorityRestart:
    async def test_the_next_acquisition_from_the_masters_is_past_the_whole_chain(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        masters = Masters(group.urls)
        leases: list[Lease] = []
        try:
            async with AsyncRedlock(group.urls) as a, AsyncRedlock(group.urls) as other:
                queue = Queue(a)
                first = await a.lock("chain").acquire()
                await a.settle()
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        lock = a.lock("chain", timeout=HANG_GUARD)

                        async def take() -> None:
                            lease = await lock.acquire()
                            leases.append(lease)
                            if len(leases) == 5:
                                for server in group[:2]:
                                    server.restart()
                                await reconnect(masters, group, range(2))
                            await lease.release()

                        for _ in range(10):
                            tg.start_soon(take)
                        await queue.reach(10)
                        await first.release()
                after = await other.lock("chain", timeout=5).acquire()
                await after.release()
        finally:
            await masters.aclose()
        tokens = [first.token, *(lease.token for lease in leases), after.token]
        assert all(isinstance(t, int) for t in tokens)
        assert all(y > x for x, y in itertools.pairwise(tokens)), tokens  # type: ignore[operator]
        assert after.token >= first.token + TOKEN_BLOCK  # type: ignore[operator]


class TestFairHandOverAcrossAMinorityRestart:
    """The fair variant: B queued from its first attempt."""

    async def test_the_handed_token_is_above_the_holder_s(self, make_servers: MakeServers) -> None:
        group = make_servers(5)
        masters = Masters(group.urls)
        try:
            async with (
                AsyncRedlock(group.urls) as a,
                AsyncRedlock(group.urls, retry_delay=0.05) as b,
            ):
                held = await a.lock("f", fair=True).acquire()
                await a.settle()
                got: list[Lease] = []
                with anyio.fail_after(HANG_GUARD), Waits(b) as waits:
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            got.append(await b.lock("f", fair=True, timeout=HANG_GUARD).acquire())

                        tg.start_soon(take)
                        await waits.reach(1)
                        for server in group[:2]:
                            server.restart()
                        await reconnect(masters, group, range(2))
                        assert await polled(lambda: waits.waiting >= 3, POLLS)
                        await held.release()
                lease = got[0]
                await b.settle()
                assert lease.token is not None
                assert held.token is not None
                assert lease.token > held.token
                await committed(masters, "f", lease.token, b.quorum)
                await lease.release()
        finally:
            await masters.aclose()


class TestMinorityRestartWithClocks:
    """X commits on masters 0-2 (3 and 4 held by a foreign key); 0 and 1 restart
    empty; Y is granted by 0, 1 and 3 (2 and 4 held by a foreign key): Y's quorum
    shares only the two wiped masters with X's, and master 3 never saw X's count.
    Y's token is then above X's only through the clocks: the restarted counters
    start from their masters' clocks, and master 3's count is lifted to its clock's
    second (guarantees.md, what is assumed of the servers)."""

    async def _x_then_y(self, group: ServerGroup, behind: float) -> tuple[int, int]:
        masters = Masters(group.urls)
        try:
            async with AsyncRedlock(group.urls) as redlock:
                warm = await redlock.lock("wipe").acquire()  # counters made, in step
                await warm.release()
                await redlock.settle()
                top = max(f for f in await masters.fences("wipe") if f is not None)
                for client in masters.clients:  # in step, at the clock's count
                    await client.set("{wipe}:fence", top)
                for client in masters.clients[3:]:
                    await client.set("wipe", "foreign", px=60_000)
                x = await redlock.lock("wipe", timeout=0).acquire()
                await x.release()
                await redlock.settle()
                for server in group[:2]:
                    server.clock.jump(-behind)
                    server.restart()
                group[3].clock.jump(-behind)  # (or its clock floor may lift it past X)
                await reconnect(masters, group, range(2))
                await masters.clients[3].delete("wipe")
                await masters.clients[2].set("wipe", "foreign", px=60_000)
                y = await redlock.lock("wipe", timeout=0).acquire()
                await y.release()
        finally:
            await masters.aclose()
        assert x.token is not None
        assert y.token is not None
        return x.token, y.token

    @pytest.mark.usefixtures("fake_clock_available")
    async def test_with_the_clocks_right_the_later_token_is_larger(
        self, make_servers: MakeServers
    ) -> None:
        x, y = await self._x_then_y(make_servers(5, fake_clock=True), behind=0.0)
        assert y > x

    @pytest.mark.usefixtures("fake_clock_available")
    async def test_restarted_with_clocks_behind_the_later_token_is_smaller(
        self, make_servers: MakeServers
    ) -> None:
        x, y = await self._x_then_y(make_servers(5, fake_clock=True), behind=60.0)
        assert y <= x  # the documented limit: repeated (equal) or smaller
