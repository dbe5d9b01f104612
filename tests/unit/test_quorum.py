"""Fan-out and quorum decisions, with fake masters whose replies the test hands out.

No server here: each fake client's call waits on a future that the test resolves, so
the order in which masters answer is chosen by the test, not by timing. What Redis
does with the calls is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import NodeOutcome
from asyncredlock._core import classify_acquire, classify_flag
from asyncredlock._node import Node, Reply
from asyncredlock._quorum import (
    MAX_OVERDUE,
    Classify,
    Decision,
    NodeSkippedError,
    Round,
    TaskTracker,
    Timing,
    Verdict,
)
from asyncredlock._scripts import Script

pytestmark = pytest.mark.anyio

SCRIPT = Script("probe", "return 1")
#: Rounds decided by replies alone: no master is ever given up on for silence.
PATIENT = Timing(node_timeout=3600.0, max_wait=3600.0)
GRANTED = [1]
PENDING = "not answered yet (the round was decided without it)"
HELD = [0, 1500]
HANG_GUARD = 10  # seconds: a bug fails the test instead of hanging it


class FakeClient:
    """Stands in for a redis client: the k-th call returns what ``reply(k)`` is given."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []
        self._replies: list[asyncio.Future[Any]] = []

    def reply(self, k: int = 0) -> asyncio.Future[Any]:
        while len(self._replies) <= k:
            self._replies.append(asyncio.get_running_loop().create_future())
        return self._replies[k]

    async def execute_command(self, *args: Any) -> Any:
        self.commands.append(args)
        return await self.reply(len(self.commands) - 1)


class FakeMasters:
    def __init__(self, n: int) -> None:
        self.clients = [FakeClient() for _ in range(n)]
        self.nodes = [Node(c, name=f"m{i}", owned=False) for i, c in enumerate(self.clients)]

    def round(self, tracker: TaskTracker, patience: float | None = None) -> Round:
        return Round(
            tracker, self.nodes, lambda _, node: node.call(SCRIPT, ("k",), ("v", 1000)), patience
        )


async def answer(rnd: Round, masters: FakeMasters, i: int, value: Any) -> None:
    """Master ``i`` answers its call with ``value`` (an exception is raised by the call)."""
    future = masters.clients[i].reply()
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)
    # Once this returns, the round's own done-callbacks for the call have run too.
    await asyncio.wait([rnd.tasks[i]])


def start_decide(
    rnd: Round, quorum: int, classify: Classify = classify_acquire, timing: Timing = PATIENT
) -> asyncio.Task[Decision]:
    return asyncio.get_running_loop().create_task(rnd.decide(quorum, classify, timing))


def details(outcomes: Sequence[NodeOutcome]) -> list[str]:
    return [o.detail for o in outcomes]


@pytest.fixture
async def tracker() -> AsyncIterator[TaskTracker]:
    tracker = TaskTracker()
    yield tracker
    await tracker.aclose()


