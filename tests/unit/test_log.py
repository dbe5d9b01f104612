"""What the log says of a master's refused idle PING, and of a lease taken after
waiting."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import ResponseError

from asyncredlock import _log
from asyncredlock._log import log_acquired, log_ping_refused
from asyncredlock._wire import Reply


def _answered(error: Exception | None) -> asyncio.Future[Reply]:
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[Reply] = loop.create_future()
        future.set_result(Reply(b"PONG") if error is None else Reply(error=error))
        return future
    finally:
        loop.close()


def test_a_ping_refused_by_the_acl_is_logged_once_per_master(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    refused = ResponseError("NOPERM User idler has no permissions to run the 'ping' command")
    for master in ("redis://log-a:1", "redis://log-a:1", "redis://log-b:1"):
        log_ping_refused(master, _answered(refused))
    assert [r.getMessage().split(" refuses")[0] for r in caplog.records] == [
        "master redis://log-a:1",
        "master redis://log-b:1",
    ]


@pytest.mark.parametrize(
    "error",
    [
        None,
        ResponseError("BUSY Valkey is busy running a script."),
        ResponseError("LOADING Valkey is loading the dataset in memory"),
        ConnectionError("connection lost"),
    ],
)
def test_a_ping_answered_otherwise_is_not_taken_for_a_refusal(
    caplog: pytest.LogCaptureFixture, error: Exception | None
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    log_ping_refused("redis://log-c:1", _answered(error))
    assert caplog.records == []


class _Lease:
    resource = "waited-for"
    value = "web-1:abc"
    token = 7
    _holder = None


def test_a_waited_acquisition_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncredlock")
    log_acquired(_Lease(), 3, 0.25)
    (record,) = caplog.records
    assert record.getMessage() == "acquired 'waited-for' after waiting (waited 0.250 s, 3 attempts)"
    assert (record.__dict__["resource"], record.__dict__["token"]) == ("waited-for", 7)


def test_a_waited_acquisition_builds_nothing_when_info_is_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")

    def built(*_: object) -> dict[str, object]:
        raise AssertionError("the record's fields were built with INFO off")

    monkeypatch.setattr(_log, "_facts", built)
    log_acquired(_Lease(), 3, 0.25)
    assert caplog.records == []
