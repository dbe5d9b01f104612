"""The fault-injection harness: client processes, their history, and the checker.

Each `Worker` is a separate OS process (``worker.py``) that can be paused; the test
injects faults at the points where a worker reports it is ready (``paused``), then
lets it go. Every event carries ``time.monotonic()``, one clock for every process on
the machine, so the history of all workers can be merged and checked:

- **overlaps**: two holders whose critical sections (from the acquisition to the
  last access to the resource) overlapped while both leases were *valid*: the
  guarantee Redlock makes; and two holders whose critical sections overlapped at all,
  as each *believed* it held the lock. Readers of a read-write lock may overlap each
  other, never a writer; the most readers holding at one moment, valid and believed,
  is reported (`most_valid`, `most_believed`), showing they did. Holders of a counting
  semaphore's slots may overlap up to its ``limit`` (their ``acquired`` says it): each
  group of ``limit + 1`` of them holding at one moment is an overlap, valid or
  believed, and the most at once of each kind is reported (the same fields);
- **lost updates**: increments the resource acknowledged, minus what the counter holds;
- **late writes**: writes the resource accepted after the writer's validity ended;
- **token order**: tokens of the accepted writes, in time order, never going back;
- **orphan keys**: keys the clients left on the masters with no expiry;
- **detection**: for a lease reported lost, how long after its holder could know
  (it resumed from a pause, or its validity ended) the report came;
- **hand-over** (`handover`, asked for by a scenario): how long after one holder's
  last write the next one acquired.

*Valid* means within the validity in force at that moment: the end of validity the
library reported at the acquisition, then the one each successful extension granted
(``extended``, reported as it takes effect), each in force from when it was granted.
A lease extending itself is thus measured over its whole hold, not its first TTL; an
extension granted only after the validity before it had ended leaves the time between
not valid. A holder whose process was SIGKILLed (`Worker.kill`) held until the kill.

Every process is bounded: a worker that does not report within `EVENT_GUARD` seconds
fails the test, and `Worker.close()` kills what remains.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anyio
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

WORKER = Path(__file__).with_name("worker.py")
#: Every worker process started, for the check that none outlives its test.
STARTED: list[Process] = []
EVENT_GUARD = 30.0  # seconds a worker may take to report; only stops a hung run


@dataclass(frozen=True)
class Event:
    """One line a worker reported."""

    worker: int
    kind: str
    t: float
    fields: dict[str, Any]


class Worker:
    """One client process; `events` is its history so far."""

    def __init__(self, index: int, process: Process) -> None:
        self.index = index
        self.process = process
        self.events: list[Event] = []
        self._lines = TextReceiveStream(process.stdout) if process.stdout else None
        self._buffer = ""

    @classmethod
    async def start(
        cls,
        index: int,
        masters: list[str],
        resource: str,
        name: str,
        env: Mapping[str, str] | None = None,
    ) -> Worker:
        """Start worker ``index`` (in ``env``, e.g. on a `FakeClock`)."""
        command = [sys.executable, str(WORKER), ",".join(masters), resource, name]
        process = await anyio.open_process(command, stderr=subprocess.PIPE, env=env)
        STARTED.append(process)
        worker = cls(index, process)
        await worker.expect("ready")
        return worker

    @property
    def pid(self) -> int:
        return self.process.pid

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((line + "\n").encode())

    async def cycle(
        self,
        *,
        fencing: bool,
        ttl: float,
        wait: float,
        pause: bool,
        hold: bool = False,
        role: str = "exclusive",
        fair: bool = False,
        extend: bool = False,
        limit: int | None = None,
    ) -> None:
        """Start one lock cycle, whose ``acquire()`` waits up to ``wait`` seconds (it
        reports as it goes: see `expect`); with ``hold``, inside ``async with``, the
        lease extending itself. ``role``, ``fair``, ``extend`` (a cycle's lease
        extending itself) and ``limit`` (a semaphore's slot instead of a lock, with
        ``fencing`` false) are described in ``worker.py``."""
        spec = {"fencing": fencing, "ttl": ttl, "timeout": wait, "pause": pause}
        options = {"role": role, "fair": fair, "extend": extend, "limit": limit}
        command = "hold" if hold else "cycle"
        await self.send(json.dumps({"cmd": command, **spec, **options}))

    async def expect(self, kind: str) -> Event:
        """Read events until one of ``kind``; fails on ``failed`` or a hang."""
        with anyio.fail_after(EVENT_GUARD):
            while True:
                event = await self._next()
                if event.kind == kind:
                    return event
                if event.kind == "failed" and kind not in ("done", "failed"):
                    raise AssertionError(f"worker {self.index}: {event.fields}")

    async def _next(self) -> Event:
        assert self._lines is not None
        while "\n" not in self._buffer:
            try:
                self._buffer += await self._lines.receive()
            except anyio.EndOfStream:
                error = f"worker {self.index} exited: {await self._stderr()}"
                raise AssertionError(error) from None
        line, self._buffer = self._buffer.split("\n", 1)
        data = json.loads(line)
        event = Event(self.index, data.pop("ev"), data.pop("t"), data)
        self.events.append(event)
        return event

    async def _stderr(self) -> str:
        if self.process.stderr is None:
            return ""
        with anyio.move_on_after(1):
            return (await self.process.stderr.receive()).decode(errors="replace")[-2000:]
        return ""

    def freeze(self) -> None:
        """SIGSTOP the process (a stalled VM, a debugger): nothing of it runs."""
        os.kill(self.pid, signal.SIGSTOP)
        self._note("stopped")

    def thaw(self) -> None:
        """SIGCONT a frozen process; its history gets ``resumed`` (the harness's
        clock is the workers' clock)."""
        os.kill(self.pid, signal.SIGCONT)
        self._note("resumed")

    def _note(self, kind: str) -> None:
        self.events.append(Event(self.index, kind, time.monotonic(), {}))

    async def kill(self) -> None:
        """SIGKILL the process, wherever it is (a client that crashed); its history
        gets ``killed``."""
        os.kill(self.pid, signal.SIGKILL)
        self._note("killed")
        with anyio.fail_after(EVENT_GUARD):
            await self.process.wait()

    async def close(self) -> None:
        """Ask it to exit; kill it if it does not within a few seconds."""
        if self.process.returncode is None:
            with anyio.move_on_after(5):
                await self.send(json.dumps({"cmd": "exit"}))
                await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        await self.process.aclose()


@dataclass
class Outcome:
    """What the checker found in one scenario's history."""

    # pairs of holders whose validity intervals overlap; a semaphore's holders: groups
    # of limit + 1 valid at one moment
    overlaps: int = 0
    believed: int = 0  # the same, as the holders believed they held it (valid or not)
    lost_updates: int = 0
    late_writes: int = 0
    token_regressions: int = 0
    rejected_writes: int = 0  # stale writes the resource's fence refused
    acknowledged: int = 0
    final: int = 0
    orphans: int = 0  # keys left on the masters with no expiry (fence counters aside)
    detection: list[float] = field(default_factory=list)  # seconds to report a loss
    handover: list[float] = field(default_factory=list)  # seconds to the next holder
    limit: int | None = None  # a semaphore's (None for a lock)
    # a semaphore's: the most leases valid at one moment (a read-write lock's: readers')
    most_valid: int = 0
    most_believed: int = 0  # and the most holders who believed they held at once

    @property
    def violated(self) -> bool:
        """Whether mutual exclusion was observed broken (validity overlapped)."""
        return self.overlaps > 0


#: The events that set a lease's validity: its acquisition, and each extension.
GRANTS = ("acquired", "extended")

#: A stretch of time, from (included) to (excluded).
Stretch = tuple[float, float]


class Hold(NamedTuple):
    """One acquisition, as the checker sees it."""

    worker: int
    start: float  # acquired at
    valid: tuple[Stretch, ...]  # the parts of its critical section while valid
    end: float  # the end of its critical section
    shared: bool  # a reader's (readers may overlap each other)
    limit: int | None = None  # a semaphore slot's: the semaphore's limit


def valid_parts(grants: list[tuple[float, float]], end: float) -> tuple[Stretch, ...]:
    """The parts of a critical section ending at ``end`` during which its lease was
    valid, from its ``grants`` in time order: ``(when, until)``, the acquisition's
    first. Each grant is in force from when it came to the next one."""
    parts = []
    superseded = [when for when, _ in grants[1:]] + [end]
    for (when, until), replaced in zip(grants, superseded, strict=True):
        cut = min(until, replaced, end)
        if cut > when:
            parts.append((when, cut))
    return tuple(parts)


def meet(a: tuple[Stretch, ...], b: tuple[Stretch, ...]) -> bool:
    """Whether two unions of stretches have a moment in common."""
    return any(a0 < b1 and b0 < a1 for a0, a1 in a for b0, b1 in b)


def holds(events: list[Event]) -> list[Hold]:
    """Every acquisition. The critical section runs from the acquisition to the
    holder's last access to the resource (its write, or its read when it did not
    write); its release comes after and is not part of it. A holder killed holds
    until the kill: it may have been using the resource up to then."""
    found = []
    start: dict[int, Event] = {}
    last: dict[int, float] = {}
    grants: dict[int, list[tuple[float, float]]] = {}
    for event in sorted(events, key=lambda e: e.t):
        if event.kind == "acquired":
            start[event.worker], last[event.worker] = event, event.t
            grants[event.worker] = [(event.t, event.fields["until"])]
        elif event.kind == "extended" and event.worker in start:
            grants[event.worker].append((event.t, event.fields["until"]))
        elif event.kind in ("read", "wrote") and event.worker in start:
            last[event.worker] = event.t
        elif event.kind in ("released", "lost", "killed") and event.worker in start:
            began, end = start.pop(event.worker), last.pop(event.worker)
            end = event.t if event.kind == "killed" else end
            valid = valid_parts(grants.pop(event.worker), end)
            shared, limit = began.fields.get("shared", False), began.fields.get("limit")
            found.append(Hold(event.worker, began.t, valid, end, shared, limit))
    return found


def excluded(a: Hold, b: Hold) -> bool:
    """Whether two acquisitions must not overlap: not of one worker, not both readers,
    not semaphore slots (see `crowds`)."""
    slots = a.limit is not None or b.limit is not None
    return a.worker != b.worker and not (a.shared and b.shared) and not slots


def crowds(parts: Sequence[tuple[Stretch, ...]], size: int) -> tuple[int, int]:
    """How many groups of ``size`` of ``parts`` (each a holder's stretches) have a
    moment in common, and the most that do. A group's moments in common begin at the
    latest start of its stretches there, so the starts are the moments to look at.
    Each part is another holder's (a worker holds one slot at a time)."""
    found: set[frozenset[int]] = set()
    most = 0
    for t in sorted({since for part in parts for since, _ in part}):
        here = [i for i, part in enumerate(parts) if any(s <= t < e for s, e in part)]
        most = max(most, len(here))
        found.update(frozenset(group) for group in itertools.combinations(here, size))
    return len(found), most


def judge_slots(outcome: Outcome, slots: list[Hold]) -> None:
    """A semaphore's bound: groups of ``limit + 1`` holders at one moment, while
    their leases were valid and as they believed, and the most at once."""
    (limit,) = {hold.limit for hold in slots}  # one semaphore per history
    assert limit is not None
    outcome.limit = limit
    valid, outcome.most_valid = crowds([hold.valid for hold in slots], limit + 1)
    spans = [((hold.start, hold.end),) for hold in slots]
    believed, outcome.most_believed = crowds(spans, limit + 1)
    outcome.overlaps += valid
    outcome.believed += believed


def count_readers(outcome: Outcome, readers: list[Hold]) -> None:
    """A read-write lock's readers may overlap each other: no overlap, but the most of
    them holding at one moment, valid and as they believed."""
    _, outcome.most_valid = crowds([hold.valid for hold in readers], 2)
    _, outcome.most_believed = crowds([((hold.start, hold.end),) for hold in readers], 2)


def in_force(events: list[Event], worker: int, t: float) -> float | None:
    """The end of worker ``worker``'s validity in force at ``t``: the latest granted
    (acquisition or extension) by then; None if it had none."""
    granted = [e for e in events if e.worker == worker and e.kind in GRANTS and e.t <= t]
    return max(granted, key=lambda e: e.t).fields["until"] if granted else None


def detections(events: list[Event]) -> list[float]:
    """Per lease reported lost: seconds from when it could know (its holder resumed
    from a pause, or else its validity, as last extended, ended) to the report."""
    found = []
    since: dict[int, float] = {}
    for event in sorted(events, key=lambda e: e.t):
        if event.kind == "acquired":
            since[event.worker] = event.fields["until"]
        elif event.kind == "extended" and event.worker in since:
            since[event.worker] = max(since[event.worker], event.fields["until"])
        elif event.kind == "resumed":
            since[event.worker] = max(since.get(event.worker, 0.0), event.t)
        elif event.kind == "lost" and event.worker in since:
            found.append(round(max(0.0, event.t - since.pop(event.worker)), 3))
    return found


def handover(events: list[Event], giver: int, taker: int) -> float:
    """Seconds from worker ``giver``'s last write (its release began right after) to
    worker ``taker``'s next acquisition."""
    wrote = max((e for e in events if (e.worker, e.kind) == (giver, "wrote")), key=lambda e: e.t)
    later = (e for e in events if (e.worker, e.kind) == (taker, "acquired") and e.t > wrote.t)
    return round(min(later, key=lambda e: e.t).t - wrote.t, 3)


def check(events: list[Event], final: int, orphans: int = 0) -> Outcome:
    """The checker: see the module's docstring."""
    outcome = Outcome(final=final, orphans=orphans, detection=detections(events))
    intervals = holds(events)
    if slots := [hold for hold in intervals if hold.limit is not None]:
        judge_slots(outcome, slots)
    elif readers := [hold for hold in intervals if hold.shared]:
        count_readers(outcome, readers)
    for i, a in enumerate(intervals):
        for b in intervals[i + 1 :]:
            if excluded(a, b):
                outcome.overlaps += meet(a.valid, b.valid)
                outcome.believed += a.start < b.end and b.start < a.end
    writes = sorted((e for e in events if e.kind == "wrote"), key=lambda e: e.t)
    accepted = [e for e in writes if e.fields["ok"]]
    outcome.acknowledged = len(accepted)
    outcome.rejected_writes = len(writes) - len(accepted)
    outcome.lost_updates = max(0, outcome.acknowledged - final)
    for write in accepted:
        until = in_force(events, write.worker, write.t)
        outcome.late_writes += until is not None and write.t > until
    tokens = [e.fields["token"] for e in accepted if e.fields.get("token") is not None]
    outcome.token_regressions = sum(1 for a, b in itertools.pairwise(tokens) if b < a)
    return outcome