class TestRound:
    async def test_decided_at_quorum_while_other_calls_still_run(
        self, tracker: TaskTracker
    ) -> None:
        masters = FakeMasters(5)
        rnd = masters.round(tracker)
        decide = start_decide(rnd, quorum=3)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, GRANTED)
            await answer(rnd, masters, 1, GRANTED)
            assert not decide.done()
            await answer(rnd, masters, 2, GRANTED)
            decision = await decide
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (3, 0, 0, 2)
        assert [o.ok for o in decision.outcomes] == [True, True, True, False, False]
        assert details(decision.outcomes) == ["granted"] * 3 + [PENDING] * 2
        assert [o.node for o in decision.outcomes] == ["m0", "m1", "m2", "m3", "m4"]
        # the two other calls go on in the background, owned by the tracker
        assert not rnd.tasks[3].done()
        assert not rnd.tasks[4].done()
        assert tracker.pending == 2
        assert [node.in_flight for node in masters.nodes] == [0, 0, 0, 1, 1]
        await answer(rnd, masters, 3, HELD)
        await answer(rnd, masters, 4, GRANTED)
        with anyio.fail_after(HANG_GUARD):
            await tracker.settle()
        assert tracker.pending == 0
        assert rnd.tasks[3].result() == Reply(HELD)

    async def test_every_master_gets_the_call(self, tracker: TaskTracker) -> None:
        masters = FakeMasters(3)
        rnd = masters.round(tracker)
        for i in range(3):
            await answer(rnd, masters, i, GRANTED)
        for client in masters.clients:
            assert client.commands[0] == ("EVALSHA", SCRIPT.sha, 1, "k", "v", 1000)

    async def test_decided_early_when_refusals_make_quorum_impossible(
        self, tracker: TaskTracker
    ) -> None:
        masters = FakeMasters(5)
        rnd = masters.round(tracker)
        decide = start_decide(rnd, quorum=3)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 4, HELD)
            await answer(rnd, masters, 0, GRANTED)
            await answer(rnd, masters, 2, HELD)
            assert not decide.done()  # 1 yes, 2 no: two masters could still make 3
            await answer(rnd, masters, 3, HELD)
            decision = await decide
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (1, 3, 0, 1)
        assert details(decision.outcomes) == [
            "granted",
            PENDING,
            "held by another holder (1500 ms left)",
            "held by another holder (1500 ms left)",
            "held by another holder (1500 ms left)",
        ]
        assert not decision.unavailable(3)
        assert not rnd.tasks[1].done()

    async def test_failures_count_against_the_quorum(self, tracker: TaskTracker) -> None:
        masters = FakeMasters(3)
        rnd = masters.round(tracker)
        decide = start_decide(rnd, quorum=2)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, RedisConnectionError("Connection refused"))
            assert not decide.done()
            await answer(rnd, masters, 1, TimeoutError())
            decision = await decide
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (0, 0, 2, 1)
        assert details(decision.outcomes) == [
            "ConnectionError: Connection refused",
            "TimeoutError: no message",
            PENDING,
        ]
        assert decision.unavailable(2)

    async def test_decided_when_every_master_answered(self, tracker: TaskTracker) -> None:
        masters = FakeMasters(4)  # quorum 3: two yes and two no leave it undecided until the end
        rnd = masters.round(tracker)
        decide = start_decide(rnd, quorum=3, classify=classify_flag)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, 1)
            await answer(rnd, masters, 1, 0)
            await answer(rnd, masters, 2, 1)
            assert not decide.done()
            await answer(rnd, masters, 3, 0)
            decision = await decide
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (2, 2, 0, 0)
        assert tracker.pending == 0

    async def test_unanswered_calls_do_not_turn_contention_into_an_outage(
        self, tracker: TaskTracker
    ) -> None:
        masters = FakeMasters(5)
        rnd = masters.round(tracker)
        decide = start_decide(rnd, quorum=3)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, HELD)
            await answer(rnd, masters, 1, HELD)
            await answer(rnd, masters, 2, RedisConnectionError("Connection refused"))
            decision = await decide
        # Two masters refused (a holder exists), one is down, two were not waited for:
        # failures alone did not make the quorum unreachable.
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (0, 2, 1, 2)
        assert not decision.unavailable(3)

    async def test_a_known_reply_needs_no_call(self, tracker: TaskTracker) -> None:
        masters = FakeMasters(3)

        def make(i: int, node: Node) -> Any:
            return Reply(0) if i == 1 else node.call(SCRIPT, ("k",), ())

        rnd = Round(tracker, masters.nodes, make)
        assert rnd.tasks[1].done()
        assert rnd.tasks[1].result() == Reply(0)
        assert tracker.pending == 2
        await answer(rnd, masters, 0, 1)
        await answer(rnd, masters, 2, 1)
        assert masters.clients[1].commands == []

    async def test_cancelling_decide_leaves_the_calls_running(self, tracker: TaskTracker) -> None:
        masters = FakeMasters(5)
        rnd = masters.round(tracker)
        decide = start_decide(rnd, quorum=3)
        await answer(rnd, masters, 0, GRANTED)
        decide.cancel()
        with pytest.raises(asyncio.CancelledError):
            await decide
        assert not any(task.done() for task in rnd.tasks[1:])
        assert tracker.pending == 4
        for i in range(1, 5):
            await answer(rnd, masters, i, GRANTED)
        assert [task.result() for task in rnd.tasks] == [Reply(GRANTED)] * 5
        assert tracker.pending == 0

    async def test_a_silent_master_is_given_up_after_node_timeout(
        self, tracker: TaskTracker
    ) -> None:
        masters = FakeMasters(3)
        rnd = masters.round(tracker)
        decide = start_decide(rnd, 2, timing=Timing(node_timeout=0.05, max_wait=3600.0))
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, GRANTED)
            decision = await decide  # m1 and m2 never answer in time
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (1, 0, 2, 0)
        assert details(decision.outcomes)[1:] == ["master silent for over 0.05 s"] * 2
        assert [node.overdue for node in masters.nodes] == [0, 1, 1]
        await answer(rnd, masters, 1, GRANTED)
        await answer(rnd, masters, 2, GRANTED)
        assert [node.overdue for node in masters.nodes] == [0, 0, 0]

    async def test_a_master_with_too_many_calls_unanswered_is_skipped(
        self, tracker: TaskTracker
    ) -> None:
        masters = FakeMasters(3)
        hung = masters.nodes[2]
        earlier = masters.round(tracker)  # one call out on each master
        await answer(earlier, masters, 0, GRANTED)
        await answer(earlier, masters, 1, GRANTED)
        hung.overdue = MAX_OVERDUE
        hung.busy_since -= 3600  # silent for an hour

        skipping = masters.round(tracker, patience=0.1)
        reply = skipping.tasks[2].result()
        assert isinstance(reply.error, NodeSkippedError)
        assert classify_acquire(reply) == (
            Verdict.FAILED,
            f"NodeSkippedError: {MAX_OVERDUE} calls unanswered",
        )
        assert len(masters.clients[2].commands) == 1  # no second call was sent

        sent = masters.round(tracker)  # without patience (release, extension): never skipped
        masters.clients[2].reply(1).set_result(GRANTED)
        await asyncio.wait([sent.tasks[2]])
        assert sent.tasks[2].result() == Reply(GRANTED)
        assert len(masters.clients[2].commands) == 2


