"""A process of test_semaphore_procs: tasks of two AsyncRedlock clients pass
through one semaphore; each counts itself in on a separate counter server while it
holds, and prints the largest count it saw (as JSON) when done."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time

from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, LockTimeoutError, QuorumUnavailableError, RedlockError


async def main(
    urls: list[str],
    counter_url: str,
    name: str,
    limit: int,
    seed: int,
    deletes: bool,
    cancels: bool,
) -> None:
    rng = random.Random(seed)
    counter = Redis.from_url(counter_url)
    seen: list[int] = []
    stats = {"acquired": 0, "cancelled": 0, "timeouts": 0, "lost": 0}
    holds: list[list[object]] = []  # [start, end, valid throughout, count, key]
    async with (
        AsyncRedlock(urls, retry_delay=0.02, node_timeout=0.5) as a,
        AsyncRedlock(urls, retry_delay=0.02, node_timeout=0.5) as b,
    ):
        directs = [Redis.from_url(url) for url in urls]

        async def worker(client: AsyncRedlock, fair: bool) -> None:
            semaphore = client.semaphore(name, limit, ttl=1.0, timeout=5, fair=fair)
            for _ in range(12):
                task = asyncio.ensure_future(semaphore.acquire())
                if cancels and rng.random() < 0.3:  # cancel it after k loop steps
                    for _ in range(rng.randrange(12)):
                        await asyncio.sleep(0)
                    task.cancel()
                try:
                    lease = await task
                except asyncio.CancelledError:
                    stats["cancelled"] += 1
                    continue
                except (LockTimeoutError, QuorumUnavailableError):
                    stats["timeouts"] += 1
                    continue
                stats["acquired"] += 1
                start = time.time()
                seen.append(await counter.incr(name))
                try:
                    if deletes and rng.random() < 0.3:
                        # the slot lost on one master, where that leaves it on a
                        # quorum even with master 0 restarted empty (losing more
                        # would break Redlock's own assumption, not the library)
                        holding = []
                        for direct in directs[1:]:
                            with contextlib.suppress(Exception):
                                if await direct.get(lease.key) == lease.value.encode():
                                    holding.append(direct)
                        if len(holding) == len(directs) - 1:
                            with contextlib.suppress(Exception):
                                await rng.choice(holding).delete(lease.key)
                    await asyncio.sleep(rng.choice([0, 0.01, 0.05, 0.6]))
                finally:
                    valid = lease.held and lease.validity > 0
                    holds.append([start, time.time(), valid, seen[-1], lease.key])
                    await counter.decr(name)
                    stats["lost"] += lease.lost
                    with contextlib.suppress(RedlockError):
                        await lease.release()

        await asyncio.gather(*(worker((a, b)[i % 2], fair=bool(seed % 2)) for i in range(4)))
        for direct in directs:
            await direct.aclose()
    await counter.aclose()
    print(json.dumps({"most": max(seen, default=0), "holds": holds, **stats}))


if __name__ == "__main__":
    asyncio.run(main(*json.loads(sys.argv[1])))
