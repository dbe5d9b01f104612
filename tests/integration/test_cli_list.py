"""``asyncredlock list`` against real servers, and how it tells lock keys from the
library's auxiliary keys."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.__main__ import main
from asyncredlock._cli.listing import listed_key, split_aux
from asyncredlock._keys import aux_key, channel, queue_keys, readers_key, terms_key, undo_key
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters

pytestmark = pytest.mark.anyio

WAIT = 30.0  # a bound on each wait, far above what it takes


async def cli(*argv: str) -> int:
    """``main(argv)`` in a worker thread: it runs its own event loop, as from a shell."""
    return await anyio.to_thread.run_sync(main, list(argv))


async def cli_abandoned(*argv: str) -> int:
    """`cli`, for a test that may give up on it (``fail_after``): the thread is left
    behind rather than waited for."""
    return await anyio.to_thread.run_sync(main, list(argv), abandon_on_cancel=True)


def master_args(urls: list[str]) -> list[str]:
    return [arg for url in urls for arg in ("--master", url)]


def table(out: str) -> dict[str, list[str]]:
    """The rows of a listing, by lock name: its cells after the name."""
    lines = out.splitlines()
    if not lines[0].startswith("NAME"):
        return {}
    rows = [re.split(r"\s{2,}", line) for line in lines[1:-1]]
    return {row[0]: row[1:] for row in rows}


def json_documents(out: str) -> list[dict[str, Any]]:
    """The JSON documents printed one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(out):
        document, end = decoder.raw_decode(out, at)
        found.append(document)
        at = end + 1  # the newline after it
    return found


def names(document: dict[str, Any]) -> list[str]:
    return [lock["name"] for lock in document["locks"]]


@pytest.fixture(autouse=True)
def _no_masters_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_MASTERS", raising=False)


@asynccontextmanager
async def reader_urls(urls: list[str], *, refused: int) -> AsyncIterator[list[str]]:
    """URLs of a read-only user of ``urls`` (its rules: usage.md's) whom the first
    ``refused`` masters do not allow ``EVALSHA`` or ``EVAL``: the lock's state
    cannot be read there, its keys can be scanned."""
    user, password = "listreader", "list-pw"
    rules = ["on", f">{password}", "~*", "+scan", "+ping", "+time", "+get", "+pttl"]
    rules += ["+hget", "+zrange", "+zrangebyscore", "+zscore"]
    try:
        for i, url in enumerate(urls):
            async with Redis.from_url(url) as client:
                scripts = [] if i < refused else ["+evalsha", "+eval"]
                await client.execute_command("ACL", "SETUSER", user, "reset", *rules, *scripts)
        yield [url.replace("redis://", f"redis://{user}:{password}@") for url in urls]
    finally:
        for url in urls:
            async with Redis.from_url(url) as client:
                await client.execute_command("ACL", "DELUSER", user)


async def hold(redlock: AsyncRedlock, *names: str) -> list[Lease]:
    """Take each lock for a minute, and wait until every master has it."""
    leases = [await redlock.lock(name, ttl=60.0, auto_extend=False).acquire() for name in names]
    await redlock.settle()
    return leases


