"""A queued writer granted by a minority of masters (the readers' entries, or the
holder's key, gone there: they lapsed, or a restart emptied them) and refused by the
rest: its undo there runs release.lua, which finds the writer itself first in line
with hand-over terms and hands it the key. Its next attempt, granted by the others,
must take those keys into its lease: the lease holds every master that is up and
free, not a bare quorum, and survives the failures the quorum tolerates."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError
from asyncredlock._scripts import ADOPT, evalsha
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, Waiting, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
#: the writer's TTL: its first extension comes a third of it after the lease
WRITER_TTL = 1.5


async def _extended(redlock: AsyncRedlock, times: int) -> bool:
    """Whether ``redlock``'s leases extend ``times`` more times (bounded wait)."""
    start = redlock.statistics().extensions
    return await polled(lambda: redlock.statistics().extensions >= start + times)


class TestSelfHandOver:
    """The readers' entries are gone on two masters of five: the writer's attempts
    are granted there and refused elsewhere, and each undo there hands the key back
    to the writer, first in line. Once the readers release, its attempt is granted
    by the other three: its lease must hold all five."""

    @pytest.mark.parametrize(
        "mode",
        [{"fair": True}, {"patience": 0}, {"exclusive": True}],
        ids=["fair", "patience 0", "lock(name)"],
    )
    async def test_a_writer_that_waited_holds_on_every_master_that_is_free(
        self, servers: ServerGroup, masters: Masters, mode: dict[str, object]
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as readers,
            AsyncRedlock(servers.urls, retry_delay=0.05) as writers,
        ):
            exclusive = bool(mode.pop("exclusive", False))
            rw = readers.rwlock("doc", **mode)
            leases = [await rw.read(ttl=HANG_GUARD).acquire() for _ in range(2)]
            await readers.settle()
            for client in masters.clients[:2]:  # lapsed there (or a restart emptied them)
                await client.delete("{doc}:readers")
            waiting = Waiting([writers])
            got: list[Lease] = []
            if exclusive:
                lock = writers.lock("doc", ttl=WRITER_TTL, timeout=HANG_GUARD)
            else:
                lock = writers.rwlock("doc", **mode).write(ttl=WRITER_TTL, timeout=HANG_GUARD)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def write() -> None:
                        got.append(await lock.acquire())

                    tg.start_soon(write)
                    await waiting.reach(2)  # attempted, refused, undone at least twice
                    for lease in leases:
                        await lease.release()
            await writers.settle()
            state = await writers.inspect("doc")
            assert [node.holder for node in state.nodes] == [got[0].value] * len(masters)
            assert await _extended(writers, 1)  # an extension keeps all five
            await writers.settle()
            state = await writers.inspect("doc")
            assert [node.holder for node in state.nodes] == [got[0].value] * len(masters)
            await got[0].release()
            await writers.settle()
        assert await masters.keys() == [[]] * len(masters)


class TestRestartedEmpty:
    """Readers hold, two masters of five restart empty: a writer waits (granted
    there, handed its own key back by its undos) and gets the lock once the readers
    release. Then two other masters restart empty: the writer's lease, on every
    master, still holds three."""

    @pytest.mark.parametrize(
        "mode", [{}, {"fair": True}, {"patience": 0}], ids=["default", "fair", "patience 0"]
    )
    async def test_readers_keep_a_writer_out_across_a_minority_restart_and_back(
        self, make_servers: MakeServers, mode: dict[str, object]
    ) -> None:
        group = make_servers(5)  # no persistence: a restart comes back empty
        async with (
            AsyncRedlock(group.urls, retry_delay=0.05) as readers,
            AsyncRedlock(group.urls, retry_delay=0.05) as writers,
        ):
            rw = readers.rwlock("doc", **mode)
            leases = [await rw.read(ttl=1.0).acquire() for _ in range(2)]
            await readers.settle()  # on every master
            for server in group[:2]:
                server.restart()
            with pytest.raises(LockTimeoutError):
                await writers.rwlock("doc", **mode).write(timeout=0).acquire()
            got: list[Lease] = []
            waiting = Waiting([writers])
            lock = writers.rwlock("doc", **mode).write(ttl=1.0, timeout=HANG_GUARD)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def write() -> None:
                        got.append(await lock.acquire())

                    tg.start_soon(write)
                    await waiting.reach(1)
                    assert await _extended(readers, 4)  # well past the readers' TTL
                    assert got == []
                    assert all(lease.held for lease in leases)
                    for lease in leases:
                        await lease.release()
                assert got[0].held
                # and the other way round: the writer holds, a minority restarts empty
                await writers.settle()
                for server in group[2:4]:
                    server.restart()
                with pytest.raises(LockTimeoutError):
                    await rw.read(timeout=0).acquire()
                # two masters down (empty) of five: the writer still holds three
                assert await _extended(writers, 4)
                assert got[0].held
                with pytest.raises(LockTimeoutError):
                    await rw.read(timeout=0).acquire()
                await got[0].release()
            async with rw.read(timeout=0):
                pass


class TestAdoptScript:
    """``adopt.lua``: a compare-and-set from the hand-over value to the lease's, with
    the lease's PX; the fence counter raised to the token, never lowered."""

    KEYS = ("{a}", "{a}:fence")
    TOKEN = 1_764_000_000_000_064  # a token as the counters make them (µs, past 2^50)

    async def _adopt(self, masters: Masters, token: str) -> list[int]:
        args = ("handed", "lease", 60_000, token)
        return list(await evalsha(masters.clients[0], ADOPT, self.KEYS, args))

    @pytest.mark.parametrize("counter", [TOKEN - 64, TOKEN + 64, None])
    async def test_the_handed_key_becomes_the_lease_s(
        self, masters: Masters, counter: int | None
    ) -> None:
        client = masters.clients[0]
        await client.set("{a}", "handed", px=900)
        if counter is not None:
            await client.set("{a}:fence", counter)
        assert await self._adopt(masters, str(self.TOKEN)) == [1]
        assert await client.get("{a}") == b"lease"
        assert 900 < await client.pttl("{a}") <= 60_000
        raised = self.TOKEN if counter is None else max(counter, self.TOKEN)
        assert int(await client.get("{a}:fence")) == raised

    @pytest.mark.parametrize("held", [b"lease", b"someone else", None])
    async def test_any_other_key_is_left_alone(self, masters: Masters, held: bytes | None) -> None:
        client = masters.clients[0]
        if held is not None:
            await client.set("{a}", held, px=900)
        await client.set("{a}:fence", 7)
        assert await self._adopt(masters, str(self.TOKEN)) == [int(held == b"lease")]
        assert await client.get("{a}") == held
        assert await client.pttl("{a}") <= 900
        assert await client.get("{a}:fence") == b"7"

    async def test_without_fencing_the_counter_is_not_touched(self, masters: Masters) -> None:
        client = masters.clients[0]
        await client.set("{a}", "handed", px=900)
        assert await self._adopt(masters, "") == [1]
        assert await client.get("{a}") == b"lease"
        assert await client.exists("{a}:fence") == 0
