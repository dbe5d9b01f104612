"""Faults injected while client processes hold slots of a counting semaphore,
``semaphore(NAME, 2)``, as ``test_scenarios.py`` does for a lock: the checker judges
the bound (at most ``limit`` valid leases at once; limit + 1 holders at one moment
is an overlap, see ``harness.py``) and reports the most holders at once.

Slot leases carry no fencing token, so each scenario runs for plain clients only; a
holder increments the counter with ``INCR`` (holders at once lose nothing of each
other's), so a scenario expects no lost update. Where the bound is expected to break
(a master restarted without persistence), the test asserts the break is observed;
where only belief passes it (a holder paused past its TTL), that this is observed.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncredlock._keys import aux_key  # the slots' keys, {K}:sem:<i>
from asyncredlock.testing.pytest_plugin import MakeServers

from .deployment import NAME, Run, run, take_turns, verdict
from .harness import EVENT_GUARD, Event, Worker, handover
from .report import Expected

pytestmark = pytest.mark.anyio

LIMIT = 2
SLOTS = tuple(aux_key(NAME, f"sem:{i}") for i in range(LIMIT))
MODE = "plain"  # no token: a semaphore's leases have none
#: A cycle's settings: a slot of the semaphore, no token.
SLOT: dict[str, Any] = {"fencing": False, "limit": LIMIT}


def scenario(what: str) -> str:
    return f"semaphore (limit {LIMIT}): {what}"


async def hold_paused(worker: Worker, ttl: float, wait: float = 10.0, fair: bool = False) -> Event:
    """``worker`` takes a slot, reads the counter and freezes (its event loop
    blocked) until sent ``go``; returns its ``acquired``."""
    await worker.cycle(ttl=ttl, wait=wait, pause=True, fair=fair, **SLOT)
    acquired = await worker.expect("acquired")
    await worker.expect("paused")
    return acquired


async def go(*workers: Worker) -> None:
    """Let each frozen worker write and release, in turn."""
    for worker in workers:
        await worker.send("go")
        await worker.expect("done")


@pytest.mark.parametrize("killed", [0, 2], ids=["no-faults", "two-masters-killed"])
async def test_semaphore_limit_reached(make_servers: MakeServers, killed: int) -> None:
    """Three clients, limit 2, with ``killed`` of the five masters killed first: A and
    B hold both slots while C waits; A releases and C takes its slot, B holding; then
    two rounds of all three contending. Two leases at once, never three."""
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        for i in range(len(r.masters) - killed, len(r.masters)):
            r.masters[i].kill()
        await hold_paused(a, ttl=10.0)
        await hold_paused(b, ttl=10.0)
        await c.cycle(ttl=10.0, wait=10.0, pause=False, **SLOT)
        await c.expect("waiting")  # both slots held
        await go(a)
        await c.expect("done")
        await go(b)
        await take_turns(r.workers, 2, ttl=2.0, wait=10.0, pause=False, **SLOT)
        outcome = await r.outcome()
    assert outcome.acknowledged == 9
    assert (outcome.most_valid, outcome.most_believed) == (LIMIT, LIMIT)
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    fault = f"{killed} of 5 masters killed" if killed else "no faults"
    verdict(scenario(fault), MODE, expected, outcome)


async def test_semaphore_holder_paused_past_its_ttl(make_servers: MakeServers) -> None:
    """A takes a slot (TTL 0.5 s), reads and freezes past its TTL; B holds the other
    slot; C takes A's slot once A's keys expire and increments; B releases; A wakes
    and increments, late. Three believed they held a slot at once; never more than
    two leases were valid: as a lock's frozen client, with the limit for one."""
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await hold_paused(a, ttl=0.5)
        await hold_paused(b, ttl=10.0)
        await c.cycle(ttl=2.0, wait=10.0, pause=False, **SLOT)
        await c.expect("done")  # after A's keys expired
        await go(b, a)
        outcome = await r.outcome()
    assert (outcome.believed, outcome.most_believed, outcome.most_valid) == (1, 3, 2)
    assert outcome.late_writes == 1  # A's
    expected = Expected(violation=False, lost_updates=False, rejected=False, late_writes=True)
    verdict(scenario("holder paused past its TTL (process frozen)"), MODE, expected, outcome)


async def _fill_slots(r: Run, masters: tuple[int, ...]) -> None:
    """Every slot taken on ``masters`` by someone else, for a minute."""
    for i in masters:
        client = r.direct(i)
        for key in SLOTS:
            await client.set(key, "someone else", px=60_000)
        await client.aclose()


async def _free_slots(r: Run, masters: tuple[int, ...]) -> None:
    """What `_fill_slots` took expires (at once)."""
    for i in masters:
        client = r.direct(i)
        for key in SLOTS:
            await client.pexpire(key, 1)
        await client.aclose()


