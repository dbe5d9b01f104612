"""``AsyncRedlock.run_singleton``: one job on one process at a time, taken over when
its holder dies or loses the lock."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockLostError
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from asyncredlock import AsyncRedlock

    async def lead(lease):
        print("leading", lease.token, flush=True)
        await asyncio.Event().wait()

    async def main():
        async with AsyncRedlock(sys.argv[1:], ttl=1.0, identity="child") as redlock:
            await redlock.run_singleton("scheduler", lead)

    asyncio.run(main())
    """
)


class TestOneAtATime:
    async def test_three_candidates_one_leader_at_a_time(self, servers: ServerGroup) -> None:
        leading: list[str] = []
        now_leading = 0
        candidates = [AsyncRedlock(servers.urls, identity=f"web-{i}") for i in range(3)]
        turns = [anyio.Event() for _ in range(3)]
        led = [anyio.Event() for _ in range(3)]

        async def run(i: int) -> str:
            async def job(lease: Lease) -> str:
                nonlocal now_leading
                now_leading += 1
                assert now_leading == 1  # never two leaders
                leading.append(candidates[i].identity)
                turn = len(leading) - 1
                led[turn].set()
                await turns[turn].wait()  # lead until the test says stop
                now_leading -= 1
                return candidates[i].identity

            return await candidates[i].run_singleton("scheduler", job)

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(run, i)
                for turn in range(3):
                    await led[turn].wait()
                    state = await candidates[0].inspect("scheduler")
                    assert state.identity == leading[turn]
                    turns[turn].set()  # this leader's job returns: the next takes over
        for candidate in candidates:
            await candidate.aclose()
        assert sorted(leading) == ["web-0", "web-1", "web-2"]

    async def test_a_lost_lease_cancels_the_job_and_it_runs_again(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        runs: list[int | None] = []
        cancelled = 0

        async def job(lease: Lease) -> int:
            nonlocal cancelled
            runs.append(lease.token)
            if len(runs) == 1:
                try:
                    await redlock.force_release("job")  # an operator frees it mid-run
                    await anyio.sleep_forever()
                except BaseException:
                    cancelled += 1
                    raise
            return len(runs)

        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                assert await redlock.run_singleton("job", job) == 2
            await redlock.settle()
        assert cancelled == 1
        first, second = runs
        assert first is not None
        assert second is not None
        assert second > first
        assert await masters.keys() == [[]] * 5

    async def test_cancelling_it_cancels_the_job_and_releases(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        started = anyio.Event()

        async def job(lease: Lease) -> None:
            started.set()
            await anyio.sleep_forever()

        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(redlock.run_singleton, "cancelled", job)
                    await started.wait()
                    tg.cancel_scope.cancel()
            await redlock.settle()
        assert await masters.keys() == [[]] * 5

    async def test_an_error_in_the_job_propagates_after_the_release(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        async def job(lease: Lease) -> None:
            raise KeyError("broken")

        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(KeyError, match="broken"):
                await redlock.run_singleton("broken", job)
            await redlock.settle()
        assert await masters.keys() == [[]] * 5

    async def test_the_jobs_own_lock_lost_error_propagates(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        runs = 0

        async def job(lease: Lease) -> None:
            nonlocal runs
            runs += 1
            async with redlock.lock("inner"):
                await redlock.force_release("inner")  # the job's own lock is lost
                await anyio.sleep_forever()

        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError) as caught:
                await redlock.run_singleton("outer", job)
            await redlock.settle()
        assert (caught.value.resource, runs) == ("inner", 1)  # not restarted
        assert await masters.keys() == [[]] * 5

    async def test_a_job_that_finished_is_not_run_again_when_the_release_finds_it_gone(
        self, servers: ServerGroup
    ) -> None:
        runs = 0
        async with AsyncRedlock(servers.urls) as redlock:

            async def job(lease: Lease) -> str:
                nonlocal runs
                runs += 1
                for client in Masters(servers.urls).clients:  # expired under it
                    await client.delete("gone")
                    await client.aclose()
                return "done"

            with anyio.fail_after(HANG_GUARD):
                assert await redlock.run_singleton("gone", job) == "done"
        assert runs == 1

    async def test_a_job_that_raised_is_not_run_again_when_the_release_finds_it_gone(
        self, servers: ServerGroup
    ) -> None:
        """The job raises, and its release finds the key gone (it expired under it):
        the job's error propagates, and the job is not run again (the release's
        LockLostError is not a loss to wait out)."""
        runs = 0
        async with AsyncRedlock(servers.urls) as redlock:

            async def job(lease: Lease) -> str:
                nonlocal runs
                runs += 1
                if runs > 1:
                    return "ran again"
                for client in Masters(servers.urls).clients:  # expired under it
                    await client.delete("raising")
                    await client.aclose()
                raise KeyError("broken")

            with anyio.fail_after(HANG_GUARD), pytest.raises(KeyError, match="broken"):
                await redlock.run_singleton("raising", job)
        assert runs == 1

    async def test_closing_the_client_cancels_the_job(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, "asyncredlock")
        started, cancelled = anyio.Event(), anyio.Event()

        async def job(lease: Lease) -> None:
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.set()
                raise

        redlock = AsyncRedlock(servers.urls)
        errors: list[BaseException] = []

        async def run() -> None:
            try:
                await redlock.run_singleton("closing", job)
            except RuntimeError as exc:
                errors.append(exc)

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await started.wait()
                await redlock.aclose()
        assert cancelled.is_set()
        assert [str(error) for error in errors] == ["this AsyncRedlock is closed"]
        # it never waits to lead again: its log does not say so
        assert not [r for r in caplog.records if "waiting to lead again" in r.getMessage()]

    async def test_its_own_name_from_inside_its_job_is_refused(self, servers: ServerGroup) -> None:
        """Leading again on its own name from the job (or a task the job started)
        would wait for itself forever, the job's lease extending itself: refused."""
        refused: list[str] = []

        async def inner(lease: Lease) -> None: ...

        async with AsyncRedlock(servers.urls) as redlock:

            async def job(lease: Lease) -> None:
                async with anyio.create_task_group() as tg:  # a task the job started

                    async def nested() -> None:
                        with pytest.raises(RuntimeError, match="wait for itself") as caught:
                            await redlock.run_singleton("self", inner)
                        refused.append(str(caught.value))

                    tg.start_soon(nested)
                # another name is led as usual
                await redlock.run_singleton("other", inner)

            with anyio.fail_after(HANG_GUARD):
                await redlock.run_singleton("self", job)
                await redlock.run_singleton("self", inner)  # led again once it ended
        assert len(refused) == 1

    async def test_bad_input_before_any_io(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])

        async def job(lease: Lease) -> None: ...

        def plain(lease: Lease) -> None: ...

        async def no_lease() -> None: ...

        with pytest.raises(TypeError, match="must be an async function"):
            await redlock.run_singleton("x", plain)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="taking the lease"):  # found out before it leads
            await redlock.run_singleton("x", no_lease)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^ttl must be > 0"):
            await redlock.run_singleton("x", job, ttl=-1)
        with pytest.raises(ValueError, match="must not be empty"):
            await redlock.run_singleton("", job)
        assert redlock.statistics().attempts == 0
        await redlock.aclose()


class TestTakeOver:
    async def test_a_killed_leader_is_taken_over_within_its_ttl(self, servers: ServerGroup) -> None:
        took_over = anyio.Event()

        async def job(lease: Lease) -> None:
            took_over.set()

        async with (
            AsyncRedlock(servers.urls) as redlock,
            await anyio.open_process(
                [sys.executable, "-c", CHILD, *servers.urls], stdout=subprocess.PIPE
            ) as child,
        ):
            try:
                assert child.stdout is not None
                with anyio.fail_after(HANG_GUARD):
                    assert (await child.stdout.receive()).startswith(b"leading")
                    assert (await redlock.inspect("scheduler")).identity == "child"
            finally:
                os.kill(child.pid, signal.SIGKILL)  # never left waiting forever
            assert await child.wait() == -signal.SIGKILL
            with anyio.fail_after(HANG_GUARD):
                # the dead leader's key expires (ttl 1 s) and this candidate takes over
                await redlock.run_singleton("scheduler", job)
        assert took_over.is_set()


# -- a loss while the job cleans up, and closing as the release finds the lock gone


class CleanupError(Exception):
    """What a job's cleanup raised while the loss cancelled it."""


async def test_a_job_whose_cleanup_raises_on_the_loss_runs_again(
    servers: ServerGroup, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease is lost while the job runs; the job's cleanup (a ``finally`` that
    fails, as closing a resource on cancellation may) raises instead of the
    cancellation. Before 76e3182 that came to ``async with`` as the block's
    exception: LockLostError from it, the job restarted ("lost its lock; waiting to
    lead again"). Now `_run_job` swallows it, the block ends normally, and
    run_singleton takes the loss for one found by the release: it logs "its lock was
    gone when released" and raises the cleanup's error; the job is not restarted,
    though docs/singleton.md says a leader that loses the lock starts the job anew."""
    runs = 0

    async def job(lease: Lease) -> int:
        nonlocal runs
        runs += 1
        if runs == 1:
            try:
                await redlock.force_release("cleanup-job")  # lost at once, mid-run
                await anyio.sleep_forever()
            finally:
                raise CleanupError("closing the job's resource failed")
        return runs

    caplog.set_level(logging.WARNING, "asyncredlock")
    async with AsyncRedlock(servers.urls) as redlock:
        with anyio.fail_after(HANG_GUARD):
            assert await redlock.run_singleton("cleanup-job", job) == 2
    assert "gone when released" not in caplog.text


async def test_a_job_that_returned_keeps_its_result_when_closing_meets_a_gone_lock(
    servers: ServerGroup,
) -> None:
    """The job ran to its end and returned; its release finds the lock gone (another
    process freed it) while the client begins to close. run_singleton checks
    ``closing`` before whether the job had ended (`_singleton.py`: the RuntimeError
    comes first), so the job's result is dropped for "this AsyncRedlock is closed",
    though no job was cancelled and docs/singleton.md says a job that returned has
    its result returned, also when the release finds the lock gone."""
    results: list[object] = []

    async with AsyncRedlock(servers.urls) as other:
        redlock = AsyncRedlock(servers.urls)
        await redlock.__aenter__()
        try:

            async def job(lease: Lease) -> str:
                await other.force_release("closing-job")  # gone on the masters
                loop = asyncio.get_running_loop()
                # aclose() starts while this job's release is out
                loop.call_soon(lambda: results.append(loop.create_task(redlock.aclose())))
                return "done"

            with anyio.fail_after(HANG_GUARD):
                outcome: object
                try:
                    outcome = await redlock.run_singleton("closing-job", job)
                except RuntimeError as exc:
                    outcome = exc
                await results[0]  # type: ignore[misc]
            assert outcome == "done"
        finally:
            await redlock.aclose()
