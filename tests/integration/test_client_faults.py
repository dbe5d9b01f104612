"""`asyncredlock.testing`'s faults inside a client: `whole_retry_delay`, `deafened`,
`hold_calls`, and `Waits.ahead` that tests of fairness use with them."""

from __future__ import annotations

import contextlib
import math

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError, RWLock
from asyncredlock.testing import (
    ServerGroup,
    Waits,
    deafened,
    hold_calls,
    whole_retry_delay,
)

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class TestBoundary:
    """The faults take an AsyncRedlock and a script the library has, and change
    nothing otherwise."""

    async def test_they_take_an_asyncredlock_and_a_known_script_only(
        self, servers: ServerGroup
    ) -> None:
        with pytest.raises(TypeError, match="AsyncRedlock, not str"), whole_retry_delay("x"):  # type: ignore[arg-type]
            pass
        with pytest.raises(TypeError, match="AsyncRedlock, not int"), deafened(1):  # type: ignore[arg-type]
            pass
        async with AsyncRedlock(servers.urls) as redlock:
            unknown = "no script 'comit'; the scripts are acquire, "
            with pytest.raises(ValueError, match=unknown), hold_calls(redlock, "comit"):
                pass
            async with redlock.lock("fine", timeout=0):  # nothing was changed
                pass


class TestFaults:
    """Each fault holds inside its block and is undone at its end."""

    async def test_whole_retry_delay_takes_the_jitter_out(self, servers: ServerGroup) -> None:
        """A waiter that hears no release retries every ``retry_delay`` until its
        deadline: at most 2 + timeout / retry_delay + 1 attempts (pauses drawn from
        [0, retry_delay], 0.1 s on average, would make about twice as many); at
        least the first one and the one right after it listens."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=0.2) as waiter,
        ):
            lease = await holder.lock("jitter").acquire()
            with whole_retry_delay(waiter), deafened(waiter), pytest.raises(LockTimeoutError):
                await waiter.lock("jitter", timeout=1.0).acquire()
            assert 2 <= waiter.statistics().attempts <= 2 + 5 + 1
            await lease.release()

    async def test_a_deafened_client_hears_no_release_until_the_block_ends(
        self,
        servers: ServerGroup,
    ) -> None:
        """Deafened, the waiter gets the lock by retrying (once the key handed to it
        expires, as nobody told it); afterwards it hears the release again."""
        async with (
            AsyncRedlock(servers.urls) as holder,
            AsyncRedlock(servers.urls, retry_delay=0.05) as deaf,
        ):
            for muted in (True, False):
                lease = await holder.lock("deaf").acquire()
                before = deaf.statistics().notifications
                fault = deafened(deaf) if muted else contextlib.nullcontext()
                with Waits(deaf) as waits, fault, anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_take, deaf, "deaf")
                        await waits.reach(1)
                        await lease.release()
                heard = deaf.statistics().notifications - before
                if muted:
                    assert (heard, waits.woken) == (0, 0)
                else:
                    assert heard >= 1

    async def test_hold_calls_holds_one_script_until_let_go(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            await masters.skew_fences("held")  # so that the commit round runs
            with hold_calls(redlock, "commit") as commits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    got: list[Lease] = []

                    async def acquire() -> None:
                        got.append(await redlock.lock("held").acquire())

                    tg.start_soon(acquire)
                    await commits.reached.wait()
                    assert got == []
                    assert commits.held >= 3  # the commits of a quorum at least, held
                    assert await masters.holding("held") >= 3  # the first phase won
                    held_back = commits.held
                    commits.let_go()
            assert len(got) == 1
            assert got[0].token is not None
            await redlock.settle()
            assert (await masters.fences("held")).count(got[0].token) >= 3  # committed
            await got[0].release()
            await masters.skew_fences("held")
            async with redlock.lock("held", timeout=0) as lease:  # not held any more
                assert lease.token is not None
            assert commits.held == held_back  # nothing held after the block


async def _take(redlock: AsyncRedlock, name: str) -> None:
    async with redlock.lock(name, timeout=HANG_GUARD):
        pass


class TestWaitsAhead:
    """Waits.ahead counts the attempts that keep a writer's place in the masters' queue."""

    async def test_waits_counts_the_attempts_that_keep_a_writers_place(
        self, servers: ServerGroup
    ) -> None:
        """``ahead``: every attempt of a fair writer; none of a writer without patience."""
        async with (
            AsyncRedlock(servers.urls) as readers,
            AsyncRedlock(servers.urls, retry_delay=0.05) as writers,
        ):
            for options, ahead in (({"fair": True}, True), ({"patience": math.inf}, False)):
                reading = await readers.rwlock("ahead", **options).read().acquire()
                with Waits(writers) as waits, anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_write, writers.rwlock("ahead", **options))
                        await waits.reach(2)
                        await reading.release()
                assert (waits.ahead >= 3) if ahead else (waits.ahead == 0)


async def _write(rw: RWLock) -> None:
    async with rw.write(timeout=HANG_GUARD):
        pass
