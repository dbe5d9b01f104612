"""Script replies read: verdicts toward the quorum, fence tokens, the holder's TTL."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock._node import Reply
from asyncredlock._protocol import (
    QueueEntry,
    behind,
    classify_acquire,
    classify_flag,
    fence_tokens,
    handed_already,
    holder_expires_in,
    holds_ours,
    may_be_queued,
    queued_by,
)
from asyncredlock._quorum import NodeSkippedError, Verdict


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
                Reply(error=NodeSkippedError("master silent, 8 calls out")),
                Verdict.FAILED,
                "NodeSkippedError: master silent, 8 calls out",
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


def still_out() -> asyncio.Future[Reply]:
    """A call whose reply has not come."""
    loop = asyncio.new_event_loop()
    try:
        return loop.create_future()
    finally:
        loop.close()


def settled(*replies: Reply) -> list[asyncio.Future[Reply]]:
    loop = asyncio.new_event_loop()
    try:
        futures: list[asyncio.Future[Reply]] = []
        for reply in replies:
            future: asyncio.Future[Reply] = loop.create_future()
            future.set_result(reply)
            futures.append(future)
        return futures
    finally:
        loop.close()


class TestReplies:
    def test_fence_tokens_take_the_largest_count_and_say_if_a_quorum_has_it(self) -> None:
        replies = settled(Reply([1, 7]), Reply([1, 9]), Reply([1, 9]), Reply([0, 100]))
        assert fence_tokens(replies, 2) == ((9,), True)
        assert fence_tokens(replies, 3) == ((9,), False)

    def test_the_holder_expires_in_the_median_ttl_the_refusing_masters_report(self) -> None:
        replies = settled(Reply([0, 300]), Reply([0, 100]), Reply([0, 200]), Reply([1, 5]))
        assert holder_expires_in(replies) == 0.2
        assert holder_expires_in(settled(Reply([1, 5]), Reply([0, -1]))) == float("inf")

    def test_masters_that_handed_the_key_already_give_its_pttl_and_count(self) -> None:
        """Code 4 ("already handed to this waiter") with a live key counts; other
        refusals, grants, a key without time left, errors and calls still out do not."""
        out = still_out()
        replies = [
            *settled(
                Reply([0, 900, 0, 4, b"1795825684000064"]),
                Reply([0, 900, 0, 3]),
                Reply([1, 7]),
                Reply([0, 0, 0, 4, b"5"]),
                Reply(error=RedisConnectionError("reset")),
                Reply([0, 450, 0, 4, b"0"]),
            ),
            out,
        ]
        assert handed_already(replies) == {0: (900, 1795825684000064), 5: (450, 0)}

    def test_an_earlier_waiter_ahead_is_read_from_a_refusal(self) -> None:
        """A refusal says an earlier waiter is queued ahead: the lock free but another
        first (code 3), held and the ahead flag set, or handed to this waiter and the
        flag set (an earlier one listed there since); not when first in line, held by
        readers, handed to it with nobody earlier (or no flag in the reply),
        granted, failed or still out."""
        out = still_out()
        replies = [
            *settled(
                Reply([0, -1, 1, 3]),
                Reply([0, 900, 1, 1, 1]),
                Reply([0, 900, 0, 4, b"0", 1]),
                Reply([0, 900, 1, 1, 0]),
                Reply([0, 900, 0]),
                Reply([0, 40, 1, 2]),
                Reply([0, 900, 0, 4, b"0", 0]),
                Reply([0, 900, 0, 4, b"0"]),
                Reply([1]),
                Reply(error=RedisConnectionError("reset")),
            ),
            out,
        ]
        assert [behind(reply) for reply in replies] == [True] * 3 + [False] * 8

    def test_a_granted_writer_may_be_queued_and_holds_ours(self) -> None:
        """A grant leaves a writer listed (a dequeue may be needed) and holds the
        attempt's key (its undo goes there); a failed call may have done either; a
        refusal holds nothing, and may have queued the waiter only if it says so;
        a call never sent did neither."""
        replies = settled(
            Reply([1]),
            Reply(error=RedisConnectionError("reset")),
            Reply([0, 900, 1, 1, 0]),
            Reply([0, 900, 0]),
            Reply(error=NodeSkippedError("master silent")),
        )
        assert [holds_ours(reply) for reply in replies] == [True, True, False, False, False]
        assert [may_be_queued(reply) for reply in replies] == [True, True, True, False, False]

    def test_a_refusal_that_queued_the_waiter_says_so(self) -> None:
        """Queued (or its entry refreshed): held by another, by readers, the lock
        free but an earlier waiter first. Not queued: refused without an id, free
        with nobody queued before an id came, handed already, granted, failed, out."""
        out = still_out()
        replies = [
            *settled(
                Reply([0, 900, 1, 1, 0]),
                Reply([0, 40, 1, 2]),
                Reply([0, -1, 1, 3]),
                Reply([0, 900, 0]),
                Reply([0, -1, 0, 3]),
                Reply([0, 900, 0, 4, b"0"]),
                Reply([1]),
                Reply(error=RedisConnectionError("reset")),
            ),
            out,
        ]
        assert [queued_by(reply) for reply in replies] == [True] * 3 + [False] * 6


class TestQueueEntry:
    @pytest.mark.parametrize(
        ("ttl", "handover", "handover_ttl", "shortest"),
        [(1.0, "v", 10.0, 1.0), (15.6, "v", 10.0, 10.0), (15.6, None, 10.0, 15.6)],
    )
    def test_a_refresh_pause_lets_two_refreshes_come_before_anything_lapses(
        self, ttl: float, handover: str | None, handover_ttl: float, shortest: float
    ) -> None:
        """Between a sixth and a third of the shorter of the entry's life and, for a
        waiter with hand-over terms, the key a release would hand it."""
        entry = QueueEntry("w:c:1", 1, ttl, handover, handover_ttl)
        pauses = [entry.refresh_pause() for _ in range(200)]
        assert all(shortest / 6 <= pause <= shortest / 3 for pause in pauses)
        assert max(pauses) - min(pauses) > shortest / 12  # drawn, not fixed
