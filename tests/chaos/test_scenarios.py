"""Faults injected while client processes run, each scenario for plain Redlock and
fenced: what the checker observes against what is expected (see ``harness.py``).

Where plain Redlock is expected to break (a client paused past its TTL, a master
restarted without persistence), the test asserts the break is *observed* for plain
clients, so the harness is shown able to see it, and that the fenced resource loses
nothing. Every outcome is recorded for the results table (``report.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .harness import Outcome, Worker, check
from .report import Expected, record
from .worker import COUNTER

pytestmark = pytest.mark.anyio

NAME = "chaos:lock"
MODES = ("plain", "fenced")


@dataclass
class Run:
    """One scenario's servers and clients."""

    masters: ServerGroup
    resource: Redis
    resource_url: str
    workers: list[Worker]

    async def final(self) -> int:
        return int(await self.resource.get(COUNTER) or 0)

    async def outcome(self) -> Outcome:
        return check([e for w in self.workers for e in w.events], await self.final())

    def direct(self, i: int) -> Redis:
        return Redis.from_url(self.masters.urls[i])


@asynccontextmanager
async def run(
    make_servers: MakeServers, workers: int, *, appendonly: bool = False
) -> AsyncIterator[Run]:
    masters = make_servers(5, appendonly=appendonly)
    resource_url = make_servers(1).urls[0]
    resource = Redis.from_url(resource_url)
    started: list[Worker] = []
    try:
        for i in range(workers):
            started.append(await Worker.start(i, masters.urls, resource_url, NAME))
        yield Run(masters, resource, resource_url, started)
    finally:
        for worker in started:
            await worker.close()
        await resource.aclose()


def expect(outcome: Outcome, expected: Expected) -> None:
    """The observed outcome matches what the scenario expects."""
    assert outcome.violated == expected.violation, outcome
    assert (outcome.lost_updates > 0) == expected.lost_updates, outcome
    assert (outcome.rejected_writes > 0) == expected.rejected, outcome
    assert outcome.token_regressions == 0, outcome


@pytest.mark.parametrize("mode", MODES)
async def test_no_faults(make_servers: MakeServers, mode: str) -> None:
    """Three clients contend for the lock, three cycles each, nothing fails."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        for _ in range(3):
            for worker in r.workers:
                await worker.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
            for worker in r.workers:
                await worker.expect("done")
        outcome = await r.outcome()
    assert outcome.acknowledged == 9
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    record("no faults", mode, expected, outcome)
    expect(outcome, expected)


@pytest.mark.parametrize("mode", MODES)
async def test_client_paused_past_its_ttl(make_servers: MakeServers, mode: str) -> None:
    """A reads the counter and freezes (event loop and all) past its TTL; B takes the
    lock and increments; A wakes and writes what it read."""
    fencing = mode == "fenced"
    async with run(make_servers, 2) as r:
        a, b = r.workers
        await a.cycle(fencing=fencing, ttl=0.5, wait=5.0, pause=True)
        await a.expect("paused")
        await b.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        await b.expect("done")  # after A's keys expired
        await a.send("go")
        await a.expect("done")
        outcome = await r.outcome()
    # validity never overlaps (A's ended before B's began); belief does
    assert outcome.believed == 1
    assert outcome.late_writes == (0 if fencing else 1)
    expected = Expected(violation=False, lost_updates=not fencing, rejected=fencing)
    record("client paused past its TTL (process frozen)", mode, expected, outcome)
    expect(outcome, expected)


async def _a_on_three_of_five(r: Run, fencing: bool) -> None:
    """A takes the lock on masters 0, 1, 2 only (3 and 4 hold another value, which
    then expires there) and freezes after reading the counter."""
    a = r.workers[0]
    others = [r.direct(3), r.direct(4)]
    for client in others:
        await client.set(NAME, "someone else", px=60_000)
    await a.cycle(fencing=fencing, ttl=10.0, wait=0.0, pause=True)
    await a.expect("paused")
    for client in others:
        await client.pexpire(NAME, 1)
        await client.aclose()


async def _crash_scenario(
    make_servers: MakeServers, mode: str, *, appendonly: bool, restart: Callable[[Run], None]
) -> Outcome:
    fencing = mode == "fenced"
    async with run(make_servers, 2, appendonly=appendonly) as r:
        a, b = r.workers
        await _a_on_three_of_five(r, fencing)
        restart(r)
        await b.cycle(fencing=fencing, ttl=10.0, wait=2.0, pause=False)
        await b.expect("done")
        await a.send("go")
        await a.expect("done")
        return await r.outcome()


@pytest.mark.parametrize("mode", MODES)
async def test_master_crash_restart_without_persistence(
    make_servers: MakeServers, mode: str
) -> None:
    """A holds 3 of 5; master 2 crashes (SIGKILL) and restarts empty at once; B takes
    masters 2, 3, 4 while A's lease is valid: Redlock's known break."""

    def crash(r: Run) -> None:
        r.masters[2].restart(kill=True)

    outcome = await _crash_scenario(make_servers, mode, appendonly=False, restart=crash)
    expected = Expected(violation=True, lost_updates=mode == "plain", rejected=mode == "fenced")
    record("master crash, restart without persistence", mode, expected, outcome)
    expect(outcome, expected)


@pytest.mark.parametrize("mode", MODES)
async def test_master_crash_restart_with_appendfsync_always(
    make_servers: MakeServers, mode: str
) -> None:
    """The same crash with ``appendonly yes``, ``appendfsync always``: master 2 comes
    back with A's key, B finds no majority and gives up."""

    def crash(r: Run) -> None:
        r.masters[2].restart(kill=True)

    outcome = await _crash_scenario(make_servers, mode, appendonly=True, restart=crash)
    assert outcome.acknowledged == 1  # only A's
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    record("master crash, restart with appendfsync always", mode, expected, outcome)
    expect(outcome, expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", ["killed", "paused"])
async def test_two_of_five_masters_down(make_servers: MakeServers, mode: str, fault: str) -> None:
    """Two masters killed (or frozen) before the clients start: the three left are a
    majority; every cycle completes and nothing overlaps."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        for server in (r.masters[3], r.masters[4]):
            server.kill() if fault == "killed" else server.pause()
        for _ in range(2):
            for worker in r.workers:
                await worker.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
            for worker in r.workers:
                await worker.expect("done")
        outcome = await r.outcome()
        for server in (r.masters[3], r.masters[4]):
            if server.paused:
                server.resume()
    assert outcome.acknowledged == 6
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    record(f"2 of 5 masters {fault}", mode, expected, outcome)
    expect(outcome, expected)
