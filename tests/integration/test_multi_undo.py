"""Locks on several resources: wake-ups that no release caused.

A set listens on each of its resources' channels. The undo of its own failed
attempt, on a master that granted it, deletes its keys there and is announced
(``undo <value>``): heard back, it must not wake the set itself, nor ping-pong
between two sets of the same resources (each may wake the other once, until its
pause runs out: docs/algorithm.md, "Undos").
"""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a retry delay no test waits out
WAIT = 1.5  # the waiter's timeout: how long it is watched (not a threshold)


async def hold_b_on_a_bare_majority(holder: AsyncRedlock, masters: Masters) -> object:
    """Hold "b" for a minute, its key then gone on 2 of the 5 masters (as after a
    minority restarted empty): a set with "b" is granted there, refused on the 3
    others, and its failed attempt is undone on the 2."""
    held = await holder.lock("b", ttl=60.0, auto_extend=False).acquire()
    for client in masters.clients[:2]:
        await client.delete("b")
    return held


class TestOwnUndoWakesNobody:
    async def test_a_set_is_not_woken_by_the_undo_of_its_own_attempt(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Nothing is released while the set waits: every wake-up it gets is
        spurious, and, with a retry delay it never waits out, it attempts only
        twice (the first attempt and the one right after enrolling) and once
        more at its deadline (once more if the undo of its first attempt wakes it)."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            held = await hold_b_on_a_bare_majority(holder, masters)
            waits = Waits(waiter)
            lock = waiter.lock(["a", "b"], timeout=WAIT)
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockTimeoutError):
                await lock.acquire()
            attempts = lock.statistics().attempts
            woken = waits.woken
            await held.release()  # type: ignore[attr-defined]
        # at most one spurious wake-up: the undo of its first attempt, sent before it
        # enrolled, may be heard before that attempt counts as its own (a spin makes
        # thousands)
        assert woken <= 1, (woken, attempts)
        assert attempts <= 4, (woken, attempts)

    async def test_two_sets_of_two_clients_do_not_wake_each_other_without_end(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Two clients wait for ["a", "b"]; the undo of one's failed attempt is no
        release of anything the other waits for ("b" stays held): neither is woken
        by the other's undos over and over."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as one,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as two,
        ):
            held = await hold_b_on_a_bare_majority(holder, masters)
            waits = Waits(one, two)
            locks = [one.lock(["a", "b"], timeout=WAIT), two.lock(["a", "b"], timeout=WAIT)]

            async def take(index: int) -> None:
                with pytest.raises(LockTimeoutError):
                    await locks[index].acquire()

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(take, 0)
                    tg.start_soon(take, 1)
            attempts = [lock.statistics().attempts for lock in locks]
            woken = waits.woken
            await held.release()  # type: ignore[attr-defined]
        # each woken at most once by the other's undo (it might have been free to go)
        assert woken <= 2, (woken, attempts)
        assert max(attempts) <= 4, attempts

    async def test_a_set_does_not_spin_while_a_holder_that_won_on_a_bare_majority_holds(
        self, make_servers: MakeServers
    ) -> None:
        """The same without tampering with keys: "b" is taken while two of five
        masters are down; they come back (empty). The holder holds "b" on three
        masters for its whole lease, as any holder that won 3-2 does; a set
        waiting for "b" meanwhile must wait, not attempt over and over."""
        group = make_servers(5)
        async with AsyncRedlock(group.urls, node_timeout=0.5) as holder:
            group[0].stop()
            group[1].stop()
            held = await holder.lock("b", ttl=60.0).acquire()
            group[0].start()
            group[1].start()
            async with AsyncRedlock(group.urls, retry_delay=NEVER) as waiter:
                waits = Waits(waiter)
                lock = waiter.lock(["a", "b"], timeout=WAIT)
                with anyio.fail_after(HANG_GUARD), pytest.raises(LockTimeoutError):
                    await lock.acquire()
                attempts, woken = lock.statistics().attempts, waits.woken
            await held.release()
        # at most one spurious wake-up: the undo of its first attempt, sent before it
        # enrolled, may be heard before that attempt counts as its own (a spin makes
        # thousands)
        assert woken <= 1, (woken, attempts)
        assert attempts <= 4, (woken, attempts)


class TestAReleaseTheSetCannotUse:
    async def test_a_set_woken_by_the_release_of_one_key_does_not_spin(
        self, servers: ServerGroup
    ) -> None:
        """["a", "b"] waits; "a" is released while "b" stays held. The set is woken
        (once per master's copy at most), fails on "b", and waits again: a few
        attempts, not a loop."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            held_a = await holder.lock("a", ttl=60.0).acquire()
            held_b = await holder.lock("b", ttl=60.0).acquire()
            waits = Waits(waiter)
            lock = waiter.lock(["a", "b"], timeout=WAIT)
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        with pytest.raises(LockTimeoutError):
                            await lock.acquire()

                    tg.start_soon(take)
                    await waits.reach(1)
                    await held_a.release()
            attempts, woken = lock.statistics().attempts, waits.woken
            await held_b.release()
        assert woken <= 2, (woken, attempts)
        assert attempts <= 5, (woken, attempts)


class TestPassingOn:
    async def test_a_wake_up_is_passed_along_a_chain_of_sets_to_one_that_can_go(
        self, servers: ServerGroup
    ) -> None:
        """Three sets of one client wait on "a": ["a", "b"] (b held), ["a", "d"] (d
        held), then ["a", "c"] (c free). The release of "a" wakes the first; it
        passes the wake-up on, the second passes it on again, and the third takes
        the lock without waiting out a retry delay (here: never). Two hops, where
        test_multi shows one."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=NEVER) as waiter,
        ):
            held = [await holder.lock(name, ttl=60.0).acquire() for name in ("a", "b", "d")]
            waits = Waits(waiter)
            got: list[tuple[str, ...]] = []
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take(names: list[str]) -> None:
                        lease = await waiter.lock(names, timeout=NEVER).acquire()
                        got.append(lease.resources)
                        await lease.release()
                        tg.cancel_scope.cancel()

                    for i, names in enumerate((["a", "b"], ["a", "d"], ["a", "c"])):
                        tg.start_soon(take, names)
                        await waits.reach(i + 1)
                    await held[0].release()
            for lease in held[1:]:
                await lease.release()
        assert got == [("a", "c")]
