"""The floor of a hand-over between clients: how fast could any arrival-order lock go?

The case is `peers.py`'s scenario d with a client per worker: ten clients in one event
loop, each with one worker, take one key again and again and hold it 1 ms
(``asyncio.sleep``), over five masters on loopback. Its target (issue 11) is 1.3x
aioredlock's acquisitions per second. aioredlock gets its rate by barging (the
releasing worker takes the lock straight back, the others sleep between attempts); a
lock that serves waiters in arrival order needs, per hand-over, at least one round of
the releasing client (its release, which tells the next waiter) and one round of its
next acquire (which queues it again), both over all the masters.

Rows, alternated within each repetition:

- **floor model** (not a lock: mutual exclusion holds only inside this process): each
  client has one connection per master; its acquire is one round of ``PING`` to every
  master (back at the third reply), then a wait in a queue shared in the process if
  the lock is taken; its release is one round of ``PING``, then it wakes the first
  queued worker. That is the message pattern of a hand-over through the masters at no
  cost of scripts, keys or library code, and with the waiter woken for free (a real
  lock's masters must also tell it: asyncredlock's publish to its inbox): a lock that
  keeps arrival order this way, its release awaited, is slower in this case.
- **asyncredlock** and **asyncredlock fair=True**, as ``peers.py`` runs them.
- **aioredlock**, as ``peers.py`` runs it.

The hold is ``asyncio.sleep(0.001)`` by default. With ``--hold query`` it is a 1 ms
query to another process instead (`lockbench.hold_service`: each worker's connection
is answered 1 ms after it asks), as a holder that writes to a database waits: its
hold ends when the reply is read, where a sleep on asyncio's default loop ends no
sooner than a whole millisecond after the loop's last wake-up (its poll takes
milliseconds), so that the replies a lock reads during the hold lengthen it.

Each row records acquisitions per second, wait p50 and p99, where a cycle of the lock
goes (how long a hold lasted, and the hand-over from a ``release()`` call to the next
holder's ``acquire()`` returning), how often the same worker took the lock again, the
holds that overlapped, and the CPU time per hold of the client process and of the
five servers (Linux: ``/proc``).

Each repetition runs the rows in turn, starting one row later than the repetition
before it. Run from the repository root: ``python benchmarks/handover.py`` (about 2 minutes;
``--quick`` for a smoke run, ``--only floor,asyncredlock`` for some rows). It writes
``handover.json`` and ``handover.md`` (``handover-query.*`` with ``--hold query``) to
``--out`` (default ``benchmarks/results``); ``--docs docs`` also writes the table into
``docs/peers.md`` between its ``<!-- HANDOVER-FLOOR -->`` lines (``HANDOVER-QUERY``).
That report step is ``lockbench.handover_report``, and ``--report JSON`` runs it alone
on results already written.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lockbench.adapters.base import Handle, Mode, Session
from lockbench.adapters.ours import AsyncredlockSession
from lockbench.adapters.peer_aioredlock import AioredlockSession
from lockbench.handover_report import HandoverReport, RowRun, write_outputs
from lockbench.harness import add_report_option, environment, process_cpu, read_report
from lockbench.settings import CONTENTION_WORKERS, WAIT
from lockbench.workloads import Failures, bounded, quiet_loggers
from peers import CONTENTION_HOLD, Hold, contention_holds, contention_result

from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
MASTERS = 5
QUORUM = MASTERS // 2 + 1
PING = b"*1\r\n$4\r\nPING\r\n"


class _Replies(asyncio.Protocol):
    """One connection to a master: each reply line (``+PONG``) calls the callback of
    the oldest ``PING`` still out on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[Callable[[], None]] = collections.deque()
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        *lines, self._buffer = (self._buffer + data).split(b"\r\n")
        for _ in lines:
            self.pending.popleft()()


class _Queue:
    """The floor model's lock state, shared by its clients: held, and who waits."""

    def __init__(self) -> None:
        self.held = False
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()


