"""One server must never count as two masters.

A server given twice gives two votes of a quorum: a safety bug, not a nuisance.
``AsyncRedlock`` refuses it at construction, whatever the spelling: a host as
redis-py reads it (%-decoded), an IP address written two ways, a socket path with
a doubled slash, a ready client of a server also named by URL, one Sentinel
service through overlapping sentinels. None of the checks needs DNS or I/O: the
duplicate is visible in what is given.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock.testing import ServerGroup

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds: a hang fails the test instead of blocking CI
SECRET = "s3cretPW"  # a password no error may show


def _pct(host: str) -> str:
    """``host`` with every character %-encoded (redis-py unquotes the host)."""
    return "".join(f"%{ord(c):02X}" for c in host)


@contextmanager
def refusing_port() -> Iterator[str]:
    """The URL of a port bound but not listening: connections are refused at once."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


class TestOneServerTwoSpellings:
    @pytest.mark.parametrize(
        ("first", "second"),
        [
            # IPv6 literals: one address, written two ways (no DNS involved)
            ("redis://[::1]:7000", "redis://[0:0::1]:7000"),
            ("redis://[fe80::1%251]:7000", "redis://[fe80:0::1%251]:7000"),  # one zone
            ("redis://[::1]:7000", "redis://[0000:0000:0000:0000:0000:0000:0000:0001]:7000"),
            # an IPv4 literal and its IPv4-mapped IPv6 form
            ("redis://127.0.0.1:7000", "redis://[::ffff:127.0.0.1]:7000"),
            # the short IPv4 form the resolver reads as 127.0.0.1 without DNS
            ("redis://127.0.0.1:7000", "redis://127.1:7000"),
            # a %-encoded host: redis-py unquotes it and connects to 127.0.0.1
            ("redis://127.0.0.1:7000", f"redis://{_pct('127.0.0.1')}:7000"),
            ("redis://db.example:7000", f"rediss://{_pct('DB.example')}:7000/2"),
            # a name with its final dot
            ("redis://db.example:7000", "redis://db.example.:7000"),
            # a %-encoded socket path: redis-py unquotes it too
            ("unix:///tmp/a.sock", "unix:///tmp/%61.sock"),
            # one socket path with a doubled slash / a dot segment
            ("unix:///tmp/a.sock", "unix:///tmp//a.sock"),
            ("unix:///tmp/a.sock", "unix:///tmp/./a.sock"),
            ("unix:///tmp/a.sock", "unix:////tmp/a.sock"),
        ],
    )
    def test_the_same_master_spelled_two_ways_is_refused(self, first: str, second: str) -> None:
        with pytest.raises(ValueError, match="given twice") as refused:
            AsyncRedlock([first, second, "redis://127.0.0.1:7001"])
        message = str(refused.value)
        assert f"'{second.lower()}' is given twice" in message.lower()  # both spellings
        assert f"(first as '{first}': one server)" in message

    def test_the_message_shows_no_password(self) -> None:
        with pytest.raises(ValueError, match="given twice") as refused:
            AsyncRedlock(
                [f"redis://:{SECRET}@[::1]:7000", f"redis://u:{SECRET}@[0::1]:7000/1", "redis://h"]
            )
        assert SECRET not in str(refused.value)
        assert "'redis://u@[0::1]:7000/1' is given twice (first as 'redis://[::1]:7000'" in str(
            refused.value
        )

    @pytest.mark.parametrize(
        "masters",
        [
            ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001", "redis://127.0.0.2:7000"],
            ["redis://[::1]:7000", "redis://[::2]:7000", "redis://127.0.0.1:7000"],
            ["unix:///tmp/a.sock", "unix:///tmp/b.sock", "unix:///tmp/a/a.sock"],
            ["redis-sentinel://s1/orders", "redis-sentinel://s1/payments", "redis://s1"],
            # one link-local address on two links (zones): two machines
            ["redis://[fe80::1%25lo]:7000", "redis://[fe80::1%25eth0]:7000", "redis://h"],
            ["redis://[fe80::1%251]:7000", "redis://[fe80::1%252]:7000", "redis://h"],
        ],
    )
    def test_distinct_servers_are_taken(self, masters: list[str]) -> None:
        assert len(AsyncRedlock(masters).masters) == 3

    async def test_a_url_and_a_client_of_one_server_are_refused(self, servers: ServerGroup) -> None:
        host, port = servers.urls[0].removeprefix("redis://").rsplit(":", 1)
        clients = [
            Redis.from_url(servers.urls[0]),
            Redis(host=f"::ffff:{host}", port=int(port), db=3),
            Redis.from_url(f"redis://{_pct(host)}:{port}/2"),
        ]
        try:
            for client in clients:
                with pytest.raises(ValueError, match="given twice"):
                    AsyncRedlock([servers.urls[0], client, servers.urls[1]])
                with pytest.raises(ValueError, match="given twice"):
                    AsyncRedlock([client, servers.urls[1], f"redis://{_pct(host)}:{port}"])
        finally:
            for client in clients:
                await client.aclose()

    async def test_a_unix_url_and_a_client_of_one_socket_are_refused(self) -> None:
        client = Redis(unix_socket_path="/tmp//a.sock")
        try:
            with pytest.raises(ValueError, match="given twice"):
                AsyncRedlock(["unix:///tmp/%61.sock", client, "redis://h"])
        finally:
            await client.aclose()

    def test_one_sentinel_service_through_overlapping_sentinels_is_refused(self) -> None:
        # A sentinel monitors one master per service name: s1 names one master,
        # whichever other sentinels are listed beside it.
        with pytest.raises(ValueError, match="given twice"):
            AsyncRedlock(
                [
                    "redis-sentinel://s1:26379,s2:26379,s3:26379/orders",
                    "redis-sentinel://S1/orders",
                    "redis://127.0.0.1:7001",
                ]
            )

    async def test_a_sentinel_url_and_a_sentinel_client_of_one_service_are_refused(
        self,
    ) -> None:
        client = Sentinel([("127.0.0.1", 26380), ("s9", 26379)]).master_for("orders")
        try:
            with pytest.raises(ValueError, match="given twice"):
                AsyncRedlock(["redis-sentinel://127.1:26380/orders", client, "redis://h"])
        finally:
            await client.aclose()

    async def test_a_cluster_client_and_a_url_of_its_node_are_refused(self) -> None:
        cluster = RedisCluster(host="127.0.0.1", port=7000)
        try:
            with pytest.raises(ValueError, match="given twice"):
                AsyncRedlock([cluster, "redis://[::ffff:127.0.0.1]:7000", "redis://h"])
        finally:
            await cluster.aclose()

    async def test_one_server_does_not_make_a_quorum_of_three(self, servers: ServerGroup) -> None:
        """The consequence: one live server spelled twice (two databases of it), one
        master down, and a lock granted by "2 of 3 masters" that are one server."""
        url = servers.urls[0]
        host, port = url.removeprefix("redis://").rsplit(":", 1)
        with refusing_port() as dead:
            try:
                redlock = AsyncRedlock(
                    [f"{url}/0", f"redis://{_pct(host)}:{port}/1", dead], timeout=0
                )
            except ValueError:
                return  # refused at construction
            async with redlock:
                with anyio.fail_after(HANG_GUARD):
                    try:
                        lease = await redlock.lock("one-server", fencing=False).acquire()
                    except QuorumUnavailableError:
                        return
                    await lease.release()
                    pytest.fail(
                        f"a quorum of 2 of 3 masters was granted by one server ({redlock.masters})"
                    )


