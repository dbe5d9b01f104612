"""A lease extended up to its ``max_hold`` whose validity is then cut below the bound
by a shorter round that fails: it is no longer "extended as far as its bound
allows", so the automatic extender goes on extending it, and it ends at its bound.

Two ways to get there: the caller's ``extend(ttl=...)`` after a successful extension
to the bound (the shorter round cuts the validity as it is sent), and an automatic
round to the bound confirmed after a shorter round was sent (the shorter one caps
it, see test_extend_overlap.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, QuorumUnavailableError
from asyncredlock.testing import ServerGroup, hold_calls
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import polled
from .test_telemetry import Telemetry, cause, installed

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
LOST = "asyncredlock.lease.lost"


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    yield from installed(monkeypatch)


async def _capped_then_cut(redlock: AsyncRedlock, group: ServerGroup) -> Lease:
    """A lease extended up to its max_hold (4 s), then an extend(ttl=0.5) that a
    majority does not answer (paused): its validity is cut to 0.5 s."""
    lease = await redlock.lock("capped-cut", ttl=1, max_hold=4).acquire()
    await lease.extend(30)  # up to its bound: the extender has nothing left to do
    for server in (group[0], group[1]):
        server.pause()
    try:
        with pytest.raises(QuorumUnavailableError):
            await lease.extend(0.5)
    finally:
        for server in (group[0], group[1]):
            server.resume()
    return lease


async def test_a_capped_lease_whose_shorter_extension_failed_is_kept_to_its_bound(
    make_servers: MakeServers, otel: Telemetry
) -> None:
    group = make_servers(3)
    async with AsyncRedlock(group.urls, node_timeout=0.05, socket_timeout=0.2) as redlock:
        with anyio.fail_after(HANG_GUARD):
            lease = await _capped_then_cut(redlock, group)
            assert await lease.wait_lost()
        # one extension (to the bound) before the cut; the extender must extend again
        # (the bound is seconds away, the masters answer again), not give up
        extensions = lease.statistics().extensions
    assert otel.points(LOST) == {cause("max_hold"): 1}
    assert extensions >= 2, "lost at the cut, as if held for its max_hold"


async def test_a_round_to_the_bound_capped_by_a_failed_shorter_one_is_extended_again(
    make_servers: MakeServers, otel: Telemetry
) -> None:
    """ttl 3 s, max_hold 3.5 s: the first automatic round (a second in) reaches the
    bound. While its calls are held back, extend(ttl=2) is sent (its calls held too);
    the automatic round is then confirmed (the validity capped by the shorter round's
    expiry, under the bound), and the shorter round, sent to paused masters, fails.
    The masters answer again: the extender must extend it once more, up to its
    bound, where it ends (cause ``max_hold``)."""
    group = make_servers(3)
    async with AsyncRedlock(group.urls, node_timeout=0.05, socket_timeout=0.5) as redlock:
        lease = await redlock.lock("capped-confirmed", ttl=3, max_hold=3.5).acquire()
        with anyio.fail_after(HANG_GUARD):
            with hold_calls(redlock, "extend") as automatic:
                await automatic.reached.wait()  # the round to the bound is out
                with hold_calls(redlock, "extend") as shorter:
                    shorten = asyncio.create_task(lease.extend(2))
                    await shorter.reached.wait()  # sent after it: it caps its expiry
                    automatic.let_go()
                    assert await polled(lambda: lease.statistics().extensions == 1)
                    for server in group:
                        server.pause()
                    shorter.let_go()  # to masters that do not answer in time
                try:
                    with pytest.raises(QuorumUnavailableError):
                        await shorten
                finally:
                    for server in group:
                        server.resume()
            assert lease.held
            assert await lease.wait_lost()
        extensions = lease.statistics().extensions
    assert otel.points(LOST) == {cause("max_hold"): 1}
    assert extensions >= 2, "lost at the capped expiry, as if held for its max_hold"
