"""A round's deadline is not a busy loop's: replies that arrived during a stall of the
loop (in another connection's I/O callback) are read before the round gives up on them.

Every test here runs on both loops (whatever ``ASYNCREDLOCK_TEST_LOOP`` says).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock._liveness import readable
from asyncredlock.testing import client_state

from . import test_loops
from .conftest import Masters
from .test_loops import THREE

# test_loops' fixtures: both loops here (whatever ASYNCREDLOCK_TEST_LOOP says), and
# direct clients to three of the session's servers
anyio_backend = test_loops.anyio_backend
three = test_loops.three

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
ATTEMPTS = 400  # acquisitions tried until one meets the stall


class _Busy(asyncio.Protocol):
    """One end of a ping-pong connection inside this process: other work of the
    application's that runs in the loop's I/O callbacks (as an HTTP server parses
    requests in ``data_received``). Once ``armed()`` is true, its next
    ``data_received`` keeps the loop busy for ``stall`` seconds (CPU-bound work),
    once."""

    def __init__(
        self, armed: Callable[[], bool], stall: float, stalls: list[float], first: bool
    ) -> None:
        self.armed = armed
        self.stall = stall
        self.stalls = stalls  # shared by both ends: one stall in all
        self.first = first
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.first:
            transport.write(b".")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.stalls and self.armed():
            self.stalls.append(self.stall)
            time.sleep(self.stall)  # the application's CPU-bound work, not a wait
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b".")


def _replies_unread(redlock: AsyncRedlock) -> bool:
    """Calls are out to every master (not a PING of the connection's own), and no
    reply has arrived yet (none waits in a socket)."""
    links = [node.link for node in redlock._core.nodes if node.link is not None]
    transports = [link._conn.transport if link._conn else None for link in links]
    return all(client_state(redlock).in_flight) and not any(map(readable, transports))


@pytest.mark.parametrize("step", ["acquire", "extend", "release"])
async def test_a_round_is_not_failed_by_the_loops_own_stall_in_an_io_callback(
    three: Masters, step: str
) -> None:
    """A busy loop is not a slow master (algorithm.md: "A client that is slow (its own
    queue of work) is thus never taken for silent masters"). Here the loop is kept busy
    (0.6 s, CPU-bound) in another connection's ``data_received`` right after a round's
    calls went out, longer than the round's ``max(node_timeout, socket_timeout)`` =
    0.2 s; the masters answer at once, during the stall.

    On asyncio's loop the replies are read before the timers run. On uvloop, after an
    I/O callback, the next iteration runs its timers first: the round's deadline fired
    before the replies were read, and ``acquire()`` raised QuorumUnavailableError,
    ``extend()`` failed and ``release()`` reported too few masters, though the masters
    had carried each out. The deadline now looks again once the loop has read its
    sockets."""
    redlock = AsyncRedlock(three.urls, node_timeout=0.1, socket_timeout=0.2, fencing=False)
    outcomes: list[object] = []
    armed = [False]
    stalls: list[float] = []

    async def one(i: int) -> None:
        lock = redlock.lock(f"stall:deadline:{i}", auto_extend=False, timeout=0)
        lease = None
        try:
            armed[0] = step == "acquire"  # only while the round under test runs
            lease = await lock.acquire()
            armed[0] = False
            if step == "extend":
                armed[0] = True
                await lease.extend()
                armed[0] = False
            armed[0] = step == "release"
            await lease.release()
            armed[0] = False
            outcomes.append(True)
        except Exception as exc:  # recorded and asserted
            armed[0] = False
            outcomes.append(exc)
            if lease is not None and lease.held:
                await lease.release()

    await _with_a_stall(redlock, armed, stalls, one)
    # Every attempt must succeed, the one that met the stall included. (The window, a
    # round's calls out and no reply read yet when the other connection's data comes,
    # is met within a few attempts as a rule; should it never come, as on asyncio's
    # loop, which reads replies fast, nothing failed all the same.)
    left = await three.keys()
    assert (outcomes, left) == ([True] * len(outcomes), [[]] * THREE)


async def _with_a_stall(
    redlock: AsyncRedlock,
    armed: list[bool],
    stalls: list[float],
    one: Callable[[int], Awaitable[None]],
) -> None:
    """Run ``one(i)`` until a round of it met the stall (the first, as a rule), beside
    a ping-pong connection that stalls the loop once ``armed`` while the round's calls
    are out and unanswered; then close ``redlock``."""
    loop = asyncio.get_running_loop()

    def arm() -> bool:
        return armed[0] and _replies_unread(redlock)

    server = await loop.create_server(lambda: _Busy(arm, 0.6, stalls, first=False), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(
        lambda: _Busy(arm, 0.6, stalls, first=True), "127.0.0.1", port
    )
    try:
        with anyio.fail_after(HANG_GUARD):
            warm = await redlock.lock("stall:deadline:warm", auto_extend=False).acquire()
            await warm.release()
            await redlock.settle()
            for i in range(ATTEMPTS):
                await one(i)
                await redlock.settle()
                if stalls:
                    break
    finally:
        transport.close()
        server.close()
        await redlock.aclose()
