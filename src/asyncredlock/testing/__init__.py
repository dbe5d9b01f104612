"""Test support for asyncredlock and its users: real servers, a fault proxy, fixtures.

- `ServerProcess` / `ServerGroup`: real ``valkey-server`` (or ``redis-server``)
  processes on 127.0.0.1 that can be stopped, killed, paused and restarted.
- `SentinelProcess`: a Sentinel (the same binary, ``--sentinel``) monitoring
  servers, for masters named by ``redis-sentinel://`` URLs.
- `ServerCluster`: a real Redis Cluster of such servers (shards, optional
  replicas), formed without Docker, for ``RedisCluster`` masters; it can move a
  slot between shards and fail a primary over.
- `client_state`: what an ``AsyncRedlock`` keeps in this process (leases held, tasks
  queued, wake-ups, connections), for tests that check nothing was left behind.
- `Waits`: wait until ``acquire()`` calls are parked (queued behind another task, or
  waiting for a release) instead of sleeping.
- `whole_retry_delay`, `deafened`, `hold_calls`: faults inside a client (retries
  without jitter, release announcements lost, calls of one script held back before
  they are sent), for tests that need them at a point of their choosing.
- `FaultProxy`: a TCP proxy in front of one server that adds delay, blackholes,
  resets or refuses connections at run time.
- `FakeClock`: one server's wall clock (``ServerProcess(fake_clock=True).clock``),
  jumped forward or back at run time through libfaketime, as a master whose clock
  steps; `FakeClockUnavailableError` when that cannot be done (not Linux, no
  libfaketime, or a server binary libfaketime cannot run in).
- The pytest plugin (`asyncredlock.testing.pytest_plugin`, opt-in: ``-p
  asyncredlock.testing.pytest_plugin`` or ``pytest_plugins`` in a conftest) provides
  the ``servers``, ``make_servers``, ``redlock_server_group``, ``docker_available`` and
  ``fake_clock_available`` fixtures.
"""

from ._clock import FakeClock as FakeClock
from ._clock import FakeClockUnavailableError as FakeClockUnavailableError
from ._cluster import ServerCluster as ServerCluster
from ._faults import HeldCalls as HeldCalls
from ._faults import deafened as deafened
from ._faults import hold_calls as hold_calls
from ._faults import whole_retry_delay as whole_retry_delay
from ._group import ServerGroup as ServerGroup
from ._proxy import FaultProxy as FaultProxy
from ._sentinel import SentinelProcess as SentinelProcess
from ._servers import ServerProcess as ServerProcess
from ._state import ClientState as ClientState
from ._state import client_state as client_state
from ._support import ServerBinaryNotFoundError as ServerBinaryNotFoundError
from ._support import ServerStartError as ServerStartError
from ._support import find_server_binary as find_server_binary
from ._waits import Waits as Waits

__all__ = [
    "ClientState",
    "FakeClock",
    "FakeClockUnavailableError",
    "FaultProxy",
    "HeldCalls",
    "SentinelProcess",
    "ServerBinaryNotFoundError",
    "ServerCluster",
    "ServerGroup",
    "ServerProcess",
    "ServerStartError",
    "Waits",
    "client_state",
    "deafened",
    "find_server_binary",
    "hold_calls",
    "whole_retry_delay",
]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
