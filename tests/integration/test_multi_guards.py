"""Locks on several resources: exclusion, loss, cancellation, restarts,
fencing, inspection and closing, against real servers (separate clients stand in
for processes)."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import anyio.lowlevel
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, LockLostError, LockTimeoutError
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, library_tasks


async def connections(urls: list[str]) -> int:
    """Client connections on the masters, but the one asking on each."""
    total = 0
    for url in urls:
        async with Redis.from_url(url) as direct:
            total += len(await direct.client_list()) - 1
    return total


pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0


class Exclusion:
    """Who holds each resource right now, and the tokens in holding order."""

    def __init__(self, names: list[str]) -> None:
        self.holders: dict[str, int] = dict.fromkeys(names, 0)
        self.tokens: dict[str, list[int]] = {name: [] for name in names}
        self.violations: list[str] = []

    def enter(self, lease: Lease) -> None:
        for name in lease.resources:
            self.holders[name] += 1
            if self.holders[name] != 1:
                self.violations.append(name)
        assert lease.tokens is not None
        for name, token in lease.tokens.items():
            self.tokens[name].append(token)

    def leave(self, lease: Lease) -> None:
        for name in lease.resources:
            self.holders[name] -= 1


class TestOverlappingSets:
    async def test_a_cycle_of_sets_and_a_single_lock_with_extensions(
        self, servers: ServerGroup
    ) -> None:
        """[a, b], [b, c], [c, a] and [b], one client each, holding past their TTL
        (so the leases extend themselves): no resource is ever held twice, every
        acquisition gets in within its timeout, tokens rise in holding order, and
        the attempts it takes stay a few per acquisition (counted)."""
        seen = Exclusion(["a", "b", "c"])
        sets = [["a", "b"], ["b", "c"], ["c", "a"], ["b"]]
        rounds = 6
        attempts: list[int] = []

        async def worker(redlock: AsyncRedlock, names: list[str]) -> None:
            lock = redlock.lock(names, ttl=0.3, timeout=HANG_GUARD)
            for _ in range(rounds):
                async with lock as lease:
                    seen.enter(lease)
                    await anyio.sleep(0.35)  # past its TTL: extended meanwhile
                    assert lease.held
                    seen.leave(lease)
            attempts.append(lock.statistics().attempts)

        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(AsyncRedlock(servers.urls)) for _ in sets]
            with anyio.fail_after(HANG_GUARD * 4):
                async with anyio.create_task_group() as tg:
                    for redlock, names in zip(clients, sets, strict=True):
                        tg.start_soon(worker, redlock, names)
        assert seen.violations == []
        for name, tokens in seen.tokens.items():
            assert tokens == sorted(set(tokens)), name
        # Each acquisition waits for at most three others' holds; with wake-ups that
        # only releases cause, a handful of attempts each. The undos of split
        # attempts wake the other sets (and the set itself) at once, in lockstep,
        # and they split again: hundreds of attempts per acquisition were seen.
        acquisitions = rounds * len(sets)
        assert sum(attempts) <= 10 * acquisitions, attempts


class TestOneKeyLostMidHold:
    async def test_the_whole_lease_is_lost_its_block_cancelled_and_the_rest_removed(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """ "b" of ["a", "b", "c"] is deleted on every master while the block runs:
        the next automatic extension fails, the lease is lost as a whole (its block
        cancelled, LockLostError), and "a" and "c" are removed from the masters."""
        async with AsyncRedlock(servers.urls) as redlock, AsyncRedlock(servers.urls) as other:
            leases: list[Lease] = []
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError):
                async with redlock.lock(["a", "b", "c"], ttl=0.3) as lease:
                    leases.append(lease)
                    for client in masters.clients:
                        await client.delete("b")
                    await anyio.sleep_forever()  # cancelled by the loss
            assert leases[0].lost
            await redlock.settle()
            assert await masters.keys() == [[]] * 5
            assert redlock.statistics().held == 0
            taken = await other.lock(["a", "c"], timeout=0).acquire()  # free at once
            await taken.release()

    async def test_a_key_lost_on_a_minority_only_keeps_the_lease_and_excludes_others(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """ "b" deleted on 2 of 5 masters: the set still holds every key on a
        majority, its extensions go on, and nobody else can take "b" meanwhile."""
        async with AsyncRedlock(servers.urls) as redlock, AsyncRedlock(servers.urls) as other:
            async with redlock.lock(["a", "b"], ttl=0.3) as lease:
                for client in masters.clients[:2]:
                    await client.delete("b")
                with anyio.fail_after(HANG_GUARD):
                    while lease.statistics().extensions < 3:  # past its TTL
                        with pytest.raises(LockTimeoutError):
                            await other.lock("b", timeout=0).acquire()
                        with pytest.raises(LockTimeoutError):
                            await other.lock(["b", "c"], timeout=0).acquire()
                        await anyio.sleep(0.05)
                assert lease.held
            await redlock.settle()
            await other.settle()
            assert await masters.keys() == [[]] * 5


class TestCancellation:
    @pytest.mark.parametrize("steps", range(60))
    async def test_a_waiting_set_cancelled_after_any_number_of_steps_leaves_nothing(
        self, servers: ServerGroup, masters: Masters, steps: int
    ) -> None:
        """["a", "b"] waits for "b"; it is cancelled after ``steps`` turns of the
        loop (its first attempt, its enrolment, its retry, its wait). Then "b" is
        released and another set, cancelled after as many turns again, may or may
        not take the lock. Nothing of either is left on the masters or in the
        client's wake-up queues, and the lock can be taken at once."""
        async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as redlock:
            held = await holder.lock("b", ttl=60.0).acquire()
            task = asyncio.create_task(redlock.lock(["a", "b"], timeout=HANG_GUARD).acquire())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                lease = await task
                pytest.fail(f"acquired {lease} while b was held")
            await redlock.settle()
            assert await masters.keys() == [[b"b"]] * 5
            assert redlock._core.waker.queues == {}
            # the same once woken by the release (the wake-up, if any, goes nowhere)
            task = asyncio.create_task(redlock.lock(["a", "b"], timeout=HANG_GUARD).acquire())
            await held.release()
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            got: Lease | None = None
            with contextlib.suppress(asyncio.CancelledError):
                got = await task
            if got is not None:
                await got.release()
            await redlock.settle()
            await holder.settle()
            assert await masters.keys() == [[]] * 5
            assert redlock._core.waker.queues == {}
            listeners = [each for each in redlock._core.waker.listeners if each is not None]
            assert [each.channels for each in listeners] == [set()] * len(listeners)
            assert redlock.statistics().held == 0
            again = await holder.lock(["b", "a"], timeout=0).acquire()
            await again.release()


