"""Bad input at the boundary: a typed error that names the problem, and nothing lost.

After each refused call the same ``AsyncRedlock`` still acquires and releases; a
refused construction leaves no connection open; unreachable masters fail fast with
what each one said, never a hang.
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import redis
import valkey
import valkey.asyncio
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel

from asyncredlock import AsyncRedlock, LockNotOwnedError, QuorumUnavailableError
from asyncredlock._lock import SPECS_KEPT
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds: a hang fails the test instead of blocking CI
SECRET = "s3cretPW"  # a password no error may show


@contextmanager
def refusing_ports(n: int) -> Iterator[list[str]]:
    """URLs of ports bound but not listening: connections are refused at once."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        yield [f"redis://127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


async def assert_still_works(redlock: AsyncRedlock, masters: Masters) -> None:
    """The redlock takes and gives back a lock on every master, leaving no key."""
    with anyio.fail_after(HANG_GUARD):
        lease = await redlock.lock("still-works", timeout=0).acquire()
        await redlock.settle()  # the masters beyond the quorum have answered too
        assert await masters.holding("still-works") == len(masters.clients)
        await lease.release()
        await redlock.settle()
    assert await masters.keys() == [[]] * len(masters.clients)


async def client_count(masters: Masters) -> int:
    return sum([len(await client.client_list()) for client in masters.clients])


