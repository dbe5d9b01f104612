"""Bad input gets a clear, typed error at the boundary, before any I/O: master URLs
no connection could send, URL flags redis-py would misread, `acl_rules()` arguments,
and a `locked()` template that is a lock name itself (found in review: rinput)."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, acl_rules
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10  # seconds; only stops a hung test, never decides an outcome


async def client_count(masters: Masters) -> int:
    return sum([len(await client.client_list()) for client in masters.clients])


# Master URLs whose host, socket path, service, user or password can never be sent:
# a lone surrogate has no UTF-8 encoding, a NUL ends a C string (getaddrinfo, the
# socket path). Names and the prefix are refused for the same reasons; the URL is
# accepted and every connection to that master fails later.
UNSENDABLE_URLS = [
    "redis://h\ud800:6379",
    "redis://h\x00x:6379",
    "unix:///tmp/a\ud800.sock",
    "unix:///tmp/a\x00b.sock",
    "redis://user:p\ud800@h:6379",
    "redis://h:6379?username=\ud800",
    "redis://h:6379?password=\ud800",
    "redis-sentinel://h\ud800:26379/svc",
    "redis-sentinel://h:26379/s\ud800vc",
    "redis-sentinel://h:26379/s\x00vc",
]


class TestMasterUrls:
    @pytest.mark.parametrize("url", UNSENDABLE_URLS, ids=ascii)
    def test_an_unsendable_url_is_refused_at_construction(self, url: str) -> None:
        """A lone surrogate or a NUL would fail every connection to that master."""
        with pytest.raises(ValueError, match="master URL"):
            AsyncRedlock([url])

    async def test_an_unsendable_password_fails_later_not_at_construction(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A surrogate in a password: refused at construction, nothing opened."""
        host, port = servers.urls[0].removeprefix("redis://").split("/")[0].rsplit(":", 1)
        bad = f"redis://default:p\ud800@{host}:{port}"
        before = await client_count(masters)
        with pytest.raises(ValueError, match="master URL"):
            redlock = AsyncRedlock([bad, *servers.urls[1:]])
            try:  # reached only if the URL were taken
                with anyio.fail_after(HANG_GUARD):
                    await redlock.lock("review-pw", timeout=0).acquire()
            finally:
                await redlock.aclose()
        assert await client_count(masters) <= before

    @pytest.mark.parametrize(
        ("url", "complaint"),
        [
            # redis-py's to_bool: anything but 0/F/FALSE/N/NO is True, so a typo of
            # "false" silently turns the option on; docs say `true` or `false`.
            ("redis://h?socket_keepalive=flase", "socket_keepalive"),
            ("rediss://h?ssl_check_hostname=nope", "ssl_check_hostname"),
            # A database number no server accepts (SELECT takes a 32-bit int).
            ("redis://h?db=99999999999999999999", "db"),
            ("redis://h/99999999999999999999", "database number"),
        ],
    )
    def test_a_url_parameter_redis_py_misreads_is_refused(self, url: str, complaint: str) -> None:
        """A flag redis-py would read as true (anything but its false words), or a
        database number SELECT refuses: refused at construction."""
        with pytest.raises(ValueError, match=re.escape(complaint)):
            AsyncRedlock([url])


class TestAclRules:
    @pytest.mark.parametrize(
        ("kwargs", "error", "pattern"),
        [
            ({"keys": None}, TypeError, r"^keys must be a str"),
            ({"keys": 5}, TypeError, r"^keys must be a str"),
            ({"keys": b"*"}, TypeError, r"^keys must be a str"),
            ({"prefix": None}, TypeError, r"^prefix must be a str"),
            ({"prefix": 5}, TypeError, r"^prefix must be a str"),
            ({"keys": "k\ud800"}, ValueError, "keys cannot be encoded as UTF-8"),
            ({"prefix": "p\ud800"}, ValueError, "prefix cannot be encoded as UTF-8"),
            ({"prefix": "a\0"}, ValueError, "prefix must not contain a NUL"),
        ],
    )
    def test_bad_arguments_are_typed_and_named(
        self, kwargs: dict[str, Any], error: type[Exception], pattern: str
    ) -> None:
        """Wrong types are a TypeError naming the argument; text that cannot be
        sent (which AsyncRedlock(prefix=...) refuses too) a ValueError."""
        with pytest.raises(error, match=pattern):
            acl_rules(**kwargs)


class TestLockedTemplate:
    @pytest.mark.parametrize(
        ("template", "pattern"),
        [
            ("a\0b", "NUL"),
            ("k\ud800", "UTF-8"),
        ],
        ids=ascii,
    )
    async def test_a_template_without_fields_is_checked_when_decorating(
        self, servers: ServerGroup, template: str, pattern: str
    ) -> None:
        """A template with no fields is the lock name itself: a name no server can
        take is refused by locked() at once, not at each call. (A reserved name
        depends on the prefix, so it is refused at the call, before any I/O.)"""
        async with AsyncRedlock(servers.urls) as redlock:
            with pytest.raises(ValueError, match=pattern):
                redlock.locked(template)
