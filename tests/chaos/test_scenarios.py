"""Faults injected while client processes run, each scenario for plain Redlock and
fenced: what the checker observes against what is expected (see ``harness.py``).

Where plain Redlock is expected to break (a client paused past its TTL, a master
restarted without persistence), the test asserts the break is *observed* for plain
clients, so the harness is shown able to see it, and that the fenced resource loses
nothing. Every outcome is recorded for the results table (``report.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from asyncredlock.testing import FakeClock
from asyncredlock.testing.pytest_plugin import MakeServers

from .deployment import MODES, NAME, Run, proxied, run, start_workers, take_turns, verdict
from .harness import Outcome
from .report import Expected

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", MODES)
async def test_no_faults(make_servers: MakeServers, mode: str) -> None:
    """Three clients contend for the lock, three cycles each, nothing fails."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        await take_turns(r.workers, 3, fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        outcome = await r.outcome()
    assert outcome.acknowledged == 9
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("no faults", mode, expected, outcome)


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
    expected = Expected(
        violation=False, lost_updates=not fencing, rejected=fencing, late_writes=not fencing
    )
    verdict("client paused past its TTL (process frozen)", mode, expected, outcome)


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
    make_servers: MakeServers,
    mode: str,
    *,
    appendonly: bool,
    restart: Callable[[Run], None],
    fake_clock: bool = False,
) -> Outcome:
    fencing = mode == "fenced"
    async with run(make_servers, 2, appendonly=appendonly, fake_clock=fake_clock) as r:
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
    verdict("master crash, restart without persistence", mode, expected, outcome)


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
    verdict("master crash, restart with appendfsync always", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", ["killed", "paused"])
async def test_two_of_five_masters_down(make_servers: MakeServers, mode: str, fault: str) -> None:
    """Two masters killed (or frozen) before the clients start: the three left are a
    majority; every cycle completes and nothing overlaps."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        for server in (r.masters[3], r.masters[4]):
            server.kill() if fault == "killed" else server.pause()
        await take_turns(r.workers, 2, fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        outcome = await r.outcome()
        for server in (r.masters[3], r.masters[4]):
            if server.paused:
                server.resume()
    assert outcome.acknowledged == 6
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict(f"2 of 5 masters {fault}", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_client_frozen_while_its_lease_extends_itself(
    make_servers: MakeServers, mode: str
) -> None:
    """As above, but A holds the lock in ``async with`` (extending itself): when A
    wakes, its lease reports itself lost and its block is cancelled before it
    writes."""
    fencing = mode == "fenced"
    async with run(make_servers, 2) as r:
        a, b = r.workers
        await a.cycle(fencing=fencing, ttl=0.5, wait=5.0, pause=True, hold=True)
        await a.expect("paused")
        await b.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        await b.expect("done")  # after A's keys expired
        await a.send("go")
        await a.expect("lost")
        await a.expect("done")
        outcome = await r.outcome()
    assert outcome.acknowledged == 1  # B's; A never wrote
    assert len(outcome.detection) == 1
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("client frozen past its TTL, lease extending itself", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_majority_of_masters_frozen_while_held(make_servers: MakeServers, mode: str) -> None:
    """A holds the lock in ``async with``; three of five masters freeze (SIGSTOP), so
    no extension can reach a quorum: the lease reports itself lost when its validity
    ends, and its block is cancelled before it writes."""
    fencing = mode == "fenced"
    async with run(make_servers, 1) as r:
        (a,) = r.workers
        await a.cycle(fencing=fencing, ttl=1.0, wait=5.0, pause=False, hold=True)
        await a.expect("read")
        frozen = [r.masters[i] for i in (0, 1, 2)]
        for server in frozen:
            server.pause()
        try:
            await a.expect("lost")
        finally:
            for server in frozen:
                server.resume()
        await a.expect("done")
        outcome = await r.outcome()
    assert outcome.acknowledged == 0
    assert len(outcome.detection) == 1
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("3 of 5 masters frozen while held (auto-extension)", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_cancellation_at_random_points(make_servers: MakeServers, mode: str) -> None:
    """Three clients, twenty cycles each, two thirds of them cancelled after a random
    0 to 5 ms (seeded) unless done by then, wherever they are: no overlap, no lost
    update, nothing left on the masters without an expiry."""
    fencing = mode == "fenced"
    async with run(make_servers, 3) as r:
        for seed, worker in enumerate(r.workers):
            spec = {"cmd": "churn", "fencing": fencing, "ttl": 2.0, "cycles": 20, "seed": seed}
            await worker.send(json.dumps(spec))
        for worker in r.workers:
            await worker.expect("done")
        outcome = await r.outcome()
        cancelled = sum(e.kind == "cancelled" for w in r.workers for e in w.events)
    assert cancelled > 0  # cycles were cut short
    assert outcome.acknowledged > 0  # and some got as far as their write
    expected = Expected(violation=False, lost_updates=False, rejected=None)
    verdict("cancellation at random points (60 cycles)", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.usefixtures("fake_clock_available")  # not with Debian's redis-server
async def test_clock_jump_on_one_master(make_servers: MakeServers, mode: str) -> None:
    """Kleppmann's example: A holds 3 of 5; master 2's wall clock jumps a minute
    forward (libfaketime), so A's key there expires at once; B takes masters 2, 3, 4
    while A's lease is valid."""

    def jump(r: Run) -> None:
        r.masters[2].clock.jump(60.0)

    outcome = await _crash_scenario(
        make_servers, mode, appendonly=False, restart=jump, fake_clock=True
    )
    expected = Expected(violation=True, lost_updates=mode == "plain", rejected=mode == "fenced")
    verdict("clock jump (+60 s) on one master", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_master_crash_restart_delayed_past_the_ttl(
    make_servers: MakeServers, mode: str
) -> None:
    """A holds 3 of 5 in ``async with``; master 2 crashes. A's extensions reach only
    masters 0 and 1, so its lease reports itself lost when its validity ends, and only
    then does master 2 come back (empty): the delayed restart. B then takes the lock;
    nothing overlaps and A never writes."""
    fencing = mode == "fenced"
    async with run(make_servers, 2) as r:
        a, b = r.workers
        others = [r.direct(3), r.direct(4)]
        for client in others:
            await client.set(NAME, "someone else", px=60_000)
        await a.cycle(fencing=fencing, ttl=1.0, wait=0.0, pause=False, hold=True)
        await a.expect("read")
        r.masters[2].kill()
        for client in others:
            await client.pexpire(NAME, 1)
            await client.aclose()
        await a.expect("lost")  # at the end of its validity: the restart waits for it
        r.masters[2].start()
        await b.cycle(fencing=fencing, ttl=2.0, wait=5.0, pause=False)
        await b.expect("done")
        await a.expect("done")
        outcome = await r.outcome()
    assert outcome.acknowledged == 1  # B's
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    scenario = "master crash, restart delayed past the TTL (lease extending itself)"
    verdict(scenario, mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_client_wall_clocks_jump(
    make_servers: MakeServers, tmp_path: Path, mode: str
) -> None:
    """Both clients' wall clocks jump a minute (A forward, B back; libfaketime, the
    monotonic clock untouched) while A holds the lock in ``async with`` and B waits
    for it: validity is measured on the monotonic clock, so nothing changes."""
    fencing = mode == "fenced"
    clocks = [FakeClock(tmp_path / "a"), FakeClock(tmp_path / "b")]
    async with run(make_servers, 2, clocks=clocks) as r:
        a, b = r.workers
        assert all(clock.loaded_by(w.pid) for clock, w in zip(clocks, r.workers, strict=True))
        await a.cycle(fencing=fencing, ttl=0.6, wait=5.0, pause=False, hold=True)
        await a.expect("read")
        clocks[0].jump(60.0)
        clocks[1].jump(-60.0)
        await b.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        await a.expect("done")
        await b.expect("done")
        outcome = await r.outcome()
    assert outcome.acknowledged == 2
    assert outcome.detection == []  # A's lease was never lost
    # A wrote five TTLs in, on validity its extensions granted: not a late write
    assert any(e.kind == "extended" for e in a.events)
    assert outcome.late_writes == 0
    # the jumps took effect: B acquired with its wall clock a minute behind A's
    (b_acquired,) = [e for e in b.events if e.kind == "acquired"]
    (a_done,) = [e for e in a.events if e.kind == "done"]
    assert a_done.fields["wall"] - b_acquired.fields["wall"] > 100
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("client wall clocks jumped (+60 s, -60 s) while held", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_replies_delayed_past_the_ttl(make_servers: MakeServers, mode: str) -> None:
    """Every master's replies take longer than A's TTL (a 0.4 s delay each way): A
    gets no lock (its validity would be used up on arrival); once the delay is gone,
    B takes it. Nothing is left behind by A's attempt."""
    fencing = mode == "fenced"
    async with run(make_servers, 0) as r, proxied(r.masters) as proxies:
        await start_workers(r, [proxies] * 2)
        a, b = r.workers
        for proxy in proxies:
            proxy.delay = 0.4
        await a.cycle(fencing=fencing, ttl=0.5, wait=0.0, pause=False)
        failed = await a.expect("failed")
        await a.expect("done")
        for proxy in proxies:
            proxy.heal()
        await b.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        await b.expect("done")
        outcome = await r.outcome()
    assert failed.fields["error"] in ("LockTimeoutError", "QuorumUnavailableError")
    assert outcome.acknowledged == 1  # B's
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("replies delayed past the TTL (0.4 s each way, TTL 0.5 s)", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_flapping_partition_of_two_masters(make_servers: MakeServers, mode: str) -> None:
    """Two of five masters are cut off and reconnected every 30 ms (60 times) while
    three clients take turns: the three others are always a majority; every cycle
    completes, nothing overlaps."""
    fencing = mode == "fenced"
    async with run(make_servers, 0) as r, proxied(r.masters) as proxies:
        await start_workers(r, [proxies] * 3)
        async with anyio.create_task_group() as tg:

            async def flap() -> None:
                for i in range(60):
                    for proxy in proxies[3:]:
                        proxy.blackhole = i % 2 == 0
                    await anyio.sleep(0.03)  # the fault's own rhythm, nothing awaited
                for proxy in proxies[3:]:
                    proxy.heal()

            tg.start_soon(flap)
            await take_turns(r.workers, 3, fencing=fencing, ttl=2.0, wait=10.0, pause=False)
        outcome = await r.outcome()
    assert outcome.acknowledged == 9
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict("2 of 5 masters partitioned, flapping every 30 ms", mode, expected, outcome)


@pytest.mark.parametrize("mode", MODES)
async def test_client_process_sigstopped_past_its_ttl(make_servers: MakeServers, mode: str) -> None:
    """A holds the lock in ``async with`` (extending itself) and its process is
    stopped (SIGSTOP) after reading; B takes the lock once A's keys expire and
    increments; A is continued (SIGCONT): its lease reports itself lost and the block
    is cancelled before it writes."""
    fencing = mode == "fenced"
    async with run(make_servers, 2) as r:
        a, b = r.workers
        await a.cycle(fencing=fencing, ttl=0.5, wait=5.0, pause=False, hold=True)
        await a.expect("read")
        a.freeze()
        try:
            await b.cycle(fencing=fencing, ttl=2.0, wait=10.0, pause=False)
            await b.expect("done")  # after A's keys expired
        finally:
            a.thaw()
        await a.expect("lost")
        await a.expect("done")
        outcome = await r.outcome()
    assert outcome.acknowledged == 1  # B's; A never wrote
    assert len(outcome.detection) == 1
    expected = Expected(violation=False, lost_updates=False, rejected=False)
    verdict(
        "client process SIGSTOPped past its TTL, lease extending itself", mode, expected, outcome
    )
