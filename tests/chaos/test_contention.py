"""Faults while several clients contend for one lock, each scenario for plain Redlock
and fenced (see ``test_scenarios.py``): a partition that cuts each client off from a
different minority, a read-write lock's writer frozen past its TTL among readers, a
fair lock's queue lost by a master restart, and a queued waiter killed.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncredlock.testing.pytest_plugin import MakeServers

from .deployment import MODES, NAME, Run, proxied, run, start_workers, take_turns, verdict
from .harness import EVENT_GUARD, handover
from .report import Expected

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", MODES)
async def test_each_client_cut_off_from_a_different_minority(
    make_servers: MakeServers, mode: str
) -> None:
    """Each client reaches the masters through proxies of its own: A is cut off
    (blackhole) from masters 3 and 4, B from masters 0 and 1, so each can reach a
    bare majority and master 2 decides between them. Both take the lock at once, five
    rounds: one holds it at a time, nothing is lost. Healed, one more round."""
    fencing = mode == "fenced"
    async with run(make_servers, 0) as r, proxied(r.masters) as to_a, proxied(r.masters) as to_b:
        await start_workers(r, [to_a, to_b])
        for proxy in (*to_a[3:], *to_b[:2]):
            proxy.blackhole = True
        await take_turns(r.workers, 5, fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        for proxy in (*to_a, *to_b):
            proxy.heal()
        await take_turns(r.workers, 1, fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        outcome = await r.outcome()
    assert outcome.acknowledged == 12
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict(
        "each client cut off from a different minority (A: 3, 4; B: 0, 1)", mode, expected, outcome
    )


@pytest.mark.parametrize("mode", MODES)
async def test_rwlock_writer_frozen_past_its_ttl(make_servers: MakeServers, mode: str) -> None:
    """Read-write lock: writer A reads the counter and freezes (event loop and all)
    past its TTL. Reader R1 takes the read lock once A's key has expired and holds it
    (reading before and after a pause) while reader R2 reads beside it; then writer B
    increments, R2 reads again, and A wakes and writes what it read: as the exclusive
    lock's frozen client (``test_client_paused_past_its_ttl``), readers in between."""
    fencing = mode == "fenced"
    async with run(make_servers, 4) as r:
        a, b, r1, r2 = r.workers
        await a.cycle(fencing=fencing, ttl=0.5, wait=5.0, pause=True, role="writer")
        await a.expect("paused")
        await r1.cycle(fencing=fencing, ttl=10.0, wait=10.0, pause=True, role="reader")
        await r1.expect("paused")  # after A's key expired
        await r2.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False, role="reader")
        await r2.expect("done")  # read while R1 reads
        await r1.send("go")
        await r1.expect("done")
        await b.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False, role="writer")
        await b.expect("done")
        await r2.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False, role="reader")
        await r2.expect("done")
        await a.send("go")
        await a.expect("done")
        outcome = await r.outcome()
    # A believed it held the lock through R1, R2 (twice) and B; R1 and R2 reading
    # together is no overlap (were it counted, it would be one of valid leases too)
    assert outcome.believed == 4
    assert outcome.late_writes == (0 if fencing else 1)
    expected = Expected(
        violation=False, lost_updates=not fencing, rejected=fencing, late_writes=not fencing
    )
    verdict("read-write lock: writer frozen past its TTL, readers between", mode, expected, outcome)


async def _a_master_without_the_key(r: Run) -> int:
    """A master that does not hold the lock's key, if there is one; else master 4."""
    for i in range(len(r.masters)):
        client = r.direct(i)
        held = await client.exists(NAME)
        await client.aclose()
        if not held:
            return i
    return len(r.masters) - 1


@pytest.mark.parametrize("mode", MODES)
async def test_fair_turns_through_a_master_restart(make_servers: MakeServers, mode: str) -> None:
    """Three clients take turns on a fair lock (the masters' queue orders them; the
    waiters' leases extend themselves, so a release hands the key over), six rounds.
    In the third, A holds the lock (frozen) while B and C are queued, and a master is
    killed and restarted empty: its queue is lost. The master is one that does not
    hold A's key, if there is one: losing A's key where A holds a bare majority is
    the known break of ``test_master_crash_restart_without_persistence``, not what
    this scenario is about. Every cycle completes, in turn."""
    fencing = mode == "fenced"
    # the waiters' leases extend themselves: they leave hand-over terms
    turn: dict[str, Any] = {
        "fencing": fencing,
        "ttl": 2.0,
        "pause": False,
        "fair": True,
        "extend": True,
    }
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await take_turns(r.workers, 2, wait=10.0, **turn)
        await a.cycle(fencing=fencing, ttl=60.0, wait=10.0, pause=True, fair=True)
        await a.expect("paused")
        for waiter in (b, c):
            await waiter.cycle(wait=EVENT_GUARD, **turn)
            await waiter.expect("waiting")  # queued on the masters
        r.masters[await _a_master_without_the_key(r)].restart(kill=True)
        await a.send("go")
        for worker in r.workers:
            await worker.expect("done")
        await take_turns(r.workers, 3, wait=10.0, **turn)
        outcome = await r.outcome()
    assert outcome.acknowledged == 18
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("fair lock, 3 clients taking turns, a master restarted empty", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extend", [True, False], ids=["handed", "announced"])
async def test_queued_waiter_killed(make_servers: MakeServers, mode: str, extend: bool) -> None:
    """Fair lock: A holds it (frozen), B and C wait queued on the masters, in that
    order; B's process is SIGKILLed; A releases: C gets the lock. With the waiters'
    leases extending themselves, A's release hands the key to B, dead, for its queue
    entry's TTL; otherwise it announces the release to B, who never hears it, and C
    goes once B's entry has lapsed. The hand-over time is reported, not bounded."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await a.cycle(fencing=fencing, ttl=60.0, wait=10.0, pause=True, fair=True)
        await a.expect("paused")
        for waiter in (b, c):
            await waiter.cycle(
                fencing=fencing, ttl=2.0, wait=EVENT_GUARD, pause=False, fair=True, extend=extend
            )
            await waiter.expect("waiting")  # queued on the masters
        await b.kill()
        await a.send("go")
        await a.expect("done")
        await c.expect("acquired")
        await c.expect("done")
        outcome = await r.outcome()
        outcome.handover.append(handover(r.events(), a.index, c.index))
    assert outcome.acknowledged == 2
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    how = "handed the key" if extend else "announced the release"
    verdict(f"fair lock, a queued waiter SIGKILLed ({how})", mode, expected, outcome)
