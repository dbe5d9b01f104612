"""Read-write locks against a reference model (their cancellation storm is in
``test_cancellation.py``).

The model test drives two clients through seeded random interleavings of read and
write acquisitions, extensions, releases, expiries (the lease's keys deleted on a
random set of masters) and master stops and restarts (with an AOF, as Redlock's
safety argument needs), and checks after every step that the leases the model
holds never include a writer together with a reader or another writer.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

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
MODES: dict[str, dict[str, Any]] = {
    "readers first": {"patience": float("inf")},
    "patience 0": {"patience": 0},
    "fair": {"fair": True},
}


@dataclass
class Model:
    """What the test believes is held: leases acquired and neither released nor
    expired (an extension that succeeds after an expiry brings a lease back)."""

    kind: dict[Lease, str] = field(default_factory=dict)  # live lease -> "read" | "write"
    open: list[Lease] = field(default_factory=list)  # acquired, not yet released
    tokens: list[int] = field(default_factory=list)
    steps: dict[str, int] = field(default_factory=dict)
    acquired: dict[str, int] = field(default_factory=dict)

    def check(self) -> None:
        writers = [lease for lease, kind in self.kind.items() if kind == "write"]
        readers = [lease for lease, kind in self.kind.items() if kind == "read"]
        assert len(writers) <= 1, f"two writers hold: {writers}"
        assert not (writers and readers), f"a writer {writers} holds with readers {readers}"


async def _expire(group: ServerGroup, lease: Lease, nodes: list[int]) -> None:
    """Delete what ``lease`` holds on ``nodes``, as its expiry there would."""
    for i in nodes:
        client = Redis.from_url(group[i].url)
        try:
            if lease.shared:
                await client.zrem("{model}:readers", lease.value)
            elif await client.get("model") == lease.value.encode():
                await client.delete("model")
        finally:
            await client.aclose()


async def _step(
    rng: random.Random,
    group: ServerGroup,
    clients: tuple[AsyncRedlock, ...],
    options: dict[str, Any],
    model: Model,
) -> None:
    op = rng.choice(["read"] * 2 + ["write"] * 2 + ["release"] * 3 + ["extend", "expire", "node"])
    model.steps[op] = model.steps.get(op, 0) + 1
    if op in ("read", "write"):
        client = rng.choice(clients)
        rw = client.rwlock("model", **options)
        lock = (rw.read if op == "read" else rw.write)(ttl=60, timeout=0, auto_extend=False)
        try:
            lease = await lock.acquire()
        except (LockTimeoutError, QuorumUnavailableError):
            return
        model.kind[lease] = op
        model.open.append(lease)
        model.acquired[op] = model.acquired.get(op, 0) + 1
        if lease.token is not None:
            assert all(lease.token > token for token in model.tokens)
            model.tokens.append(lease.token)
    elif op == "extend" and model.open:
        lease = rng.choice(model.open)
        try:
            await lease.extend()
        except LockNotOwnedError:
            model.open.remove(lease)
            model.kind.pop(lease, None)
        except QuorumUnavailableError:
            pass
        else:
            model.kind[lease] = "read" if lease.shared else "write"
    elif op == "release" and model.open:
        lease = rng.choice(model.open)
        model.open.remove(lease)
        model.kind.pop(lease, None)
        with contextlib.suppress(LockNotOwnedError, QuorumUnavailableError):
            await lease.release()
    elif op == "expire" and model.open:
        lease = rng.choice(model.open)
        running = [i for i, server in enumerate(group) if server.running]
        if running:
            await _expire(group, lease, rng.sample(running, rng.randint(1, len(running))))
        model.kind.pop(lease, None)
    elif op == "node":
        i = rng.randrange(len(group))
        if group[i].running:
            group[i].stop()
        else:
            group[i].start()


@pytest.mark.parametrize("mode", list(MODES), ids=list(MODES))
@pytest.mark.parametrize("n", [3, 5])
async def test_random_interleavings_never_mix_a_writer_with_anyone(
    make_servers: MakeServers, n: int, mode: str
) -> None:
    group = make_servers(n, appendonly=True)
    rng = random.Random(f"{n} {mode}")
    model = Model()
    async with (
        AsyncRedlock(group.urls, retry_delay=0.01) as first,
        AsyncRedlock(group.urls, retry_delay=0.01) as second,
    ):
        for _ in range(STEPS):
            await _step(rng, group, (first, second), MODES[mode], model)
            model.check()
        await end_model_run(group, (first, second), model.open)
    # every kind of step ran, and locks were taken both ways
    assert set(model.steps) == {"read", "write", "extend", "release", "expire", "node"}
    assert set(model.acquired) == {"read", "write"}
    await assert_every_key_expires(group, but=(b":fence",))
