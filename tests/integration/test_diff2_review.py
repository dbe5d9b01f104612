"""Review of the day's changes (b3ff78d..main): `LostLeaseError` at a block's exit and
in `run_singleton`, the contrib helpers' `RequestLock.held()`, a read lock's repr, and
semaphore waiters woken by the undos of failed attempts while a holder keeps a quorum."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import anyio
import pytest

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LostLeaseError,
)
from asyncredlock._config import LockOptions
from asyncredlock._singleton import run_singleton
from asyncredlock.contrib._http import RequestLock, ShuttingDown
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, clients

pytestmark = pytest.mark.anyio

PATIENT = 120.0  # a retry delay no test waits out: only a wake-up moves a waiter


async def test_a_release_in_the_block_that_finds_the_loss_ends_it_with_lost_lease_error(
    servers: ServerGroup, masters: Masters
) -> None:
    """The block's own release() finds the lease gone: it raises `LostLeaseError` (a
    `LockNotOwnedError` and a `LockLostError`), and so does the block's exit, the
    release's error its cause."""
    async with AsyncRedlock(servers.urls) as redlock:
        lock = redlock.lock("diff2:release", ttl=10.0)
        with pytest.raises(LostLeaseError) as raised:
            async with lock as lease:
                await masters.delete_held(redlock, lease)
                await lease.release()
        assert isinstance(raised.value, LockNotOwnedError)
        assert "found by the block's own release() or extend()" in str(raised.value)
        cause = raised.value.__cause__
        assert isinstance(cause, LostLeaseError)
        assert cause is not raised.value
        assert lease.lost


async def test_a_caught_extend_loss_ends_the_block_as_the_loss_that_cancelled_it(
    servers: ServerGroup, masters: Masters
) -> None:
    """extend() found the loss, which cancelled the block (as every loss found by an
    extension does); the block caught its `LostLeaseError` and ended: the exit raises
    the plain `LockLostError` of a block cancelled by its loss (errors.md), not a
    `LostLeaseError` (kept for a loss the block was not cancelled for, or an
    extend() error left to end it)."""
    async with AsyncRedlock(servers.urls) as redlock:
        lock = redlock.lock("diff2:extend", ttl=10.0, auto_extend=False)
        with pytest.raises(LockLostError) as raised:
            async with lock as lease:
                await masters.delete_held(redlock, lease)
                with pytest.raises(LostLeaseError):
                    await lease.extend()
        assert lease.lost
        assert type(raised.value) is LockLostError


async def test_an_uncaught_extend_loss_ends_the_block_with_lost_lease_error(
    servers: ServerGroup, masters: Masters
) -> None:
    """The same loss found by extend(), left to end the block: `LostLeaseError`."""
    async with AsyncRedlock(servers.urls) as redlock:
        lock = redlock.lock("diff2:extend2", ttl=10.0, auto_extend=False)
        with pytest.raises(LostLeaseError) as raised:
            async with lock as lease:
                await masters.delete_held(redlock, lease)
                await lease.extend()
        assert isinstance(raised.value.__cause__, LostLeaseError)
        assert lease.lost


async def test_a_singleton_whose_job_finds_its_lease_lost_leads_again(
    servers: ServerGroup, masters: Masters
) -> None:
    """run_singleton catches `LockLostError`: a job whose own release() finds the
    lease gone (`LostLeaseError`) is a loss, as before the change (the job runs again),
    not the job's error."""
    runs: list[Lease] = []

    async with AsyncRedlock(servers.urls) as redlock:
        lock = redlock.lock("diff2:singleton", ttl=10.0)

        async def job(lease: Lease) -> str:
            runs.append(lease)
            if len(runs) == 1:
                await masters.delete_held(redlock, lease)
                await lease.release()
            return "done"

        with anyio.fail_after(30):
            assert await run_singleton(lock, job) == "done"
    assert len(runs) == 2
    assert runs[0].lost
    assert not runs[1].lost


async def test_a_singleton_job_raising_another_leases_loss_propagates_it(
    servers: ServerGroup, masters: Masters
) -> None:
    """A `LostLeaseError` of another lock's lease, raised by the job, is the job's
    error: it propagates once (the singleton's lease is not lost, not restarted)."""
    runs = 0
    async with AsyncRedlock(servers.urls) as redlock:
        other = redlock.lock("diff2:other", ttl=10.0)

        async def job(lease: Lease) -> None:
            nonlocal runs
            runs += 1
            inner = await other.acquire()
            await masters.delete_held(redlock, inner)
            await inner.release()

        with anyio.fail_after(30), pytest.raises(LostLeaseError) as raised:
            await run_singleton(redlock.lock("diff2:leader", ttl=10.0), job)
    assert raised.value.resource == "diff2:other"
    assert runs == 1


