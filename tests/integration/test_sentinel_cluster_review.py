"""Review of the Sentinel-discovered and Redis Cluster masters: a failover while a
waiter is queued on the masters (its wake-up subscription must follow the new
master: a Sentinel primary killed, a cluster primary killed under the subscription),
a cluster subscription moving on from a frozen node, and what ``aclose()`` leaves
behind with ready clients (``Sentinel.master_for()``, ``RedisCluster``) given as
masters. Real servers, sentinels and clusters; each test bounded. (The review's
``slave_for()`` test is ``TestReplicaClient`` in test_sentinel.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import SentinelProcess, ServerCluster, ServerGroup, ServerProcess, Waits
from asyncredlock.testing._support import connected_clients, resp_call
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
PATIENT = 60.0  # a retry delay no test waits out: only a wake-up moves the waiter
CONFIRM = 5.0  # node_timeout of a waiter to be handed the key (its inbox confirmed)
DOWN_AFTER = 0.5  # the sentinel's down-after: tokens are not looked at here


class Replicated:
    """Three masters: a Sentinel-managed one (``servers[0]`` its primary, with a
    replica), then two standalone ones."""

    def __init__(self, servers: ServerGroup, replica: ServerProcess, sentinel: SentinelProcess):
        self.servers, self.replica, self.sentinel = servers, replica, sentinel
        self.urls = [sentinel.master_url("svc"), servers[1].url, servers[2].url]

    async def synced(self) -> None:
        """Every write made so far on the primary has reached the replica (a write
        of this client's, then WAIT: acknowledged offsets cover the writes before)."""
        async with Redis(port=self.servers[0].port) as client:
            await client.set("review:sync", 1)
            assert await client.wait(1, HANG_GUARD * 1000) == 1

    async def switched(self, act: Callable[[], Awaitable[None]]) -> None:
        """Run ``act`` (which fails the primary over), then wait for +switch-master."""
        async with Redis(port=self.sentinel.port) as client:
            events = client.pubsub()
            await events.subscribe("+switch-master")
            await act()
            with anyio.fail_after(HANG_GUARD):
                async for message in events.listen():
                    if message["type"] == "message":
                        break
            await events.aclose()
        assert self.sentinel.master_address("svc") == ("127.0.0.1", self.replica.port)


@pytest.fixture
async def replicated(make_servers: MakeServers) -> AsyncIterator[Replicated]:
    servers = make_servers(3)
    replica = ServerProcess(extra_args=("--replicaof", "127.0.0.1", str(servers[0].port)))
    with replica, SentinelProcess({"svc": servers[0]}, down_after=DOWN_AFTER) as sentinel:
        async with Redis(port=sentinel.port) as client:
            events = client.pubsub()
            await events.subscribe("+slave")
            if not await client.execute_command("SENTINEL", "REPLICAS", "svc"):
                with anyio.fail_after(HANG_GUARD):
                    async for message in events.listen():
                        if message["type"] == "message":
                            break
            await events.aclose()
        yield Replicated(servers, replica, sentinel)


def _subscribed(port: int) -> bool:
    """Whether a pub/sub connection is open on the server at ``port`` (a sentinel's
    own, named ``sentinel-...``, left out)."""
    listed = resp_call(port, "CLIENT", "LIST", "TYPE", "pubsub", timeout=2.0)
    text = listed.decode() if isinstance(listed, bytes) else str(listed)
    return any(" name=sentinel-" not in line for line in text.splitlines() if line.strip())


async def _handed_across(replicated: Replicated, fail_over: Callable[[], Awaitable[None]]) -> Lease:
    """A holder holds the Sentinel master and the first standalone one (the second
    has another holder's key); a waiter of another client is queued on all three;
    ``fail_over`` runs; then the foreign key goes and the holder releases. The
    waiter holds a quorum of hand-overs only if it heard the Sentinel master's
    announcement after the failover. Returns the waiter's lease (released)."""
    foreign = Redis(port=replicated.servers[2].port)
    await foreign.set("moved", "another holder", px=HANG_GUARD * 1000)
    urls = replicated.urls
    async with (
        AsyncRedlock(urls) as holder,
        AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
    ):
        lease = await holder.lock("moved", ttl=HANG_GUARD, auto_extend=False).acquire()
        await holder.settle()
        got: list[Lease] = []

        async def take() -> None:
            got.append(await waiter.lock("moved", timeout=HANG_GUARD).acquire())

        with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                await waits.reach(1)
                await waiter.settle()  # queued on all three
                await replicated.synced()  # the key and the queue are on the replica
                await fail_over()
                await waiter.settle()  # the retries the loss and the resubscription woke
                await foreign.delete("moved")
                await lease.release()
        await got[0].release()
    await foreign.aclose()
    return got[0]


class TestSentinelFailoverWhileQueued:
    async def test_the_waiters_subscription_follows_the_promoted_replica(
        self, replicated: Replicated
    ) -> None:
        """The primary dies: the listener's connection is lost, and the next one
        asks the sentinel again, so it lands on the promoted replica and hears the
        hand-over there."""

        async def kill() -> None:
            async def act() -> None:
                replicated.servers[0].kill()

            await replicated.switched(act)
            assert await polled(lambda: _subscribed(replicated.replica.port))

        handed = await _handed_across(replicated, kill)
        assert handed.statistics().source == "hand-over"


class TestClosingWithReadyClients:
    async def test_a_master_for_client_is_left_open_and_our_connections_closed(
        self, make_servers: MakeServers
    ) -> None:
        """A ready ``Sentinel(...).master_for()`` client given as a master: aclose()
        closes asyncredlock's own connections to the master (commands and wake-ups)
        and leaves the client (the user's) working."""
        primary = make_servers(1)[0]
        with SentinelProcess({"svc": primary}) as process:
            sentinel = Sentinel([("127.0.0.1", process.port)], socket_timeout=2.0)
            client = sentinel.master_for("svc", socket_timeout=2.0)
            await client.ping()  # the user's own connection, counted in the baseline
            before = connected_clients(primary.port)
            async with AsyncRedlock([client]) as holder, AsyncRedlock([client]) as waiter:
                await _waited_once(holder, waiter, "ready:sentinel")
                assert connected_clients(primary.port) > before
            assert connected_clients(primary.port) == before
            assert not _subscribed(primary.port)
            assert await client.set("still", "usable")
            await client.aclose()
            for each in sentinel.sentinels:
                await each.aclose()


async def _waited_once(holder: AsyncRedlock, waiter: AsyncRedlock, name: str) -> None:
    """``waiter`` waits for ``holder``'s lease (so it subscribes), then gets it."""
    lease = await holder.lock(name).acquire()
    with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                got = await waiter.lock(name, timeout=HANG_GUARD).acquire()
                await got.release()

            tg.start_soon(take)
            await waits.reach(1)
            await lease.release()


@pytest.fixture
def cluster() -> Any:
    """Three shards, no replica; a node may be frozen for up to 15 s unfailed."""
    with ServerCluster(3, node_timeout=15.0) as made:
        yield made


class TestClusterClosing:
    async def test_a_cluster_client_is_left_open_and_no_subscription_stays(
        self, cluster: ServerCluster
    ) -> None:
        """A ``RedisCluster`` client given as a master: after aclose(), no
        subscription asyncredlock opened stays on any node, and the client (the
        user's) still works."""
        client = cluster.client()
        try:
            async with AsyncRedlock([client]) as holder, AsyncRedlock([client]) as waiter:
                await _waited_once(holder, waiter, "ready:cluster")
                assert any(_subscribed(node.port) for node in cluster.nodes)
            assert not any(_subscribed(node.port) for node in cluster.nodes)
            assert await client.set("still", "usable")
        finally:
            await client.aclose()


class TestClusterSubscriptionToAFrozenNode:
    async def test_the_subscription_gives_up_on_a_frozen_node_and_moves_on(
        self, cluster: ServerCluster
    ) -> None:
        """The node the waiter's subscription goes to first is frozen (SIGSTOP: the
        kernel still accepts connections). Its handshake gives up after the cluster
        client's own ``socket_timeout`` (redis-py's default, 5 s; ``None`` would wait
        for ever, as docs/configuration.md says) and the subscription goes to the
        next node, so the waiter is woken by the release."""
        serving = cluster.primary_for(cluster.keyslot("frozen"))
        frozen = next(node for node in cluster.nodes if node is not serving)
        mine, theirs = cluster.client(), cluster.client()
        await theirs.initialize()
        ports = [node.port for node in theirs.get_nodes()]
        try:
            async with (
                AsyncRedlock([mine]) as holder,
                AsyncRedlock([theirs], retry_delay=PATIENT, socket_timeout=1.0) as waiter,
            ):
                opener: Any = waiter._core.nodes[0].listen_opener
                opener.turn = ports.index(frozen.port)
                lease = await holder.lock("frozen", ttl=HANG_GUARD, auto_extend=False).acquire()
                frozen.pause()
                try:
                    live = [node for node in cluster.nodes if node is not frozen]
                    moved_on = _polled_for(lambda: any(_subscribed(n.port) for n in live))
                    await _handed_after(waiter, lease, moved_on)
                finally:
                    frozen.resume()
        finally:
            for client in (mine, theirs):
                await client.aclose()


def _polled_for(condition: Callable[[], bool]) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        assert await polled(condition)

    return check


@pytest.fixture
def replicated_cluster() -> Any:
    with ServerCluster(3, replicas=1, node_timeout=1.0) as made:
        yield made


class TestClusterFailoverWhileQueued:
    async def test_a_subscription_on_the_failed_primary_moves_and_hears_the_hand_over(
        self, replicated_cluster: ServerCluster
    ) -> None:
        """The waiter's wake-up subscription is on the primary of the lock's slot
        (chosen so), which dies while the waiter is queued there: the subscription
        moves to another node, the replica takes the slot over with the key and the
        queue, and the release (through MOVED) hands the waiter the key."""
        cluster = replicated_cluster
        slot = cluster.keyslot("moved")
        primary = cluster.primary_for(slot)
        mine, theirs = cluster.client(), cluster.client()
        await theirs.initialize()
        ports = [node.port for node in theirs.get_nodes()]
        try:
            async with (
                AsyncRedlock([mine]) as holder,
                AsyncRedlock([theirs], retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
            ):
                opener: Any = waiter._core.nodes[0].listen_opener
                opener.turn = ports.index(primary.port)  # its subscription: on that primary
                lease = await holder.lock("moved", ttl=HANG_GUARD, auto_extend=False).acquire()
                got = await _handed_after(waiter, lease, lambda: _kill_primary(cluster, slot))
            assert got.statistics().source == "hand-over"
        finally:
            for client in (mine, theirs):
                await client.aclose()


async def _kill_primary(cluster: ServerCluster, slot: int) -> None:
    primary = cluster.primary_for(slot)
    (replica,) = cluster.replicas_of(primary)
    assert _subscribed(primary.port)
    async with Redis(port=primary.port) as direct:  # the key and the queue replicated
        await direct.set("{moved}:sync", 1)
        assert await direct.wait(1, HANG_GUARD * 1000) == 1
    primary.kill()
    await anyio.to_thread.run_sync(cluster.wait_ready, HANG_GUARD)
    assert cluster.primary_for(slot) is replica
    live = [node for node in cluster.nodes if node.running]
    assert await polled(lambda: any(_subscribed(node.port) for node in live))


async def _handed_after(
    waiter: AsyncRedlock, lease: Lease, between: Callable[[], Awaitable[None]]
) -> Lease:
    """``waiter`` queues for ``lease``'s lock, ``between`` runs, ``lease`` is
    released: the waiter's lease (released)."""
    got: list[Lease] = []

    async def take() -> None:
        got.append(await waiter.lock(lease.resource, timeout=HANG_GUARD).acquire())

    with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            await waits.reach(1)
            await waiter.settle()
            await between()
            await waiter.settle()
            await lease.release()
    await got[0].release()
    return got[0]