class FloorSession:
    """One client of the floor model: a connection per master."""

    def __init__(self, ports: Sequence[int], queue: _Queue) -> None:
        self._ports, self._queue = ports, queue
        self._conns: list[_Replies] = []

    async def open(self) -> FloorSession:
        """Connect to every master (none left open if one fails)."""
        loop = asyncio.get_running_loop()
        try:
            for port in self._ports:
                _, conn = await loop.create_connection(_Replies, "127.0.0.1", port)
                self._conns.append(conn)
        except BaseException:
            await self.aclose()
            raise
        return self

    def round(self) -> asyncio.Future[None]:
        """``PING`` every master; done at the quorum-th reply."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        replies = 0

        def reply() -> None:
            nonlocal replies
            replies += 1
            if replies == QUORUM and not done.done():
                done.set_result(None)

        for conn in self._conns:
            assert conn.transport is not None
            conn.pending.append(reply)
            conn.transport.write(PING)
        return done

    def handle(self, key: str) -> Handle:
        """A worker's handle (every key is the one lock of the model)."""
        return FloorHandle(self, self._queue)

    def settings(self) -> dict[str, Any]:
        """What the model does, for the record."""
        return {"model": "a PING round per acquire and per release, quorum 3 of 5"}

    async def aclose(self) -> None:
        """Close the connections."""
        for conn in self._conns:
            if conn.transport is not None:
                conn.transport.close()


class FloorHandle:
    """Acquire: a round (the attempt that queues), then wait in line if the lock is
    held. Release: a round (the release that tells the next waiter), then wake it."""

    def __init__(self, session: FloorSession, queue: _Queue) -> None:
        self._session, self._queue = session, queue

    async def acquire(self) -> None:
        """The round, then the lock if free, else the turn in line."""
        await self._session.round()
        if not self._queue.held:
            self._queue.held = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.waiting.append(turn)
        await turn

    async def release(self) -> None:
        """The round, then the lock handed to the first in line, or freed."""
        await self._session.round()
        if self._queue.waiting:
            self._queue.waiting.popleft().set_result(None)  # still held: handed over
        else:
            self._queue.held = False


#: The rows, by the names ``--only`` takes, in the order they run.
SHORT = {
    "floor": "floor model",
    "asyncredlock": "asyncredlock",
    "asyncredlock-fair": "asyncredlock fair=True",
    "aioredlock": "aioredlock",
}


async def open_session(row: str, servers: ServerGroup, queue: _Queue) -> Session:
    """One client of a row (the floor model's clients share ``queue``)."""
    mode = Mode("contended", waiting=True, workers=1)
    if row == "floor model":
        return await FloorSession([server.port for server in servers], queue).open()
    if row == "aioredlock":
        return AioredlockSession(servers.urls, mode)
    fair = row == "asyncredlock fair=True"
    return AsyncredlockSession(servers.urls, mode, fencing=True, fair=fair)


def servers_cpu(servers: ServerGroup) -> float | None:
    """CPU seconds the servers used so far (None where ``/proc`` cannot tell)."""
    used = [process_cpu(server.pid) for server in servers]
    return None if None in used else sum(u or 0.0 for u in used)


@contextlib.contextmanager
def hold_service(seconds: float) -> Iterator[int]:
    """`lockbench.hold_service` in a child process for ``seconds`` at most: its port."""
    script = HERE / "lockbench" / "hold_service.py"
    args = [sys.executable, str(script), str(CONTENTION_HOLD * 1000), str(seconds)]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            yield int(child.stdout.readline())
        finally:
            child.kill()


async def query_holds(
    stack: contextlib.AsyncExitStack, port: int
) -> Callable[[int], Awaitable[None]]:
    """A hold per worker: a 1 ms query to the hold service, on the worker's connection."""
    links = []
    for _ in range(CONTENTION_WORKERS):
        links.append(await asyncio.open_connection("127.0.0.1", port))
        stack.callback(links[-1][1].close)  # each one closed, should a later one fail

    async def hold(worker: int) -> None:
        reader, writer = links[worker]
        writer.write(b"?")
        await reader.readexactly(1)

    return hold


