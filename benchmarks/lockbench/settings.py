"""The settings every library gets in the benchmarks, so that they compare like with like."""

from __future__ import annotations

import math

SERVERS = 5  # masters in the N = 5 cases
THROUGHPUT_WORKERS = 200  # c: workers, each on its own key
CONTENTION_WORKERS = 10  # d: workers on one key
TTL = 10.0  # seconds: every library's lock TTL (asyncredlock's and pottery's default)
WAIT = 10.0  # seconds a contended acquire may wait, where the library takes a bound
# Connections per master in every peer's pool (asyncredlock has no pool: one
# connection per master carries every call). redis-py's default pool (100) raises
# MaxConnectionsError under 200 workers, and aioredlock's (100) makes the rest wait,
# which would make the throughput scenario a pool-size contest.
POOL = 256
# aioredlock has no "wait up to" setting, only a retry count with 0.1-0.3 s pauses;
# waiting scenarios give it enough attempts to wait at least WAIT.
AIOREDLOCK_WAIT_RETRIES = math.ceil(WAIT / 0.1)
