"""A ready client's connection settings are checked at construction, as a URL's are.

asyncredlock opens its own connections with a client's settings (its pool's
``connection_kwargs``): a bad port, no host or socket path, a timeout NaN, negative
or infinite, a bad database or client name would fail (or hang) each of them later.
Each is refused by ``AsyncRedlock(...)`` itself, before any I/O, with the error a URL
holding the same value gets, naming the master and the setting.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import valkey.asyncio
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel

from asyncredlock import AsyncRedlock

LOCAL = "master 'redis://localhost:6379/0'"
CLUSTER = "master 'redis-cluster://127.0.0.1:7000'"
SENTINEL = "master 'redis-sentinel://127.0.0.1:26379/orders'"


def orders(**kwargs: Any) -> Redis:
    """A Sentinel-managed client of the service ``orders`` (nothing is connected)."""
    return Sentinel([("127.0.0.1", 26379)]).master_for("orders", **kwargs)


BAD: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (lambda: Redis(port=0), ValueError, "master 'redis://localhost:0/0' has port 0"),
    (lambda: Redis(port=70000), ValueError, "'redis://localhost:70000/0' has an invalid port"),
    (lambda: Redis(port=-1), ValueError, "'redis://localhost:-1/0' has an invalid port"),
    (lambda: Redis(port="x"), ValueError, "'redis://localhost:x/0' has an invalid port"),
    (lambda: Redis(host=""), ValueError, "master 'redis://:6379/0' names no host"),
    (lambda: Redis(host="a\0b"), ValueError, "'redis://a\\x00b:6379/0' holds a NUL character"),
    (
        lambda: Redis(socket_timeout=math.nan),
        ValueError,
        f"{LOCAL}: socket_timeout must be a finite number of seconds, got nan",
    ),
    (
        lambda: Redis(socket_timeout=-1),
        ValueError,
        f"{LOCAL}: socket_timeout must be > 0 seconds, got -1",
    ),
    (
        lambda: Redis(socket_timeout=0),
        ValueError,
        f"{LOCAL}: socket_timeout must be > 0 seconds, got 0",
    ),
    (
        lambda: Redis(socket_timeout=math.inf),
        ValueError,
        f"{LOCAL}: socket_timeout must be a finite number of seconds, got inf",
    ),
    (
        lambda: Redis(socket_connect_timeout=-0.5),
        ValueError,
        f"{LOCAL}: socket_connect_timeout must be > 0 seconds, got -0.5",
    ),
    (
        lambda: Redis(socket_connect_timeout=math.inf),
        ValueError,
        f"{LOCAL}: socket_connect_timeout must be a finite number of seconds, got inf",
    ),
    (
        lambda: Redis(socket_timeout="5"),
        TypeError,
        f"{LOCAL}: socket_timeout must be a number of seconds, not str",
    ),
    (
        lambda: Redis(db=-1),
        ValueError,
        "master 'redis://localhost:6379/-1': db must be a database number, got -1",
    ),
    (lambda: Redis(db=2**31), ValueError, "db must be a database number, got 2147483648"),
    (lambda: Redis(db=True), ValueError, "db must be a database number, got True"),
    (
        lambda: Redis(client_name="a b"),
        ValueError,
        f"{LOCAL}: client_name may not hold spaces or special characters, got 'a b'",
    ),
    (lambda: Redis(unix_socket_path=""), ValueError, "master 'unix://' names no socket path"),
    (
        lambda: Redis(unix_socket_path="/run/a\0b.sock"),
        ValueError,
        "master 'unix:///run/a\\x00b.sock' holds a NUL character",
    ),
    (
        lambda: Redis(unix_socket_path="/run/v.sock", socket_timeout=math.nan),
        ValueError,
        "master 'unix:///run/v.sock': socket_timeout must be a finite number",
    ),
    (
        lambda: RedisCluster(host="127.0.0.1", port=70000),
        ValueError,
        "master 'redis-cluster://127.0.0.1:70000' has an invalid port",
    ),
    (
        lambda: RedisCluster(host="127.0.0.1", port=7000, socket_timeout=math.nan),
        ValueError,
        f"{CLUSTER}: socket_timeout must be a finite number of seconds, got nan",
    ),
    (
        lambda: orders(socket_timeout=-2),
        ValueError,
        f"{SENTINEL}: socket_timeout must be > 0 seconds, got -2",
    ),
    (lambda: orders(db=-1), ValueError, f"{SENTINEL}: db must be a database number, got -1"),
    (
        lambda: Sentinel([("127.0.0.1", 0)]).master_for("orders"),
        ValueError,
        "the sentinel 127.0.0.1:0 of master 'redis-sentinel://127.0.0.1:0/orders' has port 0",
    ),
    (
        lambda: valkey.asyncio.Valkey(socket_timeout=math.nan),
        ValueError,
        f"{LOCAL}: socket_timeout must be a finite number of seconds, got nan",
    ),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD)
def test_a_bad_client_setting_is_refused_at_construction(
    make: Callable[[], Any], error: type[Exception], message: str
) -> None:
    # No event loop runs here: the refusal can do no I/O.
    with pytest.raises(error, match=re.escape(message)):
        AsyncRedlock(["redis://127.0.0.1:1", make(), "redis://127.0.0.1:2"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: Redis(),
        lambda: Redis(port="6380", db="1", socket_timeout=None, socket_connect_timeout=None),
        lambda: Redis(host="::1", db=2**31 - 1, socket_timeout=1e9, client_name="locker-1"),
        lambda: Redis(unix_socket_path="/run/valkey.sock", socket_timeout=0.5),
        lambda: RedisCluster(host="127.0.0.1", port=7000, socket_timeout=2),
        lambda: orders(socket_timeout=2, db=3),
        lambda: valkey.asyncio.Valkey(port=6390),
    ],
)
@pytest.mark.anyio
async def test_good_client_settings_are_taken(make: Callable[[], Any]) -> None:
    client = make()
    redlock = AsyncRedlock([client])
    assert len(redlock.masters) == 1
    await redlock.aclose()
    await client.aclose()
