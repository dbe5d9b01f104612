"""Compatibility of the lock's primitives with other server versions, through Docker.

Skipped, with the reason, where no Docker engine answers or testcontainers (the
``compat`` extra) is missing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_available")]

IMAGES = ["redis:6.2", "redis:7.4", "valkey/valkey:8"]
NODES = 3
READY_TIMEOUT = 60.0
COMPARE_AND_DELETE = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
"""


def wait_for_ping(client: redis.Redis) -> None:
    """Poll PING: the mapped port opens before the server inside is ready."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@pytest.fixture(params=IMAGES)
def clients(request: pytest.FixtureRequest, docker_available: None) -> Iterator[list[redis.Redis]]:
    from testcontainers.core.container import DockerContainer

    with contextlib.ExitStack() as stack:
        made = []
        for _ in range(NODES):
            container = stack.enter_context(DockerContainer(request.param).with_exposed_ports(6379))
            made.append(
                redis.Redis(
                    host=container.get_container_host_ip(),
                    port=int(container.get_exposed_port(6379)),
                    socket_timeout=5,
                    retry=Retry(NoBackoff(), 0),
                )
            )
        yield made


def test_set_nx_px_and_compare_and_delete(clients: list[redis.Redis]) -> None:
    for client in clients:
        wait_for_ping(client)
        assert client.set("k", "mine", nx=True, px=1000)
        assert client.set("k", "theirs", nx=True, px=1000) is None
        assert 0 < client.pttl("k") <= 1000
        assert client.eval(COMPARE_AND_DELETE, 1, "k", "theirs") == 0
        assert client.eval(COMPARE_AND_DELETE, 1, "k", "mine") == 1
        assert client.get("k") is None
