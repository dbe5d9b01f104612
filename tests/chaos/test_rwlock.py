"""Faults injected while client processes hold a read-write lock, ``rwlock(NAME)``, as
``test_scenarios.py`` does for the exclusive lock, each scenario for plain and fenced
clients (writers carry a token; readers carry none and read without one): readers
of several processes together with a writer waiting, two masters killed, a master
restarted without persistence while a writer holds, a reader SIGKILLed while it
holds, and a fair lock's arrival order. The checker lets readers overlap each other,
never a writer, and reports the most readers at once (see ``harness.py``). The writer
frozen past its TTL among readers is in ``test_contention.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from asyncredlock.testing.pytest_plugin import MakeServers

from .deployment import MODES, NAME, Run, run, verdict
from .harness import Event, Worker, handover
from .report import Expected

pytestmark = pytest.mark.anyio

QUIET = Expected(violation=False, lost_updates=False, rejected=False)


def scenario(what: str) -> str:
    return f"read-write lock: {what}"


async def hold_paused(worker: Worker, role: str, **cycle: Any) -> Event:
    """``worker`` takes the ``role`` side, reads the counter and freezes (its event
    loop blocked) until sent ``go``; returns its ``acquired``."""
    await worker.cycle(role=role, pause=True, **cycle)
    acquired = await worker.expect("acquired")
    await worker.expect("paused")
    return acquired


async def go(*workers: Worker) -> None:
    """Let each frozen worker finish (a writer writes, a reader reads again) and
    release, in turn."""
    for worker in workers:
        await worker.send("go")
        await worker.expect("done")


async def mixed_turns(
    workers: Sequence[Worker], roles: Sequence[str], rounds: int, **cycle: Any
) -> None:
    """``rounds`` rounds in each of which every worker starts a cycle at once, worker
    ``i`` on side ``roles[i]``; a round ends when every worker is done."""
    for _ in range(rounds):
        for worker, role in zip(workers, roles, strict=True):
            await worker.cycle(role=role, **cycle)
        for worker in workers:
            await worker.expect("done")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("killed", [0, 2], ids=["no-faults", "two-masters-killed"])
async def test_rwlock_readers_together_writer_alone(
    make_servers: MakeServers, mode: str, killed: int
) -> None:
    """``killed`` of the five masters killed first. Readers R1, R2, R3, each its own
    process, hold the read lock at once; writer W waits, and writes once they have
    read again and released. Then two rounds of two readers and two writers
    contending. Readers hold together, a writer alone."""
    fencing = mode == "fenced"
    async with run(make_servers, 4) as r:
        *readers, w = r.workers
        for i in range(len(r.masters) - killed, len(r.masters)):
            r.masters[i].kill()
        for reader in readers:
            await hold_paused(reader, "reader", fencing=fencing, ttl=10.0, wait=10.0)
        await w.cycle(fencing=fencing, ttl=10.0, wait=10.0, pause=False, role="writer")
        await w.expect("waiting")  # the readers hold
        await go(*readers)
        await w.expect("done")
        roles = ("reader", "reader", "writer", "writer")
        await mixed_turns(r.workers, roles, 2, fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        outcome = await r.outcome()
    assert outcome.acknowledged == 5  # W's, and two writers' twice
    assert outcome.believed == 0  # not even as a holder believed: no writer with anyone
    assert (outcome.most_valid, outcome.most_believed) == (3, 3)  # R1, R2, R3 at once
    fault = f"{killed} of 5 masters killed" if killed else "no faults"
    verdict(scenario(f"{fault}, 3 readers at once, writers alone"), mode, QUIET, outcome)


async def _writer_on_three_of_five(r: Run, a: Worker, fencing: bool) -> None:
    """Writer A takes the lock on masters 0, 1, 2 only (3 and 4 hold another writer's
    key, which then expires there) and freezes after reading the counter."""
    others = [r.direct(3), r.direct(4)]
    for client in others:
        await client.set(NAME, "someone else", px=60_000)
    await hold_paused(a, "writer", fencing=fencing, ttl=10.0, wait=0.0)
    for client in others:
        await client.pexpire(NAME, 1)
        await client.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_rwlock_master_restarted_without_persistence(
    make_servers: MakeServers, mode: str
) -> None:
    """Writer A holds the lock on 3 of 5 masters and freezes; master 2 crashes
    (SIGKILL) and restarts empty at once; reader B, then writer C, each take the lock
    on masters 2, 3, 4 while A's lease is valid: the exclusive lock's known break
    (``test_master_crash_restart_without_persistence``), for both sides. A wakes and
    writes what it read: lost for plain clients, refused by the fence (C's token is
    newer) for fenced ones."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        a, b, c = r.workers
        await _writer_on_three_of_five(r, a, fencing)
        r.masters[2].restart(kill=True)
        for worker, role in ((b, "reader"), (c, "writer")):
            await worker.cycle(fencing=fencing, ttl=10.0, wait=2.0, pause=False, role=role)
            await worker.expect("acquired")
            await worker.expect("done")
        await go(a)
        outcome = await r.outcome()
    assert (outcome.overlaps, outcome.believed) == (2, 2)  # A with B, A with C
    expected = Expected(violation=True, lost_updates=not fencing, rejected=fencing)
    verdict(
        scenario("master crash, restart without persistence (a writer holding)"),
        mode,
        expected,
        outcome,
    )


