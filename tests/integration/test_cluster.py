"""Every master a real 3-shard Redis Cluster (`asyncredlock.testing.ServerCluster`,
``RedisCluster`` clients as masters): the lock, fencing, read-write lock, locks on
several resources and waiters; names with odd braces against ``CLUSTER KEYSLOT``; a
slot moved and a primary failed over while a lock is held. test_lock's, test_fencing's
and test_rwlock's scenarios picked below run here too, on the clusters (the `masters`
fixture of this module replaces the conftest's)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import valkey.asyncio
from redis.asyncio import Redis, RedisCluster
from valkey.asyncio.cluster import ClusterNode as ValkeyNode

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError
from asyncredlock._keys import aux_key, key_slot
from asyncredlock._node import Node
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock._scripts import ACQUIRE, EXTEND, SCRIPTS
from asyncredlock._wire import ClosedError
from asyncredlock.testing import (
    ServerCluster,
    ServerProcess,
    ServerStartError,
    Waits,
    client_state,
)
from asyncredlock.testing._slots import wait_until
from asyncredlock.testing._support import HOST, registry, resp_call

from . import test_fencing, test_lock, test_rwlock
from .conftest import Masters, cut_off_replica

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
CLUSTERS = 3  # masters, each a cluster of SHARDS primaries
SHARDS = 3
PATIENT = 60.0  # a retry delay no test waits out: only a wake-up moves the waiter
#: node_timeout of a waiter that must be handed the key: it sends hand-over terms only
#: once its inbox subscription is confirmed, which it waits for up to node_timeout
CONFIRM = 5.0
NODE_TIMEOUT = 1.0  # seconds; the clusters with replicas, which the tests fail over
SCRIPT_NAMES = {script.sha: script.name for script in SCRIPTS}

#: A slot of a cluster with replicas, the primary serving it and its replica.
Shard = tuple[int, ServerProcess, ServerProcess]


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


@pytest.fixture
async def mixed(replicated: ServerCluster, clusters: list[ServerCluster]) -> AsyncIterator[Masters]:
    """Three cluster masters: `replicated` first, then two of the module's (emptied)."""
    for cluster in clusters[:2]:
        cluster.flushall()
    direct = Masters([replicated.client(), clusters[0].client(), clusters[1].client()])
    yield direct
    await direct.aclose()


# -- the scenarios of test_lock, test_fencing and test_rwlock, on cluster masters --


class TestLockScenarios:
    _lease = test_lock.TestLease
    test_second_holder_waits_for_the_first = (
        test_lock.TestMutualExclusion.test_second_holder_waits_for_the_first
    )
    test_lease_reports_token_validity_and_state = _lease.test_lease_reports_token_validity_and_state
    test_auto_extension_keeps_a_short_lock_through_long_work = (
        _lease.test_auto_extension_keeps_a_short_lock_through_long_work
    )
    test_deleting_the_key_on_a_majority_cancels_the_block = (
        _lease.test_deleting_the_key_on_a_majority_cancels_the_block
    )
    test_explicit_lease_exposes_loss = _lease.test_explicit_lease_exposes_loss
    test_release_of_a_lease_another_holder_owns = _lease.test_release_of_a_lease_another_holder_owns
    test_release_twice_raises_not_owned = _lease.test_release_twice_raises_not_owned
    test_explicit_extend_resets_the_ttl = _lease.test_explicit_extend_resets_the_ttl
    test_inspect_names_the_holder_on_a_quorum = (
        test_lock.TestHolderIdentity.test_inspect_names_the_holder_on_a_quorum
    )


class TestFencingScenarios:
    _tokens = test_fencing.TestTokens
    test_a_token_is_committed_on_every_master_and_starts_from_server_time = (
        _tokens.test_a_token_is_committed_on_every_master_and_starts_from_server_time
    )
    test_fencing_false_is_plain_redlock_with_no_token = (
        _tokens.test_fencing_false_is_plain_redlock_with_no_token
    )
    test_unfenced_acquisitions_leave_the_counter_alone = (
        _tokens.test_unfenced_acquisitions_leave_the_counter_alone
    )


