"""Fan-out and quorum decisions, with fake masters whose replies the test hands out.

No server here: each fake master's call is a future that the test resolves, so the
order in which masters answer, and when one turns silent, is chosen by the test, not
by timing. What Redis
does with the calls is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import NodeOutcome
from asyncredlock._node import Node, Reply
from asyncredlock._protocol import classify_acquire, classify_flag
from asyncredlock._quorum import (
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
#: Rounds decided by replies alone: no master is ever given up on.
PATIENT = Timing(give_up_silent=False, max_wait=3600.0)
#: Acquisition rounds: a master reported silent is given up on.
ACQUIRING = Timing(give_up_silent=True, max_wait=3600.0, node_timeout=0.1)
GRANTED = [1]
PENDING = "not answered yet (the round was decided without it)"
HELD = [0, 1500]
HANG_GUARD = 10  # seconds: a bug fails the test instead of hanging it


class FakeNode:
    """Stands in for a master: the k-th call resolves with what ``reply(k)`` is given,
    and the test says when the master turns silent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.commands: list[tuple[Any, ...]] = []
        self.silent = False
        self.watchers: set[Callable[[], None]] = set()
        self._replies: list[asyncio.Future[Reply]] = []
        #: Called when a round's deadline asks whether bytes wait unread (None: none).
        self.on_unread: Callable[[], bool] | None = None

    def unread(self) -> bool:
        return self.on_unread() if self.on_unread is not None else False

    def reply(self, k: int = 0) -> asyncio.Future[Reply]:
        while len(self._replies) <= k:
            self._replies.append(asyncio.get_running_loop().create_future())
        return self._replies[k]

    @property
    def in_flight(self) -> int:
        return sum(not future.done() for future in self._replies[: len(self.commands)])

    def call(
        self, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> asyncio.Future[Reply]:
        self.commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
        return self.reply(len(self.commands) - 1)

    def listen(self, future: asyncio.Future[Reply], hook: Any, index: int) -> bool:
        return False  # the replies are futures the test resolves: done callbacks

    def unlisten(self, future: asyncio.Future[Reply]) -> None:
        pass

    def watch(self, watcher: Callable[[], None]) -> None:
        self.watchers.add(watcher)

    def turn_silent(self) -> None:
        self.silent = True
        for watcher in list(self.watchers):
            watcher()


class FakeMasters:
    def __init__(self, n: int) -> None:
        self.fakes = [FakeNode(f"m{i}") for i in range(n)]
        self.nodes = cast(list[Node], self.fakes)

    def round(self, *, skip_silent: bool = False) -> Round:
        return Round(
            self.nodes,
            lambda _, node: node.call(SCRIPT, ("k",), ("v", 1000)),
            skip_silent=skip_silent,
        )


async def answer(rnd: Round, masters: FakeMasters, i: int, value: Any) -> None:
    """Master ``i`` answers its first call with ``value`` (an exception is a failed call)."""
    future = masters.fakes[i].reply()
    future.set_result(Reply(error=value) if isinstance(value, Exception) else Reply(value))
    # Once this returns, the round's own done-callbacks for the call have run too.
    await asyncio.sleep(0)


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
    async def test_decided_at_quorum_while_other_calls_still_run(self) -> None:
        masters = FakeMasters(5)
        rnd = masters.round()
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
        # the two other calls go on, their futures kept in the round
        assert not rnd.tasks[3].done()
        assert not rnd.tasks[4].done()
        assert [node.in_flight for node in masters.fakes] == [0, 0, 0, 1, 1]
        await answer(rnd, masters, 3, HELD)
        await answer(rnd, masters, 4, GRANTED)
        assert rnd.tasks[3].result() == Reply(HELD)

    async def test_every_master_gets_the_call(self) -> None:
        masters = FakeMasters(3)
        rnd = masters.round()
        for i in range(3):
            await answer(rnd, masters, i, GRANTED)
        for fake in masters.fakes:
            assert fake.commands == [("EVALSHA", SCRIPT.sha, 1, "k", "v", 1000)]

    async def test_decided_early_when_refusals_make_quorum_impossible(self) -> None:
        masters = FakeMasters(5)
        rnd = masters.round()
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
        assert not decision.unavailable
        assert not rnd.tasks[1].done()

    async def test_failures_count_against_the_quorum(self) -> None:
        masters = FakeMasters(3)
        rnd = masters.round()
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
        assert decision.unavailable

    async def test_decided_when_every_master_answered(self) -> None:
        masters = FakeMasters(4)  # quorum 3: two yes and two no leave it undecided until the end
        rnd = masters.round()
        decide = start_decide(rnd, quorum=3, classify=classify_flag)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, 1)
            await answer(rnd, masters, 1, 0)
            await answer(rnd, masters, 2, 1)
            assert not decide.done()
            await answer(rnd, masters, 3, 0)
            decision = await decide
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (2, 2, 0, 0)

    async def test_unanswered_calls_do_not_turn_contention_into_an_outage(self) -> None:
        masters = FakeMasters(5)
        rnd = masters.round()
        decide = start_decide(rnd, quorum=3)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, HELD)
            await answer(rnd, masters, 1, HELD)
            await answer(rnd, masters, 2, RedisConnectionError("Connection refused"))
            decision = await decide
        # Two masters refused (a holder exists), one is down, two were not waited for:
        # failures alone did not make the quorum unreachable.
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (0, 2, 1, 2)
        assert not decision.unavailable

    async def test_a_known_reply_needs_no_call(self) -> None:
        masters = FakeMasters(3)

        def make(i: int, node: Node) -> Any:
            return Reply(0) if i == 1 else node.call(SCRIPT, ("k",), ())

        rnd = Round(masters.nodes, make)
        assert rnd.tasks[1].done()
        assert rnd.tasks[1].result() == Reply(0)
        assert [len(fake.commands) for fake in masters.fakes] == [1, 0, 1]

    async def test_cancelling_decide_leaves_the_calls_running(self) -> None:
        masters = FakeMasters(5)
        rnd = masters.round()
        decide = start_decide(rnd, quorum=3)
        await answer(rnd, masters, 0, GRANTED)
        decide.cancel()
        with pytest.raises(asyncio.CancelledError):
            await decide
        assert not any(task.done() for task in rnd.tasks[1:])
        assert not any(waiter.rnd is rnd for waiter in PATIENT.rounds.waiting)  # it let go
        for i in range(1, 5):
            await answer(rnd, masters, i, GRANTED)
        assert [task.result() for task in rnd.tasks] == [Reply(GRANTED)] * 5

    async def test_a_master_reported_silent_is_given_up_by_acquisition(self) -> None:
        masters = FakeMasters(3)
        rnd = masters.round()
        decide = start_decide(rnd, 2, timing=ACQUIRING)
        with anyio.fail_after(HANG_GUARD):
            await answer(rnd, masters, 0, GRANTED)
            await asyncio.sleep(0)
            assert not decide.done()  # m1 and m2 are slow, not silent: waited for
            masters.fakes[1].turn_silent()
            masters.fakes[2].turn_silent()
            decision = await decide
        assert (decision.yes, decision.no, decision.failed, decision.pending) == (1, 0, 2, 0)
        assert details(decision.outcomes)[1:] == ["master silent for over 0.1 s"] * 2
        # one watcher per master serves every acquisition round; this one left it
        assert all(len(fake.watchers) == 1 for fake in masters.fakes)
        assert not any(waiter.rnd is rnd for waiter in ACQUIRING.rounds.waiting)

    async def test_release_and_extension_wait_for_a_silent_master(self) -> None:
        masters = FakeMasters(3)
        rnd = masters.round()
        decide = start_decide(rnd, 2, classify=classify_flag, timing=PATIENT)
        await answer(rnd, masters, 0, 1)
        masters.fakes[1].turn_silent()
        await asyncio.sleep(0)
        assert not decide.done()
        await answer(rnd, masters, 1, 1)  # a silent master that answers in the end counts
        with anyio.fail_after(HANG_GUARD):
            decision = await decide
        assert (decision.yes, decision.failed) == (2, 0)

    async def test_every_call_still_out_at_max_wait_is_given_up(self) -> None:
        masters = FakeMasters(3)
        rnd = masters.round()
        decide = start_decide(
            rnd, 2, classify=classify_flag, timing=Timing(give_up_silent=False, max_wait=0.05)
        )
        await answer(rnd, masters, 0, 1)
        with anyio.fail_after(HANG_GUARD):
            decision = await decide
        assert (decision.yes, decision.failed) == (1, 2)
        assert details(decision.outcomes)[1:] == ["no reply within 0.05 s"] * 2

    async def test_a_reply_unread_at_the_deadline_is_counted(self) -> None:
        """Bytes unread in a master's socket when the deadline fires (a busy loop) are
        its reply: the round looks again once the loop has read them."""
        masters = FakeMasters(3)
        rnd = masters.round()
        decide = start_decide(
            rnd, 2, classify=classify_flag, timing=Timing(give_up_silent=False, max_wait=0.05)
        )
        await answer(rnd, masters, 0, 1)
        loop = asyncio.get_running_loop()

        def unread() -> bool:  # the next poll reads the reply
            masters.fakes[1].on_unread = None
            loop.call_soon(masters.fakes[1].reply().set_result, Reply(1))
            return True

        masters.fakes[1].on_unread = unread
        with anyio.fail_after(HANG_GUARD):
            decision = await decide
        assert (decision.yes, decision.failed) == (2, 0)

    async def test_rounds_sharing_a_timing_each_get_their_own_max_wait(self) -> None:
        """One timer serves every round of a `Timing`: a round decided early leaves
        the others' deadlines as they were, and one that started later is not cut
        short when an earlier one runs out of time."""
        timing = Timing(give_up_silent=False, max_wait=0.6)
        first, second, third = FakeMasters(3), FakeMasters(3), FakeMasters(3)
        rnds = [first.round(), second.round()]
        decides = [start_decide(rnd, 2, classify=classify_flag, timing=timing) for rnd in rnds]
        await asyncio.sleep(0)
        for i in range(2):
            await answer(rnds[0], first, i, 1)  # decided long before its deadline
        # not synchronisation: the third round starts 0.3 s later, so that the
        # second's timer, even late on a busy machine, falls before its deadline
        await asyncio.sleep(0.3)
        later = third.round()
        decides.append(start_decide(later, 2, classify=classify_flag, timing=timing))
        with anyio.fail_after(HANG_GUARD):
            assert (await decides[0]).yes == 2
            assert (await decides[1]).failed == 3
            assert not decides[2].done()  # still within its own max_wait
            assert list(timing.rounds.waiting) != []
            assert (await decides[2]).failed == 3
        assert timing.rounds.waiting == {}

    async def test_a_silent_master_gets_no_acquisition_call_until_it_answers(self) -> None:
        masters = FakeMasters(3)
        hung = masters.fakes[2]
        earlier = masters.round()  # one call out on each master
        await answer(earlier, masters, 0, GRANTED)
        await answer(earlier, masters, 1, GRANTED)
        hung.turn_silent()

        skipping = masters.round(skip_silent=True)
        reply = skipping.tasks[2].result()
        assert isinstance(reply.error, NodeSkippedError)
        assert classify_acquire(reply) == (
            Verdict.FAILED,
            "NodeSkippedError: master silent, 1 calls out",
        )
        assert len(hung.commands) == 1  # no second call was sent

        sent = masters.round()  # release, extension: never skipped
        assert len(hung.commands) == 2
        hung.reply(1).set_result(Reply(GRANTED))
        hung.silent = False  # it answered: readmitted
        assert sent.tasks[2].result() == Reply(GRANTED)
        readmitted = masters.round(skip_silent=True)
        assert not readmitted.tasks[2].done()
        assert len(hung.commands) == 3


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
        assert self.decision(n, failed).unavailable is unavailable

    @pytest.mark.parametrize(
        ("yes", "no", "failed", "refuted"),
        [(1, 1, 1, False), (0, 1, 2, False), (1, 2, 0, True), (0, 2, 1, True), (0, 3, 0, True)],
    )
    def test_refuted_when_too_many_masters_say_no_for_a_quorum(
        self, yes: int, no: int, failed: int, refuted: bool
    ) -> None:
        decision = Decision(yes, no, failed, lambda: ())
        assert decision.refuted is refuted

    def test_the_success_rule_needs_a_quorum_and_validity_left(self) -> None:
        reads: list[float] = []

        def clock() -> float:
            reads.append(5.0)
            return 5.0

        outcomes = tuple(NodeOutcome(f"m{i}", i < 3, "x") for i in range(5))
        granted = Decision(3, 2, 0, outcomes)
        assert (granted.quorum, granted.reached) == (3, True)
        assert granted.holds(6.0, clock)
        assert not granted.holds(5.0, clock)  # validity used up exactly
        assert len(reads) == 2
        refused = Decision(2, 3, 0, outcomes)
        assert not refused.reached
        assert not refused.holds(6.0, clock)
        assert len(reads) == 2  # no quorum: the clock is not even read

    def test_a_round_decided_with_another_quorum_keeps_it(self) -> None:
        outcomes = tuple(NodeOutcome(f"m{i}", False, "x") for i in range(5))
        decision = Decision(2, 0, 3, outcomes, quorum=2)
        assert (decision.reached, decision.unavailable) == (True, False)
        majority = Decision(2, 0, 3, outcomes)  # 3 of 5
        assert (majority.reached, majority.unavailable) == (False, True)


