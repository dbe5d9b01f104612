"""Waits for replies up to a deadline (a waiter's subscription confirmations, a
semaphore's slot) are not ended by the loop's own stall: a reply that came while the
loop was busy in another I/O callback is read before the wait gives up.

Every test here runs on both loops (whatever ``ASYNCREDLOCK_TEST_LOOP`` says).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import anyio
import pytest

from asyncredlock._wakeup import _wait_for_some

from .. import loops

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome
WITHIN = 0.1  # the wait's bound (node_timeout)
STALL = 0.3  # the loop kept busy, longer than WITHIN


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops here, whatever ``ASYNCREDLOCK_TEST_LOOP`` says."""
    return loops.BACKENDS[request.param]


class _Reply(asyncio.Protocol):
    """A master's connection: its first bytes resolve ``future`` (the reply read)."""

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future

    def data_received(self, data: bytes) -> None:
        if not self.future.done():
            self.future.set_result(None)


class _Busy(asyncio.Protocol):
    """Other work of the application's in an I/O callback: its first bytes make the
    master answer (``answer`` written) and keep the loop busy ``STALL`` seconds."""

    def __init__(self, answer: socket.socket) -> None:
        self.answer = answer

    def data_received(self, data: bytes) -> None:
        self.answer.send(b"+OK\r\n")  # the master answers now, while the loop is busy
        time.sleep(STALL)  # the application's CPU-bound work, not a wait


async def test_a_confirmation_that_came_during_a_stall_is_counted() -> None:
    """On uvloop the next iteration after an I/O callback runs its due timers before
    it polls: the wait's timeout ended it with the confirmation unread in its socket,
    and `_wait_for_some` returned short of ``need``. It now looks again once the loop
    has polled."""
    loop = asyncio.get_running_loop()
    confirmed: asyncio.Future[None] = loop.create_future()
    master, ours = socket.socketpair()
    poke, busy = socket.socketpair()
    transports = []
    try:
        for sock, protocol in ((ours, _Reply(confirmed)), (busy, _Busy(master))):
            transport, _ = await loop.connect_accepted_socket(lambda p=protocol: p, sock)
            transports.append(transport)

        async def wait() -> bool:  # whether the wait ended with the confirmation in
            await _wait_for_some([confirmed], 1, WITHIN)
            return confirmed.done()

        with anyio.fail_after(HANG_GUARD):
            waiting = loop.create_task(wait())
            await asyncio.sleep(0)  # the wait has begun (its timer armed)
            poke.send(b".")  # the busy callback runs at the next poll
            assert await waiting
    finally:
        for transport in transports:
            transport.close()
        for sock in (master, poke):
            sock.close()
