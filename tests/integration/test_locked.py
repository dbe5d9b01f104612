"""``AsyncRedlock.locked``: a coroutine function whose calls run holding a lock named
from their arguments."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, LockLostError, LockTimeoutError
from asyncredlock.testing import ServerGroup, Waits

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


@dataclasses.dataclass
class User:
    id: int


class TestSerializing:
    async def test_calls_with_the_same_name_run_one_at_a_time(self, servers: ServerGroup) -> None:
        entered: list[int] = []
        first_inside = anyio.Event()
        first_may_leave = anyio.Event()
        async with (
            AsyncRedlock(servers.urls) as one,
            AsyncRedlock(servers.urls) as other,  # as another process would
        ):

            @one.locked("jobs:{job_id}")
            async def run_first(job_id: int) -> str:
                entered.append(1)
                first_inside.set()
                await first_may_leave.wait()
                return f"first {job_id}"

            @other.locked("jobs:{job_id}")
            async def run_second(job_id: int) -> str:
                entered.append(2)
                return f"second {job_id}"

            results: dict[str, str] = {}

            async def call(label: str, function: Any) -> None:
                results[label] = await function(7)

            with Waits(other) as waits, anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call, "first", run_first)
                    await first_inside.wait()
                    tg.start_soon(call, "second", run_second)
                    await waits.reach(1)  # the second call failed an attempt: it waits
                    assert entered == [1]
                    first_may_leave.set()
        assert entered == [1, 2]
        assert results == {"first": "first 7", "second": "second 7"}

    async def test_calls_with_different_names_run_together(self, servers: ServerGroup) -> None:
        inside = {1: anyio.Event(), 2: anyio.Event()}
        async with AsyncRedlock(servers.urls) as redlock:

            @redlock.locked("jobs:{job_id}", timeout=0)
            async def run(job_id: int) -> None:
                inside[job_id].set()
                await inside[3 - job_id].wait()  # returns only once the other is inside too

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run, 1)
                    tg.start_soon(run, 2)

    async def test_the_name_is_filled_by_parameter_name_defaults_included(
        self, servers: ServerGroup
    ) -> None:
        names: list[str | None] = []
        async with AsyncRedlock(servers.urls, identity="filler") as redlock:

            @redlock.locked("report:{user.id}:{kind}:{extra[0]}")
            async def report(user: User, *extra: str, kind: str = "daily") -> int:
                names.append(
                    (await redlock.inspect(f"report:{user.id}:{kind}:{extra[0]}")).identity
                )
                return user.id

            assert await report(User(4), "a", "b") == 4
            assert await report(User(5), "z", kind="weekly") == 5
        assert names == ["filler", "filler"]

    async def test_wraps_the_function(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])

        @redlock.locked("jobs:{job_id}")
        async def run_job(job_id: int) -> None:
            """Run one job."""

        assert (run_job.__name__, run_job.__doc__) == ("run_job", "Run one job.")
        await redlock.aclose()

    async def test_contended_past_the_timeout_raises_lock_timeout(
        self, servers: ServerGroup
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:

            @redlock.locked("busy", timeout=0)
            async def run() -> None:
                raise AssertionError("must not run while the lock is held elsewhere")

            async with AsyncRedlock(servers.urls) as holder, holder.lock("busy"):
                with pytest.raises(LockTimeoutError):
                    await run()


class TestLoss:
    async def test_a_lost_lease_cancels_the_call(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        cancelled: list[bool] = []
        async with AsyncRedlock(servers.urls) as redlock:

            @redlock.locked("lost:{n}")
            async def work(n: int) -> None:
                try:
                    await redlock.force_release(f"lost:{n}")
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    cancelled.append(True)
                    raise

            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError) as caught:
                await work(1)
            await redlock.settle()
        assert caught.value.resource == "lost:1"
        assert cancelled == [True]
        assert await masters.keys() == [[]] * 5


class TestBadInput:
    """Refused when decorating, or at the call before any I/O: nothing is written."""

    @pytest.mark.parametrize(
        ("template", "error", "pattern"),
        [
            (b"jobs", TypeError, "template must be a str"),
            ("", ValueError, "must not be empty"),
            ("jobs:{", ValueError, "malformed"),
            ("jobs:{}", ValueError, "fields must be named"),
            ("jobs:{0}", ValueError, "fields must be named"),
            ("jobs:{job_id!x}", ValueError, r"malformed field \{job_id!x\}: Unknown conversion"),
            ("jobs:{job_id.}", ValueError, r"malformed field \{job_id\.\}: Empty attribute"),
            ("jobs:{job_id[0]]}", ValueError, r"malformed field \{job_id\[0\]\]\}"),
            ("jobs:{job_id:{width!z}}", ValueError, r"malformed field \{width!z\}"),
        ],
    )
    def test_a_bad_template(self, template: Any, error: type[Exception], pattern: str) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])
        with pytest.raises(error, match=pattern):
            redlock.locked(template)

    def test_a_bad_setting_is_refused_when_decorating(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])
        with pytest.raises(ValueError, match=r"^ttl must be > 0"):
            redlock.locked("jobs", ttl=0)
        with pytest.raises(TypeError, match=r"^fair must be a bool"):
            redlock.locked("jobs", fair="yes")  # type: ignore[arg-type]

    def test_a_field_that_is_not_a_parameter(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])
        decorate = redlock.locked("jobs:{job}")
        with pytest.raises(
            ValueError, match=r"uses job, which is not a parameter of .*run_job\(\)$"
        ):

            @decorate
            async def run_job(job_id: int) -> None: ...

    def test_fields_that_are_not_parameters_are_named_in_the_plural(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])
        decorate = redlock.locked("jobs:{job}:{step}")
        with pytest.raises(
            ValueError, match=r"uses job, step, which are not parameters of .*run_job\(\)$"
        ):

            @decorate
            async def run_job(job_id: int) -> None: ...

    def test_a_field_nested_in_a_format_spec_is_checked_too(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])
        with pytest.raises(ValueError, match="uses width, which is not"):

            @redlock.locked("jobs:{job_id:>{width}}")
            async def run_job(job_id: int) -> None: ...

    def test_a_plain_function_is_refused(self) -> None:
        redlock = AsyncRedlock(["redis://127.0.0.1:1"])
        with pytest.raises(TypeError, match="coroutine functions"):
            redlock.locked("jobs")(lambda: None)  # type: ignore[arg-type, return-value]

    async def test_bad_calls_fail_before_any_io(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        ran = False
        async with AsyncRedlock(servers.urls) as redlock:

            @redlock.locked("jobs:{job_id}:{user.id}")
            async def run_job(job_id: str, user: object) -> None:
                nonlocal ran
                ran = True

            with pytest.raises(TypeError, match="missing a required argument"):
                await run_job("7")  # type: ignore[call-arg]
            with pytest.raises(ValueError, match="cannot fill"):
                await run_job("7", object())  # no .id
            calls = redlock.statistics().attempts
        assert (ran, calls) == (False, 0)
        assert await masters.keys() == [[]] * 5
