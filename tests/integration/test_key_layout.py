"""Distinct names never share a key: a name and the same name as a hash tag (``a``,
``{a}``), a lock and a semaphore's slot, a name shaped like an auxiliary key."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock._keys import readers_key
from asyncredlock.testing import ServerGroup, Waits

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


async def test_a_release_of_a_never_hands_over_braced_a(
    servers: ServerGroup, masters: Masters
) -> None:
    """Y holds ``a``, X holds ``{a}``, a task of Z queues for ``{a}`` (fair). When
    Y releases ``a``, the key ``a`` goes to nobody: with one queue for both names,
    it went to Z's waiter, which then returned a lease on ``{a}`` while X held it."""
    async with (
        AsyncRedlock(servers.urls) as x,
        AsyncRedlock(servers.urls) as y,
        AsyncRedlock(servers.urls) as z,
    ):
        held_a = await y.lock("a", ttl=30).acquire()
        held_braced = await x.lock("{a}", ttl=30).acquire()
        probe = Waits(z)
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    with pytest.raises(LockTimeoutError):
                        await z.lock("{a}", timeout=1.0, fair=True).acquire()

                tg.start_soon(wait)
                await probe.reach(1)  # Z queued for {a} on the masters
                await held_a.release()
                # each master holds Y's value still (not reached yet) or nothing
                values = [await client.get("a") for client in masters.clients]
                assert set(values) <= {None, held_a.value.encode()}
        assert not held_braced.lost
        await held_braced.release()


async def test_force_release_of_a_leaves_the_readers_of_braced_a(
    servers: ServerGroup, masters: Masters
) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        reader = await redlock.rwlock("{a}").read().acquire()
        await redlock.force_release("a")  # an operator frees the other resource
        await redlock.settle()  # the reader's calls beyond the quorum have answered too
        assert await masters.holding(readers_key("{a}")) == len(masters)
        with pytest.raises(LockTimeoutError):
            await redlock.rwlock("{a}").write(timeout=0).acquire()
        await reader.release()


async def test_semaphores_s_and_braced_s_have_their_own_slots(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        one = await redlock.semaphore("s", 1).acquire()
        other = await redlock.semaphore("{s}", 1, timeout=0).acquire()
        await other.release()
        await one.release()


@pytest.mark.parametrize("name", ["{a}:fence", "{a}:queue", "{s}:sem:0", "{x}:readers"])
async def test_a_name_that_is_an_auxiliary_key_is_refused(
    servers: ServerGroup, masters: Masters, name: str
) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        with pytest.raises(ValueError, match="is reserved"):
            redlock.lock(name)
        with pytest.raises(ValueError, match="is reserved"):
            redlock.rwlock(name)
        with pytest.raises(ValueError, match="is reserved"):
            redlock.semaphore(name, 2)
        with pytest.raises(ValueError, match="is reserved"):
            await redlock.inspect(name)
        with pytest.raises(ValueError, match="is reserved"):
            await redlock.force_release(name)
        assert redlock.statistics().attempts == 0
    assert await masters.keys() == [[] for _ in masters.urls]