class TestList:
    async def test_held_locks_and_readers_not_auxiliary_keys(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with AsyncRedlock(servers.urls, identity="lister") as redlock:
            await (await redlock.lock("done").acquire()).release()  # its fence counter stays
            leases = await hold(redlock, "jobs:1", "{user}:7", "a}b")
            rw = redlock.rwlock("report")
            readers = [await rw.read().acquire(), await rw.read().acquire()]
            await redlock.settle()
            async with Redis.from_url(servers.urls[0]) as first:
                await _not_locks(first)
                assert await first.exists("{done}:fence", "{jobs:1}:fence", "{report}:readers") == 3
            code = await cli("list", *master_args(servers.urls))
            text = capsys.readouterr().out
            json_code = await cli("list", "--json", *master_args(servers.urls))
        assert (code, json_code) == (0, 0)
        assert table(text) == {
            "a}b": ["5 of 5", "lister", "-"],
            "jobs:1": ["5 of 5", "lister", "-"],
            "report": ["5 of 5", "-", "2 (lister)"],
            "{user}:7": ["5 of 5", "lister", "-"],
        }
        assert (
            text.splitlines()[-1] == "4 locks matching '*' held on 5 masters (5 answered, quorum 3)"
        )
        locks = {lock["name"]: lock for lock in json.loads(capsys.readouterr().out)["locks"]}
        assert [locks[name]["holder"] for name in ("jobs:1", "{user}:7", "a}b")] == [
            lease.value for lease in leases
        ]
        assert locks["jobs:1"] | {"holder": None} == {
            "name": "jobs:1",
            "key": "jobs:1",
            "status": "held",
            "held_on": 5,
            "unread": [],
            "holder": None,
            "identity": "lister",
            "readers": [],
        }
        assert locks["report"]["readers"] == sorted(
            ({"value": lease.value, "identity": "lister", "on": 5} for lease in readers),
            key=lambda reader: reader["value"],
        )

    async def test_any_string_with_an_expiry_is_listed_other_keys_are_not(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        for i, url in enumerate(servers.urls):
            async with Redis.from_url(url) as client:
                await client.set("config", "x")  # no expiry: not a lock
                await client.hset("hash", "field", "value")  # not a string
                if i < 3:
                    await client.set("elsewhere", "not-ours", px=60_000)  # another client's
                if i < 2:
                    await client.set("partial", "not-ours", px=60_000)  # not on a quorum
        code = await cli("list", *master_args(servers.urls))
        assert table(capsys.readouterr().out) == {
            "elsewhere": ["3 of 5", "not-ours", "-"],
            "partial": ["2 of 5", "(no majority)", "-"],
        }
        json_code = await cli("list", "--json", *master_args(servers.urls))
        elsewhere, partial = json.loads(capsys.readouterr().out)["locks"]
        assert (code, json_code) == (0, 0)
        assert (elsewhere["held_on"], elsewhere["holder"], elsewhere["identity"]) == (
            3,
            "not-ours",
            None,
        )
        assert (partial["held_on"], partial["holder"], partial["identity"]) == (2, None, None)

    async def test_a_lock_on_fewer_than_a_quorum_is_not_counted_held(
        self, servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A key on a minority of masters is listed, "(no majority)", and the summary
        counts it apart from the locks held (it said "3 locks [...] held")."""
        for i, client in enumerate(masters.clients):
            await client.set("held", "v", px=60_000)
            if i < 2:
                await client.set("partial", "v", px=60_000)  # a writer on 2 of 5
                await client.zadd("{read}:readers", {"r:" + "0" * 32: 9e15})  # readers on 2
        code = await cli("list", *master_args(servers.urls))
        out = capsys.readouterr().out
        assert code == 0
        assert table(out) == {
            "held": ["5 of 5", "v", "-"],
            "partial": ["2 of 5", "(no majority)", "-"],
            "read": ["2 of 5", "-", "-"],
        }
        assert out.splitlines()[-1] == (
            "1 lock matching '*' held on 5 masters, 2 without a majority (5 answered, quorum 3)"
        )

    @pytest.mark.parametrize(
        ("on", "row", "code", "summary"),
        [
            (3, ["0 of 5 (3 unread)", "(unknown)", "-"], 3, "0 locks [...] 5 masters, 1 unknown"),
            (
                1,
                ["0 of 5 (1 unread)", "-", "-"],
                0,
                "0 locks [...] 5 masters, 1 without a majority",
            ),
        ],
    )
    async def test_a_lock_not_read_on_a_master_is_listed_and_named(
        self,
        servers: ServerGroup,
        masters: Masters,
        capsys: pytest.CaptureFixture[str],
        on: int,
        row: list[str],
        code: int,
        summary: str,
    ) -> None:
        """A lock key on the first ``on`` masters, which refuse the lister's EVALSHA
        (inspect.lua): its row says how many masters were not read, a warning names
        the lock, each master and why; exit 3 when the masters not read could hold it
        on a quorum. It was left out of the listing, nothing on stderr, exit 0."""
        for client in masters.clients[:on]:
            await client.set("jobs:1", "v", px=60_000)
        async with reader_urls(servers.urls, refused=on) as urls:
            with anyio.fail_after(WAIT):
                status = await cli("list", *master_args(urls))
                captured = capsys.readouterr()
                json_status = await cli("list", "--json", *master_args(urls))
        assert (status, json_status) == (code, code)
        assert table(captured.out) == {"jobs:1": row}
        head, tail = summary.split(" [...] ")
        assert captured.out.splitlines()[-1] == (
            f"{head} matching '*' held on {tail} (5 answered, quorum 3)"
        )
        nodes = [url.replace(":list-pw@", "@") for url in urls[:on]]  # shown without it
        warnings = [line for line in captured.err.splitlines() if ": warning: " in line]
        assert [line.split(": ResponseError: NOPERM ")[0] for line in warnings] == [
            f"asyncredlock: warning: lock jobs:1 not read on {node}" for node in nodes
        ]
        assert all("'evalsha'" in line for line in warnings)
        assert ("error: could not tell whether 1 lock is held" in captured.err) == bool(code)
        (lock,) = json.loads(capsys.readouterr().out)["locks"]
        assert lock["status"] == ("unknown" if code else "free")
        assert [node["node"] for node in lock["unread"]] == nodes

    async def test_pattern_and_prefix(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with (
            AsyncRedlock(servers.urls, prefix="app:") as app,
            AsyncRedlock(servers.urls) as plain,
        ):
            await hold(app, "jobs:1", "jobs:2", "mail:1")
            await hold(plain, "jobs:3")
            argv = ["--json", *master_args(servers.urls)]
            codes = [
                await cli("list", "jobs:*", "--prefix", "app:", *argv),
                await cli("list", "jobs:*", *argv),
                await cli("list", "*jobs*", *argv),
                await cli("list", "[!j]*", "--prefix", "app:", *argv),
            ]
        documents = json_documents(capsys.readouterr().out)
        assert codes == [0, 0, 0, 0]
        assert [names(document) for document in documents] == [
            ["jobs:1", "jobs:2"],  # names without the prefix
            ["jobs:3"],
            ["app:jobs:1", "app:jobs:2", "jobs:3"],
            ["mail:1"],
        ]
        assert documents[0]["prefix"] == "app:"
        assert [lock["key"] for lock in documents[0]["locks"]] == ["app:jobs:1", "app:jobs:2"]

    async def test_a_value_that_is_not_text_is_listed(
        self, servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
    ) -> None:
        for client in masters.clients:
            await client.set("binary", b"\xff\xfe", px=60_000)
        assert await cli("list", *master_args(servers.urls)) == 0
        assert "binary" in table(capsys.readouterr().out)

    @pytest.mark.parametrize(
        "odd_key",
        [
            b"cache:a\x00b",  # keys are binary-safe: a NUL, which lock names refuse
            b"{a}:9:{a}:fence:readers",  # a readers set whose lock key is a reserved key
        ],
    )
    async def test_a_key_that_is_no_lock_name_is_skipped(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str], odd_key: bytes
    ) -> None:
        """A key on a shared server whose name ``inspect()`` refuses is left out of
        the listing; the locks beside it are listed (it raised ValueError: no
        listing, a traceback, exit 1)."""
        async with AsyncRedlock(servers.urls, identity="lister") as redlock:
            await hold(redlock, "jobs:1")
            for url in servers.urls:
                async with Redis.from_url(url) as client:
                    if odd_key.endswith(b":readers"):
                        await client.zadd(odd_key, {"r": 9e15})
                    else:
                        await client.set(odd_key, "x", px=60_000)
            code = await cli("list", *master_args(servers.urls))
        captured = capsys.readouterr()
        assert code == 0
        assert table(captured.out) == {"jobs:1": ["5 of 5", "lister", "-"]}
        assert captured.err == ""

    async def test_control_characters_are_escaped_in_text_not_in_json(
        self, servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A holder's value, a reader's and a key's name are any client's to write: in
        the table their control characters are escaped (a newline printed a forged
        row), in JSON they are exact."""
        holder = "web-1\n:" + "0" * 32  # its identity is "web-1\n"
        for client in masters.clients:
            await client.set("x\nforged", "v", px=60_000)
            await client.set("jobs:1", holder, px=60_000)
            await client.set("plain", "not\x1b[2Jours", px=60_000)
            await client.zadd("{report}:readers", {"r\tx:" + "0" * 32: 9e15})
        text_code = await cli("list", *master_args(servers.urls))
        text = capsys.readouterr().out
        json_code = await cli("list", "--json", *master_args(servers.urls))
        document = json.loads(capsys.readouterr().out)
        assert (text_code, json_code) == (0, 0)
        assert table(text) == {
            "jobs:1": ["5 of 5", "web-1\\n", "-"],
            "plain": ["5 of 5", "not\\x1b[2Jours", "-"],
            "report": ["5 of 5", "-", "1 (r\\tx)"],
            "x\\nforged": ["5 of 5", "v", "-"],
        }
        assert len(text.splitlines()) == 6  # header, four rows, summary
        locks = {lock["name"]: lock for lock in document["locks"]}
        assert set(locks) == {"jobs:1", "plain", "report", "x\nforged"}
        assert (locks["jobs:1"]["holder"], locks["jobs:1"]["identity"]) == (holder, "web-1\n")
        assert locks["report"]["readers"][0]["identity"] == "r\tx"

    async def test_a_set_of_resources_is_listed_per_name(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A lock on a set of names shows as one lock per name; forcing one free
        leaves the other held."""
        urls = servers.urls
        async with AsyncRedlock(urls, identity="setter") as redlock:
            await redlock.lock(["set:7", "set:9"], ttl=30.0, auto_extend=False).acquire()
            await redlock.settle()
            assert await cli("list", "set:*", *master_args(urls)) == 0
            listed = table(capsys.readouterr().out)
            assert await cli("force-release", "set:9", "--yes", *master_args(urls)) == 0
            assert await cli("inspect", "set:7", *master_args(urls)) == 0
            assert await cli("inspect", "set:9", *master_args(urls)) == 1
        capsys.readouterr()
        assert listed == {
            "set:7": ["5 of 5", "setter", "-"],
            "set:9": ["5 of 5", "setter", "-"],
        }

    async def test_nothing_held_exits_0(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code = await cli("list", *master_args(servers.urls))
        assert code == 0
        assert capsys.readouterr().out == (
            "0 locks matching '*' held on 5 masters (5 answered, quorum 3)\n"
        )

    @pytest.mark.parametrize(("down", "expected_code"), [(2, 0), (3, 3)])
    async def test_exit_3_when_fewer_than_a_quorum_answer(
        self,
        servers: ServerGroup,
        make_servers: MakeServers,
        capsys: pytest.CaptureFixture[str],
        down: int,
        expected_code: int,
    ) -> None:
        silent = make_servers(down, start=False)  # ports reserved, nothing listening
        urls = servers.urls[: 5 - down] + silent.urls
        async with AsyncRedlock(servers.urls) as redlock:
            await hold(redlock, "up")
            code = await cli("list", "--json", *master_args(urls))
        captured = capsys.readouterr()
        document = json.loads(captured.out)
        assert code == expected_code
        assert names(document) == ["up"]
        assert document["answered"] == 5 - down
        assert [master["error"] is not None for master in document["masters"]] == [False] * (
            5 - down
        ) + [True] * down
        warnings = [line for line in captured.err.splitlines() if ": warning: " in line]
        assert len(warnings) == down
        assert ("error: only 2 of 5 masters answered" in captured.err) == (expected_code == 3)

    async def test_a_sentinel_master_is_reported_not_scanned(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The lock's connections take redis-sentinel:// masters; the scan reaches each
        master directly, which such a URL cannot: a warning for it, no traceback."""
        urls = [*servers.urls[:4], "redis-sentinel://127.0.0.1:1/mymaster"]
        async with AsyncRedlock(servers.urls) as redlock:
            await hold(redlock, "up")
            code = await cli("list", "--node-timeout", "0.5", *master_args(urls))
        captured = capsys.readouterr()
        assert code == 0
        assert "up" in table(captured.out)
        (warning,) = [line for line in captured.err.splitlines() if ": warning: " in line]
        assert "its keys cannot be listed through this URL" in warning

    @pytest.mark.parametrize(
        "query", ["?decode_responses=true", "?decode_responses=true&encoding=latin-1"]
    )
    async def test_a_url_decoding_for_redis_py_clients_changes_nothing(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str], query: str
    ) -> None:
        """``decode_responses`` and ``encoding`` in a URL shared with redis-py clients
        are of no effect on asyncredlock's connections, the scan's included. The scan
        decoded with them: a key that is not UTF-8 raised UnicodeDecodeError (a
        traceback, exit 1), and latin-1 read 'café' as another name, missing the lock."""
        async with AsyncRedlock(servers.urls, identity="lister") as redlock:
            await hold(redlock, "café")
            for url in servers.urls:
                async with Redis.from_url(url) as client:
                    await client.set(b"\xff", "x", px=60_000)
            code = await cli("list", *master_args([url + query for url in servers.urls]))
        captured = capsys.readouterr()
        assert code == 0
        assert table(captured.out) == {"café": ["5 of 5", "lister", "-"]}
        assert captured.err == ""

    async def test_node_timeout_bounds_the_scan_whatever_the_url_says(
        self, servers: ServerGroup, make_servers: MakeServers, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A frozen master given with ``?socket_timeout=60``: its scan gives up after
        ``--node-timeout`` (it waited the URL's 60 s), and the listing goes on."""
        frozen = make_servers(1)
        urls = [*servers.urls[:2], frozen.urls[0] + "?socket_timeout=60"]
        frozen[0].pause()
        try:
            with anyio.fail_after(WAIT):
                code = await cli_abandoned("list", "--node-timeout", "0.5", *master_args(urls))
        finally:
            frozen[0].resume()
        captured = capsys.readouterr()
        assert code == 0
        (warning,) = [line for line in captured.err.splitlines() if ": warning: " in line]
        assert warning.startswith(f"asyncredlock: warning: {frozen.urls[0]}: TimeoutError")

    async def test_reads_at_most_about_max_keys_per_master(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            await hold(redlock, *(f"many:{i}" for i in range(30)))
            bounded = await cli("list", "--max-keys", "1", "--json", *master_args(servers.urls))
            captured = capsys.readouterr()
            whole = await cli("list", "--json", *master_args(servers.urls))
        assert (bounded, whole) == (0, 0)
        document = json.loads(captured.out)
        assert all(master["truncated"] for master in document["masters"])
        assert captured.err.count("stopped after about 1 keys, locks may be missing") == 5
        assert len(document["locks"]) < 30
        complete = json.loads(capsys.readouterr().out)
        assert len(complete["locks"]) == 30
        assert not any(master["truncated"] for master in complete["masters"])


async def _not_locks(client: Redis) -> None:
    """Auxiliary keys with no lock key beside them, as a crash could leave."""
    await client.zadd("{ghost}:queue", {"w:c:1": 1})
    await client.zadd("{ghost}:queue:expiry", {"w:c:1": 1})
    await client.hset("{ghost}:queue:terms", "w:c:1", "1")
    await client.set("{ghost}:undo:host:1:" + "0" * 32, "1", px=60_000)
    await client.set("{ghost}:fence", "7")


LOCK_KEYS = ["a", "jobs:1", "{user}:7", "a}b", "}", "a{b", "x}{y}", "{a}", "{a9j}:a}b"]


@pytest.mark.parametrize("key", LOCK_KEYS)
def test_auxiliary_keys_map_back_to_their_lock_key(key: str) -> None:
    value = "host:1:" + "0" * 32
    aux = {
        aux_key(key, "fence"): "fence",
        readers_key(key): "readers",
        queue_keys(key)[0]: "queue",
        queue_keys(key)[1]: "queue:expiry",
        terms_key(key): "queue:terms",
        undo_key(key, value): f"undo:{value}",
        channel(key): "released",
    }
    assert {each: split_aux(each) for each in aux} == {each: (key, s) for each, s in aux.items()}


@pytest.mark.parametrize(
    "key", ["a", "jobs:1", "{user}:7", "a}b", "{user}:profile", "{}:fence", "{a}:3:{a}:x"]
)
def test_lock_keys_are_not_auxiliary(key: str) -> None:
    assert split_aux(key) is None


@pytest.mark.parametrize(
    ("raw", "prefix", "pattern", "expected"),
    [
        (b"jobs:1", "", "*", "jobs:1"),
        (b"{jobs:1}:readers", "", "jobs:*", "jobs:1"),
        (b"{jobs:1}:fence", "", "*", None),
        (b"mail:1", "", "jobs:*", None),
        (b"app:jobs:1", "app:", "jobs:?", "app:jobs:1"),
        (b"{app:jobs:1}:readers", "app:", "jobs:1", "app:jobs:1"),
        (b"jobs:1", "app:", "*", None),
        (b"app:", "app:", "*", None),  # the prefix alone names no lock
        (b"\xff", "", "*", None),
        (b"a\x00b", "", "*", None),  # a NUL: check_name refuses it
        (b"{a}:9:{a}:fence:readers", "", "*", None),  # the readers of a reserved key
    ],
)
def test_listed_key(raw: bytes, prefix: str, pattern: str, expected: str | None) -> None:
    assert listed_key(raw, prefix, pattern) == expected
