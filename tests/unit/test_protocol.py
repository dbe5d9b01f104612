"""Script replies read: verdicts toward the quorum, fence tokens, the holder's TTL."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock._node import Reply
from asyncredlock._protocol import (
    classify_acquire,
    classify_flag,
    fence_tokens,
    handed_already,
    holder_expires_in,
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
        loop = asyncio.new_event_loop()
        try:
            out: asyncio.Future[Reply] = loop.create_future()
        finally:
            loop.close()
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
