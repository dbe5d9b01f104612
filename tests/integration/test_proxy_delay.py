"""`FaultProxy.delay` holds every chunk at least that long, on either loop.

Every test here runs on both loops (whatever ``ASYNCREDLOCK_TEST_LOOP`` says).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import anyio
import pytest

from asyncredlock.testing import FaultProxy, ServerGroup

from .. import loops

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
PINGS = 200  # round trips through the proxy


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops here, whatever ``ASYNCREDLOCK_TEST_LOOP`` says."""
    return loops.BACKENDS[request.param]


async def test_a_fault_proxy_delay_holds_each_chunk_at_least_that_long(
    servers: ServerGroup,
) -> None:
    """`FaultProxy.delay`: "seconds added in each direction (a round trip gains
    ``2 * delay``)". A lower bound, whatever the host's load: no chunk may be forwarded
    before it was held ``delay``. On uvloop round trips came back in less than
    ``2 * delay`` (1.16 ms for 2 x 1.4 ms): chunks were stamped with ``loop.time()``
    (uvloop: whole milliseconds, floored) and held by one ``asyncio.sleep`` (uvloop:
    rounded to whole milliseconds)."""
    delay = 0.0014
    async with FaultProxy(servers[0].host, servers[0].port) as proxy:
        proxy.delay = delay
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        shortest = math.inf
        try:
            with anyio.fail_after(HANG_GUARD):
                for _ in range(PINGS):
                    start = time.monotonic()
                    writer.write(b"PING\r\n")
                    assert await reader.readline() == b"+PONG\r\n"
                    shortest = min(shortest, time.monotonic() - start)
        finally:
            writer.close()
    assert shortest >= 2 * delay, f"a round trip of {shortest * 1000:.2f} ms"