async def run_row(
    row: str, servers: ServerGroup, key: str, seconds: float, port: int | None = None
) -> RowRun:
    """One row for ``seconds``: ten clients, a worker each, on ``key``; each hold a
    query to the hold service on ``port`` if given, else a sleep."""
    failures = Failures()
    async with contextlib.AsyncExitStack() as stack:
        sessions: list[Session] = []
        queue = _Queue()
        for _ in range(CONTENTION_WORKERS):
            sessions.append(await open_session(row, servers, queue))
            stack.push_async_callback(sessions[-1].aclose)
        handles = [session.handle(key) for session in sessions]
        hold = None if port is None else await query_holds(stack, port)
        for handle in handles:  # connected, scripts loaded
            await handle.acquire()
            await handle.release()
        gc.collect()
        cpu, served = time.process_time(), servers_cpu(servers)
        start = time.monotonic()
        holds, misses = await contention_holds(handles, start + seconds, failures, hold=hold)
        cpu = time.process_time() - cpu
        after = servers_cpu(servers)
    result = contention_result(holds, start, start + seconds, len(handles), misses)
    if result is None:
        return {"status": "failed", "reason": "no acquisition", **failures.counts()}
    per_hold = 1000 / max(1, len(holds))
    return {
        **result,
        **failures.counts(),
        **cycle_parts(holds, start + seconds),
        "client_cpu_ms_per_hold": round(cpu * per_hold, 3),
        "servers_cpu_ms_per_hold": None
        if served is None or after is None
        else round((after - served) * per_hold, 3),
    }


def cycle_parts(holds: Sequence[Hold], end: float) -> dict[str, float | None]:
    """Where a cycle of the lock goes, from the holds that began before ``end``:
    how long a hold lasted (``acquire()`` returning to ``release()`` called; for a
    sleep, the sleep as the loop ended it) and the hand-over, from ``release()``
    called to the next holder's ``acquire()`` returning (medians, in ms)."""
    inside = sorted((h for h in holds if h.got < end), key=lambda h: h.got)
    pairs = list(itertools.pairwise(inside))
    return {
        "hold_p50_ms": round(statistics.median(h.releasing - h.got for h in inside) * 1000, 3)
        if inside
        else None,
        "handover_p50_ms": round(statistics.median(b.got - a.releasing for a, b in pairs) * 1000, 3)
        if pairs
        else None,
    }


async def run(
    rows: Sequence[str], seconds: float, repetitions: int, hold: str = "sleep"
) -> HandoverReport:
    """Every row, ``repetitions`` times, each repetition starting one row later; each
    hold a sleep, or (``hold="query"``) a query to the hold service."""
    quiet_loggers()
    runs: dict[str, list[RowRun]] = {row: [] for row in rows}
    guard = seconds + 2 * WAIT + 10
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(ServerGroup(MASTERS))
        lasting = guard * len(rows) * repetitions
        port = stack.enter_context(hold_service(lasting)) if hold == "query" else None
        for rep in range(repetitions):
            turn = rep % len(rows)
            for row in (*rows[turn:], *rows[:turn]):
                key = f"handover:{row}:{rep}"
                try:
                    measuring = run_row(row, servers, key, seconds, port)
                    result = await bounded(measuring, guard, row)
                except ImportError as exc:
                    result = {"status": "failed", "reason": f"not installed: {exc.name}"}
                except Exception as exc:  # the row fails, the others go on
                    result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
                runs[row].append(result)
                rate = result.get("acquisitions_per_s", "-")
                print(f"{rep + 1}/{repetitions} {row:<24} {rate} acquisitions/s", flush=True)
    return {
        "environment": environment(),
        "masters": MASTERS,
        "clients": CONTENTION_WORKERS,
        "hold_s": CONTENTION_HOLD,
        "hold": hold,
        "seconds_per_run": seconds,
        "repetitions": repetitions,
        "quick": seconds < 2,
        "rows": runs,
    }


def main() -> None:
    """Measure (or, with ``--report``, read results already written) and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    parser.add_argument("--docs", type=Path, help="also write the table into DOCS/peers.md")
    parser.add_argument("--only", help=f"comma-separated rows: {','.join(SHORT)}")
    parser.add_argument(
        "--hold",
        choices=("sleep", "query"),
        default="sleep",
        help="each hold: asyncio.sleep (default), or a 1 ms query to another process",
    )
    add_report_option(parser, "handover.json")
    args = parser.parse_args()
    names = list(SHORT) if args.only is None else args.only.split(",")
    if unknown := sorted(set(names) - SHORT.keys()):
        parser.error(f"--only: no row {', '.join(map(repr, unknown))} (rows: {','.join(SHORT)})")
    if len(set(names)) < len(names):
        parser.error(f"--only: a row named twice in {args.only!r}")
    rows = tuple(SHORT[name] for name in names)
    started = time.monotonic()
    if args.report:
        results = read_report(args.report)
    else:
        seconds, repetitions = (0.5, 1) if args.quick else (8.0, 4)
        results = asyncio.run(run(rows, seconds, repetitions, args.hold))
    write_outputs(results, args.out, args.docs)
    print(f"\nwritten to {args.out} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