async def test_semaphore_master_restarted_without_persistence(make_servers: MakeServers) -> None:
    """A and B each take a slot on masters 0, 1, 2 only (3 and 4 hold both slots for
    someone else, which then expires there) and freeze; master 2 crashes (SIGKILL) and
    restarts empty at once; C takes a slot on masters 2, 3, 4 while A's and B's
    leases are valid: three valid at once, two on one slot. The bound breaks as a
    lock's exclusion does (``test_master_crash_restart_without_persistence``)."""
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await _fill_slots(r, (3, 4))
        held = {(await hold_paused(w, ttl=10.0, wait=0.0)).fields["key"] for w in (a, b)}
        await _free_slots(r, (3, 4))
        r.masters[2].restart(kill=True)
        await c.cycle(ttl=10.0, wait=2.0, pause=False, **SLOT)
        taken = await c.expect("acquired")
        await c.expect("done")
        await go(b, a)
        outcome = await r.outcome()
    assert held == set(SLOTS)
    assert taken.fields["key"] in held  # a slot A or B held, on a quorum of its own
    assert (outcome.overlaps, outcome.most_valid) == (1, 3)
    expected = Expected(violation=True, lost_updates=False, rejected=False)
    verdict(scenario("master crash, restart without persistence"), MODE, expected, outcome)


async def test_semaphore_holder_killed(make_servers: MakeServers) -> None:
    """B holds a slot; A takes the other (TTL 1 s) and its process is SIGKILLed while
    it holds it; C waits, and takes A's slot once A's keys expire (after A's
    validity): a dead holder's slot comes back with its TTL. B releases."""
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await hold_paused(b, ttl=10.0)
        a_acquired = await hold_paused(a, ttl=1.0)
        await a.kill()
        await c.cycle(ttl=2.0, wait=10.0, pause=False, **SLOT)
        taken = await c.expect("acquired")
        await c.expect("done")
        await go(b)
        outcome = await r.outcome()
    assert taken.fields["key"] == a_acquired.fields["key"]
    assert taken.t > a_acquired.fields["until"]
    assert outcome.acknowledged == 2  # B's and C's
    assert outcome.most_valid == LIMIT
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict(scenario("holder SIGKILLed while holding"), MODE, expected, outcome)


async def test_semaphore_fair_waiter_killed_while_queued(make_servers: MakeServers) -> None:
    """``semaphore(NAME, 2, fair=True)``: A and B hold both slots; C, then D, wait
    queued on the masters; C's process is SIGKILLed; A releases: D, second in the
    queue, takes the free slot once C's entry has lapsed (a dead waiter holds up the
    queue for its entry's life, about a second). B releases; then a round of A, B and
    D: nothing is stuck. The hand-over from A to D is reported, not bounded."""
    turn: dict[str, Any] = {"pause": False, "fair": True, **SLOT}
    async with run(make_servers, 4) as r:
        a, b, c, d = r.workers
        for holder in (a, b):
            await hold_paused(holder, ttl=10.0, fair=True)
        for waiter in (c, d):
            await waiter.cycle(ttl=2.0, wait=EVENT_GUARD, **turn)
            await waiter.expect("waiting")  # queued on the masters, C first
        await c.kill()
        await go(a)
        await d.expect("acquired")
        await d.expect("done")
        handed = handover(r.events(), a.index, d.index)  # before A writes again
        await go(b)
        await take_turns([a, b, d], 1, ttl=2.0, wait=10.0, **turn)
        outcome = await r.outcome()
        outcome.handover.append(handed)
    assert outcome.acknowledged == 6  # A's, B's, D's, then a round of the three
    assert outcome.most_valid == LIMIT
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict(scenario("fair, a queued waiter SIGKILLed"), MODE, expected, outcome)


async def test_semaphore_holder_sigstopped_while_its_lease_extends_itself(
    make_servers: MakeServers,
) -> None:
    """A holds a slot in ``async with`` (TTL 0.5 s, extending itself) and its process
    is stopped (SIGSTOP) after reading; B holds the other slot; C takes A's slot once
    A's key expires and increments; A is continued (SIGCONT): its lease reports itself
    lost and its block is cancelled before it increments. B releases. As a lock's
    stopped client (``test_client_process_sigstopped_past_its_ttl``): never more than
    two leases valid, nor believed (A's critical section ended with its read)."""
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await a.cycle(ttl=0.5, wait=5.0, pause=False, hold=True, **SLOT)
        a_acquired = await a.expect("acquired")
        await a.expect("read")
        a.freeze()
        try:
            await hold_paused(b, ttl=10.0)
            await c.cycle(ttl=2.0, wait=10.0, pause=False, **SLOT)
            taken = await c.expect("acquired")
            await c.expect("done")  # after A's key expired
        finally:
            a.thaw()
        await a.expect("lost")
        await a.expect("done")
        await go(b)
        outcome = await r.outcome()
    assert taken.fields["key"] == a_acquired.fields["key"]
    assert outcome.acknowledged == 2  # B's and C's; A never incremented
    assert len(outcome.detection) == 1
    assert (outcome.most_valid, outcome.most_believed) == (LIMIT, LIMIT)
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    what = "holder SIGSTOPped past its TTL, lease extending itself"
    verdict(scenario(what), MODE, expected, outcome)
