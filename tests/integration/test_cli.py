"""The command line against real servers: inspect, force-release, demo, --version,
and bad input (list and watch: test_cli_list.py, test_cli_watch.py)."""

from __future__ import annotations

import io
import json
import re

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis

import asyncredlock
from asyncredlock import AsyncRedlock, Lease, LockNotOwnedError, LockTimeoutError
from asyncredlock.__main__ import main
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

WAIT = 30.0  # a bound on each wait, far above what it takes

#: A master URL whose password holds a space (AsyncRedlock takes it as it is).
SECRET_HEAD = "Hunter2xyz"
SPACED_URL = f"redis://locker:{SECRET_HEAD} tail@127.0.0.1:1"


async def cli(*argv: str) -> int:
    """``main(argv)`` in a worker thread: it runs its own event loop, as from a shell."""
    return await anyio.to_thread.run_sync(main, list(argv))


async def cli_abandoned(*argv: str) -> int:
    """`cli`, for a test that may give up on it (``fail_after``): the thread is left
    behind rather than waited for."""
    return await anyio.to_thread.run_sync(main, list(argv), abandon_on_cancel=True)


def master_args(urls: list[str]) -> list[str]:
    return [arg for url in urls for arg in ("--master", url)]


@pytest.fixture(autouse=True)
def _no_masters_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_MASTERS", raising=False)


async def _queue_lengths(urls: list[str], name: str) -> list[int]:
    """How many ids ``{name}:queue`` holds on each master."""
    lengths = []
    for url in urls:
        async with Redis.from_url(url) as client:
            lengths.append(await client.zcard("{" + name + "}:queue"))
    return lengths