class TestCommitRoundScenarios(test_fencing.TestCommitRound):
    pass


class TestRWLockScenarios:
    _exclusion = test_rwlock.TestExclusion
    test_readers_share_the_lock_and_keep_writers_out = (
        _exclusion.test_readers_share_the_lock_and_keep_writers_out
    )
    test_an_exclusive_holder_keeps_readers_out_and_tokens_are_shared = (
        _exclusion.test_an_exclusive_holder_keeps_readers_out_and_tokens_are_shared
    )
    test_writers_of_one_process_never_pass_the_lease_on = (
        _exclusion.test_writers_of_one_process_never_pass_the_lease_on
    )


class TestReaderLeaseScenarios(test_rwlock.TestReaderLeases):
    pass


# -- the cluster itself --


class TestServerCluster:
    def test_the_slots_are_split_evenly_between_the_primaries(
        self, clusters: list[ServerCluster]
    ) -> None:
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

    def test_a_cluster_not_ready_in_time_is_a_start_error_and_leaves_nothing_running(
        self,
    ) -> None:
        """Each node waits about two seconds after it starts before it serves: one
        second is not enough."""
        cluster = ServerCluster(1)
        try:
            with pytest.raises(ServerStartError, match=r"not ready within 1\.0 s: .*cluster_state"):
                cluster.start(timeout=1.0)
            assert not any(node.running for node in cluster.nodes)
        finally:
            cluster.close()

    def test_a_with_block_whose_start_fails_removes_what_it_made(self) -> None:
        cluster = ServerCluster(1, replicas=1, extra_args=["--no-such-directive", "1"])
        with pytest.raises(ServerStartError), cluster:
            pytest.fail("the block ran")
        assert not any(node.running for node in cluster.nodes)
        assert not any(node.workdir.exists() for node in cluster.nodes)
        assert registry.tempdirs.isdisjoint(node.workdir for node in cluster.nodes)
        assert registry.ports.isdisjoint(node.port for node in cluster.nodes)

    def test_start_after_close_is_refused(self, tmp_path: Path) -> None:
        cluster = ServerCluster(1, workdir=tmp_path)
        cluster.close()
        try:
            with pytest.raises(RuntimeError, match="is closed"):
                cluster.start()
            assert not any(node.running for node in cluster.nodes)
        finally:
            cluster.stop()

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


class TestNode:
    async def test_calls_cancelled_by_aclose_before_they_ran_end_with_a_reply(
        self, clusters: list[ServerCluster]
    ) -> None:
        """A cluster master's calls are tasks; aclose() cancels those still out, some
        before their first step (their coroutine never runs, so cannot catch it). The
        future a call returns never raises, even then: it ends with a closed reply,
        and the rounds and releases that read it in a callback do not raise there."""
        client = clusters[0].client()
        node = Node("cluster", client=client)
        try:
            calls = [node.call(EXTEND, ("never-sent",), ("value", 1000)) for _ in range(3)]
            await node.aclose()  # no await before it cancels: none of them ran
            replies = [call.result() for call in calls]
            assert all(isinstance(reply.error, ClosedError) for reply in replies)
            assert node.in_flight == 0
        finally:
            await client.aclose()


