"""Every master a real 3-shard Redis Cluster (`asyncredlock.testing.ServerCluster`)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from asyncredlock.testing import ServerCluster

CLUSTERS = 3  # masters, each a cluster of SHARDS primaries
SHARDS = 3
NODE_TIMEOUT = 1.0  # seconds; the clusters with replicas, which the tests fail over


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
