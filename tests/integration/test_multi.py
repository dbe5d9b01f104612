"""Locks on several resources: all or none on each master, one lease, a token each."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from redis.asyncio import RedisCluster

from asyncredlock import AsyncRedlock, Lease, LockNotOwnedError, LockTimeoutError
from asyncredlock._protocol import TOKEN_BLOCK
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, Queue

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a retry delay no test waits out


class TestAllOrNone:
    """A lock on several resources takes all of them on a master, or none."""

    async def test_all_resources_are_taken_on_every_master_with_a_token_each(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lock = redlock.lock(["a", "b", "c"])
            assert (lock.names, lock.keys, lock.name) == (
                ("a", "b", "c"),
                ("a", "b", "c"),
                "a, b, c",
            )
            lease = await lock.acquire()
            await redlock.settle()
            assert await masters.keys() == [[b"a", b"b", b"c"]] * 5
            assert lease.resources == ("a", "b", "c")
            assert lease.token is None  # one token per resource instead:
            assert lease.tokens is not None
            assert sorted(lease.tokens) == ["a", "b", "c"]
            for name, token in lease.tokens.items():
                assert (await masters.fences(name)).count(token) >= 3
            await lease.extend()
            await lease.release()
            await redlock.settle()
            assert await masters.keys() == [[]] * 5
            single = await redlock.lock("b").acquire()  # same counter as the set's "b"
            assert single.token is not None
            assert single.token >= lease.tokens["b"] + TOKEN_BLOCK
            await single.release()

    async def test_a_partly_available_set_is_taken_by_nobody(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as other:
            held = await holder.lock("b").acquire()
            with pytest.raises(LockTimeoutError, match="'a, b, c'"):
                await other.lock(["a", "b", "c"], timeout=0).acquire()
            await other.settle()
            assert await masters.keys() == [[b"b"]] * 5  # neither a nor c was set anywhere
            assert (await masters.fences("a")) == [None] * 5  # nor counted
            await held.release()
            lease = await other.lock(["a", "b", "c"], timeout=0).acquire()
            await lease.release()

    async def test_an_extension_needs_every_resource_on_a_majority(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lease = await redlock.lock(["x", "y"], auto_extend=False).acquire()
            # acquire() returns at a quorum: a SET still out could land after the DELETE
            # below. inspect() reads every master after it, in order on each connection.
            state = await redlock.inspect("y")
            assert [node.holder for node in state.nodes] == [lease.value] * 5
            for client in masters.clients[:3]:
                await client.delete("y")  # y gone on a majority, x still everywhere
            with pytest.raises(LockNotOwnedError):
                await lease.extend()
            assert lease.lost
            await redlock.settle()
            assert await masters.keys() == [[]] * 5  # what remained was removed


class TestWaiting:
    """Sets that overlap or wait for each other."""

    async def test_a_set_waits_for_a_release_of_any_of_its_resources(
        self, servers: ServerGroup
    ) -> None:
        """With no timer to save it, only the announcement of the release of "c" can
        hand the set over."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            held = await holder.lock("c", ttl=60.0).acquire()
            waits = Waits(waiter)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    got: list[Lease] = []

                    async def take() -> None:
                        got.append(await waiter.lock(["a", "b", "c"], timeout=HANG_GUARD).acquire())

                    tg.start_soon(take)
                    await waits.reach(1)
                    await held.release()
            assert waiter.statistics().wakeups == 1
            await got[0].release()

    async def test_overlapping_sets_never_hold_a_resource_twice(self, servers: ServerGroup) -> None:
        rng = random.Random(20261123)
        resources = ["r1", "r2", "r3", "r4"]
        holders: dict[str, int] = dict.fromkeys(resources, 0)
        tokens: dict[str, list[int]] = {name: [] for name in resources}

        async def worker(redlock: AsyncRedlock, seed: int) -> None:
            own = random.Random(seed)
            for _ in range(15):
                names = own.sample(resources, own.randint(1, 3))
                async with redlock.lock(names, timeout=HANG_GUARD) as lease:
                    for name in names:
                        holders[name] += 1
                        assert holders[name] == 1, f"{name} held twice"
                    assert lease.tokens is not None
                    for name, token in lease.tokens.items():
                        tokens[name].append(token)
                    await anyio.lowlevel.checkpoint()  # let the others run while it is held
                    for name in names:
                        holders[name] -= 1

        async with AsyncRedlock(servers.urls) as one, AsyncRedlock(servers.urls) as two:
            with anyio.fail_after(HANG_GUARD * 4):
                async with anyio.create_task_group() as tg:
                    for redlock in (one, two):
                        for _ in range(4):
                            tg.start_soon(worker, redlock, rng.random())
        for name in resources:
            assert tokens[name] == sorted(set(tokens[name])), name  # in holding order

    async def test_tasks_waiting_for_the_same_set_get_it_passed_on(
        self, servers: ServerGroup
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            queue = Queue(redlock)
            lock = redlock.lock(["p", "q"], timeout=HANG_GUARD)
            first = await lock.acquire()
            nxt = asyncio.create_task(lock.acquire())
            await queue.reach(1)
            await first.release()
            with anyio.fail_after(HANG_GUARD):
                second = await nxt
            assert redlock.statistics().handoffs == 1
            assert first.tokens is not None
            assert second.tokens == {name: token + 1 for name, token in first.tokens.items()}
            await second.release()


class TestWakingSets:
    @pytest.mark.parametrize("masters", [1, 5])
    async def test_a_release_a_woken_set_cannot_use_wakes_the_next_set(
        self, make_servers: MakeServers, masters: int
    ) -> None:
        """Two sets of one client wait on "a": ["a", "b"] (b held elsewhere) enrolled
        first, then ["a", "c"] (c free). The release of "a" wakes the first; its
        attempt fails on "b", and it passes the wake-up on: ["a", "c"] takes the
        lock without waiting out its retry delay (here: never). With one master no
        copy of the release from another master wakes anyone again meanwhile."""
        urls = make_servers(masters).urls
        async with (
            AsyncRedlock(urls) as holder,
            AsyncRedlock(urls, retry_delay=NEVER) as waiter,
        ):
            held_a = await holder.lock("a", ttl=60.0).acquire()
            held_b = await holder.lock("b", ttl=60.0).acquire()
            waits = Waits(waiter)
            got: list[Lease] = []
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take(names: list[str]) -> None:
                        got.append(await waiter.lock(names, timeout=NEVER).acquire())
                        tg.cancel_scope.cancel()  # the other set stays blocked on "b"

                    tg.start_soon(take, ["a", "b"])
                    await waits.reach(1)
                    tg.start_soon(take, ["a", "c"])
                    await waits.reach(2)
                    await held_a.release()
            assert [lease.resources for lease in got] == [("a", "c")]
            await got[0].release()
            await held_b.release()


class TestValidation:
    @pytest.mark.parametrize(
        ("names", "error", "match"),
        [
            ([], ValueError, "at least one name"),
            (["a", "b", "a"], ValueError, r"given twice: \['a'\]"),
            (["a", ""], ValueError, "must not be empty"),
            (["a", 1], TypeError, "must be a str, not int"),
            ({"a", "b"}, TypeError, "must be a str, not set"),
        ],
    )
    async def test_bad_names_are_refused(
        self, servers: ServerGroup, names: Any, error: type[Exception], match: str
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(error, match=match):
                redlock.lock(names)
            assert redlock.statistics().attempts == 0

    async def test_cluster_masters_need_one_slot(self, servers: ServerGroup) -> None:
        cluster = RedisCluster(host="127.0.0.1", port=servers[0].port)  # never connects
        async with AsyncRedlock([cluster]) as redlock:
            with pytest.raises(ValueError, match="2 cluster slots"):
                redlock.lock(["order:7:items", "order:7:payment"])
            lock = redlock.lock(["{order:7}:items", "{order:7}:payment"])
            assert lock.keys == ("{order:7}:items", "{order:7}:payment")
        await cluster.aclose()