class TestMasters:
    @pytest.mark.parametrize(
        ("masters_arg", "error", "pattern"),
        [
            ([], ValueError, "at least one"),
            ((), ValueError, "at least one"),
            # one URL given as masters: the message says what to pass instead
            (
                "redis://127.0.0.1:6379",
                TypeError,
                r"sequence of URLs .*, not str: pass the URLs in a list \(\[url\] for one",
            ),
            (b"redis://127.0.0.1:6379", TypeError, "sequence of URLs .*, not bytes$"),
            ({"redis://127.0.0.1:6379"}, TypeError, "sequence of URLs .*, not set$"),
            (None, TypeError, "sequence of URLs .*, not NoneType$"),
            ([b"redis://127.0.0.1:6379"], TypeError, "not bytes"),
            ([6379], TypeError, "not int"),
            (["http://x"], ValueError, r"'http://x' must start with redis://"),
            (["redis://"], ValueError, r"'redis://' names no host"),
            (["redis://:6379"], ValueError, r"'redis://:6379' names no host"),
            (["redis://h:notaport"], ValueError, r"'redis://h:\.\.\.' has an invalid port"),
            (["redis://h:99999"], ValueError, r"'redis://h:99999' has an invalid port"),
            (["unix://"], ValueError, r"'unix://' names no socket path"),
            (["redis://h:0"], ValueError, r"'redis://h:0' has port 0"),
            (["redis://h/notadb"], ValueError, "the path must be a database number"),
            (["redis://h/\u00b2"], ValueError, "the path must be a database number"),  # ²
            (["redis://h/\u0663"], ValueError, "the path must be a database number"),  # ٣
            (["unix://relative/s.sock"], ValueError, "'unix://relative/s.sock' names a host"),
            (["unix://h:1/s.sock"], ValueError, "'unix://h:1/s.sock' names a host"),
            (["redis://h/0#f"], ValueError, r"'redis://h/0' has a fragment \('#\.\.\.'\)"),
            (["redis://h:1/1", "redis://h:1/2"], ValueError, "is given twice"),
            (["redis://h:1", "redis://h:1"], ValueError, r"'redis://h:1' is given twice"),
            (["redis://h:1", "redis://H:1/0"], ValueError, "is given twice"),
            (["redis://h", "redis://h:6379"], ValueError, "is given twice"),
        ],
    )
    async def test_bad_masters_refused(
        self, masters_arg: Any, error: type[Exception], pattern: str
    ) -> None:
        with pytest.raises(error, match=pattern):
            AsyncRedlock(masters_arg)

    @pytest.mark.parametrize(
        ("url", "complaint"),
        [
            ("redis://h/0?foo=bar", "'redis://h/0': unknown parameter 'foo' (it takes db, "),
            ("redis://h/0?ssl=true", "unknown parameter 'ssl'"),
            ("redis://h/0?ssl_cert_reqs=none", "unknown parameter 'ssl_cert_reqs'"),
            ("unix:///s.sock?socket_keepalive=true", "unknown parameter 'socket_keepalive'"),
            ("redis://h?encoding=klingon", "encoding must name a codec"),
            ("redis://h?encoding_errors=shrug", "encoding_errors must name a codec or error"),
            ("redis://h?max_connections=many", "Invalid value for 'max_connections'"),
            ("redis://h?socket_timeout=-1", "socket_timeout must be > 0 seconds"),
            ("redis://h?socket_timeout=0", "socket_timeout must be > 0 seconds"),
            ("redis://h?socket_connect_timeout=nan", "socket_connect_timeout must be a finite"),
            ("redis://h?socket_timeout=soon", "socket_timeout must be seconds, got 'soon'"),
            ("redis://h?db=\u00b2", "db must be a database number"),
            ("redis://h?db=1&db=2", "gives the parameter 'db' twice"),
            ("redis://h?client_name=a%20b", "client_name may not hold spaces"),
            ("rediss://h?ssl_cert_reqs=maybe", "Invalid SSL Certificate Requirements Flag"),
            ("rediss://h?ssl_include_verify_flags=NO", "Invalid value for 'ssl_include_verify"),
            ("rediss://h?ssl_min_version=99", "ssl_min_version must be an ssl.TLSVersion"),
        ],
    )
    def test_a_url_parameter_is_checked_at_construction(self, url: str, complaint: str) -> None:
        with pytest.raises(ValueError, match=re.escape(complaint)):
            AsyncRedlock([url])

    @pytest.mark.parametrize(
        ("url", "shown"),
        [
            (f"redis://:{SECRET}@h:notaport", "'redis://h:...' has an invalid port"),
            (f"redis://u:{SECRET}@h:99999", "'redis://u@h:99999' has an invalid port"),
            (f"redis://u:{SECRET}@h/abc", "'redis://u@h/abc': the path must be"),
            (f"redis://u:{SECRET}@:6379", "'redis://u@:6379' names no host"),
            (f"redis://u:{SECRET}@h:0", "'redis://u@h:0' has port 0"),
            (f"redis://u:{SECRET}@h1,h2", "'redis://u@h1,h2' has a comma"),
            (f"rediss//u:{SECRET}@h", "'rediss//u@h' must start with"),
            (f"http://u:{SECRET}@h", "'http://u@h' must start with"),
            (f"redis://u:{SECRET[:3]}/{SECRET[3:]}@h:1", "'redis://u@h:1' has an invalid port"),
            (f"unix://u:{SECRET}@", "'unix://u@' names no socket path"),
            # an '@' after a '?': a password holding a '?', or one in the query
            (f"redis://u:2024?{SECRET}@h:1/0", "'redis://...': its query holds an '@'"),
            (f"redis://h:1/0?password={SECRET[:3]}@{SECRET[3:]}", "'redis://...': its query"),
            (f"redis://h:1/0#{SECRET[:3]}@{SECRET[3:]}", "'redis://...' has a fragment"),
            # an unencoded '&' in a query password: its tail read as a parameter
            (f"redis://h:1/0?password=ab&{SECRET}", "'redis://h:1/0': an unknown parameter"),
            (f"redis://h:1/0?password=ab&db={SECRET}", "the value of 'db' is not valid"),
        ],
    )
    def test_a_refused_url_is_shown_without_its_password(self, url: str, shown: str) -> None:
        with pytest.raises(ValueError, match=re.escape(shown)) as refused:
            AsyncRedlock([url])
        assert SECRET[:3] not in str(refused.value)
        assert SECRET[3:] not in str(refused.value)

    async def test_a_refused_construction_opens_nothing(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        before = await client_count(masters)
        with pytest.raises(ValueError, match="must start with"):
            AsyncRedlock([*servers.urls[:4], "http://x"])
        with pytest.raises(ValueError, match="given twice"):
            AsyncRedlock([*servers.urls, servers.urls[0]])
        assert await client_count(masters) <= before
        async with AsyncRedlock(servers.urls) as redlock:
            await assert_still_works(redlock, masters)

    async def test_a_refused_client_opens_nothing_and_good_ones_work(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        # a client of a real master, one setting bad: refused before any connection
        first = urlsplit(servers.urls[0])
        host, port = first.hostname, first.port
        name = f"master 'redis://{host}:{port}/0'"
        refused: list[tuple[dict[str, Any], str]] = [
            ({"socket_timeout": math.nan}, f"{name}: socket_timeout must be a finite"),
            ({"socket_connect_timeout": -1}, f"{name}: socket_connect_timeout must be > 0"),
            ({"client_name": "a b"}, f"{name}: client_name may not hold spaces"),
            ({"db": -1}, f"'redis://{host}:{port}/-1': db must be a database number"),
        ]
        before = await client_count(masters)
        for settings, message in refused:
            client = Redis(host=host, port=port, **settings)
            with pytest.raises(ValueError, match=re.escape(message)):
                AsyncRedlock([client, *servers.urls[1:]])
            await client.aclose()
        assert await client_count(masters) <= before
        # the same master with good settings (a port in digits, as redis-py takes it)
        good = Redis(host=host, port=str(port), socket_timeout=2, socket_connect_timeout=2)
        try:
            async with AsyncRedlock([good, *servers.urls[1:]]) as redlock:
                await assert_still_works(redlock, masters)
        finally:
            await good.aclose()

    async def test_the_same_client_twice_is_refused(self, servers: ServerGroup) -> None:
        client = Redis.from_url(servers.urls[0])
        try:
            with pytest.raises(ValueError, match="given twice"):
                AsyncRedlock([client, client])
        finally:
            await client.aclose()

    async def test_a_sync_client_is_refused(self, servers: ServerGroup) -> None:
        sync_client = redis.Redis.from_url(servers.urls[0])
        try:
            with pytest.raises(TypeError, match=r"redis\.asyncio .*not Redis"):
                AsyncRedlock([sync_client])
        finally:
            sync_client.close()

    async def test_two_databases_of_one_server_are_not_two_masters(
        self, servers: ServerGroup
    ) -> None:
        # one server is one failure domain, whichever database each URL names
        url = servers.urls[0]
        for first, second in [(f"{url}/1", f"{url}/2"), (f"{url}?db=1", f"{url}?db=2")]:
            with pytest.raises(ValueError, match="given twice"):
                AsyncRedlock([first, second, servers.urls[1]])

    async def test_valkey_clients_are_masters_too(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        mine = [valkey.asyncio.Valkey.from_url(url) for url in servers.urls[:3]]
        try:
            async with AsyncRedlock([*mine, *servers.urls[3:]]) as redlock:
                assert redlock.masters[:3] == tuple(f"{url}/0" for url in servers.urls[:3])
                await assert_still_works(redlock, masters)
            assert [await client.ping() for client in mine] == [True] * 3  # still open
        finally:
            for client in mine:
                await client.aclose()

    def test_a_valkey_object_that_is_no_client_is_refused(self) -> None:
        with pytest.raises(TypeError, match=r"valkey\.asyncio Valkey/ValkeyCluster"):
            AsyncRedlock([valkey.asyncio.ConnectionPool()])  # type: ignore[list-item]

    def test_a_sync_valkey_client_is_refused(self, servers: ServerGroup) -> None:
        with pytest.raises(TypeError, match=r"valkey\.asyncio Valkey/ValkeyCluster"):
            AsyncRedlock([valkey.Valkey.from_url(servers.urls[0])])  # type: ignore[list-item]

    async def test_cluster_and_sentinel_clients_display_where_they_point(self) -> None:
        cluster = RedisCluster(host="127.0.0.1", port=7000)  # nothing is connected
        sentinel = Sentinel([("127.0.0.1", 26379)]).master_for("orders")
        redlock = AsyncRedlock([cluster, sentinel, "redis://127.0.0.1:6379"])
        assert redlock.masters == (
            "redis-cluster://127.0.0.1:7000",
            "redis-sentinel://127.0.0.1:26379/orders",
            "redis://127.0.0.1:6379",
        )
        await redlock.aclose()

    async def test_an_ipv6_master_displays_in_brackets(self) -> None:
        cluster = RedisCluster(host="::1", port=7000)  # nothing is connected
        redlock = AsyncRedlock(
            ["redis://u:pw@[::1]:6399/0", "rediss://[fe80::1]", Redis(host="::2"), cluster]
        )
        assert redlock.masters == (
            "redis://u@[::1]:6399/0",
            "rediss://[fe80::1]",
            "redis://[::2]:6379/0",
            "redis-cluster://[::1]:7000",
        )
        await redlock.aclose()

    async def test_urls_and_user_clients_mix_and_user_clients_stay_open(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        mine = [Redis.from_url(url) for url in servers.urls[:2]]
        try:
            async with AsyncRedlock([*mine, *servers.urls[2:]]) as redlock:
                assert redlock.masters[2:] == tuple(servers.urls[2:])
                await assert_still_works(redlock, masters)
            assert [await client.ping() for client in mine] == [True, True]
        finally:
            for client in mine:
                await client.aclose()


class TestLockArguments:
    @pytest.mark.parametrize(
        ("name", "error", "pattern"),
        [
            ("", ValueError, "must not be empty"),
            (b"orders", TypeError, "must be a str, not bytes"),
            (42, TypeError, "must be a str, not int"),
            (None, TypeError, "must be a str, not NoneType"),
            ("k\ud800", ValueError, "cannot be encoded as UTF-8"),
            ("a\0b", ValueError, r"must not contain a NUL character \('\\0'\)"),
        ],
    )
    async def test_bad_names_refused_everywhere(
        self,
        servers: ServerGroup,
        masters: Masters,
        name: Any,
        error: type[Exception],
        pattern: str,
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(error, match=pattern):
                redlock.lock(name)
            with pytest.raises(error, match=pattern):
                redlock.lock(["fine", name])
            with pytest.raises(error, match=pattern):
                redlock.rwlock(name)
            with pytest.raises(error, match=pattern):
                await redlock.inspect(name)
            with pytest.raises(error, match=pattern):
                await redlock.force_release(name)
            assert redlock.statistics().attempts == 0
            await assert_still_works(redlock, masters)

    @pytest.mark.parametrize(
        ("kwargs", "error", "pattern"),
        [
            ({"ttl": 0}, ValueError, r"^ttl must be > 0"),
            ({"ttl": -1.5}, ValueError, r"^ttl must be > 0"),
            ({"ttl": math.nan}, ValueError, r"^ttl must be a finite"),
            ({"ttl": math.inf}, ValueError, r"^ttl must be a finite"),
            ({"ttl": True}, TypeError, r"^ttl must be a number"),
            ({"ttl": "10"}, TypeError, r"^ttl must be a number"),
            ({"ttl": 1e20}, ValueError, r"^ttl must be at most 1e\+09 seconds"),
            ({"ttl": 10**400}, ValueError, r"^ttl must be at most 1e\+09 seconds"),
            ({"ttl": 0.001}, ValueError, r"^ttl must be at least 0\.01 s \(the clock drift"),
            ({"ttl": 0.0099}, ValueError, r"^ttl must be at least 0\.01 s"),
            ({"max_hold": 0.002}, ValueError, r"^max_hold must be at least 0\.01 s"),
            ({"timeout": 1e20}, ValueError, r"^timeout must be at most 1e\+09 seconds"),
            ({"timeout": -1}, ValueError, r"^timeout must be >= 0"),
            ({"timeout": math.nan}, ValueError, r"^timeout must be a finite"),
            ({"timeout": "2"}, TypeError, r"^timeout must be a number"),
            ({"auto_extend": "yes"}, TypeError, r"^auto_extend must be a bool"),
            ({"fencing": "yes"}, TypeError, r"^fencing must be a bool"),
        ],
    )
    async def test_bad_lock_settings_refused(
        self,
        servers: ServerGroup,
        masters: Masters,
        kwargs: dict[str, Any],
        error: type[Exception],
        pattern: str,
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(error, match=pattern):
                redlock.lock("bad", **kwargs)
            assert redlock.statistics().attempts == 0
            await assert_still_works(redlock, masters)

    @pytest.mark.parametrize(
        ("good", "bad", "pattern"),
        [
            ({"ttl": 1}, {"ttl": True}, r"^ttl must be a number"),
            ({"ttl": 5}, {"ttl": [5]}, r"^ttl must be a number"),
            ({"auto_extend": True}, {"auto_extend": 1}, r"^auto_extend must be a bool"),
            ({"fencing": False}, {"fencing": 0}, r"^fencing must be a bool"),
            ({"fair": False}, {"fair": 0}, r"^fair must be a bool"),
        ],
    )
    async def test_settings_equal_to_ones_already_used_are_still_checked(
        self, servers: ServerGroup, good: dict[str, Any], bad: dict[str, Any], pattern: str
    ) -> None:
        """lock() keeps the spec of each set of arguments: one that compares equal
        (True == 1) but has the wrong type is refused all the same."""
        async with AsyncRedlock(servers.urls) as redlock:
            first, again = redlock.lock("same", **good), redlock.lock("same", **good)
            assert first._spec is again._spec  # kept
            with pytest.raises(TypeError, match=pattern):
                redlock.lock("same", **bad)

    async def test_the_lock_specs_kept_are_bounded(self, servers: ServerGroup) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            first = redlock.lock("name-0")
            for i in range(SPECS_KEPT + 10):
                redlock.lock(f"name-{i}", ttl=7)
            assert len(redlock._core.specs) == SPECS_KEPT
            assert redlock.lock("name-0")._spec is not first._spec  # the oldest went
            assert redlock.lock(f"name-{SPECS_KEPT + 9}", ttl=7).ttl == 7

    @pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "5", 1e20, 0.001])
    async def test_a_bad_extend_ttl_keeps_the_lease(
        self, servers: ServerGroup, masters: Masters, ttl: Any
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("ext", ttl=5.0, auto_extend=False).acquire()
                with pytest.raises((ValueError, TypeError), match=r"^ttl must be"):
                    await lease.extend(ttl=ttl)
                assert lease.held
                assert lease.ttl == 5.0
                await lease.extend()
                assert lease.held
                await lease.release()
                await redlock.settle()
            assert await masters.keys() == [[]] * 5
            await assert_still_works(redlock, masters)


class TestUnreachableMasters:
    @pytest.mark.parametrize("wait", [0, 0.3])
    async def test_no_master_listening_is_an_outage_with_each_error(self, wait: float) -> None:
        with refusing_ports(3) as urls:
            async with AsyncRedlock(urls) as redlock:
                with anyio.fail_after(HANG_GUARD):
                    with pytest.raises(QuorumUnavailableError) as caught:
                        await redlock.lock("down", timeout=wait).acquire()
                    await redlock.settle()
                stats = redlock.statistics()
        error = caught.value
        assert error.resource == "down"
        assert "too many masters failed or did not answer" in str(error)
        assert [o.node for o in error.outcomes] == urls
        for url, outcome in zip(urls, error.outcomes, strict=True):
            assert not outcome.ok
            assert outcome.detail.startswith("ConnectionError: ")
            assert url.rsplit(":", 1)[1] in outcome.detail  # the port it could not reach
        assert stats.unavailable == 1
        assert stats.timeouts == 0
        assert stats.acquisitions == 0
        assert stats.failed_attempts == stats.attempts >= 1
        assert stats.background_tasks == 0

    async def test_a_majority_down_is_an_outage_and_the_minority_is_undone(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        with refusing_ports(3) as down:
            async with AsyncRedlock([*servers.urls[:2], *down]) as redlock:
                with anyio.fail_after(HANG_GUARD):
                    with pytest.raises(QuorumUnavailableError) as caught:
                        await redlock.lock("half", timeout=0).acquire()
                    await redlock.settle()
        outcomes = caught.value.outcomes
        assert all(o.detail.startswith("ConnectionError: ") for o in outcomes[2:])
        assert not any(o.ok for o in outcomes[2:])
        assert await masters.holding("half") == 0
        assert await masters.keys() == [[]] * 5

    async def test_a_minority_down_is_tolerated(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        with refusing_ports(2) as down:
            # patient with the live masters: a loaded machine can take longer than
            # the default 0.1 s for a first connection, and this test is about the
            # refused ones
            urls = [*servers.urls[:3], *down]
            async with AsyncRedlock(urls, node_timeout=HANG_GUARD / 3) as redlock:
                with anyio.fail_after(HANG_GUARD):
                    lease = await redlock.lock("minority", timeout=0).acquire()
                    assert await masters.holding("minority") == 3
                    await lease.release()
                    await redlock.settle()
        assert await masters.keys() == [[]] * 5


class TestClosed:
    async def test_using_a_closed_redlock_raises_runtime_error(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        redlock = AsyncRedlock(servers.urls)
        with anyio.fail_after(HANG_GUARD):
            lock = redlock.lock("closing")
            lease = await lock.acquire()
            await redlock.aclose()
        assert lease.lost  # aclose ended it (released on the masters)
        assert await masters.keys() == [[]] * 5
        with pytest.raises(RuntimeError, match="closed"):
            redlock.lock("closing")
        with pytest.raises(RuntimeError, match="closed"):
            async with redlock:
                pass
        with pytest.raises(RuntimeError, match="closed"):
            await lock.acquire()  # a Lock made before the close
        with pytest.raises(RuntimeError, match="closed"):
            await redlock.inspect("closing")
        with pytest.raises(LockNotOwnedError, match="already lost"):
            await lease.release()

    async def test_force_release_on_a_closed_redlock_raises(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        redlock = AsyncRedlock(servers.urls)
        await redlock.aclose()
        before = await client_count(masters)
        try:
            with pytest.raises(RuntimeError, match="closed"):
                await redlock.force_release("anything")
        finally:
            assert await client_count(masters) <= before

    async def test_aclose_twice_is_fine(self, servers: ServerGroup, masters: Masters) -> None:
        redlock = AsyncRedlock(servers.urls)
        await assert_still_works(redlock, masters)
        with anyio.fail_after(HANG_GUARD):
            await redlock.aclose()
            await redlock.aclose()
        assert redlock.statistics().acquisitions == 1

    async def test_closing_an_unused_redlock_is_fine(self) -> None:
        with refusing_ports(3) as urls:
            redlock = AsyncRedlock(urls)
            with anyio.fail_after(HANG_GUARD):
                await redlock.aclose()
        assert redlock.statistics().attempts == 0
