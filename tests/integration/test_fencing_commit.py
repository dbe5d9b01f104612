"""The commit round of a fenced acquisition meeting a slow master (its first-phase reply
after the decision, with the largest or the smallest count), failures between the
phases, and a commit refused on some masters. The token a caller sees is the one a
quorum of masters holds, and the next is larger."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError, QuorumUnavailableError
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock.testing import FaultProxy, ServerGroup, hold_calls
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import ABOVE_CLOCK as B
from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30
FENCE = "{slow}:fence"


class TestSlowMaster:
    @pytest.mark.parametrize("slow_count", [B + 10_000, B], ids=["largest", "smallest"])
    async def test_a_reply_after_the_decision(
        self, servers: ServerGroup, masters: Masters, slow_count: int
    ) -> None:
        async with FaultProxy("127.0.0.1", servers[4].port) as proxy:
            urls = [*servers.urls[:4], proxy.url]
            async with AsyncRedlock(urls, node_timeout=30) as redlock:
                await (await redlock.lock("warm").acquire()).release()
                await redlock.settle()
                for i, client in enumerate(masters.clients[:4]):
                    await client.set(FENCE, B + 100 + i)  # apart: a commit round
                await masters.clients[4].set(FENCE, slow_count)
                proxy.delay = 0.3
                commits = redlock.statistics().commits
                lease = await redlock.lock("slow").acquire()
                assert redlock.statistics().commits == commits + 1
                # the largest count among the grants in when the round was decided
                assert lease.token in range(B + 100 + TOKEN_BLOCK, B + 104 + TOKEN_BLOCK)
                fences = await masters.fences("slow")
                assert fences[:4].count(lease.token) >= 3, (lease.token, fences)
                await redlock.settle()  # the slow grant, and its commit behind it
                fences = await masters.fences("slow")
                slow_granted = slow_count + TOKEN_BLOCK
                # past the token: refused, keeps its count; below it: raised to it
                assert fences[4] == max(slow_granted, lease.token), fences
                state = await redlock.inspect("slow")
                assert [node.holder for node in state.nodes] == [lease.value] * 5
                proxy.delay = 0.0
                await lease.release()
                after = await redlock.lock("slow").acquire()
                assert after.token is not None
                assert after.token >= lease.token + TOKEN_BLOCK
                await after.release()


class TestFailuresBetweenThePhases:
    @pytest.mark.parametrize("stopped", [2, 3], ids=["a minority", "a majority"])
    async def test_masters_stopped_before_the_commit(
        self, make_servers: MakeServers, stopped: int
    ) -> None:
        group = make_servers(5)
        masters = Masters(group.urls)
        try:
            async with AsyncRedlock(group.urls) as redlock:
                before = await redlock.lock("between").acquire()
                await before.release()
                await redlock.settle()
                await masters.skew_fences("between")
                failed: list[BaseException] = []
                got = []
                with hold_calls(redlock, "commit") as commits, anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def acquire() -> None:
                            try:
                                got.append(await redlock.lock("between", timeout=0).acquire())
                            except (LockTimeoutError, QuorumUnavailableError) as exc:
                                failed.append(exc)

                        tg.start_soon(acquire)
                        await commits.reached.wait()
                        await redlock.settle()
                        for server in group[5 - stopped :]:
                            server.stop()
                        commits.let_go()
                for server in group[5 - stopped :]:
                    server.start()  # empty: no persistence
                for client in masters.clients[5 - stopped :]:
                    await client.connection_pool.disconnect()
                fences = await masters.fences("between")
                if stopped == 2:
                    assert failed == []
                    lease = got[0]
                    assert lease.token is not None
                    assert fences[:3] == [lease.token] * 3  # committed on the three left
                    last = lease.token
                    await lease.release()
                else:
                    assert got == []
                    assert len(failed) == 1
                    assert before.token is not None
                    last = before.token
                await redlock.settle()
                after = await redlock.lock("between", timeout=5).acquire()
                assert after.token is not None
                assert after.token > last
                await after.release()
        finally:
            await masters.aclose()

    async def test_the_key_gone_on_two_masters_before_the_commit(self, masters: Masters) -> None:
        """Two of five commits refused (the key expired there): three commit, the
        lease holds, its token is on those three; another client that takes one of
        the two meanwhile counts there, and its attempt fails."""
        async with AsyncRedlock(masters.given) as redlock, AsyncRedlock(masters.given) as other:
            await masters.skew_fences("gone")
            got = []
            with hold_calls(redlock, "commit") as commits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def acquire() -> None:
                        got.append(await redlock.lock("gone", timeout=0).acquire())

                    tg.start_soon(acquire)
                    await commits.reached.wait()
                    await redlock.settle()
                    for client in masters.clients[3:]:
                        await client.delete("gone")
                    with pytest.raises(LockTimeoutError):
                        await other.lock("gone", timeout=0).acquire()  # takes 3 and 4 a moment
                    await other.settle()
                    commits.let_go()
            lease = got[0]
            await redlock.settle()
            fences = await masters.fences("gone")
            assert lease.token is not None
            assert fences.count(lease.token) >= 3, (lease.token, fences)
            await lease.release()
            after = await other.lock("gone", timeout=5).acquire()
            assert after.token is not None
            assert after.token > lease.token
            await after.release()