class TestTaskTracker:
    async def test_settle_waits_for_followed_calls_and_jobs_started_meanwhile(
        self, tracker: TaskTracker
    ) -> None:
        first: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        second: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        async def job() -> None:
            await first
            tracker.follow(second)  # e.g. an undo sent once an earlier reply is in

        tracker.job(job())
        settle = asyncio.get_running_loop().create_task(tracker.settle())
        first.set_result(Reply(1))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not settle.done()
        second.set_result(Reply(1))
        with anyio.fail_after(HANG_GUARD):
            await settle
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

    async def test_aclose_cancels_jobs_and_loops(self, tracker: TaskTracker) -> None:
        jobs = [tracker.job(anyio.sleep_forever()) for _ in range(3)]
        loop = tracker.loop(anyio.sleep_forever())
        assert tracker.pending == 4
        with anyio.fail_after(HANG_GUARD):
            await tracker.aclose()
        assert all(task.cancelled() for task in [*jobs, loop])
        assert tracker.pending == 0

    async def test_a_crashed_task_is_logged(
        self, tracker: TaskTracker, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def crash() -> None:
            raise RuntimeError("boom")

        with caplog.at_level(logging.ERROR, logger="asyncredlock"):
            task = tracker.job(crash())
            await asyncio.wait([task])
        assert [r.getMessage() for r in caplog.records] == ["asyncredlock background task failed"]
        assert caplog.records[0].exc_info is not None
        assert "boom" in str(caplog.records[0].exc_info[1])
        assert tracker.pending == 0
