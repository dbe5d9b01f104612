"""Counting semaphores against a reference model.

Two clients go through seeded random interleavings of acquisitions (one, or a burst
of several at once from both clients), extensions,
releases, expiries (a lease's slot key deleted on a random set of masters) and
master stops and restarts (with an AOF, as Redlock's safety argument needs); after
every step, the leases the model holds (acquired, and neither released nor expired)
number at most ``limit``, and no two hold the same slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockNotOwnedError,
    LockTimeoutError,
    QuorumUnavailableError,
)
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import assert_every_key_expires, end_model_run

pytestmark = pytest.mark.anyio

STEPS = 200
LIMIT = 3


@dataclass
class Model:
    """The leases the test believes valid (an extension that succeeds after an
    expiry brings one back), and what ran."""

    live: set[Lease] = field(default_factory=set)
    open: list[Lease] = field(default_factory=list)  # acquired, not yet released
    steps: dict[str, int] = field(default_factory=dict)
    acquired: int = 0
    most: int = 0

    def check(self) -> None:
        assert len(self.live) <= LIMIT, f"{len(self.live)} holders: {self.live}"
        keys = [lease.key for lease in self.live]
        assert len(set(keys)) == len(keys), f"two holders of one slot: {keys}"
        self.most = max(self.most, len(self.live))


async def _expire(group: ServerGroup, lease: Lease, nodes: list[int]) -> None:
    """Delete ``lease``'s slot key on ``nodes``, as its expiry there would."""
    for i in nodes:
        client = Redis.from_url(group[i].url)
        try:
            if await client.get(lease.key) == lease.value.encode():
                await client.delete(lease.key)
        finally:
            await client.aclose()


async def _step(
    rng: random.Random,
    group: ServerGroup,
    clients: tuple[AsyncRedlock, ...],
    model: Model,
    fair: bool,
) -> None:
    op = rng.choice(
        ["acquire"] * 2 + ["burst"] * 2 + ["release"] * 3 + ["extend", "expire", "node"]
    )
    model.steps[op] = model.steps.get(op, 0) + 1
    if op in ("acquire", "burst"):
        # a burst: several acquisitions of both clients at once, their attempts
        # reaching the masters in different orders (grants of different slots)
        count = 1 if op == "acquire" else rng.randint(2, 2 * LIMIT)
        semaphores = [
            rng.choice(clients).semaphore("model", LIMIT, ttl=60, timeout=0, fair=fair)
            for _ in range(count)
        ]
        results = await asyncio.gather(
            *(semaphore.acquire() for semaphore in semaphores), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Lease):
                model.live.add(result)
                model.open.append(result)
                model.acquired += 1
            elif not isinstance(result, LockTimeoutError | QuorumUnavailableError):
                raise result
    elif op == "extend" and model.open:
        lease = rng.choice(model.open)
        try:
            await lease.extend()
        except LockNotOwnedError:
            model.open.remove(lease)
            model.live.discard(lease)
        except QuorumUnavailableError:
            pass
        else:
            model.live.add(lease)
    elif op == "release" and model.open:
        lease = rng.choice(model.open)
        model.open.remove(lease)
        model.live.discard(lease)
        with contextlib.suppress(LockNotOwnedError, QuorumUnavailableError):
            await lease.release()
    elif op == "expire" and model.open:
        lease = rng.choice(model.open)
        running = [i for i, server in enumerate(group) if server.running]
        if running:
            await _expire(group, lease, rng.sample(running, rng.randint(1, len(running))))
        model.live.discard(lease)
    elif op == "node":
        i = rng.randrange(len(group))
        if group[i].running:
            group[i].stop()
        else:
            group[i].start()


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
@pytest.mark.parametrize("n", [3, 5])
async def test_random_interleavings_never_exceed_the_limit(
    make_servers: MakeServers, n: int, fair: bool
) -> None:
    group = make_servers(n, appendonly=True)
    rng = random.Random(f"semaphore {n} {fair}")
    model = Model()
    async with (
        AsyncRedlock(group.urls, retry_delay=0.01, auto_extend=False) as first,
        AsyncRedlock(group.urls, retry_delay=0.01, auto_extend=False) as second,
    ):
        for _ in range(STEPS):
            await _step(rng, group, (first, second), model, fair)
            model.check()
        await end_model_run(group, (first, second), model.open)
    # every kind of step ran, and the semaphore was full at some point
    assert set(model.steps) == {"acquire", "burst", "extend", "release", "expire", "node"}
    assert model.acquired > LIMIT
    assert model.most == LIMIT
    await assert_every_key_expires(group)