class TestOneDatabasePerUrl:
    @pytest.mark.parametrize("query", ["db=5", "client_name=x&db=5", "db=00"])
    def test_a_url_naming_two_databases_is_refused(self, query: str) -> None:
        # redis-py takes the query's db over the path's: the keys would go to that
        # one while errors, inspect() and the CLI show the path's.
        with pytest.raises(ValueError, match=r"names two databases: /1 in its path") as refused:
            AsyncRedlock([f"redis://h:7000/1?{query}", "redis://h:7001", "redis://h:7002"])
        assert "5" not in str(refused.value).partition("names")[2]  # the value not quoted

    @pytest.mark.parametrize("url", ["redis://h:7000/5?db=5", "redis://h:7000/05?db=5"])
    def test_one_database_given_twice_is_taken(self, url: str) -> None:
        redlock = AsyncRedlock([url, "redis://h:7001", "redis://h:7002"])
        assert redlock.masters[0] == url.partition("?")[0]

    async def test_a_url_naming_two_databases_is_refused_or_shown_with_the_one_used(
        self, servers: ServerGroup
    ) -> None:
        url = f"{servers.urls[0]}/0?db=5"
        try:
            redlock = AsyncRedlock([url, *servers.urls[1:3]], timeout=0)
        except ValueError:
            return
        async with redlock:
            with anyio.fail_after(HANG_GUARD):
                async with redlock.lock("which-db", fencing=False):
                    probe = Redis.from_url(f"{servers.urls[0]}/5")
                    try:
                        in_db5 = await probe.exists("which-db")
                    finally:
                        await probe.aclose()
        assert not in_db5 or redlock.masters[0].endswith("/5"), (
            f"the key went to db 5, but the master shows as {redlock.masters[0]!r}"
        )
