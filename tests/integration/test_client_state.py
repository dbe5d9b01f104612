"""`asyncredlock.testing.client_state`: what one client keeps in this process."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerGroup, Waits, client_state, whole_retry_delay

pytestmark = pytest.mark.anyio


class TestClientState:
    """client_state(): what one client keeps in this process."""

    async def test_it_takes_an_asyncredlock_only(
        self,
    ) -> None:
        with pytest.raises(TypeError, match="takes an AsyncRedlock, not str"):
            client_state("redis://127.0.0.1")  # type: ignore[arg-type]

    async def test_a_lease_and_its_queued_task_show_then_leave(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            fresh = client_state(redlock)
            assert (fresh.held, fresh.slots, fresh.listening, fresh.addressed) == (0, {}, {}, 0)
            assert fresh.connections == (0,) * len(servers)  # opened on first use
            lease = await redlock.lock("shown").acquire()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_take_and_release, redlock)
                await anyio.wait_all_tasks_blocked()  # it waits behind the lease
                held = client_state(redlock)
                assert (held.held, held.slots) == (1, {"shown": 1})
                assert held.connections == (1,) * len(servers)
                await lease.release()  # passed to the queued task
            await redlock.settle()  # the masters the release did not wait for answer
            after = client_state(redlock)
            assert (after.held, after.slots, after.in_flight) == (0, {}, (0,) * len(servers))
            assert len(after.client) > 0


async def _take_and_release(redlock: AsyncRedlock) -> None:
    async with redlock.lock("shown"):
        pass


class TestWaits:
    """Waits: a test waits for a waiter to park, not for long enough."""

    async def test_waits_takes_asyncredlock_clients_only(
        self,
    ) -> None:
        with pytest.raises(TypeError, match="takes AsyncRedlock clients, not int"):
            Waits(1)  # type: ignore[arg-type]

    async def test_waits_sees_a_waiter_parked_and_woken(self, servers: ServerGroup) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=30) as other,
        ):
            lease = await holder.lock("parked").acquire()
            got: list[Lease] = []

            async def wait() -> None:
                got.append(await other.lock("parked", timeout=10).acquire())

            # no retry ends its wait first (it would come after 30 s): only the release
            with Waits(other) as waits, whole_retry_delay(other), anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await waits.reach(1)
                    assert (waits.waiting, waits.queued, got) == (1, 0, [])
                    await lease.release()
            assert waits.woken == 1
            assert len(got) == 1
            await got[0].release()
            assert client_state(other).slots == {}
