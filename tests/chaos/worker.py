"""One chaos client: a separate OS process that takes a lock and increments a counter
on a separate resource server, reporting every step on stdout as a JSON line.

Started by `harness.Worker` as ``python tests/chaos/worker.py MASTERS RESOURCE NAME``,
on the event loop the suite runs on (``ASYNCREDLOCK_TEST_LOOP``: tests/loops.py).
Commands come on stdin, one JSON object per line:

- ``{"cmd": "cycle", "fencing": bool, "ttl": s, "timeout": s, "pause": bool}``: acquire
  the lock on ``NAME``; read the counter; with ``pause``, report ``paused`` and block the
  whole process (its event loop included, as a long GC pause or a stalled VM would)
  until the line ``go`` arrives; write the counter plus one; release. Optional keys:
  ``role`` (``"exclusive"``, the default: ``lock(NAME)``; ``"writer"`` or ``"reader"``:
  the sides of ``rwlock(NAME)``; a reader has no token, reads the counter without one,
  moving no fence, and reads it again instead of writing), ``fair`` (``fair=True``),
  ``extend`` (the lease extends itself, ``auto_extend=True``; otherwise it does not),
  ``limit`` (a slot of ``semaphore(NAME, limit)`` instead of a lock: no token, so
  ``fencing`` must be false; the counter is read with ``GET`` and incremented with
  ``INCR``, so that holders at once, as many as the limit lets in, lose none of each
  other's increments).
- ``{"cmd": "hold", "fencing": bool, "ttl": s, "timeout": s, "pause": bool}``: the
  same inside ``async with`` (the lease extends itself, whatever ``extend`` says); after
  reading (and the pause, if any: ``resumed``), the job goes on for five TTLs before it
  writes (a reader reads again), so that a lost lease cancels it first: ``lost`` is
  reported when it does. ``role``, ``fair`` and ``limit`` as for a cycle.
- ``{"cmd": "churn", "fencing": bool, "ttl": s, "cycles": n, "seed": n}``: ``n``
  cycles, two thirds of them cancelled (``asyncio.timeout``) after a random 0 to 5 ms,
  wherever they are (acquiring, at the resource, releasing) unless done by then;
  ``cancelled`` is reported.
- ``{"cmd": "exit"}``.

Events: ``waiting`` (a cycle's ``acquire()`` failed its first attempt and waits: a
fair lock's waiter is queued on the masters by then), ``acquired`` (``token``;
``until``: the end of the validity the library reported at the acquisition;
``shared``: a reader's; ``source``: how it was taken, ``lease.statistics().source``;
``limit``: a semaphore's, else null; ``key``: the key held, a semaphore's slot's),
``extended`` (``until``: the end of the validity a successful extension, automatic or
explicit, granted, reported as it takes effect: see `report_extensions`), ``read``
(``value``), ``paused``, ``wrote`` (``ok``: whether the resource took it; ``value``),
``released`` (``lost``: whether the release found the lease gone), ``failed``
(``error``: an acquisition that failed). Times are ``time.monotonic()``, which every
process on the machine shares and the library measures validity with (its default
clock), so an ``until`` is on the clock of every event's time. Plain (unfenced)
clients read with ``GET`` and write with ``SET``; fenced ones through the library's
`FencedStore`, the read fenced too (``read(key, token)``), so a stale holder cannot
write a value read before a newer holder's.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import sys
import time
from typing import Any

from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    Lock,
    LockLostError,
    LockNotOwnedError,
    RedlockError,
)
from asyncredlock._keeping import Keeping  # (report_extensions)
from asyncredlock.fencing import FencedStore, StaleTokenError, check_token
from asyncredlock.testing import Waits

COUNTER = "chaos:counter"

#: The fenced clients' counter: a record of the library's `FencedStore`.
FENCED = "chaos:fenced-counter"


def emit(event: str, **fields: Any) -> None:
    # "wall": this process's wall clock, which a test may have jumped (see FakeClock)
    line = {"ev": event, "t": time.monotonic(), "wall": time.time(), **fields}
    print(json.dumps(line), flush=True)


def deadline(lease: Keeping) -> float:
    """The end of ``lease``'s validity, on this module's clock (``time.monotonic()``,
    the library's): now plus what is left."""
    return time.monotonic() + lease.validity


def report_extensions() -> None:
    """Report ``extended`` each time a lease's validity moves: the library has no hook
    for it, so its extension round (automatic and explicit extensions both go through
    it) is wrapped. The report comes as the round returns, with no ``await`` between
    the new validity taking effect and it, so the checker sees the validity in force
    at every moment. A library without the method stops the worker at its start."""
    extend_round = Keeping._extend_round

    async def reporting(self: Keeping, ttl: float, **options: Any) -> Any:
        decision = await extend_round(self, ttl, **options)
        if decision is None:  # granted
            emit("extended", token=self.token, until=deadline(self))
        return decision

    Keeping._extend_round = reporting  # type: ignore[method-assign]


def make_lock(redlock: AsyncRedlock, name: str, spec: dict[str, Any]) -> Lock:
    """The lock a cycle takes: see ``role``, ``fair``, ``extend`` and ``limit`` above."""
    role, fair = spec.get("role", "exclusive"), bool(spec.get("fair"))
    options: dict[str, Any] = {
        "ttl": spec["ttl"],
        "timeout": spec["timeout"],
        "auto_extend": bool(spec.get("extend")),
    }
    if (limit := spec.get("limit")) is not None:
        if spec["fencing"]:
            raise ValueError("a semaphore's leases carry no fencing token")
        return redlock.semaphore(name, int(limit), fair=fair, **options)
    if role == "reader":
        return redlock.rwlock(name, fair=fair).read(**options)
    fencing = bool(spec["fencing"])
    if role == "writer":
        return redlock.rwlock(name, fair=fair).write(fencing=fencing, **options)
    return redlock.lock(name, fencing=fencing, fair=fair, **options)


async def acquire(redlock: AsyncRedlock, lock: Lock) -> Lease | None:
    """``lock.acquire()``, reporting ``waiting`` once it waits and ``failed`` if it
    fails (then None)."""
    with Waits(redlock) as waits:
        async with asyncio.TaskGroup() as tasks:
            watcher = tasks.create_task(report_waiting(waits))
            try:
                return await lock.acquire()
            except RedlockError as exc:
                emit("failed", error=type(exc).__name__)
                return None
            finally:
                watcher.cancel()


async def report_waiting(waits: Waits) -> None:
    await waits.reach(1)
    emit("waiting")


async def cycle(redlock: AsyncRedlock, resource: Redis, name: str, spec: dict[str, Any]) -> None:
    lease = await acquire(redlock, make_lock(redlock, name, spec))
    if lease is None:
        return
    report_acquired(lease, spec)
    value = await read(resource, bool(spec["fencing"]), lease.token)
    if value >= 0:
        if spec.get("pause"):
            emit("paused")
            sys.stdin.readline()  # blocks the process, event loop and all, until "go"
        await access(resource, lease, spec, value)
    try:
        await lease.release()
    except LockNotOwnedError:
        emit("released", lost=True)
    except RedlockError as exc:
        emit("released", lost=False, error=type(exc).__name__)
    else:
        emit("released", lost=False)


def report_acquired(lease: Lease, spec: dict[str, Any]) -> None:
    """``acquired``, with what the checker and the scenarios look at."""
    emit(
        "acquired",
        token=lease.token,
        until=deadline(lease),
        shared=lease.shared,
        source=lease.statistics().source,
        limit=spec.get("limit"),
        key=lease.key,
    )


async def access(resource: Redis, lease: Lease, spec: dict[str, Any], value: int) -> None:
    """A holder's access after its first read of ``value``: a reader reads again (its
    reading spans what came between), a semaphore's holder counts, a writer writes
    ``value + 1``."""
    fencing = bool(spec["fencing"])
    if lease.shared:
        await read(resource, fencing, lease.token)
    elif spec.get("limit") is not None:
        await count(resource)
    else:
        await write(resource, fencing, lease.token, value + 1)


async def hold(redlock: AsyncRedlock, resource: Redis, name: str, spec: dict[str, Any]) -> None:
    lock = make_lock(redlock, name, {**spec, "extend": True})
    try:
        async with lock as lease:
            report_acquired(lease, spec)
            value = await read(resource, bool(spec["fencing"]), lease.token)
            if value < 0:
                return
            if spec.get("pause"):
                emit("paused")
                sys.stdin.readline()  # blocks the process, event loop and all, until "go"
                emit("resumed")
            # the rest of the job: cancelled if the lease is lost
            await asyncio.sleep(5 * float(spec["ttl"]))
            await access(resource, lease, spec, value)
    except LockLostError:
        emit("lost")
    except RedlockError as exc:
        emit("failed", error=type(exc).__name__)
        return
    emit("released", lost=False)


async def churn(redlock: AsyncRedlock, resource: Redis, name: str, spec: dict[str, Any]) -> None:
    rng = random.Random(spec["seed"])
    for _ in range(int(spec["cycles"])):
        # a third run to the end; the others are cut short within 5 ms (a cycle takes
        # a few), wherever they are by then
        delay = None if rng.random() < 1 / 3 else rng.uniform(0.0, 0.005)
        try:
            async with asyncio.timeout(delay):
                await cycle(redlock, resource, name, {**spec, "timeout": 1.0})
        except TimeoutError:
            emit("cancelled")


async def read(resource: Redis, fencing: bool, token: int | None) -> int:
    """The counter (reported); -1 if the fence refused ``token``. A reader has no
    token: its read moves no fence."""
    if fencing:
        fence = None if token is None else check_token(token)
        try:
            found = await FencedStore(resource).read(FENCED, fence)
        except StaleTokenError:
            value = -1
        else:
            value = 0 if found is None else int(found.value)
    else:
        value = int(await resource.get(COUNTER) or 0)
    emit("read", value=value, ok=value >= 0)
    return value


async def write(resource: Redis, fencing: bool, token: int | None, value: int) -> None:
    """Write the counter (reported, with whether the resource took it)."""
    ok = True
    if fencing:
        try:
            await FencedStore(resource).write(FENCED, value, check_token(token))
        except StaleTokenError:
            ok = False
    else:
        await resource.set(COUNTER, value)
    emit("wrote", ok=ok, value=value, token=token)


async def count(resource: Redis) -> None:
    """A semaphore holder's write: ``INCR`` the plain counter (reported)."""
    value = await resource.incr(COUNTER)
    emit("wrote", ok=True, value=value, token=None)


async def main(masters: list[str], resource_url: str, name: str) -> None:
    report_extensions()
    resource = Redis.from_url(resource_url)
    async with AsyncRedlock(masters, node_timeout=0.05) as redlock:
        emit("ready")
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            if command["cmd"] == "exit":
                break
            run = {"hold": hold, "churn": churn, "cycle": cycle}[command["cmd"]]
            await run(redlock, resource, name, command)
            emit("done")
    await resource.aclose()


if __name__ == "__main__":
    # On the loop the suite runs on (tests/loops.py; the test session checked the value).
    uvloop = os.environ.get("ASYNCREDLOCK_TEST_LOOP", "").strip() == "uvloop"
    factory = importlib.import_module("uvloop").new_event_loop if uvloop else None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main(sys.argv[1].split(","), sys.argv[2], sys.argv[3]))