class TestInspect:
    async def test_shows_the_holder_of_a_held_lock(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        redlock = AsyncRedlock(servers.urls, identity="web-3")
        async with redlock, redlock.lock("cli:held") as lease:
            code = await cli("inspect", "cli:held", *master_args(servers.urls))
        out = capsys.readouterr().out
        assert code == 0
        assert f"majority holder: {lease.value} (on 5 of 5 masters; identity web-3)" in out
        rows = [line for line in out.splitlines() if line.startswith("redis://")]
        assert [row.split()[0] for row in rows] == servers.urls
        assert all(row.split()[1] == lease.value for row in rows)

    async def test_shows_readers_of_a_read_write_lock(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            rw = redlock.rwlock("cli:rw")
            async with rw.read() as first, rw.read() as second:
                await redlock.settle()  # the masters beyond the quorum have answered too
                code = await cli("inspect", "cli:rw", *master_args(servers.urls))
                json_code = await cli("inspect", "cli:rw", "--json", *master_args(servers.urls))
        text, document = capsys.readouterr().out.split("\n{", 1)
        assert (code, json_code) == (0, 0)
        header = next(line for line in text.splitlines() if line.startswith("MASTER"))
        assert header.split() == ["MASTER", "HOLDER", "TTL", "FENCE", "READERS", "QUEUED"]
        rows = [line.split() for line in text.splitlines() if line.startswith("redis://")]
        assert [row[1:2] + row[-2:] for row in rows] == [["(free)", "2", "0"]] * 5
        masters = json.loads("{" + document)["masters"]
        for master in masters:
            assert sorted(value for value, _ in master["readers"]) == sorted(
                [first.value, second.value]
            )

    async def test_json_output_parses(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        urls = ",".join(servers.urls)
        async with (
            AsyncRedlock(servers.urls, identity="worker-7") as redlock,
            redlock.lock("cli:json", ttl=30.0) as lease,
        ):
            code = await cli("inspect", "cli:json", "--json", "--masters", urls)
        document = json.loads(capsys.readouterr().out)
        assert code == 0
        assert (document["resource"], document["key"]) == ("cli:json", "cli:json")
        assert (document["holder"], document["quorum"], document["answered"]) == (lease.value, 3, 5)
        assert document["identity"] == "worker-7"
        assert [master["node"] for master in document["masters"]] == servers.urls
        assert all(master["holder"] == lease.value for master in document["masters"])
        assert all(master["identity"] == "worker-7" for master in document["masters"])
        assert all(0 < master["ttl"] <= 30.0 for master in document["masters"])
        assert all(master["error"] is None for master in document["masters"])

    async def test_a_free_lock_has_no_holder(
        self,
        servers: ServerGroup,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setenv("REDLOCK_MASTERS", ",".join(servers.urls))
        code = await cli("inspect", "cli:free", "--json")
        document = json.loads(capsys.readouterr().out)
        assert code == 1
        assert (document["holder"], document["identity"]) == (None, None)
        assert document["status"] == "free"
        assert all(master["holder"] is None for master in document["masters"])

    async def test_control_characters_in_a_value_are_escaped_in_text_not_in_json(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A value any client may write: its newline printed a forged row, its ANSI
        escape reached the terminal; escaped in the table, exact in JSON."""
        value = "web-1\x1b[2J\n:" + "0" * 32
        for url in servers.urls:
            async with Redis.from_url(url) as client:
                await client.set("cli:forged", value, px=60_000)
        code = await cli("inspect", "cli:forged", *master_args(servers.urls))
        text = capsys.readouterr().out
        json_code = await cli("inspect", "cli:forged", "--json", *master_args(servers.urls))
        document = json.loads(capsys.readouterr().out)
        assert (code, json_code) == (0, 0)
        escaped = "web-1\\x1b[2J\\n:" + "0" * 32
        rows = [line.split() for line in text.splitlines() if line.startswith("redis://")]
        assert [row[1] for row in rows] == [escaped] * 5
        assert len(text.splitlines()) == 8  # the header, the columns, 5 rows, the majority
        assert text.splitlines()[-1] == (
            f"majority holder: {escaped} (on 5 of 5 masters; identity web-1\\x1b[2J\\n)"
        )
        assert (document["holder"], document["identity"]) == (value, "web-1\x1b[2J\n")

    async def test_a_wrong_prefix_finds_the_lock_free(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with AsyncRedlock(servers.urls, prefix="app:") as redlock, redlock.lock("cli:p"):
            wrong = await cli("inspect", "cli:p", "--prefix", "ap:", *master_args(servers.urls))
            right = await cli("inspect", "cli:p", "--prefix", "app:", *master_args(servers.urls))
        out = capsys.readouterr().out
        assert (wrong, right) == (1, 0)
        assert "(key 'ap:cli:p')" in out
        assert "majority holder: none (no value is held on a quorum)" in out

    async def test_exit_3_when_a_majority_does_not_answer(
        self,
        servers: ServerGroup,
        make_servers: MakeServers,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        down = make_servers(3, start=False)  # ports reserved, nothing listening
        urls = servers.urls[:2] + down.urls
        code = await cli("inspect", "cli:outage", *master_args(urls))
        out = capsys.readouterr().out
        assert code == 3
        assert "majority holder: unknown (only 2 of 5 masters answered)" in out
        assert out.count("error: ") == 3

    async def test_the_queued_column_leaves_out_a_holder_handed_the_key(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A holder handed the key by a release stays in the masters' queue until its
        release; nobody else waits, and QUEUED (the queued waiters) says 0."""
        urls = servers.urls
        async with (
            AsyncRedlock(urls, identity="a") as a,
            AsyncRedlock(urls, identity="b", retry_delay=2.0) as b,
        ):
            held = await a.lock("cli:handed", ttl=30.0).acquire()
            got: list[Lease] = []
            with Waits(b) as waits:
                async with anyio.create_task_group() as tg:

                    async def wait_b() -> None:
                        got.append(await b.lock("cli:handed", ttl=30.0, timeout=WAIT).acquire())

                    tg.start_soon(wait_b)
                    await waits.reach(1)
                    with anyio.fail_after(WAIT):  # listed on every master
                        while not all(await _queue_lengths(urls, "cli:handed")):  # noqa: ASYNC110
                            await anyio.sleep(0.025)
                    await held.release()
            assert got[0].statistics().source == "hand-over"
            await b.settle()
            lengths = await _queue_lengths(urls, "cli:handed")
            assert await cli("inspect", "cli:handed", *master_args(urls)) == 0
            json_code = await cli("inspect", "cli:handed", "--json", *master_args(urls))
        text, document = capsys.readouterr().out.split("\n{", 1)
        assert json_code == 0
        assert "identity b" in text
        assert 1 in lengths  # the holder is still listed, somewhere at least
        rows = [line.split() for line in text.splitlines() if line.startswith("redis://")]
        assert [row[-1] for row in rows] == ["0"] * 5, text
        assert [m["queue"] for m in json.loads("{" + document)["masters"]] == [[]] * 5

    @pytest.mark.parametrize(("held_on", "expected_code"), [(0, 1), (1, 3)])
    async def test_silent_masters_could_make_a_quorum(
        self,
        servers: ServerGroup,
        make_servers: MakeServers,
        capsys: pytest.CaptureFixture[str],
        held_on: int,
        expected_code: int,
    ) -> None:
        """3 of 5 answer: free when none of them holds a value; unknown when one
        does, since with the 2 silent ones that value could be on a quorum."""
        down = make_servers(2, start=False)  # ports reserved, nothing listening
        urls = servers.urls[:3] + down.urls
        for url in servers.urls[:held_on]:
            async with Redis.from_url(url) as client:
                await client.set("cli:partial", "elsewhere:" + "0" * 32, px=60_000)
        code = await cli("inspect", "cli:partial", "--json", *master_args(urls))
        document = json.loads(capsys.readouterr().out)
        assert code == expected_code
        assert (document["answered"], document["holder"]) == (3, None)
        assert document["status"] == {1: "free", 3: "unknown"}[expected_code]


class TestForceRelease:
    async def test_an_outage_is_one_line_and_exit_3(
        self,
        servers: ServerGroup,
        make_servers: MakeServers,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        down = make_servers(3, start=False)  # ports reserved, nothing listening
        urls = servers.urls[:2] + down.urls
        code = await cli("force-release", "cli:outage", "--yes", *master_args(urls))
        err = capsys.readouterr().err
        assert code == 3
        assert err.startswith("asyncredlock: error: could not force 'cli:outage' free")
        assert "Traceback" not in err

    async def test_frees_a_held_lock(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # the stuck holder and the next one are different clients (processes)
        async with AsyncRedlock(servers.urls) as dead, AsyncRedlock(servers.urls) as redlock:
            stuck = await dead.lock("cli:stuck", ttl=60.0, auto_extend=False).acquire()
            lock = redlock.lock("cli:stuck", ttl=60.0, timeout=0, auto_extend=False)
            with pytest.raises(LockTimeoutError):
                await lock.acquire()
            code = await cli("force-release", "cli:stuck", "--yes", *master_args(servers.urls))
            fresh = await lock.acquire()
            await fresh.release()
            with pytest.raises(LockNotOwnedError):
                await stuck.release()
        assert code == 0
        assert "deleted the lock key of 'cli:stuck' on 5 of 5 masters" in capsys.readouterr().out

    async def test_nothing_held_exits_1(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            await (await redlock.lock("cli:gone").acquire()).release()
            code = await cli("force-release", "cli:gone", "--yes", *master_args(servers.urls))
        captured = capsys.readouterr()
        assert code == 1
        assert captured.out == (
            "nothing to release: no key of 'cli:gone' was deleted on any of 5 masters\n"
        )
        assert captured.err == ""

    async def test_frees_a_lock_held_by_readers_only(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            reading = await redlock.rwlock("cli:read").read().acquire()
            await redlock.settle()  # the masters beyond the quorum have listed it too
            code = await cli("force-release", "cli:read", "--yes", *master_args(servers.urls))
            state = await redlock.inspect("cli:read")
            assert reading.held  # another client: told at its next extension
        assert code == 0
        assert all(node.readers == () for node in state.nodes)
        # it deleted no lock key: only the readers' entries (it said "the lock key")
        assert (
            capsys.readouterr().out
            == "deleted the reader entries of 'cli:read' on 5 of 5 masters\n"
        )

    async def test_says_it_deleted_both_a_lock_key_and_reader_entries(
        self, servers: ServerGroup, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A writer's key (another client's) on 3 masters, readers' entries on all 5:
        it says on how many masters it deleted each."""
        for i, url in enumerate(servers.urls):
            async with Redis.from_url(url) as client:
                if i < 3:
                    await client.set("cli:both", "theirs", px=60_000)
                await client.zadd("{cli:both}:readers", {"reader": 2**50})
        code = await cli("force-release", "cli:both", "--yes", *master_args(servers.urls))
        assert code == 0
        assert capsys.readouterr().out == (
            "deleted the lock key of 'cli:both' on 3 and its reader entries on 5 of 5 masters\n"
        )

    async def test_a_master_that_did_not_answer_is_named(
        self,
        servers: ServerGroup,
        make_servers: MakeServers,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The key is on 3 of 3 masters, one frozen: deleted on 2 (a quorum), exit 0,
        and a warning names the frozen one, where the key may stay (nothing said so)."""
        frozen = make_servers(1)
        urls = [*servers.urls[:2], *frozen.urls]
        for url in urls:
            async with Redis.from_url(url) as client:
                await client.set("cli:partial", "web-1:" + "0" * 32, px=60_000)
        frozen[0].pause()
        try:
            with anyio.fail_after(WAIT):
                code = await cli_abandoned(
                    "force-release", "cli:partial", "--yes", "--node-timeout", "0.5",
                    *master_args(urls),
                )  # fmt: skip
        finally:
            frozen[0].resume()
        captured = capsys.readouterr()
        assert code == 0
        assert captured.out == "deleted the lock key of 'cli:partial' on 2 of 3 masters\n"
        (warning,) = captured.err.splitlines()
        assert warning.startswith(f"asyncredlock: warning: {frozen.urls[0]}: ")
        assert "no reply within 0.5 s" in warning
        assert warning.endswith(": the lock's keys there, if any, may stay until they expire")

    async def test_nothing_deleted_names_a_master_that_failed(
        self,
        servers: ServerGroup,
        make_servers: MakeServers,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Nothing to delete on the 4 masters that answered (exit 1), and a warning for
        the one that refused the connection: the lock's key could still be there."""
        down = make_servers(1, start=False)  # a port reserved, nothing listening
        urls = [*servers.urls[:4], *down.urls]
        code = await cli("force-release", "cli:gone", "--yes", *master_args(urls))
        captured = capsys.readouterr()
        assert code == 1
        assert captured.out == (
            "nothing to release: no key of 'cli:gone' was deleted on any of 5 masters\n"
        )
        (warning,) = captured.err.splitlines()
        assert warning.startswith(f"asyncredlock: warning: {down.urls[0]}: ")
        assert warning.endswith(": the lock's keys there, if any, may stay until they expire")
        assert ".:" not in warning  # the reason's own full stop is not doubled

    @pytest.mark.parametrize(("answer", "expected_code"), [("y\n", 0), ("n\n", 1), ("", 1)])
    async def test_asks_before_deleting(
        self,
        servers: ServerGroup,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        answer: str,
        expected_code: int,
    ) -> None:
        monkeypatch.setattr("sys.stdin", io.StringIO(answer))  # "" is end of input
        async with AsyncRedlock(servers.urls) as redlock:
            lock = redlock.lock("cli:ask", ttl=60.0, timeout=0, auto_extend=False)
            lease = await lock.acquire()
            code = await cli("force-release", "cli:ask", *master_args(servers.urls))
            state = await redlock.inspect("cli:ask")
            if state.holder is not None:
                await lease.release()
        captured = capsys.readouterr()
        assert code == expected_code
        assert f"majority holder: {lease.value}" in captured.out  # shown before asking
        assert "[y/N]" in captured.out
        if expected_code == 0:
            assert state.holder is None
        else:
            assert state.holder == lease.value
            assert captured.err == "asyncredlock: error: aborted: nothing was deleted\n"


class TestBadInput:
    @pytest.mark.parametrize("argv", [["inspect", "x"], ["force-release", "x", "--yes"]])
    def test_no_masters(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith("asyncredlock: error: no masters")

    @pytest.mark.parametrize(
        ("url", "complaint"),
        [
            ("localhost:6379", "must start with redis://"),
            ("http://127.0.0.1:6379", "must start with redis://"),
            ("redis://127.0.0.1:notaport", "invalid port"),
            ("redis://:6379", "names no host"),
        ],
    )
    def test_malformed_url(
        self, url: str, complaint: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["inspect", "some:lock", "--master", url]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert complaint in err
        assert "Traceback" not in err

    @pytest.mark.parametrize(
        "url",
        [
            "redis://u:s3cretPW@127.0.0.1:99999",
            "redis://u:s3cretPW@127.0.0.1/abc",
            "rediss//u:s3cretPW@127.0.0.1",
            "redis-sentinel://u:s3cretPW@127.0.0.1:0/svc",
        ],
    )
    def test_a_malformed_url_is_shown_without_its_password(
        self, url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["inspect", "some:lock", "--master", url]) == 2
        err = capsys.readouterr().err
        assert "u@127.0.0.1" in err  # the URL is named, without its password
        assert "s3cret" not in err

    def test_malformed_url_in_the_environment(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("REDLOCK_MASTERS", "redis://127.0.0.1:1,127.0.0.1:2")
        assert main(["inspect", "some:lock"]) == 2
        assert "'redis://127.0.0.1:1,127.0.0.1:2' has a comma" in capsys.readouterr().err

    def test_the_library_takes_a_password_with_a_space_and_shows_none_of_it(self) -> None:
        # what the command line must match
        redlock = AsyncRedlock([SPACED_URL])
        assert SECRET_HEAD not in repr(redlock.masters)

    @pytest.mark.parametrize("via", ["env", "option"])
    def test_a_password_with_a_space_is_one_url_and_never_printed(
        self, via: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # $REDLOCK_MASTERS and --masters split on whitespace: the URL was cut inside
        # its password, and the error quoted the password's first half as a port
        if via == "env":
            monkeypatch.setenv("REDLOCK_MASTERS", SPACED_URL)
            argv = ["inspect", "x"]
        else:
            monkeypatch.delenv("REDLOCK_MASTERS", raising=False)
            argv = ["inspect", "--masters", SPACED_URL, "x"]
        assert main([*argv, "--node-timeout", "0.2"]) == 3  # one master, not answering
        captured = capsys.readouterr()
        assert "on 1 master," in captured.out
        assert SECRET_HEAD not in captured.err + captured.out

    @pytest.mark.parametrize(
        "url",
        ["redis://u:Hunter2xyz", "redis://u:Hunter2xyz/0", "redis-sentinel://h:1,u:Hunter2xyz/s"],
    )
    def test_a_port_that_is_no_number_is_not_shown(
        self, url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # without its "@" and host, a URL's password reads as the port
        assert main(["inspect", "x", "--master", url]) == 2
        err = capsys.readouterr().err
        assert "u:..." in err
        assert "Hunter2" not in err

    def test_urls_are_split_before_each_scheme_only(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        urls = (
            "redis://127.0.0.1:1 ,REDISS://127.0.0.1:2\nredis-sentinel://127.0.0.1:3,127.0.0.1:4/s"
        )
        monkeypatch.setenv("REDLOCK_MASTERS", urls)
        assert main(["inspect", "x", "--node-timeout", "0.2"]) == 3
        captured = capsys.readouterr()
        assert "on 3 masters," in captured.out, captured

    @pytest.mark.parametrize(
        "argv",
        [
            [],
            ["inspect"],
            ["inspect", "", "--master", "redis://127.0.0.1:1"],
            ["inspect", "x", "--master", "redis://127.0.0.1:1", "--node-timeout", "0"],
            ["inspect", "k\udc80", "--master", "redis://127.0.0.1:1"],  # undecodable argv
            ["inspect", "{a}:fence", "--master", "redis://127.0.0.1:1"],  # a reserved key
            ["force-release", "fence", "--prefix", "{a}:", "--master", "redis://127.0.0.1:1"],
            ["watch", "{a}:queue", "--master", "redis://127.0.0.1:1"],
            ["demo", "--requests", "0"],
            ["demo", "--limit", "three"],
            ["demo", "--servers", "0"],
            ["demo", "--masters", "0"],
            ["list", "--max-keys", "0", "--master", "redis://127.0.0.1:1"],
            ["watch", "x", "--interval", "0", "--master", "redis://127.0.0.1:1"],
            ["watch", "x", "--count", "0", "--master", "redis://127.0.0.1:1"],
            ["watch", "x", "--interval", "inf", "--master", "redis://127.0.0.1:1"],
            ["inspect", "x", "--master", "redis://127.0.0.1:1?foo=1"],  # an unknown option
            ["inspect", "x", "--master", "redis://127.0.0.1:1", "--node-timeout", "nan"],
            [
                "force-release",
                "x",
                "--yes",
                "--master",
                "redis://127.0.0.1:1",
                "--node-timeout",
                "-1",
            ],
            ["no-such-command"],
        ],
    )
    def test_usage_errors_are_one_line(
        self, argv: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1
        assert captured.err.startswith("asyncredlock")
        assert ": error: " in captured.err

    @pytest.mark.parametrize(
        ("argv", "complaint"),
        [
            (["list", "--max-keys", "1e3"], "argument --max-keys: invalid int value: '1e3'"),
            (["watch", "x", "--count", "two"], "argument --count: invalid int value: 'two'"),
            (
                ["watch", "x", "--interval", "soon"],
                "argument --interval: invalid seconds value: 'soon'",
            ),
            (["demo", "--servers", "five"], "argument --servers: invalid int value: 'five'"),
        ],
    )
    def test_a_number_that_does_not_parse_is_named_by_its_kind(
        self, argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """argparse names the type by its function's name: it said 'invalid parse
        value' and 'invalid positive_seconds value', names inside the tool."""
        masters = [] if argv[0] == "demo" else ["--master", "redis://127.0.0.1:1"]
        assert main([*argv, *masters]) == 2
        assert f": error: {complaint} (see --help)" in capsys.readouterr().err

    def test_help_exits_zero(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["--help"]) == 0
        out = capsys.readouterr().out
        commands = ("demo", "inspect", "force-release", "list", "watch")
        assert all(command in out for command in commands)

    @pytest.mark.parametrize("command", ["list", "watch x"])
    def test_no_masters_for_list_and_watch(
        self, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(command.split()) == 2
        assert capsys.readouterr().err.startswith("asyncredlock: error: no masters")


async def test_semaphores_are_not_locks_to_the_commands(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both slots of a semaphore held: inspect finds no lock of its name (exit 1),
    list lists none, force-release deletes nothing, and a slot's key is refused as
    a name (exit 2), as documented."""
    urls = servers.urls
    async with AsyncRedlock(urls) as redlock:
        semaphore = redlock.semaphore("sem:x", 2, fair=True)
        held = [await semaphore.acquire(), await semaphore.acquire()]
        await redlock.settle()
        assert await cli("inspect", "sem:x", *master_args(urls)) == 1
        assert await cli("list", *master_args(urls)) == 0
        assert "0 locks matching" in capsys.readouterr().out
        assert await cli("inspect", "{sem:x}:sem:0", *master_args(urls)) == 2
        assert await cli("force-release", "sem:x", "--yes", *master_args(urls)) == 1
        for lease in held:
            await lease.release()  # still held: force-release left the slots alone
    capsys.readouterr()


async def test_reads_write_nothing_and_leave_no_connection(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """inspect, list and watch change no key (the masters' count of changes stays)
    and close every connection they opened."""
    urls = servers.urls
    async with AsyncRedlock(urls, identity="h") as redlock:
        await redlock.lock("rd:x", ttl=30.0, auto_extend=False).acquire()
        await redlock.rwlock("rd:rw").read(auto_extend=False).acquire()
        await redlock.settle()
        before = await _changes(urls)
        for argv in (
            ["inspect", "rd:x"],
            ["inspect", "rd:rw", "--json"],
            ["list"],
            ["watch", "rd:x", "--count", "1"],
        ):
            assert await cli(*argv, *master_args(urls)) == 0
        assert await _changes(urls) == before
        async with Redis.from_url(urls[0]) as client:
            mine = await client.client_id()
            with anyio.fail_after(WAIT):  # a closed connection may take a moment to go
                while len(others := await _other_clients(client, mine)) > 1:  # noqa: ASYNC110
                    await anyio.sleep(0.025)
        assert len(others) == 1, others  # the AsyncRedlock's own command connection
    capsys.readouterr()


async def _other_clients(client: Redis, mine: int) -> list[dict[str, str]]:
    return [c for c in await client.client_list() if int(c["id"]) != mine]


async def _changes(urls: list[str]) -> list[int]:
    counts = []
    for url in urls:
        async with Redis.from_url(url) as client:
            counts.append((await client.info("persistence"))["rdb_changes_since_last_save"])
    return counts


def test_help_says_the_environment_takes_commas_or_whitespace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "$REDLOCK_MASTERS (URLs separated by commas or whitespace)" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"asyncredlock {asyncredlock.__version__}\n"


class TestDemo:
    """``demo --servers N``, and ``--masters N`` still accepted (a small, fast run)."""

    @pytest.mark.parametrize(
        ("option", "servers", "notice"),
        [
            ("--servers", 2, ""),
            (
                "--masters",
                1,
                "asyncredlock demo: warning: --masters is deprecated, use --servers\n",
            ),
        ],
    )
    async def test_runs_on_that_many_servers(
        self, capsys: pytest.CaptureFixture[str], option: str, servers: int, notice: str
    ) -> None:
        code = await cli("demo", option, str(servers), "--requests", "2", "--limit", "1")
        captured = capsys.readouterr()
        assert code == 0
        masters_line = next(line for line in captured.out.splitlines() if "masters:" in line)
        assert len(re.findall(r"redis://", masters_line)) == servers
        assert "OK: with the lock, exactly 1 created and 1 refused." in captured.out
        assert captured.err == notice