class TestLock:
    async def test_two_clients_exclude_each_other(self, masters: Masters) -> None:
        counter = masters.clients[0]
        inside = overlaps = 0

        async def worker(redlock: AsyncRedlock) -> None:
            nonlocal inside, overlaps
            async with redlock.lock("counter-lock", timeout=HANG_GUARD):
                inside += 1
                overlaps += inside > 1
                value = int(await counter.get("counter") or 0)
                await anyio.sleep(0.001)  # the work between read and write
                await counter.set("counter", value + 1)
                inside -= 1

        with anyio.fail_after(HANG_GUARD):
            async with (
                AsyncRedlock(masters.given, retry_delay=0.01) as first,
                AsyncRedlock(masters.given, retry_delay=0.01) as second,
                anyio.create_task_group() as tg,
            ):
                for i in range(20):
                    tg.start_soon(worker, (first, second)[i % 2])
        assert int(await counter.get("counter")) == 20
        assert overlaps == 0

    async def test_valkey_cluster_masters_load_the_scripts(
        self, clusters: list[ServerCluster], masters: Masters
    ) -> None:
        """valkey-py's ValkeyCluster as masters, on nodes that have no script cached:
        the first EVALSHA gets NOSCRIPT, which valkey-py raises as its own
        NoScriptError (not redis-py's), and must be followed by EVAL. Before, every
        attempt failed on every master with NoScriptError until the timeout."""
        for cluster in clusters:
            for node in cluster.nodes:
                resp_call(node.port, "SCRIPT", "FLUSH", timeout=5.0)
        given = [
            valkey.asyncio.ValkeyCluster(
                startup_nodes=[ValkeyNode(HOST, node.port) for node in cluster.nodes]
            )
            for cluster in clusters
        ]
        try:
            with anyio.fail_after(HANG_GUARD):
                async with AsyncRedlock(given) as redlock:
                    lease = await redlock.lock("valkey-cluster", timeout=0).acquire()
                    await redlock.settle()  # the masters beyond the quorum too
                    assert await masters.holding("valkey-cluster") == len(clusters)
                    await lease.release()
        finally:
            for client in given:
                await client.aclose()

    async def test_tokens_strictly_increase_across_holders(self, masters: Masters) -> None:
        tokens: list[int] = []
        async with (
            AsyncRedlock(masters.given) as first,
            AsyncRedlock(masters.given) as second,
            AsyncRedlock(masters.given) as third,
        ):
            for i in range(30):
                lease = await (first, second, third)[i % 3].lock("sequence").acquire()
                assert lease.token is not None
                tokens.append(lease.token)
                await lease.release()
        assert tokens == sorted(set(tokens))  # strictly increasing

    @pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
    async def test_a_semaphore_admits_its_limit(self, masters: Masters, fair: bool) -> None:
        """A semaphore's slots and queue share its name's hash tag: one script per
        cluster, and the limit holds across clients."""
        async with AsyncRedlock(masters.given) as first, AsyncRedlock(masters.given) as second:
            leases = [
                await (first, second)[i % 2].semaphore("sem", 2, fair=fair).acquire()
                for i in range(2)
            ]
            assert len({lease.key for lease in leases}) == 2
            with pytest.raises(LockTimeoutError):
                await second.semaphore("sem", 2, timeout=0, fair=fair).acquire()
            await leases[0].release()
            again = await second.semaphore("sem", 2, timeout=0, fair=fair).acquire()
            for lease in (leases[1], again):
                await lease.release()
            for client in (first, second):
                await client.settle()

    async def test_a_waiter_is_woken_by_the_release(self, masters: Masters) -> None:
        """A waiter subscribes on one node of each cluster: a release's PUBLISH
        reaches every node, so it is woken by the release, not by a retry."""
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT) as waiter,
        ):
            lease = await holder.lock("wait").acquire()
            await holder.settle()  # held on every cluster, not only a quorum
            got: list[Lease] = []
            with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await waiter.lock("wait", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waits.reach(1)  # refused once: it listens for the release
                    await waiter.settle()  # its attempt reached every cluster
                    # subscribed on a quorum of clusters at least (enrolling waits for that)
                    assert sum(client_state(waiter).subscribed) >= 2
                    await lease.release()
            assert got[0].token is not None
            assert lease.token is not None
            assert got[0].token > lease.token
            assert waits.woken == 1  # the release, not its retry delay
            await got[0].release()

    async def test_a_queued_waiter_of_another_client_is_handed_the_key(
        self, masters: Masters
    ) -> None:
        """The release hands the key to the first queued waiter on each cluster
        and tells its inbox: it holds the lease with no attempt of its own."""
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            lease = await holder.lock("handed").acquire()
            await holder.settle()  # held on every cluster, not only a quorum
            got: list[Lease] = []
            with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await waiter.lock("handed", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waits.reach(1)
                    await waiter.settle()  # queued on every cluster, not only a quorum
                    await lease.release()
            assert got[0].statistics().source == "hand-over"
            for client in (holder, waiter):
                await client.settle()  # the release's and the hand-over's last calls
            assert await masters.holding("handed") == CLUSTERS
            await got[0].release()
            await waiter.settle()
            assert await masters.holding("handed") == 0

    async def test_a_waiting_writer_gets_the_lock_after_the_readers_leave(
        self, masters: Masters
    ) -> None:
        async with (
            AsyncRedlock(masters.given) as readers,
            AsyncRedlock(masters.given, retry_delay=PATIENT) as writers,
        ):
            held = [await readers.rwlock("page").read().acquire() for _ in range(2)]
            got: list[Lease] = []
            with Waits(writers) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def write() -> None:
                        got.append(await writers.rwlock("page").write(timeout=HANG_GUARD).acquire())

                    tg.start_soon(write)
                    await waits.reach(1)
                    await held[0].release()
                    assert got == []  # one reader is left
                    await held[1].release()
            assert not got[0].shared
            assert waits.woken >= 1  # the last reader's release, not a retry
            await got[0].release()

    async def test_a_lost_subscription_moves_to_another_node_and_hears_the_release(
        self, masters: Masters, clusters: list[ServerCluster]
    ) -> None:
        """The waiter's subscription to the first cluster is dropped (CLIENT KILL
        on its node): the listener subscribes again on another node of that
        cluster. The holder holds the first and the third cluster only (the second
        had another holder's key), so the waiter is handed the lock only if it hears
        the first cluster's announcement there: the third's alone is no quorum."""
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=PATIENT, node_timeout=CONFIRM) as waiter,
        ):
            await masters.clients[1].set("moved", "another holder", px=HANG_GUARD * 1000)
            lease = await holder.lock("moved").acquire()
            await holder.settle()
            got: list[Lease] = []
            with Waits(waiter) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await waiter.lock("moved", timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waits.reach(1)
                    await waiter.settle()
                    first = await _subscribed_node(clusters[0], but=None)
                    resp_call(first.port, "CLIENT", "KILL", "TYPE", "pubsub", timeout=2.0)
                    await _subscribed_node(clusters[0], but=first)
                    await waiter.settle()  # the retries the loss and the new subscription woke
                    await masters.clients[1].delete("moved")
                    await lease.release()
            assert got[0].statistics().source == "hand-over"
            await got[0].release()


async def _subscribed_node(cluster: ServerCluster, *, but: ServerProcess | None) -> ServerProcess:
    """The one node of ``cluster`` with a subscription open, once there is one
    (other than ``but``, and ``but`` with none); no event says when: a bounded poll."""

    def found() -> str | None:
        nodes = [node for node in cluster.nodes if _subscribed(node)]
        if len(nodes) != 1 or nodes[0] is but:
            return f"subscribed nodes: {[node.port for node in nodes]}"
        return None

    await anyio.to_thread.run_sync(wait_until, found, HANG_GUARD, "one subscribed node")
    (node,) = [node for node in cluster.nodes if _subscribed(node)]
    return node


def _subscribed(node: ServerProcess) -> bool:
    """Whether a pub/sub connection is open on ``node`` (a running one)."""
    if not node.running:
        return False
    listed = resp_call(node.port, "CLIENT", "LIST", "TYPE", "pubsub", timeout=2.0)
    if isinstance(listed, bytes):
        listed = listed.decode()
    return isinstance(listed, str) and bool(listed.strip())


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


class TestSeveralResources:
    async def test_names_sharing_a_hash_tag_are_locked_together_on_one_shard(
        self, masters: Masters, clusters: list[ServerCluster]
    ) -> None:
        names = ["{order:7}:items", "{order:7}:payment"]
        slot = clusters[0].keyslot("order:7")
        async with AsyncRedlock(masters.given) as redlock:
            async with redlock.lock(names) as lease:
                assert lease.tokens is not None
                assert sorted(lease.tokens) == names
                await redlock.settle()
                for cluster in clusters:  # both keys on the shard that serves the tag
                    shard = Redis.from_url(cluster.primary_for(slot).url)
                    assert await shard.exists(*names) == 2
                    await shard.aclose()
                with pytest.raises(LockTimeoutError):
                    await redlock.lock(names[1], timeout=0).acquire()
            await redlock.settle()
        assert await masters.keys() == [[]] * CLUSTERS

    async def test_names_in_one_slot_without_a_common_tag_are_accepted(
        self, masters: Masters, clusters: list[ServerCluster]
    ) -> None:
        """The rule is the slot, not the spelling: "x" hashes whole, "{x}:more" by
        its tag "x", to the same slot."""
        assert clusters[0].keyslot("x") == clusters[0].keyslot("{x}:more")
        async with (
            AsyncRedlock(masters.given) as redlock,
            redlock.lock(["x", "{x}:more"]) as lease,
        ):
            assert lease.tokens is not None
            assert sorted(lease.tokens) == ["x", "{x}:more"]

    async def test_names_in_different_slots_are_refused_before_any_call(
        self, masters: Masters, clusters: list[ServerCluster]
    ) -> None:
        names = ["order:7:items", "order:7:payment"]
        assert len({clusters[0].keyslot(name) for name in names}) == 2
        async with AsyncRedlock(masters.given) as redlock:
            with pytest.raises(ValueError, match=r"in 2 cluster slots.*must share a hash tag"):
                redlock.lock(names)
            assert redlock.statistics().attempts == 0


class _Recording(RedisCluster):
    """A cluster client that notes the keys of every script it is asked to run."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.script_keys: set[str] = set()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if args and args[0] in ("EVALSHA", "EVAL"):
            self.script_keys.update(args[3 : 3 + int(args[2])])
        return await super().execute_command(*args, **kwargs)


class TestKeySlots:
    @pytest.mark.parametrize("name", ["a{}b", "{x}", "}{", "{}", "x{y}z{w}"])
    async def test_every_key_of_a_lock_is_in_the_slot_of_its_name(
        self, masters: Masters, clusters: list[ServerCluster], name: str
    ) -> None:
        """Every kind of call (fenced lock, extension, a fair waiter queued and
        leaving, readers and a writer, inspection, forced release, a fair semaphore's
        slot and a waiter queued and leaving) on one cluster master, so that any call
        refused by a slot check fails the test; then each key they named hashes, by
        CLUSTER KEYSLOT on a real server, where the name does."""
        cluster = clusters[0]
        client = _Recording(startup_nodes=cluster.startup_nodes)
        async with AsyncRedlock([client]) as redlock, AsyncRedlock([client]) as other:
            lease = await redlock.lock(name, fencing=True).acquire()
            await lease.extend()
            with pytest.raises(LockTimeoutError):
                await other.lock(name, fair=True, timeout=0).acquire()
            assert all(node.error is None for node in (await redlock.inspect(name)).nodes)
            await lease.release()
            reader = await redlock.rwlock(name).read().acquire()
            with pytest.raises(LockTimeoutError):
                await other.rwlock(name).write(timeout=0).acquire()
            await reader.extend()
            await reader.release()
            async with other.rwlock(name).write(timeout=0):
                pass
            await redlock.rwlock(name).read().acquire()
            assert await redlock.force_release(name) == 1
            slot_lease = await redlock.semaphore(name, 1, fair=True).acquire()
            with pytest.raises(LockTimeoutError):  # queued, then out of the queue
                await other.semaphore(name, 1, fair=True, timeout=0).acquire()
            await slot_lease.release()
        await client.aclose()
        suffixes = ("fence", "readers", "queue", "queue:expiry", "queue:terms")
        suffixes += ("sem:0", "sem:queue", "sem:queue:expiry")
        assert {name, *(aux_key(name, suffix) for suffix in suffixes)} <= client.script_keys
        assert any(":undo:" in key for key in client.script_keys)
        slot = cluster.keyslot(name)
        assert slot == key_slot(name)
        assert {key: cluster.keyslot(key) for key in client.script_keys} == dict.fromkeys(
            client.script_keys, slot
        )


# -- resharding and failover while a lock is held --


class TestResharding:
    async def test_a_lock_held_while_its_slot_moves_to_another_shard(
        self, mixed: Masters, replicated: ServerCluster
    ) -> None:
        """Mid-move, that cluster fails the calls on the slot: those naming several
        keys get TRYAGAIN (the keys are on the target, not all of them exist), and
        redis-py's asyncio client follows an ASK redirection with ASKING on another
        pooled connection than the command. The other masters, a quorum, carry
        the lock: it extends, a rival is refused, a release succeeds (and leaves
        its key on the moving cluster, to its TTL). Once moved, calls follow
        MOVED, and the keys, the fence among them, are on the new shard."""
        moving, other = "moving", "{moving}:other"  # one slot
        slot = replicated.keyslot(moving)
        source = replicated.primary_for(slot)
        target = next(node for node in replicated.nodes[:SHARDS] if node is not source)
        async with AsyncRedlock(mixed.given) as holder, AsyncRedlock(mixed.given) as rival:
            lease = await holder.lock(moving, auto_extend=False).acquire()
            second = await holder.lock(other, auto_extend=False).acquire()
            await holder.settle()
            fence = await mixed.clients[0].get("{moving}:fence")
            replicated.begin_move(slot, target)
            await lease.extend()
            with pytest.raises(LockTimeoutError):
                await rival.lock(moving, timeout=0).acquire()
            await second.release()
            state = await holder.inspect(moving)
            assert state.nodes[0].error is not None
            assert state.holder == lease.value
            await holder.settle()
            # and the rival's refused attempt: its call to the moving cluster, retried
            # by redis-py until the move ends, would follow MOVED after the release
            # below and take the free key there until its undo (seen under load)
            await rival.settle()
            replicated.end_move(slot, target)
            assert replicated.primary_for(slot) is target
            await lease.extend()  # through MOVED
            shard = Redis.from_url(target.url)
            assert await shard.get(moving) == lease.value.encode()
            assert await shard.get("{moving}:fence") == fence
            assert await shard.get(other) == second.value.encode()  # left to its TTL
            await shard.aclose()
            await lease.release()
            await holder.settle()
            assert await mixed.holding(moving) == 0
            again = await rival.lock(moving, timeout=0).acquire()
            await again.release()
        assert lease.token is not None
        assert again.token is not None
        assert again.token > lease.token


class TestFailover:
    async def test_a_manual_failover_keeps_the_lock(
        self, mixed: Masters, replicated: ServerCluster
    ) -> None:
        """CLUSTER FAILOVER waits for the replica to catch up: the key and the fence
        are there on the new primary, reached through MOVED."""
        slot = replicated.keyslot("failing")
        (replica,) = replicated.replicas_of(replicated.primary_for(slot))
        async with AsyncRedlock(mixed.given) as holder, AsyncRedlock(mixed.given) as rival:
            lease = await holder.lock("failing", auto_extend=False).acquire()
            await holder.settle()
            await anyio.to_thread.run_sync(replicated.failover, replica)
            assert replicated.primary_for(slot) is replica
            await lease.extend()
            await holder.settle()
            assert await mixed.holding("failing") == CLUSTERS
            with pytest.raises(LockTimeoutError):
                await rival.lock("failing", timeout=0).acquire()
            await lease.release()
            again = await rival.lock("failing", timeout=0).acquire()
            await again.release()
        assert lease.token is not None
        assert again.token is not None
        assert again.token > lease.token

    async def test_a_primary_lost_before_its_replica_had_the_key(
        self, mixed: Masters, replicated: ServerCluster
    ) -> None:
        """Replication is asynchronous: the replica promoted when its primary dies
        may not have the lock key (here, for certain: it was cut off before the
        acquisition). That master has lost the lock; the others, a quorum, still
        hold it: the lease extends, a rival is refused, and the next token is
        still larger (both other masters kept the count)."""
        shard = _shard(replicated, "failing")
        async with AsyncRedlock(mixed.given) as holder, AsyncRedlock(mixed.given) as rival:
            earlier = await holder.lock("failing").acquire()
            await earlier.release()
            await holder.settle()
            cut_off_replica(*shard[1:])
            lease = await holder.lock("failing", auto_extend=False).acquire()
            await holder.settle()  # every master answered: no SET is retried later
            await _fail_over(replicated, shard)
            assert await mixed.clients[0].get("failing") is None  # lost in the failover
            await lease.extend()  # on the quorum that still holds it
            assert lease.held
            with pytest.raises(LockTimeoutError):
                await rival.lock("failing", timeout=0).acquire()
            await lease.release()
            after = await rival.lock("failing", timeout=0).acquire()
            await after.release()
        assert earlier.token is not None
        assert lease.token is not None
        assert after.token is not None
        assert earlier.token < lease.token < after.token

    async def test_a_counter_set_back_by_a_failover_is_lifted_by_the_clock(
        self, mixed: Masters, replicated: ServerCluster
    ) -> None:
        """A failover to a replica that missed the last counts sets a counter back
        (unlike a master restarted empty, whose counter starts again from its
        clock). Here the next quorum shares only that master with the last one:
        the first holder is granted by the first cluster (before its failover) and
        the second (the third refuses: another holder's key), the next one by the
        failed-over first cluster and the third (the second refuses). Neither of
        those remembers the first token; what keeps the next one larger is the
        clock floor: a count is never below the master's clock in whole seconds,
        and the failover took longer than a second (the node timeout)."""
        shard = _shard(replicated, "stale")
        _, primary, _ = shard
        start = 10**15  # every counter at one count (microseconds in 2001), the replica's too
        for client in mixed.clients[1:]:
            await client.set("{stale}:fence", start)
        direct = Redis.from_url(primary.url)
        await direct.set("{stale}:fence", start)
        assert await direct.wait(1, HANG_GUARD * 1000) == 1
        await direct.aclose()
        cut_off_replica(*shard[1:])
        async with AsyncRedlock(mixed.given) as holder, AsyncRedlock(mixed.given) as rival:
            await mixed.clients[2].set("stale", "another holder", px=HANG_GUARD * 1000)
            first = await holder.lock("stale", auto_extend=False).acquire()
            await first.release()
            await holder.settle()
            await mixed.clients[2].delete("stale")
            await _fail_over(replicated, shard)
            fences = await mixed.fences("stale")
            assert (fences[0], fences[2]) == (start, start)  # set back; never counted
            seconds, _ = await mixed.clients[2].time()
            assert first.token is not None
            assert seconds * 10**6 > first.token  # the clocks are a second further on
            await mixed.clients[1].set("stale", "another holder", px=HANG_GUARD * 1000)
            second = await rival.lock("stale", timeout=0).acquire()  # one attempt
            await second.release()
        assert first.token > start + TOKEN_BLOCK  # lifted by the floor
        assert second.token is not None
        assert second.token > first.token
        assert second.token % 10**6 == 0  # the floor: the clock in whole seconds


def _shard(cluster: ServerCluster, name: str) -> Shard:
    """The slot of ``name``, the primary serving it and its replica."""
    slot = cluster.keyslot(name)
    primary = cluster.primary_for(slot)
    (replica,) = cluster.replicas_of(primary)
    return slot, primary, replica


async def _fail_over(cluster: ServerCluster, shard: Shard) -> None:
    """Kill the primary, let its replica go on, wait until it serves the slot."""
    slot, primary, replica = shard
    primary.kill()
    replica.resume()
    await anyio.to_thread.run_sync(cluster.wait_ready, HANG_GUARD)
    assert cluster.primary_for(slot) is replica
