"""Fencing tokens against real servers: two-phase acquisition, ordering, faults."""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, LockNotOwnedError, LockTimeoutError
from asyncredlock._config import DEFAULTS
from asyncredlock._connect import make_node
from asyncredlock._node import Node
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock._scripts import ACQUIRE, COMMIT
from asyncredlock.testing import ServerGroup, hold_calls
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import ABOVE_CLOCK as B
from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 60  # seconds; only stops a hung test, never decides an outcome


class TestTokens:
    async def test_a_token_is_committed_on_every_master_and_starts_from_server_time(
        self, masters: Masters
    ) -> None:
        seconds, micros = await masters.clients[0].time()
        before = seconds * 1_000_000 + micros
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.lock("fresh").acquire()
            await redlock.settle()
            assert isinstance(lease.token, int)
            assert lease.token > before  # a missing counter starts from TIME in µs
            fences = await masters.fences("fresh")
            # committed on the masters that granted first (a quorum at least);
            # a master that granted after the decision keeps its own count
            assert fences.count(lease.token) >= redlock.quorum
            assert all(f is not None and f > before for f in fences)
            state = await redlock.inspect("fresh")
            assert [node.fence for node in state.nodes] == fences
            await lease.release()

    async def test_fencing_false_is_plain_redlock_with_no_token(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given, fencing=False) as redlock:
            lease = await redlock.lock("plain").acquire()
            assert lease.token is None
            await redlock.settle()  # the masters beyond the quorum have answered too
            assert await masters.holding("plain") == len(masters)
            await lease.release()
            fenced = await redlock.lock("plain", fencing=True).acquire()
            assert isinstance(fenced.token, int)
            await fenced.release()
            await redlock.settle()
        assert (await masters.fences("plain")).count(fenced.token) >= redlock.quorum

    async def test_unfenced_acquisitions_leave_the_counter_alone(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            first = await redlock.lock("mixed").acquire()
            await first.release()
            await redlock.settle()
            before = await masters.fences("mixed")
            for _ in range(3):
                plain = await redlock.lock("mixed", fencing=False).acquire()
                await plain.release()
            await redlock.settle()
            assert await masters.fences("mixed") == before
            second = await redlock.lock("mixed").acquire()
            await second.release()
        assert first.token is not None
        assert second.token is not None
        assert second.token > first.token

    async def test_1000_sequential_acquisitions_over_5_clients_strictly_increase(
        self, servers: ServerGroup
    ) -> None:
        tokens: list[int] = []
        clients = [AsyncRedlock(servers.urls, ttl=5.0) for _ in range(5)]
        try:
            with anyio.fail_after(HANG_GUARD):
                for i in range(1000):
                    lock = clients[i % 5].lock("sequential", timeout=5, auto_extend=False)
                    lease = await lock.acquire()
                    assert lease.token is not None
                    tokens.append(lease.token)
                    await lease.release()
        finally:
            for client in clients:
                await client.aclose()
        assert all(b > a for a, b in itertools.pairwise(tokens))
        assert len(set(tokens)) == 1000


@dataclass(frozen=True, slots=True)
class Committed:
    """One successful acquisition: when it started, when acquire() returned, its token."""

    start: float
    committed: float
    token: int


class TestOrderUnderFaults:
    async def test_contention_with_injected_expiries_keeps_tokens_unique_and_ordered(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Keys deleted on random masters break mutual exclusion; tokens stay ordered.

        For every pair: an acquisition that started after another one committed
        (acquire() returned) has the larger token.
        """
        committed: list[Committed] = []
        rng = random.Random(3)
        done = anyio.Event()
        clients = [
            AsyncRedlock(servers.urls, ttl=0.25, retry_delay=0.01, auto_extend=False)
            for _ in range(3)
        ]

        async def worker(redlock: AsyncRedlock) -> None:
            lock = redlock.lock("contended", timeout=math.inf)
            while not done.is_set():
                start = time.monotonic()
                lease = await lock.acquire()
                stamp = time.monotonic()
                assert lease.token is not None
                committed.append(Committed(start, stamp, lease.token))
                if len(committed) >= 300:
                    done.set()
                await anyio.sleep(rng.uniform(0, 0.005))  # the work
                with contextlib.suppress(LockNotOwnedError):  # its key deleted under it
                    await lease.release()

        async def expire_keys() -> None:
            while not done.is_set():
                for client in rng.sample(masters.clients, rng.randint(1, 3)):
                    await client.delete("contended")
                await anyio.sleep(rng.uniform(0, 0.01))  # the fault's timing

        try:
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(expire_keys)
                    for i in range(12):
                        tg.start_soon(worker, clients[i % 3])
        finally:
            for client in clients:
                await client.aclose()
        tokens = [c.token for c in committed]
        assert len(set(tokens)) == len(tokens)
        ordered_pairs = 0
        for a in committed:
            for b in committed:
                if b.start > a.committed:
                    assert b.token > a.token, (a, b)
                    ordered_pairs += 1
        assert ordered_pairs > 0

    @pytest.mark.parametrize("wipe", ["flushall", "restart"])
    async def test_a_master_that_loses_its_data_does_not_set_tokens_back(
        self, make_servers: MakeServers, wipe: str
    ) -> None:
        group = make_servers(3)
        tokens: list[int] = []
        async with AsyncRedlock(group.urls) as redlock:
            for round_ in range(6):
                lease = await redlock.lock("wiped", timeout=5).acquire()
                assert lease.token is not None
                tokens.append(lease.token)
                await lease.release()
                await redlock.settle()
                victim = group[round_ % 3]
                if wipe == "flushall":
                    victim.flushall()
                else:
                    victim.restart()  # no AOF: the server comes back empty
        assert all(b > a for a, b in itertools.pairwise(tokens))


class TestProtocolSteps:
    """The per-master scripts driven step by step through adversarial interleavings
    (expiries, late first-phase replies) on three real masters a, b, c.

    Each scenario is the shortest one where dropping one rule of the commit
    phase hands out a token that is not larger than an earlier committed one.
    The counters are ``B`` plus small numbers (B far above the masters' clocks), so
    the clock floor never lifts them: the commit rules alone are at work.
    """

    async def test_a_late_commit_never_sets_a_counter_back(self, make_servers: MakeServers) -> None:
        a, b, c = await self._nodes(make_servers)
        try:
            await self._set_counters([a, b, c], B + 100)
            assert await self._first_phase([a, b], "Z") == [B + 101, B + 101]  # Z decides: t=101
            await self._delete_key([a, b])  # Z's keys expire before its commit
            assert await self._first_phase([b, c], "X") == [B + 102, B + 101]
            assert await self._commit([b, c], "X", B + 102) == [1, 1]  # X committed t=102
            await self._delete_key([b, c])  # X released
            assert await self._first_phase([c], "Z") == [B + 103]  # Z's late reply from c
            # Z's commit with t=101 reaches c, which holds Z's key: refused, since
            # c's counter (103) is past 101. Accepting it would set c back to 101
            # and let Y, below, reuse X's token 102.
            assert await self._commit([c], "Z", B + 101) == [-1]
            await self._delete_key([c])
            y = await self._first_phase([a, c], "Y")
            assert max(y) > B + 102
        finally:
            await self._close([a, b, c])

    async def test_the_commit_writes_the_token_back(self, make_servers: MakeServers) -> None:
        a, b, c = await self._nodes(make_servers)
        try:
            await self._set_counters([a, c], B + 100)
            await self._set_counters([b], B + 200)
            assert await self._first_phase([a, b], "X") == [B + 101, B + 201]
            assert await self._commit([a, b], "X", B + 201) == [1, 1]
            await self._delete_key([a, b])
            # Without the write-back a would still say 101 and Y (on a and c)
            # would get 102, far below X's 201.
            y = await self._first_phase([a, c], "Y")
            assert max(y) > B + 201
        finally:
            await self._close([a, b, c])

    KEY = "steps"
    FENCE = "{steps}:fence"

    async def _nodes(self, make_servers: MakeServers) -> list[Node]:
        group = make_servers(3)
        self._clients = {}
        nodes = []
        for url in group.urls:
            node = make_node(url, DEFAULTS)[0]
            self._clients[node] = Redis.from_url(url)
            nodes.append(node)
        return nodes

    async def _set_counters(self, nodes: Sequence[Node], value: int) -> None:
        for node in nodes:
            await self._clients[node].set(self.FENCE, value)

    async def _first_phase(self, nodes: Sequence[Node], value: str) -> list[int]:
        keys = (self.KEY, f"{{{self.KEY}}}:undo:{value}", self.FENCE, f"{{{self.KEY}}}:readers")
        replies = [await node.call(ACQUIRE, keys, (value, 60_000, "1")) for node in nodes]
        assert all(r.error is None and r.value[0] == 1 for r in replies), replies
        return [int(r.value[1]) for r in replies]

    async def _commit(self, nodes: Sequence[Node], value: str, token: int) -> list[int]:
        keys = (self.KEY, self.FENCE)
        replies = [await node.call(COMMIT, keys, (value, str(token))) for node in nodes]
        return [int(r.value) for r in replies]

    async def _delete_key(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            await self._clients[node].delete(self.KEY)

    async def _close(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            await node.aclose()
            await self._clients[node].aclose()


class TestWipedMaster:
    async def test_a_wiped_master_that_alone_links_two_quorums(
        self, make_servers: MakeServers
    ) -> None:
        """c misses X's acquisition (X commits on a and b); b then restarts empty,
        a goes down and c comes back: Y's quorum (b, c) shares only the wiped b
        with X's. b's counter restarts from its clock, so Y's token is still
        larger; a counter restarting from 0 would hand Y X's token again."""
        group = make_servers(3)
        a, b, c = group[0], group[1], group[2]
        tokens: list[int | None] = []

        async def take_and_release() -> None:
            async with AsyncRedlock(group.urls) as redlock:
                lease = await redlock.lock("wiped-link", timeout=5).acquire()
                tokens.append(lease.token)
                await lease.release()
                await redlock.settle()

        await take_and_release()  # every master counts
        c.stop()
        await take_and_release()  # X: committed on a and b
        b.restart()  # no AOF: comes back empty
        a.stop()
        c.start()
        await take_and_release()  # Y: committed on b and c
        first, x, y = tokens
        assert first is not None
        assert x is not None
        assert y is not None
        assert first < x < y


class TestSetBackCounter:
    """A master whose counter went back (a failover to a replica that had missed the
    last counts) while its data stayed: X commits on a and b; then a's counter goes
    back to what it was before X, and Y is granted by a and c. Y's quorum shares
    only a with X's, and neither a nor c remembers X's token."""

    OLD = 10**15  # every counter's count before X: microseconds in 2001

    async def _x_then_y(self, group: ServerGroup, between: Callable[[], None]) -> tuple[int, int]:
        a, b, c = (Redis.from_url(url) for url in group.urls)
        try:
            for client in (a, b, c):
                await client.set("{set-back}:fence", self.OLD)
            async with AsyncRedlock(group.urls) as redlock:
                await c.set("set-back", "another holder", px=HANG_GUARD * 1000)
                x = await redlock.lock("set-back", timeout=0).acquire()  # a and b
                await x.release()
                await redlock.settle()
                await c.delete("set-back")
                await a.set("{set-back}:fence", self.OLD)  # the failover's loss
                await b.set("set-back", "another holder", px=HANG_GUARD * 1000)
                between()
                y = await redlock.lock("set-back", timeout=0).acquire()  # a and c
                await y.release()
        finally:
            for client in (a, b, c):
                await client.aclose()
        assert x.token is not None
        assert y.token is not None
        return x.token, y.token

    @pytest.mark.usefixtures("fake_clock_available")
    async def test_the_clock_floor_lifts_it_above_the_tokens_of_earlier_seconds(
        self, make_servers: MakeServers
    ) -> None:
        """The masters' clocks reach a later second before Y (a failover takes
        longer than that): each count is at least the clock in whole seconds, so
        Y's token is larger. Without the floor both would count from the old
        counters and Y would get X's token again."""
        group = make_servers(3, fake_clock=True)

        def later_second() -> None:
            for server in group:
                server.clock.jump(2)

        x, y = await self._x_then_y(group, later_second)
        assert x >= self.OLD + 10**6  # lifted by the floor, not counted from OLD
        assert y > x

    @pytest.mark.usefixtures("fake_clock_available")
    async def test_a_clock_behind_by_more_than_the_time_since_lets_a_token_go_back(
        self, make_servers: MakeServers
    ) -> None:
        """What does not hold: the floor is only as good as the clocks. With a and
        c five seconds behind b (and X's token from b's second), Y's counts are
        below X's token."""
        group = make_servers(3, fake_clock=True)

        def clocks_behind() -> None:
            group[0].clock.jump(-5)
            group[2].clock.jump(-5)

        x, y = await self._x_then_y(group, clocks_behind)
        assert y < x


class TestCommitRound:
    """The second round runs only where the first left the counters apart."""

    @pytest.mark.parametrize("skewed", [False, True], ids=["counters equal", "counters apart"])
    async def test_the_commit_round_runs_only_when_a_quorum_did_not_count_the_token(
        self,
        masters: Masters,
        skewed: bool,
    ) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            earlier = await redlock.lock("rounds").acquire()
            await earlier.release()
            await redlock.settle()
            # A new resource's counters start apart (each master's clock), and a
            # master that granted late may keep a count above the token: line them up.
            top = await masters.line_up_fences("rounds")
            if skewed:
                await masters.skew_fences("rounds")
            before = redlock.statistics().commits
            lease = await redlock.lock("rounds").acquire()
            commits = redlock.statistics().commits - before
            await redlock.settle()
            fences = await masters.fences("rounds")
            await lease.release()
        assert earlier.token is not None
        assert lease.token is not None
        assert lease.token >= top + TOKEN_BLOCK
        assert fences.count(lease.token) >= redlock.quorum  # counted or committed on a quorum
        if skewed:
            assert commits == 1  # a second round committed the token
        else:
            assert commits == 0
            assert fences == [lease.token] * len(masters)

    async def test_a_commit_refused_by_a_majority_is_not_a_lease(self, masters: Masters) -> None:
        """The lock key vanishes between the phases (an expiry): every commit is
        refused, the attempt fails and is undone everywhere."""
        async with AsyncRedlock(masters.given) as redlock:
            await masters.skew_fences("expired")  # so that the commit round runs
            with hold_calls(redlock, "commit") as commits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def acquire() -> None:
                        with pytest.raises(LockTimeoutError) as caught:
                            await redlock.lock("expired", timeout=0).acquire()
                        outcomes = caught.value.outcomes
                        assert not any(o.ok for o in outcomes)
                        assert any("gone before the commit" in o.detail for o in outcomes)

                    tg.start_soon(acquire)
                    await commits.reached.wait()
                    # every first-phase SET answered (a slow master's could otherwise
                    # land after the deletes below, and its commit succeed)
                    await redlock.settle()
                    for client in masters.clients:
                        await client.delete("expired")
                    commits.let_go()
                await redlock.settle()
            assert await masters.keys() == [[]] * len(masters)
            assert redlock.statistics().acquisitions == 0