class TestMinorityRestarted:
    async def test_sets_stay_exclusive_and_fenced_across_a_minority_restarted_empty(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(5)
        direct = Masters(group.urls)
        try:
            async with AsyncRedlock(group.urls) as one, AsyncRedlock(group.urls) as two:
                lease = await one.lock(["a", "b"], ttl=0.5).acquire()
                await one.settle()  # on every master (acquire() returns at a quorum)
                assert lease.tokens is not None
                for server in list(group)[:2]:
                    server.restart()
                with anyio.fail_after(HANG_GUARD):
                    while lease.statistics().extensions < 3:  # past its TTL
                        for names in (["b", "c"], ["b"], ["c", "a"]):
                            with pytest.raises(LockTimeoutError):
                                await two.lock(names, timeout=0).acquire()
                        await anyio.sleep(0.05)
                assert lease.held
                await lease.release()
                after = await two.lock(["b", "c"], timeout=0).acquire()
                assert after.tokens is not None
                assert after.tokens["b"] > lease.tokens["b"]
                await after.release()
                single = await one.lock("a", timeout=0).acquire()
                assert single.token is not None
                assert single.token > lease.tokens["a"]
                await single.release()
                await one.settle()
                await two.settle()
                assert await direct.keys() == [[]] * 5
        finally:
            await direct.aclose()


class TestFencing:
    async def test_each_token_is_above_every_earlier_holder_of_its_resource(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Singles and sets of two clients in turn, with the counters of "b" skewed
        (a commit round for the set): each resource's tokens rise in holding order."""
        order = [["b"], ["a", "b"], ["b", "c"], ["c"], ["c", "a", "b"], ["a"], ["b"]]
        seen: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        async with AsyncRedlock(servers.urls) as one, AsyncRedlock(servers.urls) as two:
            for i, names in enumerate(order):
                if i == 3:
                    await masters.skew_fences("b")
                lease = await (one, two)[i % 2].lock(names, timeout=0).acquire()
                tokens = lease.tokens
                assert tokens is not None
                assert sorted(tokens) == sorted(names)
                for name, token in tokens.items():
                    seen[name].append(token)
                    committed = await masters.fences(name)
                    assert sum(count is not None and count >= token for count in committed) >= 3
                await lease.release()
        for name, tokens in seen.items():
            assert tokens == sorted(set(tokens)), (name, tokens)


class TestInspectAndStatistics:
    async def test_a_held_set_shows_per_resource_and_counts_once(
        self, servers: ServerGroup
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lock = redlock.lock(["a", "b"])
            async with lock as lease:
                for name in ("a", "b"):
                    state = await redlock.inspect(name)
                    assert [node.holder for node in state.nodes] == [lease.value] * 5
                    assert lease.tokens is not None
                    assert all(node.fence is not None for node in state.nodes)
                assert (await redlock.inspect("c")).nodes[0].holder is None
                with pytest.raises(TypeError):
                    await redlock.inspect(["a", "b"])  # type: ignore[arg-type]
                assert redlock.statistics().held == 1
            stats = lock.statistics()
            assert (stats.acquisitions, stats.attempts) == (1, 1)
            assert redlock.resource_statistics()["a, b"].acquisitions == 1


class TestClosing:
    async def test_closing_ends_a_held_set_and_a_waiting_one_leaving_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder:
            held = await holder.lock("c", ttl=60.0).acquire()
            await holder.settle()
            before, opened = set(library_tasks()), await connections(servers.urls)
            redlock = AsyncRedlock(servers.urls)
            outcomes: list[BaseException] = []
            entered = anyio.Event()
            try:
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def hold() -> None:
                            try:
                                async with redlock.lock(["a", "b"]):
                                    entered.set()
                                    await anyio.sleep_forever()
                            except LockLostError as exc:
                                outcomes.append(exc)

                        async def wait() -> None:
                            try:
                                await redlock.lock(["b", "c"], timeout=HANG_GUARD).acquire()
                            except RuntimeError as exc:
                                outcomes.append(exc)

                        tg.start_soon(hold)
                        await entered.wait()
                        waits = Waits(redlock)
                        tg.start_soon(wait)
                        await waits.reach(1)
                        await redlock.aclose()
            finally:
                await redlock.aclose()
            assert sorted(type(each).__name__ for each in outcomes) == [
                "LockLostError",
                "RuntimeError",
            ]
            assert set(library_tasks()) - before == set()
            assert await connections(servers.urls) == opened
            assert await masters.keys() == [[b"c"]] * 5
            assert redlock._core.waker.queues == {}
            assert redlock.statistics().held == 0
            await held.release()


class TestValidationBeforeIO:
    @pytest.mark.parametrize(
        ("make", "error", "match"),
        [
            (lambda r: r.lock(["a", "b"], fair=True), ValueError, "takes one resource"),
            (lambda r: r.lock(("a", "{a}:fence")), ValueError, "is reserved"),
            (lambda r: r.lock(["{b}:queue", "c"]), ValueError, "is reserved"),
            (lambda r: r.lock(["a", "b\0"]), ValueError, "NUL"),
            (lambda r: r.lock(["a", b"b"]), TypeError, "not bytes"),
            (lambda r: r.lock(iter(["a", "b"])), TypeError, "must be a str"),
            (lambda r: r.lock(()), ValueError, "at least one name"),
            (lambda r: r.rwlock(["a", "b"]), TypeError, "must be a str"),
            (lambda r: r.semaphore(["a", "b"], 2), TypeError, "must be a str"),
        ],
    )
    async def test_sets_the_other_kinds_refuse_are_refused_without_a_call(
        self, servers: ServerGroup, make: object, error: type[Exception], match: str
    ) -> None:
        """Not in test_multi's table: fair sets, reserved keys inside a set, a NUL,
        bytes, iterators, empty tuples, and sets given to rwlock() or semaphore()."""
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(error, match=match):
                make(redlock)  # type: ignore[operator]
            assert redlock.statistics().attempts == 0
            assert redlock.statistics().in_flight == 0
