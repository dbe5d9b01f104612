"""Mutual exclusion, leases, extension, loss and release against real servers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import socket
import weakref
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    LostLeaseError,
    QuorumUnavailableError,
)
from asyncredlock._keeping import Keeping
from asyncredlock.testing import FaultProxy, ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class TestMutualExclusion:
    @pytest.mark.parametrize("n", [1, 3, 5])
    async def test_no_increment_is_lost(self, servers: ServerGroup, n: int) -> None:
        counter = Redis.from_url(servers.urls[0])
        inside = 0
        overlaps = 0

        async def worker(redlock: AsyncRedlock) -> None:
            nonlocal inside, overlaps
            async with redlock.lock("counter-lock", timeout=math.inf):
                inside += 1
                overlaps += inside > 1
                value = int(await counter.get("counter") or 0)
                await anyio.sleep(0.001)  # the work between read and write
                await counter.set("counter", value + 1)
                inside -= 1

        async with (
            AsyncRedlock(servers.urls[:n], retry_delay=0.02) as redlock,
            anyio.create_task_group() as tg,
        ):
            for _ in range(50):
                tg.start_soon(worker, redlock)
        assert int(await counter.get("counter")) == 50
        assert overlaps == 0
        await counter.aclose()

    async def test_second_holder_waits_for_the_first(self, masters: Masters) -> None:
        async with (
            AsyncRedlock(masters.given) as first,
            AsyncRedlock(masters.given) as second,
        ):
            lease = await first.lock("res").acquire()
            # acquire() returns at quorum: the last master's call may still be out (on
            # cluster masters, not even sent), and the second client's could overtake it
            await first.settle()
            with pytest.raises(LockTimeoutError) as caught:
                await second.lock("res", timeout=0).acquire()
            assert caught.value.resource == "res"
            assert len(caught.value.outcomes) == len(masters)
            outcomes = caught.value.outcomes
            assert not any(o.ok for o in outcomes)
            # the round stops once enough refusals make a quorum impossible
            refusals = len(masters) - second.quorum + 1
            assert sum("held by another" in o.detail for o in outcomes) >= refusals
            await lease.release()
            again = await second.lock("res", timeout=0).acquire()
            await again.release()

    async def test_200_concurrent_lockers_on_one_redlock(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:

            async def cycle(i: int) -> None:
                lease = await redlock.lock(f"many:{i}", auto_extend=False).acquire()
                await lease.release()

            async with anyio.create_task_group() as tg:
                for i in range(250):
                    tg.start_soon(cycle, i)
            stats = redlock.statistics()
        assert stats.acquisitions == 250
        assert stats.releases == 250


class TestLease:
    async def test_lease_reports_token_validity_and_state(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given, ttl=5.0) as redlock:
            lease = await redlock.lock("state").acquire()
            assert isinstance(lease.token, int)
            assert 0 < lease.validity <= 5.0
            assert lease.held
            assert not lease.lost
            await lease.release()
            assert lease.validity == 0
            assert not lease.held
            assert not lease.lost

    async def test_auto_extension_keeps_a_short_lock_through_long_work(
        self, masters: Masters
    ) -> None:
        order: list[str] = []
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=0.05) as other,
        ):

            async def wait_for_it() -> None:
                async with other.lock("long", timeout=30):
                    order.append("other acquired")

            async with anyio.create_task_group() as tg:
                async with holder.lock("long", ttl=1.0) as lease:
                    with pytest.raises(LockTimeoutError):
                        await other.lock("long", timeout=0).acquire()
                    tg.start_soon(wait_for_it)
                    await anyio.sleep(3.0)  # the work: three TTLs long
                    assert lease.held
                    assert await masters.holding("long") == len(masters)
                    order.append("holder done")
                order.append("holder released")
            stats = holder.statistics()
        # The other acquires only after the holder's work; it may do so before the
        # holder's release() returns (the masters may hand it the key first).
        assert order[0] == "holder done"
        assert sorted(order[1:]) == ["holder released", "other acquired"]
        assert stats.extensions >= 6
        assert stats.lost == 0

    async def test_deleting_the_key_on_a_majority_cancels_the_block(self, masters: Masters) -> None:
        body_finished = False
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given) as other,
        ):
            with pytest.raises(LockLostError) as caught, anyio.fail_after(HANG_GUARD):
                async with holder.lock("lost", ttl=0.6):
                    await holder.settle()  # every master has the key: none sets it later
                    for client in masters.clients[: holder.quorum]:
                        await client.delete("lost")
                    await anyio.sleep_forever()
                    body_finished = True
            assert caught.value.resource == "lost"
            assert holder.statistics().lost == 1
            lease = await other.lock("lost", timeout=5).acquire()
            await lease.release()
        assert not body_finished

    async def test_explicit_lease_exposes_loss(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.lock("explicit", ttl=0.6).acquire()
            for client in masters.clients:
                await client.delete("explicit")
            assert await lease.wait_lost() is True
            assert lease.lost
            assert lease.validity == 0
            with pytest.raises(LostLeaseError):  # a LockNotOwnedError, and a loss
                await lease.release()

    async def test_loss_callbacks_run_on_loss_only(self, servers: ServerGroup) -> None:
        """A leader loop outside the block learns of the loss by a callback."""
        async with AsyncRedlock(servers.urls) as redlock:
            called: list[tuple[str, bool]] = []
            heard = anyio.Event()

            def stop(which: str) -> Callable[[Lease], None]:
                def callback(lease: Lease) -> None:
                    called.append((which, lease.lost))
                    heard.set()

                return callback

            lease = await redlock.lock("leader", ttl=30).acquire()
            removed = stop("removed")
            lease.add_lost_callback(stop("kept"))
            lease.add_lost_callback(removed)
            lease.add_lost_callback(removed)
            assert lease.remove_lost_callback(removed) == 2
            assert called == []  # held: nothing yet
            await redlock.force_release("leader")
            with anyio.fail_after(HANG_GUARD):
                await heard.wait()
            assert called == [("kept", True)]
            heard = anyio.Event()
            lease.add_lost_callback(stop("late"))  # lost already: called soon
            with anyio.fail_after(HANG_GUARD):
                await heard.wait()
            assert called == [("kept", True), ("late", True)]

            async def coroutine_function(lease: Lease) -> None: ...

            with pytest.raises(TypeError, match="plain function"):
                lease.add_lost_callback(coroutine_function)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="plain function"):
                lease.add_lost_callback("stop")  # type: ignore[arg-type]

            released = await redlock.lock("leader").acquire()
            released.add_lost_callback(stop("released"))
            await released.release()
            released.add_lost_callback(stop("after release"))
            await redlock.settle()
            await anyio.wait_all_tasks_blocked()  # a callback scheduled would have run
            assert [which for which, _ in called] == ["kept", "late"]

    async def test_a_released_lease_is_freed_without_the_cycle_collector(
        self, servers: ServerGroup
    ) -> None:
        """Thousands of leases a second: each must go with its last reference, not
        wait for the cyclic garbage collector (a cycle once cost 40% of throughput)."""
        async with AsyncRedlock(servers.urls) as redlock:
            gc.collect()
            gc.disable()
            try:
                lease = await redlock.lock("freed").acquire()
                lease.add_lost_callback(print)
                ref = weakref.ref(lease)
                await lease.release()
                await redlock.settle()
                del lease
                assert ref() is None
            finally:
                gc.enable()

    async def test_closing_the_client_ends_a_held_lease_lost(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """No block runs on, unprotected, after its client gave the lock up."""
        redlock = AsyncRedlock(servers.urls)
        inside, cancelled, called = anyio.Event(), anyio.Event(), anyio.Event()
        explicit = await redlock.lock("explicit").acquire()
        explicit.add_lost_callback(lambda lease: called.set())

        async def block() -> None:
            with pytest.raises(LockLostError):
                async with redlock.lock("block"):
                    inside.set()
                    try:
                        await anyio.sleep_forever()
                    except anyio.get_cancelled_exc_class():
                        cancelled.set()
                        raise

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(block)
                await inside.wait()
                await redlock.aclose()
            await called.wait()
        assert cancelled.is_set()
        assert await explicit.wait_lost() is True
        assert await masters.keys() == [[]] * 5  # released on the masters all the same

    async def test_release_of_a_lease_another_holder_owns(self, masters: Masters) -> None:
        async with (
            AsyncRedlock(masters.given) as first,
            AsyncRedlock(masters.given) as second,
        ):
            stale = await first.lock("owned", auto_extend=False).acquire()
            assert await first.force_release("owned") == len(masters)
            fresh = await second.lock("owned", timeout=0).acquire()
            with pytest.raises(LockNotOwnedError) as caught:
                await stale.extend()
            assert caught.value.resource == "owned"
            with pytest.raises(LockNotOwnedError):
                await stale.release()
            await second.settle()  # the masters beyond the quorum have answered too
            values = [await client.get("owned") for client in masters.clients]
            assert values == [fresh.value.encode()] * len(masters)
            await fresh.release()

    async def test_release_twice_raises_not_owned(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.lock("twice").acquire()
            await lease.release()
            assert await lease.wait_lost() is False
            with pytest.raises(LockNotOwnedError, match="already released") as caught:
                await lease.release()
            assert not isinstance(caught.value, LockLostError)  # the caller's bug, no loss
            with pytest.raises(LockNotOwnedError, match="already released") as caught:
                await lease.extend()
            assert not isinstance(caught.value, LockLostError)

    @pytest.mark.parametrize("call", ["release", "extend"])
    async def test_a_lease_gone_behind_its_back_raises_a_loss(
        self, masters: Masters, call: str
    ) -> None:
        """Its release or extension finds it gone from a majority: the lease is lost,
        and the error says so (a `LockLostError`) while staying a `LockNotOwnedError`."""
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.lock("gone", auto_extend=False).acquire()
            await masters.delete_held(redlock, lease)
            with pytest.raises(LostLeaseError, match="no longer held") as caught:
                await getattr(lease, call)()
            assert isinstance(caught.value, LockLostError)
            assert isinstance(caught.value, LockNotOwnedError)
            assert lease.lost
            assert [o.detail for o in caught.value.outcomes].count("not held by this lease") >= 3

    @pytest.mark.parametrize("caught", [False, True])
    async def test_a_block_whose_own_release_found_the_loss_raises_a_lost_lease(
        self, masters: Masters, caught: bool
    ) -> None:
        """A block's lease gone behind its back, found so by the block's own
        ``release()``: the block was not cancelled, so its exit raises `LostLeaseError`
        (a `LockLostError`, as documented), not the plain `LockLostError` of a block
        cancelled by the loss; the call's error is its cause, unless the block caught
        that error."""
        async with AsyncRedlock(masters.given) as redlock:
            with pytest.raises(LockLostError) as ended:
                async with redlock.lock("gone-in-block") as lease:
                    await masters.delete_held(redlock, lease)
                    try:
                        await lease.release()
                    except LostLeaseError:
                        if not caught:
                            raise
        assert type(ended.value) is LostLeaseError
        assert "found by the block's own release() or extend()" in str(ended.value)
        cause = ended.value.__cause__
        assert (type(cause), lease.lost) == (type(None) if caught else LostLeaseError, True)

    @pytest.mark.parametrize("raised", [False, True])
    async def test_a_block_whose_exits_release_found_the_loss_raises_a_lost_lease(
        self, masters: Masters, raised: bool
    ) -> None:
        """A block's lease gone from every master behind its back, the block ending
        without a call of its own: the release at its exit finds the loss, and nothing
        was cancelled, so the exit raises `LostLeaseError` (a `LockLostError`), its
        message saying who found it; an error the block raised is its cause."""
        async with AsyncRedlock(masters.given) as redlock:
            with pytest.raises(LockLostError) as ended:
                async with redlock.lock("gone-at-exit", auto_extend=False) as lease:
                    await masters.delete_held(redlock, lease)
                    if raised:
                        raise KeyError("the block's own")
        assert type(ended.value) is LostLeaseError
        assert isinstance(ended.value, LockLostError)
        assert "or by the release at its exit" in str(ended.value)
        cause = ended.value.__cause__
        assert (type(cause), lease.lost) == (KeyError if raised else type(None), True)
        assert await masters.keys() == [[]] * len(masters)

    async def test_explicit_extend_resets_the_ttl(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given) as redlock:
            lease = await redlock.lock("ext", ttl=1.0, auto_extend=False).acquire()
            await lease.extend(ttl=30.0)
            assert lease.validity > 1.0
            await redlock.settle()
            pttls = [await client.pttl("ext") for client in masters.clients]
            assert all(pttl > 1000 for pttl in pttls)
            await lease.release()
            await redlock.settle()  # release returns at quorum; the rest follow
            assert await masters.holding("ext") == 0


class TestExtensionAndLoss:
    async def test_a_shorter_ttl_given_to_extend_moves_the_next_automatic_extension(
        self, masters: Masters
    ) -> None:
        """The next automatic extension comes a third of the new TTL on, not of the
        old one: the keys would otherwise expire at the new TTL while the block ran."""
        async with (
            AsyncRedlock(masters.given) as holder,
            AsyncRedlock(masters.given, retry_delay=0.05) as other,
        ):
            with anyio.fail_after(HANG_GUARD):
                async with holder.lock("shorter", ttl=60.0) as lease:
                    await lease.extend(ttl=1.0)
                    with pytest.raises(LockTimeoutError):  # several of the new TTLs
                        await other.lock("shorter", timeout=3.0).acquire()
                    assert lease.held
                assert lease.statistics().extensions >= 3  # 1 by hand, then every 1/3 s

    async def test_an_automatic_extension_never_keeps_a_lease_past_its_validity(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Three masters of five stop answering the holder, not the other client: the
        holder's extension round gives up on them at the end of the validity (its
        node_timeout is longer), so the lease is lost before the keys expire there
        and the other client takes the lock. (A large drift allowance leaves the lease
        room to end before its keys.)"""
        async with AsyncExitStack() as stack:
            proxies, urls = await _three_behind_proxies(stack, servers, masters)
            holder = await stack.enter_async_context(
                AsyncRedlock(urls, node_timeout=2.0, drift_factor=0.2)
            )
            other = await stack.enter_async_context(AsyncRedlock(masters.urls, retry_delay=0.05))
            with anyio.fail_after(HANG_GUARD):
                lease = await holder.lock("late", ttl=1.0).acquire()
                await holder.settle()  # the key is on every master
                for proxy in proxies:
                    proxy.blackhole = True
                taken = await other.lock("late", ttl=10.0, timeout=10.0).acquire()
                held_meanwhile = lease.held
                for proxy in proxies:
                    proxy.heal()
                await taken.release()
            assert not held_meanwhile
            assert lease.lost

    async def test_a_failed_extension_to_a_shorter_ttl_counts_on_no_more_than_it(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """An extension to a shorter TTL whose replies come too late (the masters set
        the shorter TTL, the round fails): the validity is no longer the old TTL's,
        which the keys no longer have."""
        async with AsyncExitStack() as stack:
            proxies, urls = await _three_behind_proxies(stack, servers, masters)
            redlock = await stack.enter_async_context(
                AsyncRedlock(urls, node_timeout=0.1, socket_timeout=0.5)
            )
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("shortened", ttl=60.0, auto_extend=False).acquire()
                await redlock.settle()
                for proxy in proxies:
                    proxy.delay = 0.4  # a round trip of 0.8 s, past the round's 0.5 s
                with pytest.raises(QuorumUnavailableError):
                    await lease.extend(ttl=2.0)
            assert lease.held
            assert lease.validity <= 2.0

    async def test_an_extension_that_crashes_ends_the_lease_lost(
        self, masters: Masters, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An automatic extension that raises (a bug: here its round is replaced by
        one that fails) does not leave the lease held and unextended, its block
        running while the keys expire: the lease ends lost and its block is
        cancelled."""

        async def broken(self: object, ttl: float, **options: object) -> None:
            raise ZeroDivisionError("a bug")

        async with AsyncRedlock(masters.given) as redlock:
            monkeypatch.setattr(Keeping, "_extend_round", broken)
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError):
                async with redlock.lock("crashing", ttl=0.3) as lease:
                    await lease.wait_lost()
            assert lease.lost

    async def test_the_blocks_exception_shows_when_the_loss_cancels_its_cleanup(
        self, masters: Masters
    ) -> None:
        """The block raised, and the loss came while its ``finally`` awaited: the
        block's exception is in the `LockLostError`'s chain (it was hidden)."""
        async with AsyncRedlock(masters.given) as redlock:
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError) as caught:
                async with redlock.lock("cause"):
                    try:
                        raise ValueError("the block failed")
                    finally:  # its cleanup awaits; the lease is lost meanwhile
                        await redlock.force_release("cause")
                        await asyncio.sleep(0)
            assert ValueError in _chain(caught.value)
            assert not caught.value.__suppress_context__

    async def test_an_exception_the_block_handled_is_not_the_cause(self, masters: Masters) -> None:
        """The block handles an exception it expects and awaits in its ``except``; the
        loss cancels that await. The handled exception never left the block: it is
        not the cause of the `LockLostError` (only in its chain)."""
        async with AsyncRedlock(masters.given) as redlock:
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError) as caught:
                async with redlock.lock("handled"):
                    try:
                        {}["missing"]
                    except KeyError:  # a cache miss: fetch instead
                        await redlock.force_release("handled")
                        await asyncio.sleep(0)
            assert caught.value.__cause__ is None
            assert KeyError in _chain(caught.value)

    async def test_a_failed_extension_to_a_shorter_ttl_ends_the_block_in_time(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """``extend(ttl=2)`` reaches every master, its replies too late: the validity
        is capped at about 2 s, and the automatic extension comes by that validity
        (not 20 s on, a third of the old TTL): the block runs no longer than its
        lease is valid, whether that extension keeps it or not."""
        async with AsyncExitStack() as stack:
            proxies, urls = await _three_behind_proxies(stack, servers, masters)
            holder = await stack.enter_async_context(
                AsyncRedlock(urls, node_timeout=0.1, socket_timeout=0.5)
            )
            other = await stack.enter_async_context(AsyncRedlock(masters.urls, retry_delay=0.05))
            held_while_taken: bool | None = None
            with anyio.fail_after(HANG_GUARD), contextlib.suppress(LockLostError):
                async with holder.lock("capped", ttl=60.0) as lease:
                    await holder.settle()
                    for proxy in proxies:
                        proxy.delay = 0.4  # a round trip of 0.8 s, past the round's 0.5 s
                    with pytest.raises(QuorumUnavailableError):
                        await lease.extend(ttl=2.0)
                    for proxy in proxies:
                        proxy.delay = 0.0
                    try:
                        taken = await other.lock("capped", timeout=5.0).acquire()
                    except LockTimeoutError:  # the automatic extension kept it
                        taken = None
                    else:
                        held_while_taken = lease.held
                        await taken.release()
            assert not held_while_taken


async def _three_behind_proxies(
    stack: AsyncExitStack, servers: ServerGroup, masters: Masters
) -> tuple[list[FaultProxy], list[str]]:
    """A proxy in front of each of the first three masters (closed with ``stack``):
    the proxies, and the five masters' URLs, those three through their proxy."""
    proxies = [
        await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
        for server in list(servers)[:3]
    ]
    return proxies, [proxy.url for proxy in proxies] + masters.urls[3:]


def _chain(error: BaseException) -> list[type[BaseException]]:
    """The types of ``error`` and of the exceptions it was raised during."""
    found: list[type[BaseException]] = []
    seen: BaseException | None = error
    while seen is not None and len(found) < 10:
        found.append(type(seen))
        seen = seen.__cause__ or seen.__context__
    return found


class TestHolderIdentity:
    """Who holds a lock can be read off the masters, without changing the key."""

    async def test_inspect_names_the_holder_on_a_quorum(self, masters: Masters) -> None:
        async with AsyncRedlock(masters.given, identity="web-3") as redlock:
            async with redlock.lock("named") as lease:
                state = await redlock.inspect("named")
                named = [node.identity for node in state.nodes].count("web-3")
                assert named >= redlock.quorum
                assert state.identity == "web-3"
                # the key holds a plain string value, as for any Redlock client
                assert await masters.clients[0].get("named") == lease.value.encode()
            await redlock.settle()
            state = await redlock.inspect("named")
            assert state.identity is None
            assert all(node.identity is None for node in state.nodes)

    async def test_the_process_is_the_holder_by_default(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock, redlock.lock("mine"):
            state = await redlock.inspect("mine")
        assert state.identity == f"{socket.gethostname()}:{os.getpid()}"

    async def test_readers_and_fenced_writers_carry_it_too(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls, identity="reports") as redlock:
            rw = redlock.rwlock("doc")
            async with rw.read() as reader:
                assert reader.value.startswith("reports:")
                state = await redlock.inspect("doc")
                assert any(value == reader.value for value, _ in state.nodes[0].readers)
            async with rw.write() as writer:
                assert writer.token is not None
                assert (await redlock.inspect("doc")).identity == "reports"

    async def test_a_value_another_client_wrote_has_no_identity(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        for client in masters.clients:
            await client.set("foreign", "5f2c9a0e", px=30_000)
        async with AsyncRedlock(servers.urls) as redlock:
            state = await redlock.inspect("foreign")
        assert (state.holder, state.identity) == ("5f2c9a0e", None)

    async def test_a_value_that_is_not_text_is_shown_escaped(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """The reference Redlock client holds the key with 20 random bytes: inspect()
        shows such a value with its bytes escaped, and raises nothing."""
        for client in masters.clients:
            await client.set("binary", b"\xff\xfe\x00random", px=30_000)
        async with AsyncRedlock(servers.urls) as redlock:
            state = await redlock.inspect("binary")
        assert all(node.error is None for node in state.nodes)
        assert (state.holder, state.identity) == ("\\xff\\xfe\x00random", None)
