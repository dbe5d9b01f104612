"""Review of waiters on Redis Cluster and Sentinel-managed masters under the waiting
rules of ``_pauses`` (waiters no queue on the masters serves) and the wake-ups of
``_wakeup``/``_listener`` (one subscription per cluster, on one node; an inbox per
client). Every waiter here has a retry delay of an hour and its holder a TTL far
past the hang guard: only a wake-up ends its wait, so a missed one hangs the test
until its guard fails it.

- On cluster masters: a fair lock's waiter, a waiter of a set of resources in one
  slot, readers after a writer, an unfair writer within its patience, and a
  semaphore's waiter (unfair and fair) are woken by the release and take the lease,
  with statistics that add up. (A plain lock's waiter, a queued waiter handed the
  key, and a writer after readers are in test_cluster.py.) A set in two slots is
  refused by ``lock()`` with no I/O at all (a cluster nobody can reach).
- A waiter's slot moved to another shard while it waits (the release after the move,
  or during it); the node its subscription is on killed (its shard fails over), or
  frozen while the release is announced.
- A Sentinel failover while a semaphore's waiter, a set's waiter or readers wait, the
  promoted replica with the holder's key or without it (cut off): no second holder
  meanwhile, the waiter holds after the release, the keys say so. (A plain lock's
  queued waiter handed the key across a failover is in
  test_sentinel_cluster_review.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerCluster, ServerProcess, Waits

from . import test_cluster as cluster_tests
from . import test_sentinel_cluster_review as sentinel_review
from .conftest import Masters, cut_off_replica, polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
PATIENT = 3600.0  # a retry delay no test waits out: only a wake-up moves the waiter
HELD = 120.0  # a holder's TTL: its key never expires within a test
CONFIRM = 5.0  # node_timeout of a waiter (its subscriptions confirmed in time)
SHARDS = 3
#: the waiters of `_held_and_waited`
KINDS = ["lock", "fair lock", "set", "semaphore", "fair semaphore"]

# the module-scoped clusters of test_cluster.py (three, of three shards), emptied per
# test by its `masters` fixture; and test_sentinel_cluster_review.py's Sentinel setup
clusters = cluster_tests.clusters
masters = cluster_tests.masters
replicated = sentinel_review.replicated
Replicated = sentinel_review.Replicated
_subscribed = cluster_tests._subscribed


def _consistent(*redlocks: AsyncRedlock) -> None:
    """Every attempt is won, failed or cut short (docs/usage.md, statistics())."""
    for redlock in redlocks:
        stats = redlock.statistics()
        won = stats.acquisitions - stats.handovers
        assert won + stats.failed_attempts <= stats.attempts, stats
        assert stats.acquisitions >= stats.handovers >= 0, stats


async def _woken(
    waiter: AsyncRedlock,
    acquire: Callable[[], Awaitable[Lease]],
    release: Callable[[], Awaitable[None]],
    *,
    waiters: int = 1,
    between: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[Lease], Waits]:
    """``waiters`` calls of ``acquire`` (of ``waiter``) wait; ``between`` runs (and
    the retries it woke end: nobody holds meanwhile); ``release`` runs. Returns the
    leases they took (still held) and the count of their waits."""
    got: list[Lease] = []

    async def take() -> None:
        got.append(await acquire())

    with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            for _ in range(waiters):
                tg.start_soon(take)
            await waits.reach(waiters)
            await waiter.settle()  # its attempts reached every master
            if between is not None:
                await between()
                await waiter.settle()  # the retries a lost subscription woke
            assert got == []  # held by another all along: nobody took it
            await release()
    assert len(got) == waiters
    assert waits.woken >= 1  # a wake-up, not the hour's retry delay
    return got, waits


async def _values(clients: Sequence[Redis | RedisCluster], key: str) -> list[bytes | None]:
    return [await client.get(key) for client in clients]


async def _one_holder(clients: Sequence[Redis | RedisCluster], mine: Lease, theirs: Lease) -> None:
    """``mine``'s value is on a quorum of the masters, ``theirs``' on none (every call
    settled). Not on every one: a release returns at a quorum, and an attempt woken
    by its first announcements may reach a slower master before the release does."""
    values = await _values(clients, mine.key)
    assert values.count(mine.value.encode()) >= len(clients) // 2 + 1, values
    for key in {mine.key, theirs.key}:
        assert theirs.value.encode() not in await _values(clients, key)


# -- 1. on cluster masters, every kind of waiter is woken by the release --


class TestClusterWaitersWokenByTheRelease:
    async def test_a_fair_waiter(self, masters: Masters) -> None:
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease = await holder.lock("fair", ttl=HELD, auto_extend=False, fair=True).acquire()
            await holder.settle()
            lock = waiter.lock("fair", timeout=HANG_GUARD, fair=True)
            (got,), _ = await _woken(waiter, lock.acquire, lease.release)
            assert (got.held, lease.held) == (True, False)
            for client in (holder, waiter):
                await client.settle()
            await _one_holder(masters.clients, got, lease)
            await got.release()
            _consistent(holder, waiter)

    async def test_a_set_of_resources_in_one_slot(
        self, masters: Masters, clusters: list[ServerCluster]
    ) -> None:
        """The set listens on every resource's channel and counts masters with every
        key free (`Needs.EVERY`): the release of the one held wakes it."""
        names = ["{account}:7", "{account}:9"]
        assert len({clusters[0].keyslot(name) for name in names}) == 1
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease = await holder.lock(names[1], ttl=HELD, auto_extend=False).acquire()
            await holder.settle()
            lock = waiter.lock(names, timeout=HANG_GUARD)
            (got,), _ = await _woken(waiter, lock.acquire, lease.release)
            assert (got.held, lease.held) == (True, False)
            assert list(got.resources) == names
            await waiter.settle()
            for name in names:
                values = await _values(masters.clients, name)
                assert values.count(got.value.encode()) >= 2, values
            assert lease.value.encode() not in await _values(masters.clients, names[1])
            await got.release()
            await waiter.settle()
            assert await masters.keys() == [[]] * 3
            _consistent(holder, waiter)

    async def test_readers_together_after_a_writer(self, masters: Masters) -> None:
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease = await holder.rwlock("page").write(ttl=HELD, auto_extend=False).acquire()
            await holder.settle()
            read = waiter.rwlock("page").read(timeout=HANG_GUARD)
            got, _ = await _woken(waiter, read.acquire, lease.release, waiters=2)
            assert all(each.shared and each.held for each in got)  # both at once
            assert not lease.held
            for each in got:
                await each.release()
            await waiter.settle()
            assert await masters.keys() == [[]] * 3
            _consistent(holder, waiter)

    async def test_an_unfair_writer_within_its_patience(self, masters: Masters) -> None:
        """Within its patience (an hour) the writer does not queue on the masters:
        the shared rule of `_pauses` (keys free on a quorum), and the release."""
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease = await holder.rwlock("doc").write(ttl=HELD, auto_extend=False).acquire()
            await holder.settle()
            write = waiter.rwlock("doc", patience=PATIENT).write(timeout=HANG_GUARD)
            with Waits(waiter) as ahead:
                (got,), _ = await _woken(waiter, write.acquire, lease.release)
            assert ahead.ahead == 0  # never queued ahead: patience not run out
            assert (got.held, got.shared, lease.held) == (True, False, False)
            await got.release()
            _consistent(holder, waiter)

    @pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
    async def test_a_semaphores_waiter(self, masters: Masters, fair: bool) -> None:
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            full = [
                await holder.semaphore("pool", 2, ttl=HELD, auto_extend=False, fair=fair).acquire()
                for _ in range(2)
            ]
            await holder.settle()
            sem = waiter.semaphore("pool", 2, timeout=HANG_GUARD, fair=fair)
            (got,), _ = await _woken(waiter, sem.acquire, full[0].release)
            assert [got.held, full[1].held, full[0].held] == [True, True, False]
            assert got.key == full[0].key  # the slot given back
            await waiter.settle()
            await _one_holder(masters.clients, got, full[0])
            for lease in (got, full[1]):
                await lease.release()
            for client in (holder, waiter):
                await client.settle()
            assert await masters.keys() == [[]] * 3
            _consistent(holder, waiter)


class TestCrossSlotSet:
    async def test_refused_at_lock_with_no_io_on_a_cluster_nobody_can_reach(self) -> None:
        """A set whose keys are in two slots is refused by ``lock()`` itself (the
        slot is computed here, not asked of the cluster): no node listens on the
        cluster client's startup port, and ``ValueError`` names the slots and the
        fix; a set in one slot is accepted there too."""
        unreachable = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", 1)])
        try:
            async with AsyncRedlock(
                [unreachable, "redis://127.0.0.1:2", "redis://127.0.0.1:3"]
            ) as redlock:
                with pytest.raises(ValueError, match=r"in 2 cluster slots.*hash tag") as refused:
                    redlock.lock(["order:7:items", "order:7:payment"])
                assert "'order:7:items', 'order:7:payment'" in str(refused.value)
                assert redlock.lock(["{order:7}:items", "{order:7}:payment"]).names == (
                    "{order:7}:items",
                    "{order:7}:payment",
                )
                assert redlock.statistics().attempts == 0
        finally:
            await unreachable.aclose()


# -- 2. a slot moved, or the subscribed node killed, while a waiter waits --


@pytest.fixture(scope="module")
def movable() -> Iterator[ServerCluster]:
    """A cluster of its own for the module, whose slots the tests move around."""
    with ServerCluster(SHARDS) as cluster:
        yield cluster


@pytest.fixture
async def moving(movable: ServerCluster, clusters: list[ServerCluster]) -> AsyncIterator[Masters]:
    """Three cluster masters: `movable` first, then two of test_cluster's (emptied)."""
    for cluster in (movable, *clusters[:2]):
        cluster.flushall()
    direct = Masters([movable.client(), clusters[0].client(), clusters[1].client()])
    yield direct
    await direct.aclose()