async def test_held_lets_a_lost_lease_cancel_the_body_and_raise_lock_lost_error(
    servers: ServerGroup,
) -> None:
    """contrib `RequestLock.held()`: a lease force-released while the body awaits
    cancels the body; the `LockLostError` comes out of the generator (503), not a
    `CancelledError` nor a `ShuttingDown`."""
    request_lock = RequestLock("diff2:req:{id}", LockOptions(ttl=10.0))
    reached: list[str] = []
    async with AsyncRedlock(servers.urls) as redlock:
        with anyio.fail_after(30), pytest.raises(LockLostError) as raised:
            async with request_lock.held(redlock, {"id": 7}) as lease:
                assert lease.resource == "diff2:req:7"
                reached.append("before")
                await redlock.force_release("diff2:req:7")  # the loss cancels the body
                await anyio.sleep(PATIENT)
                reached.append("after")
    assert reached == ["before"]
    assert not isinstance(raised.value, LostLeaseError)


async def test_held_answers_a_closing_redlock_with_shutting_down(servers: ServerGroup) -> None:
    """A request waiting in held() for a lock held elsewhere when its AsyncRedlock
    closes gets `ShuttingDown` (503), its cause the acquisition's `RuntimeError`."""
    request_lock = RequestLock("diff2:shut:{id}", LockOptions(ttl=10.0, timeout=PATIENT))
    async with AsyncExitStack() as stack:
        other = await stack.enter_async_context(AsyncRedlock(servers.urls))
        await stack.enter_async_context(other.lock("diff2:shut:1", ttl=10.0))
        redlock = AsyncRedlock(servers.urls, retry_delay=PATIENT)
        await redlock.__aenter__()
        errors: list[BaseException] = []

        async def request() -> None:
            try:
                async with request_lock.held(redlock, {"id": 1}):
                    pytest.fail("the lock was held elsewhere")
            except Exception as exc:
                errors.append(exc)

        with Waits(redlock) as waits:
            task = asyncio.ensure_future(request())
            with anyio.fail_after(30):
                await waits.reach(1)
        with anyio.fail_after(30):
            await redlock.aclose()
            await task
    assert len(errors) == 1
    assert isinstance(errors[0], ShuttingDown)
    assert isinstance(errors[0].__cause__, RuntimeError)
    assert errors[0].resource == "diff2:shut:1"


async def test_a_read_locks_repr_says_shared(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        rw = redlock.rwlock("diff2:rw")
        assert " shared " in repr(rw.read())
        assert "shared" not in repr(rw.write())
        assert "shared" not in repr(redlock.lock("diff2:plain"))


async def test_semaphore_waiters_do_not_wake_each_other_while_a_holder_keeps_a_quorum(
    make_servers: MakeServers,
) -> None:
    """A holder keeps slot 0 on masters 0-2 (a bare quorum of 5); masters 3 and 4 lost
    its key, so they grant every waiter's attempt, which fails and is undone there.
    algorithm.md: "A holder keeping a quorum never lets this wake anyone"; a waiter
    heeds an undo once until its pause (here the holder's TTL) runs out. Before
    e1de930 each of 5 waiters made 3 attempts in 3 s and none was woken; after it,
    until the backoff's end stopped counting as its pause's, each was woken by the
    others' undos again and again (about 14 attempts each)."""
    group = make_servers(5)
    name, n = "diff2:sem", 5
    direct = Masters(group.urls)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(direct.aclose)
        holder = await stack.enter_async_context(AsyncRedlock(group.urls))
        held = await holder.semaphore(name, 1, ttl=60.0, timeout=0).acquire()
        key = f"{{{name}}}:sem:0"
        await holder.settle()  # acquire() returned at a quorum: its last SETs landed
        assert await direct.holding(key) == 5
        for client in direct.clients[3:]:
            assert await client.delete(key) == 1
        waiters = await stack.enter_async_context(clients(group.urls, n, retry_delay=PATIENT))
        sems = [each.semaphore(name, 1, ttl=60.0, timeout=3.0) for each in waiters]
        with Waits(*waiters) as waits:
            results = await asyncio.gather(*(s.acquire() for s in sems), return_exceptions=True)
        assert all(isinstance(each, Exception) for each in results)
        assert held.held
        attempts = [s.statistics().attempts for s in sems]
        assert waits.woken <= n, (waits.woken, attempts)
        assert max(attempts) <= 6, attempts
        await held.release()