@pytest.mark.parametrize("mode", MODES)
async def test_rwlock_reader_killed(make_servers: MakeServers, mode: str) -> None:
    """Reader R2 holds the read lock; reader R1 takes it too (TTL 1 s) and its process
    is SIGKILLed while it holds it; writer W waits; R2 reads again and releases; W
    gets in once R1's entry has lapsed on the masters (after R1's validity): a dead
    reader holds the lock no longer than its TTL."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        r1, r2, w = r.workers
        await hold_paused(r2, "reader", fencing=fencing, ttl=10.0, wait=10.0)
        r1_acquired = await hold_paused(r1, "reader", fencing=fencing, ttl=1.0, wait=10.0)
        await r1.kill()
        await w.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False, role="writer")
        await w.expect("waiting")
        await go(r2)
        taken = await w.expect("acquired")
        await w.expect("done")
        outcome = await r.outcome()
    assert taken.t > r1_acquired.fields["until"]
    assert (outcome.acknowledged, outcome.believed) == (1, 0)  # W's, after R1 and R2
    assert (outcome.most_valid, outcome.most_believed) == (2, 2)
    verdict(scenario("reader SIGKILLed while holding, a writer waiting"), mode, QUIET, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_rwlock_fair_writer_queued_behind_a_reader(
    make_servers: MakeServers, mode: str
) -> None:
    """``rwlock(NAME, fair=True)``: reader R1 holds the read lock; writer W arrives and
    waits (queued on the masters); reader R2 arrives after W and waits too, though
    only a reader holds: behind W (unfair, it would read at once, W not out of
    patience yet). R1 releases: W writes, then R2 reads. Served in arrival order; the
    hand-over from W to R2 is reported."""
    fencing = mode == "fenced"
    fair: dict[str, Any] = {"fencing": fencing, "wait": 10.0, "pause": False, "fair": True}
    async with run(make_servers, 3) as r:
        r1, w, r2 = r.workers
        await hold_paused(r1, "reader", fencing=fencing, ttl=10.0, wait=10.0, fair=True)
        await w.cycle(ttl=2.0, role="writer", **fair)
        await w.expect("waiting")  # queued on the masters
        await r2.cycle(ttl=2.0, role="reader", **fair)
        await r2.expect("waiting")  # behind W
        await go(r1)
        w_wrote = await w.expect("wrote")
        r2_acquired = await r2.expect("acquired")
        for worker in (w, r2):
            await worker.expect("done")
        outcome = await r.outcome()
        outcome.handover.append(handover(r.events(), w.index, r2.index))
    assert r2_acquired.t > w_wrote.t  # and no overlap: after W's release
    assert (outcome.acknowledged, outcome.believed) == (1, 0)  # W's, alone
    scenario_ = "fair, a writer queued behind a reader, a later reader behind it"
    verdict(scenario(scenario_), mode, QUIET, outcome)