def _elsewhere(cluster: ServerCluster, name: str) -> tuple[int, ServerProcess]:
    """The slot of ``name`` and a primary that does not serve it."""
    slot = cluster.keyslot(name)
    source = cluster.primary_for(slot)
    return slot, next(node for node in cluster.nodes[:SHARDS] if node is not source)


class TestSlotMovedWhileWaiting:
    @pytest.mark.parametrize("kind", KINDS)
    async def test_the_release_after_the_move_wakes_the_waiter(
        self, moving: Masters, movable: ServerCluster, kind: str
    ) -> None:
        """The slot (the key, the queue, the waiter's entry) moves whole to another
        shard while the waiter waits; the release follows MOVED there, and its
        PUBLISH reaches the node the waiter listens on."""
        name = "{mv}:a"
        slot, target = _elsewhere(movable, name)
        async with (
            AsyncRedlock(moving.given) as holder,
            AsyncRedlock(moving.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease, acquire = await _held_and_waited(holder, waiter, kind, name, "{mv}:b")
            await holder.settle()

            async def move() -> None:
                await anyio.to_thread.run_sync(movable.move_slot, slot, target)
                assert movable.primary_for(slot) is target

            (got,), _ = await _woken(waiter, acquire, lease.release, between=move)
            assert (got.held, lease.held) == (True, False)
            for client in (holder, waiter):
                await client.settle()
            await _one_holder(moving.clients, got, lease)
            await got.release()
            _consistent(holder, waiter)

    @pytest.mark.parametrize("kind", KINDS)
    async def test_a_release_during_the_move_leaves_one_holder(
        self, moving: Masters, movable: ServerCluster, kind: str
    ) -> None:
        """The release comes between ``begin_move`` and ``end_move``: the moving
        cluster cannot run it yet (TRYAGAIN/ASK), the two others, a quorum, free the
        key (hand it to a queued waiter), who holds on a quorum; the moving
        cluster's late release (retried by redis-py until the move ends, or given up)
        takes nothing of the waiter's."""
        name = "{mv}:c"
        slot, target = _elsewhere(movable, name)
        async with (
            AsyncRedlock(moving.given) as holder,
            AsyncRedlock(moving.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease, acquire = await _held_and_waited(holder, waiter, kind, name, "{mv}:d")
            await holder.settle()

            async def begin() -> None:
                await anyio.to_thread.run_sync(movable.begin_move, slot, target)

            async def release_mid_move() -> None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lease.release)  # returns at a quorum
                    await anyio.to_thread.run_sync(movable.end_move, slot, target)

            (got,), _ = await _woken(waiter, acquire, release_mid_move, between=begin)
            assert (got.held, lease.held) == (True, False)
            with anyio.fail_after(HANG_GUARD):
                for client in (holder, waiter):
                    await client.settle()
            values = await _values(moving.clients, got.key)
            assert values.count(got.value.encode()) >= 2, values
            # the moving cluster may keep the holder's key to its TTL (its release
            # failed there mid-move, as in test_cluster's move of a held lock): a
            # minority, never the others
            assert lease.value.encode() not in values[1:], values
            await got.extend()
            await got.release()
            await waiter.settle()
            assert got.value.encode() not in await _values(moving.clients, got.key)
            _consistent(holder, waiter)


async def _held_and_waited(
    holder: AsyncRedlock, waiter: AsyncRedlock, kind: str, name: str, other: str
) -> tuple[Lease, Callable[[], Awaitable[Lease]]]:
    """``holder``'s lease on ``name`` (a semaphore of one slot, or a lock), and how
    ``waiter`` waits for it: the same semaphore, the lock, or a set of ``name`` and
    ``other`` (one slot)."""
    fair = kind.startswith("fair ")
    if kind.endswith("semaphore"):
        sem = holder.semaphore(name, 1, ttl=HELD, auto_extend=False, fair=fair)
        lease = await sem.acquire()
        return lease, waiter.semaphore(name, 1, timeout=HANG_GUARD, fair=fair).acquire
    lease = await holder.lock(name, ttl=HELD, auto_extend=False, fair=fair).acquire()
    names = [name, other] if kind == "set" else name
    return lease, waiter.lock(names, timeout=HANG_GUARD, fair=fair).acquire


class _FirstOn:
    """A cluster master's subscription opener whose first connection goes to the node
    at ``port`` (its turn set from the client's node list as it is then: an index
    computed earlier could name another node once the list changed); later ones as
    the opener chooses."""

    def __init__(self, opener: Any, port: int) -> None:
        self.opener, self.port = opener, port

    async def __call__(self, protocol: Any) -> None:
        if self.port:
            ports = [node.port for node in self.opener.client.get_nodes()]
            self.opener.turn, self.port = ports.index(self.port), 0
        await self.opener(protocol)


@pytest.fixture
async def failing(
    clusters: list[ServerCluster],
) -> AsyncIterator[tuple[ServerCluster, Masters]]:
    """A cluster of its own with a replica per shard (to kill a primary of), then two
    of test_cluster's (emptied), as masters."""
    with ServerCluster(SHARDS, replicas=1, node_timeout=1.0) as cluster:
        for other in clusters[:2]:
            other.flushall()
        direct = Masters([cluster.client(), clusters[0].client(), clusters[1].client()])
        yield cluster, direct
        await direct.aclose()


class TestSubscribedNodeKilled:
    @pytest.mark.parametrize("kind", ["fair lock", "set", "semaphore"])
    async def test_the_waiter_resubscribes_and_hears_the_release(
        self, failing: tuple[ServerCluster, Masters], kind: str
    ) -> None:
        """The waiter's subscription to the first cluster is on a primary of another
        shard than its keys' (chosen so), killed while it waits: its replica takes
        over, the listener subscribes on another node, the loss wakes the waiter (it
        retries, refused), and the release wakes it again."""
        cluster, direct = failing
        name = "{gone}:a"
        serving = cluster.primary_for(cluster.keyslot(name))
        victim = next(node for node in cluster.nodes[:SHARDS] if node is not serving)
        async with (
            AsyncRedlock(direct.given) as holder,
            AsyncRedlock(direct.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            listener: Any = waiter._core.waker.listeners[0]
            listener.opener = _FirstOn(listener.opener, victim.port)
            lease, acquire = await _held_and_waited(holder, waiter, kind, name, "{gone}:b")
            await holder.settle()

            async def kill() -> None:
                assert _subscribed(victim)
                victim.kill()
                await anyio.to_thread.run_sync(cluster.wait_ready, HANG_GUARD)
                live = [node for node in cluster.nodes if node.running]
                assert await polled(lambda: any(_subscribed(node) for node in live))

            (got,), waits = await _woken(waiter, acquire, lease.release, between=kill)
            assert waits.woken >= 2  # the loss, then the release
            assert (got.held, lease.held) == (True, False)
            for client in (holder, waiter):
                await client.settle()
            await _one_holder(direct.clients, got, lease)
            await got.release()
            _consistent(holder, waiter)


frozen_cluster = sentinel_review.cluster  # three shards, node_timeout 15 s: never failed


class TestSubscribedNodeFrozen:
    @pytest.mark.parametrize("kind", ["lock", "semaphore"])
    async def test_a_release_while_its_node_is_frozen_is_not_waited_out(
        self, frozen_cluster: ServerCluster, kind: str
    ) -> None:
        """The node the waiter's subscription is on (not its keys') freezes after the
        subscription is confirmed, and the release comes meanwhile: the frozen node
        passes the announcement on to nobody. The subscription, quiet, PINGs it and
        is dropped unanswered after ``socket_timeout``; the loss wakes the waiter,
        which takes the lock freed meanwhile, long before its retry delay. (One
        cluster master: its announcement is the only one.)"""
        cluster = frozen_cluster
        name = "{ice}:a"
        serving = cluster.primary_for(cluster.keyslot(name))
        frozen = next(node for node in cluster.nodes if node is not serving)
        mine, theirs = cluster.client(), cluster.client()
        await theirs.initialize()
        ports = [node.port for node in theirs.get_nodes()]
        try:
            async with (
                AsyncRedlock([mine]) as holder,
                AsyncRedlock(
                    [theirs], retry_delay=PATIENT, node_timeout=CONFIRM, socket_timeout=1.0
                ) as waiter,
            ):
                opener: Any = waiter._core.nodes[0].listen_opener
                opener.turn = ports.index(frozen.port)
                lease, acquire = await _held_and_waited(holder, waiter, kind, name, "")

                async def freeze() -> None:
                    assert _subscribed(frozen)
                    frozen.pause()

                try:
                    (got,), _ = await _woken(waiter, acquire, lease.release, between=freeze)
                finally:
                    frozen.resume()
                assert (got.held, lease.held) == (True, False)
                await got.release()
                _consistent(holder, waiter)
        finally:
            for client in (mine, theirs):
                await client.aclose()


# -- 3. a Sentinel failover while a waiter waits --


class TestSentinelFailoverWhileWaiting:
    @pytest.mark.parametrize(
        ("kind", "lost"),
        [
            ("semaphore", False),
            ("set", False),
            ("readers", False),
            ("semaphore", True),
            ("set", True),
        ],
        ids=["semaphore", "set", "readers", "semaphore-key-lost", "set-key-lost"],
    )
    async def test_no_second_holder_and_the_waiter_holds_after_the_release(
        self, replicated: Replicated, kind: str, lost: bool
    ) -> None:
        """The Sentinel-managed master's primary dies while the waiter waits: the
        promoted replica has the holder's key (or, ``lost``, was cut off before the
        holder acquired and lacks it: a minority the holder lost, whose grants the
        waiter's retries must not take for a lease). The waiter's subscription comes
        back on the promoted replica; nobody holds but the holder until it releases,
        then the waiter holds."""
        urls = replicated.urls
        name = "{fo}:a"
        if lost:
            cut_off_replica(replicated.servers[0], replicated.replica)
        async with (
            AsyncRedlock(urls) as holder,
            AsyncRedlock(urls, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            waiters = 1
            if kind != "readers":
                lease, acquire = await _held_and_waited(holder, waiter, kind, name, "{fo}:b")
            else:
                rw = holder.rwlock(name)
                lease = await rw.write(ttl=HELD, auto_extend=False).acquire()
                acquire = waiter.rwlock(name).read(timeout=HANG_GUARD).acquire
                waiters = 2
            await holder.settle()

            async def fail_over() -> None:
                if not lost:
                    await replicated.synced()  # the holder's key is on the replica

                async def kill() -> None:
                    replicated.servers[0].kill()
                    if lost:
                        replicated.replica.resume()

                await replicated.switched(kill)
                async with Redis(port=replicated.replica.port) as promoted:
                    assert (await promoted.get(lease.key) is None) == lost
                assert lease.held

            got, _ = await _woken(
                waiter, acquire, lease.release, between=fail_over, waiters=waiters
            )
            assert not lease.held
            assert all(each.held for each in got)
            for client in (holder, waiter):
                await client.settle()
            now = [Redis(port=replicated.replica.port)]
            now += [Redis(port=server.port) for server in replicated.servers[1:]]
            try:
                if kind != "readers":
                    (mine,) = got
                    await _one_holder(now, mine, lease)
            finally:
                for client in now:
                    await client.aclose()
            for each in got:
                await each.release()
            _consistent(holder, waiter)
