"""A Redis Cluster master whose node freezes (SIGSTOP: its connections stay open,
nothing is answered) is judged silent after ``node_timeout``, as a master reached on
asyncredlock's own connection is: an acquisition round that needs its answer gives up
on it, the next rounds send it nothing, and it is readmitted once it answers again.
A cold burst of callers on a new cluster client takes no healthy master for a silent
one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis, RedisCluster

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import ServerCluster, ServerGroup, client_state

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
#: socket_timeout of the clients: the longest a round waits for a master that
#: answers nothing, unless it is judged silent first (longer than HANG_GUARD)
LONG = 60.0
BURST = 300  # callers that start at once on a client that has not connected yet


@pytest.fixture(scope="module")
def one_node() -> Iterator[ServerCluster]:
    """A cluster of one shard of its own, for this module to freeze."""
    with ServerCluster(1) as cluster:
        yield cluster


@pytest.fixture
def cluster(one_node: ServerCluster) -> Iterator[ServerCluster]:
    """`one_node`, emptied, and running again after the test."""
    one_node.flushall()
    yield one_node
    node = one_node.nodes[0]
    if node.paused:
        node.resume()


@pytest.fixture
async def clients(cluster: ServerCluster) -> AsyncIterator[Callable[..., RedisCluster]]:
    """Makes ``RedisCluster`` clients of `cluster` (masters as users give them), closed
    after the test: an ``AsyncRedlock`` does not close a client it was given, and one
    left open is reported (``Unclosed RedisCluster client``) whenever it is collected."""
    made: list[RedisCluster] = []

    def make(**options: Any) -> RedisCluster:
        made.append(cluster.client(**options))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


async def _cycle(redlock: AsyncRedlock, name: str) -> None:
    lease = await redlock.lock(name, auto_extend=False, timeout=0).acquire()
    await lease.release()


def _block_the_loop(seconds: float) -> None:
    """Keep the event loop from running for ``seconds`` (as CPU-bound work would)."""
    time.sleep(seconds)


class TestFrozenClusterNode:
    async def test_a_round_that_needs_it_gives_up_on_it_once_it_is_silent(
        self, cluster: ServerCluster, clients: Callable[..., RedisCluster], servers: ServerGroup
    ) -> None:
        masters = [clients(), *servers.urls[:2]]
        other = Redis.from_url(servers.urls[1])
        try:
            async with AsyncRedlock(masters, socket_timeout=LONG) as redlock:
                await _cycle(redlock, "warm")
                # the cluster answered too (its client knows its node): a master that
                # never answered yet is a new client's, not judged silent
                await redlock.settle()
                # held elsewhere on one URL master: the decision needs the cluster's answer
                await other.set("contended", "another holder", px=60_000)
                cluster.nodes[0].pause()
                with anyio.fail_after(HANG_GUARD), pytest.raises(LockTimeoutError) as caught:
                    await redlock.lock("contended", timeout=0).acquire()
                assert "silent" in caught.value.outcomes[0].detail
                assert client_state(redlock).silent == (True, False, False)
        finally:
            await other.aclose()

    async def test_it_gets_no_new_call_while_silent_and_is_readmitted_when_it_answers(
        self, cluster: ServerCluster, clients: Callable[..., RedisCluster], servers: ServerGroup
    ) -> None:
        direct = clients()
        masters = [clients(), *servers.urls[:2]]
        async with AsyncRedlock(masters, socket_timeout=LONG) as redlock:
            await _cycle(redlock, "warm")
            await redlock.settle()  # the cluster answered (its client knows its node)
            cluster.nodes[0].pause()
            with anyio.fail_after(HANG_GUARD):
                i = 0
                while not client_state(redlock).silent[0]:  # each cycle is real work
                    await _cycle(redlock, f"frozen:{i}")
                    i += 1
                out = client_state(redlock).in_flight[0]
                for j in range(20):
                    await _cycle(redlock, f"frozen:more:{j}")
                assert client_state(redlock).in_flight[0] == out  # nothing new sent there
                cluster.nodes[0].resume()
                await redlock._core.nodes[0].wait_idle()  # the calls it held are answered
            assert client_state(redlock).silent == (False, False, False)
            lease = await redlock.lock("after", timeout=0).acquire()
            assert await direct.get("after") is not None  # the cluster had the call
            await lease.release()

    async def test_a_call_left_hanging_is_judged_once_and_its_answer_readmits_it(
        self,
        cluster: ServerCluster,
        clients: Callable[..., RedisCluster],
        servers: ServerGroup,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """One call hangs on the frozen node (the cluster client waits for it) and no
        other is made: the master turns silent once, not again every ``socket_timeout``
        for the same call, and is said to answer again when that call ends."""
        caplog.set_level(logging.INFO, logger="asyncredlock")
        masters = [clients(socket_timeout=LONG), *servers.urls[:2]]
        socket_timeout = 0.2
        async with AsyncRedlock(
            masters, node_timeout=0.05, socket_timeout=socket_timeout
        ) as redlock:
            node = redlock._core.nodes[0]
            turned: list[None] = []
            first = asyncio.Event()

            def silent() -> None:
                turned.append(None)
                first.set()

            node.silence.watchers.add(silent)
            await _cycle(redlock, "warm")
            await redlock.settle()  # the cluster answered (its client knows the slots)
            cluster.nodes[0].pause()
            with anyio.fail_after(HANG_GUARD):
                # held on the two other masters; its call to the frozen node hangs
                lease = await redlock.lock("hung", auto_extend=False).acquire()
                await first.wait()
            # four socket_timeouts with that call out: it was judged afresh at the
            # first, and nothing new was sent there to judge
            await anyio.sleep(4 * socket_timeout)
            assert len(turned) == 1
            assert not node.silence.silent
            cluster.nodes[0].resume()
            with anyio.fail_after(HANG_GUARD):
                await node.wait_idle()  # the hanging call is answered
            await lease.release()
        said = [r.getMessage() for r in caplog.records if r.name == "asyncredlock"]
        name = node.name
        assert said.count(f"master {name} answers again") == 1
        assert len([m for m in said if m.startswith(f"master {name} silent")]) == 1


class TestBusyLoop:
    async def test_a_master_that_answered_at_once_is_not_silent_after_a_busy_loop(
        self,
        cluster: ServerCluster,
        clients: Callable[..., RedisCluster],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """The loop is busy (CPU-bound) for a little over ``node_timeout`` right after
        an acquisition's call is made: too little to count as late. The master
        answered at once; its reply is read, but the call's task has not ended when
        the timer runs. It is not judged silent (the timer looks again first), and
        the lock is acquired."""
        caplog.set_level(logging.WARNING, logger="asyncredlock")
        node_timeout = 2.0
        async with AsyncRedlock(
            [clients()], node_timeout=node_timeout, socket_timeout=LONG
        ) as redlock:
            node = redlock._core.nodes[0]
            with anyio.fail_after(HANG_GUARD):
                await _cycle(redlock, "warm")
                await node.wait_idle()
                attempt = asyncio.create_task(redlock.lock("busy", timeout=0).acquire())
                for _ in range(100):  # until the call is made (its task created)
                    if node.in_flight:
                        break
                    await asyncio.sleep(0)
                assert node.in_flight
                await asyncio.sleep(0)  # its task sends it
                _block_the_loop(node_timeout * 1.15)
                lease = await attempt
                await lease.release()
        assert [r.getMessage() for r in caplog.records if "silent" in r.getMessage()] == []


class TestColdBurst:
    async def test_a_burst_on_a_new_cluster_client_takes_no_master_for_silent(
        self,
        cluster: ServerCluster,
        clients: Callable[..., RedisCluster],
        servers: ServerGroup,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.WARNING, logger="asyncredlock")
        masters = [clients(), *servers.urls[:2]]
        done = 0
        async with AsyncRedlock(masters) as redlock:

            async def caller(i: int) -> None:
                nonlocal done
                lease = await redlock.lock(f"burst:{i}", timeout=10).acquire()
                await lease.release()
                done += 1

            with anyio.fail_after(HANG_GUARD * 3):
                async with anyio.create_task_group() as tg:
                    for i in range(BURST):
                        tg.start_soon(caller, i)
            assert redlock.statistics().failed_attempts == 0
        assert done == BURST
        silent = [r.getMessage() for r in caplog.records if "silent" in r.getMessage()]
        assert silent == []