class TestDecision:
    @staticmethod
    def decision(n: int, failed: int) -> Decision:
        outcomes = tuple(NodeOutcome(f"m{i}", False, "x") for i in range(n))
        return Decision(0, n - failed, failed, outcomes)

    @pytest.mark.parametrize(
        ("n", "failed", "unavailable"),
        [
            (1, 0, False),
            (1, 1, True),
            (3, 1, False),
            (3, 2, True),
            (4, 1, False),
            (4, 2, True),
            (5, 2, False),
            (5, 3, True),
        ],
    )
    def test_unavailable_when_failures_alone_exceed_n_minus_quorum(
        self, n: int, failed: int, unavailable: bool
    ) -> None:
        assert self.decision(n, failed).unavailable(n // 2 + 1) is unavailable


class TestTaskTracker:
    async def test_settle_waits_for_calls_started_meanwhile(self, tracker: TaskTracker) -> None:
        first_reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        second_reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        spawned: list[asyncio.Task[Reply]] = []

        async def second() -> Reply:
            return await second_reply

        async def first() -> Reply:
            reply = await first_reply
            spawned.append(tracker.call(second()))  # e.g. the cleanup of a failed attempt
            return reply

        task = tracker.call(first())
        settle = asyncio.get_running_loop().create_task(tracker.settle())
        first_reply.set_result(Reply(1))
        await asyncio.wait([task])
        assert len(spawned) == 1
        assert not settle.done()
        second_reply.set_result(Reply(1))
        with anyio.fail_after(HANG_GUARD):
            await settle
        assert spawned[0].done()
        assert tracker.pending == 0

    async def test_settle_returns_at_once_without_calls(self, tracker: TaskTracker) -> None:
        with anyio.fail_after(HANG_GUARD):
            await tracker.settle()
        assert tracker.pending == 0

    async def test_settle_does_not_wait_for_loops(self, tracker: TaskTracker) -> None:
        loop = tracker.loop(anyio.sleep_forever())
        with anyio.fail_after(HANG_GUARD):
            await tracker.settle()
        assert not loop.done()
        assert tracker.pending == 1

    async def test_aclose_cancels_calls_and_loops(self, tracker: TaskTracker) -> None:
        never: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        async def call() -> Reply:
            return await never

        calls = [tracker.call(call()) for _ in range(3)]
        loop = tracker.loop(anyio.sleep_forever())
        assert tracker.pending == 4
        with anyio.fail_after(HANG_GUARD):
            await tracker.aclose()
        assert all(task.cancelled() for task in [*calls, loop])
        assert tracker.pending == 0

    async def test_a_crashed_task_is_logged(
        self, tracker: TaskTracker, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def crash() -> Reply:
            raise RuntimeError("boom")

        with caplog.at_level(logging.ERROR, logger="asyncredlock"):
            task = tracker.call(crash())
            await asyncio.wait([task])
        assert [r.getMessage() for r in caplog.records] == ["asyncredlock background task failed"]
        assert caplog.records[0].exc_info is not None
        assert "boom" in str(caplog.records[0].exc_info[1])
        assert tracker.pending == 0


class TestClassify:
    @pytest.mark.parametrize(
        ("reply", "verdict", "detail"),
        [
            (Reply([1]), Verdict.YES, "granted"),
            (Reply([0, 1500]), Verdict.NO, "held by another holder (1500 ms left)"),
            (Reply([0, -1]), Verdict.NO, "held by another holder (-1 ms left)"),
            (Reply([-1]), Verdict.NO, "attempt already undone here"),
            (
                Reply(error=RedisConnectionError("Connection refused")),
                Verdict.FAILED,
                "ConnectionError: Connection refused",
            ),
            (Reply(error=TimeoutError()), Verdict.FAILED, "TimeoutError: no message"),
            (
                Reply(error=NodeSkippedError("8 calls unanswered")),
                Verdict.FAILED,
                "NodeSkippedError: 8 calls unanswered",
            ),
        ],
    )
    def test_classify_acquire(self, reply: Reply, verdict: Verdict, detail: str) -> None:
        assert classify_acquire(reply) == (verdict, detail)

    @pytest.mark.parametrize(
        ("reply", "verdict", "detail"),
        [
            (Reply(1), Verdict.YES, "done"),
            (Reply(0), Verdict.NO, "not held by this lease"),
            (
                Reply(error=RedisConnectionError("reset")),
                Verdict.FAILED,
                "ConnectionError: reset",
            ),
        ],
    )
    def test_classify_flag(self, reply: Reply, verdict: Verdict, detail: str) -> None:
        assert classify_flag(reply) == (verdict, detail)


class TestNodeCall:
    async def test_a_call_never_raises_and_tracks_in_flight(self, tracker: TaskTracker) -> None:
        masters = FakeMasters(1)
        node = masters.nodes[0]
        assert node.last_answer == -math.inf
        rnd = masters.round(tracker)
        await answer(rnd, masters, 0, OSError("unreachable"))
        reply = rnd.tasks[0].result()
        assert isinstance(reply.error, OSError)
        assert node.in_flight == 0
        assert node.last_answer == -math.inf  # a failed call is no sign of life

        rnd = masters.round(tracker)
        masters.clients[0].reply(1).set_result(1)
        await asyncio.wait(rnd.tasks)
        assert rnd.tasks[0].result() == Reply(1)
        assert node.last_answer > -math.inf
