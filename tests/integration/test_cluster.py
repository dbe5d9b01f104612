"""Every master a real 3-shard Redis Cluster (`asyncredlock.testing.ServerCluster`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import pytest
from redis.asyncio import RedisCluster

from asyncredlock import AsyncRedlock
from asyncredlock._scripts import ACQUIRE, SCRIPTS
from asyncredlock.testing import ServerCluster

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
CLUSTERS = 3  # masters, each a cluster of SHARDS primaries
SHARDS = 3
NODE_TIMEOUT = 1.0  # seconds; the clusters with replicas, which the tests fail over
SCRIPT_NAMES = {script.sha: script.name for script in SCRIPTS}


@pytest.fixture(scope="module")
def clusters() -> Iterator[list[ServerCluster]]:
    """Three clusters of three shards without replicas, formed once for the module
    (in parallel: each node waits about two seconds after it starts before it
    serves). Shared: tests must not stop, move or fail over anything in them."""
    made = [ServerCluster(SHARDS) for _ in range(CLUSTERS)]
    try:
        with ThreadPoolExecutor(len(made)) as pool:
            list(pool.map(ServerCluster.start, made))
        yield made
    finally:
        for cluster in made:
            cluster.close()


@pytest.fixture
async def masters(clusters: list[ServerCluster]) -> AsyncIterator[Masters]:
    """A ``RedisCluster`` client to each emptied cluster: the masters, given as they
    are to the AsyncRedlock clients of the test."""
    for cluster in clusters:
        cluster.flushall()
    direct = Masters([cluster.client() for cluster in clusters])
    yield direct
    await direct.aclose()


@pytest.fixture
def replicated() -> Iterator[ServerCluster]:
    """A cluster of its own for the test, a replica per shard: to move slots in
    and fail over."""
    with ServerCluster(SHARDS, replicas=1, node_timeout=NODE_TIMEOUT) as cluster:
        yield cluster


# -- the cluster itself --


class TestServerCluster:
    def test_every_node_sees_the_slots_split_evenly(self, clusters: list[ServerCluster]) -> None:
        for cluster in clusters:
            primaries = cluster.nodes
            assert len(primaries) == SHARDS
            assert [cluster.primary_for(slot) for slot in (0, 5461, 10922, 16383)] == [
                primaries[0],
                primaries[1],
                primaries[2],
                primaries[2],
            ]
            assert cluster.replicas_of(primaries[0]) == []
            assert all(node.running for node in primaries)

    def test_a_replicated_cluster_has_its_replicas(self, replicated: ServerCluster) -> None:
        primaries, replicas = replicated.nodes[:SHARDS], replicated.nodes[SHARDS:]
        assert [replicated.replicas_of(primary) for primary in primaries] == [
            [replica] for replica in replicas
        ]

    @pytest.mark.parametrize(
        ("options", "match"),
        [
            ({"shards": 0}, "at least one shard"),
            ({"replicas": -1}, "replicas must be 0 or more"),
            ({"node_timeout": 0}, "node_timeout must be above 0"),
        ],
    )
    def test_bad_arguments_are_refused(self, options: dict[str, Any], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            ServerCluster(**options)

    def test_bad_moves_and_failovers_are_refused_before_anything_changes(
        self, clusters: list[ServerCluster]
    ) -> None:
        cluster = clusters[0]
        owner = cluster.primary_for(0)
        with pytest.raises(ValueError, match="serves slot 0 already"):
            cluster.begin_move(0, owner)
        with pytest.raises(ValueError, match="is not a replica"):
            cluster.failover(owner)
        with pytest.raises(ValueError, match=r"slot must be in 0\.\.16383"):
            cluster.primary_for(16384)
        assert cluster.primary_for(0) is owner


# -- the library on cluster masters --


class _Late(RedisCluster):
    """A cluster client that, once told to `hold`, keeps the acquisitions it is
    asked to run back until `let_go` (a master that answers them late), and notes
    each call that reaches it meanwhile: one that overtakes them."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.holding, self.held, self.gate = False, 0, anyio.Event()
        self.overtaken: list[str] = []

    def hold(self) -> None:
        self.holding = True

    def let_go(self) -> None:
        self.holding = False
        self.gate.set()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self.held:
            self.overtaken.append(SCRIPT_NAMES.get(args[1], args[0]))
        if self.holding and args[:2] == ("EVALSHA", ACQUIRE.sha):
            self.held += 1
            try:
                await self.gate.wait()
            finally:
                self.held -= 1
        return await super().execute_command(*args, **kwargs)


class TestCallOrder:
    async def test_a_release_does_not_overtake_the_late_acquisition_it_releases(
        self, masters: Masters, clusters: list[ServerCluster]
    ) -> None:
        """Calls to one master run there in the order they were made, on a cluster
        master too (reached through its client, one task per call): else the
        release would find nothing and the late SET would leave the key behind
        until its TTL."""
        late = _Late(startup_nodes=clusters[0].startup_nodes)
        async with AsyncRedlock([late, *masters.given[1:]]) as redlock:
            warm = await redlock.lock("late").acquire()  # the client set up, scripts loaded
            await warm.release()
            late.hold()
            lease = await redlock.lock("late").acquire()  # granted by the other two
            await lease.release()
            await anyio.wait_all_tasks_blocked()  # the release is out, or queued behind
            late.let_go()
            with anyio.fail_after(HANG_GUARD):
                await redlock.settle()
        await late.aclose()
        assert late.overtaken == []
        assert await masters.holding("late") == 0
