"""What every scenario runs on: five masters, a resource server and client processes
(`Run`, made by `run`), optionally reached through `FaultProxy`'s (`proxied`,
`start_workers`), rounds of cycles (`take_turns`), and the assertion that closes each
scenario (`expect`)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from redis.asyncio import Redis

from asyncredlock.fencing import FencedStore
from asyncredlock.testing import FakeClock, FaultProxy, ServerGroup
from asyncredlock.testing._support import connected_clients
from asyncredlock.testing.pytest_plugin import MakeServers

from .harness import Event, Outcome, Worker, check
from .report import Expected, matches, record
from .worker import COUNTER, FENCED

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
        """The counter: the plain clients' string, or the fenced clients' record."""
        fenced = await FencedStore(self.resource).read(FENCED)
        return int(await self.resource.get(COUNTER) or 0) + int(fenced.value if fenced else 0)

    def events(self) -> list[Event]:
        """What every worker reported so far."""
        return [e for w in self.workers for e in w.events]

    async def outcome(self) -> Outcome:
        """The checker's verdict; call it once the workers are done."""
        return check(self.events(), await self.final(), await self.orphans())

    async def orphans(self) -> int:
        """Keys on the masters with no expiry, fence counters aside (they stay by
        design: a resource's tokens keep increasing)."""
        found = 0
        for i, server in enumerate(self.masters):
            if not server.running or server.paused:
                continue
            client = self.direct(i)
            for key in await client.keys("*"):  # bytes (no decode_responses), typed either
                name = key.decode() if isinstance(key, bytes) else key
                found += not name.endswith(":fence") and await client.pttl(key) == -1
            await client.aclose()
        return found

    def direct(self, i: int) -> Redis:
        return Redis.from_url(self.masters.urls[i])


@asynccontextmanager
async def run(
    make_servers: MakeServers,
    workers: int,
    *,
    appendonly: bool = False,
    fake_clock: bool = False,
    clocks: Sequence[FakeClock] = (),
) -> AsyncIterator[Run]:
    """Five masters, a resource server, and ``workers`` client processes (worker ``i``
    on ``clocks[i]``, if given: its wall clock, not its monotonic one)."""
    masters = make_servers(5, appendonly=appendonly, fake_clock=fake_clock)
    resource_url = make_servers(1).urls[0]
    resource = Redis.from_url(resource_url)
    started: list[Worker] = []
    try:
        envs = [clocks[i].environ(os.environ) if i < len(clocks) else None for i in range(workers)]
        await _start([(masters.urls, env) for env in envs], resource_url, started)
        yield Run(masters, resource, resource_url, started)
    finally:
        for worker in started:
            await worker.close()
        await resource.aclose()
    await _no_connection_left(masters)


async def _start(
    specs: Sequence[tuple[list[str], Mapping[str, str] | None]],
    resource_url: str,
    into: list[Worker],
) -> None:
    """Start worker ``i`` on ``specs[i]`` (its masters' URLs, its environment), all at
    once: their interpreters boot side by side. ``into`` gets them in order, each
    one that started even if another failed (for the caller to close)."""
    slots: list[Worker | None] = [None] * len(specs)

    async def one(i: int) -> None:
        urls, env = specs[i]
        slots[i] = await Worker.start(i, urls, resource_url, NAME, env)

    try:
        async with anyio.create_task_group() as tg:
            for i in range(len(specs)):
                tg.start_soon(one, i)
    finally:
        into.extend(worker for worker in slots if worker is not None)


#: How many times (every 50 ms) the servers are asked whether the connections of
#: exited clients are gone: 10 s at most.
CLOSE_POLLS = 200


async def _no_connection_left(masters: ServerGroup) -> None:
    """Every client connection to the masters is gone, once the clients have exited
    (polled: a server notices a closed socket on its next event-loop turn)."""
    for server in masters:
        if not server.running or server.paused:
            continue
        for _ in range(CLOSE_POLLS):  # polls the server's count, a bounded number of times
            left = await anyio.to_thread.run_sync(connected_clients, server.port)
            if left == 0:
                break
            await anyio.sleep(0.05)
        assert left == 0, f"{left} client connections left on {server.url}"


@asynccontextmanager
async def proxied(masters: ServerGroup) -> AsyncIterator[list[FaultProxy]]:
    """A `FaultProxy` in front of each master, in this test's event loop."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
            for server in masters
        ]


async def start_workers(r: Run, routes: Sequence[Sequence[FaultProxy]]) -> None:
    """Replace the run's workers by one per route: worker ``i`` reaches the masters
    through the proxies ``routes[i]`` (the same list for several workers: they share
    its faults). `run` closes them at the end."""
    for worker in r.workers:
        await worker.close()
    r.workers.clear()
    specs = [([proxy.url for proxy in proxies], None) for proxies in routes]
    await _start(specs, r.resource_url, r.workers)


async def take_turns(workers: Sequence[Worker], rounds: int, **cycle: Any) -> None:
    """``rounds`` rounds in each of which every worker starts a cycle (`Worker.cycle`
    with ``cycle``) at once; a round ends when every worker is done."""
    for _ in range(rounds):
        for worker in workers:
            await worker.cycle(**cycle)
        for worker in workers:
            await worker.expect("done")


def verdict(scenario: str, mode: str, expected: Expected, outcome: Outcome) -> None:
    """Record the scenario's row of the results table, then check that the observed
    outcome is the expected one and that nothing was left."""
    record(scenario, mode, expected, outcome)
    assert matches(expected, outcome), (expected, outcome)
