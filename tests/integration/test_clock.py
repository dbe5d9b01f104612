"""Tests of `FakeClock` against real servers: one master's wall clock jumps, as in
Kleppmann's critique of Redlock; the host's clock is the reference."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import asyncredlock.testing._clock as clock_module
from asyncredlock.testing import (
    FakeClockUnavailableError,
    ServerGroup,
    ServerProcess,
    ServerStartError,
    find_server_binary,
)
from asyncredlock.testing._clock import PreloadClashError
from asyncredlock.testing._support import registry
from asyncredlock.testing.pytest_plugin import MakeServers, fake_clock_skip_reason

# Wide enough for a slow machine: the offsets tested are 20 s and more.
TOLERANCE = 1.0
# How long a condition the server brings about (an expire cycle) may take to hold.
GUARD = 10.0


def unavailable() -> str | None:
    """Why no fake clock can run here, if its prerequisite is absent. A
    ``REDLOCK_FAKETIME_LIB`` that names no library is a failure, not a skip."""
    if sys.platform == "linux" and os.environ.get(clock_module.LIBRARY_VARIABLE):
        return None
    try:
        clock_module.faketime_library()
    except FakeClockUnavailableError as exc:
        return str(exc)
    return None


needs_faketime = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def client(server: ServerProcess) -> redis.Redis:
    """A client that fails at once instead of retrying (redis-py retries by default)."""
    return redis.Redis(
        host=server.host,
        port=server.port,
        socket_timeout=GUARD,
        socket_connect_timeout=GUARD,
        retry=Retry(NoBackoff(), 0),
    )


def skew(server: ServerProcess) -> float:
    """The server's ``TIME`` minus the host's clock, in seconds."""
    with client(server) as direct:
        before = time.time()
        seconds, micros = direct.time()
        after = time.time()
    return seconds + micros / 1e6 - (before + after) / 2


def eventually(condition: Callable[[], bool], within: float = GUARD) -> None:
    """Poll `condition` until it holds; fail if it does not within `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not true within {within} s"
        time.sleep(0.01)


def sleep_until(host_time: float) -> None:
    """Let the host's wall clock pass `host_time`."""
    time.sleep(max(0.0, host_time - time.time()))


@pytest.fixture
def server(fake_clock_available: None) -> Iterator[ServerProcess]:
    """A server on a fake clock (skipped where the server binary cannot run on one)."""
    with ServerProcess(fake_clock=True) as started:
        yield started


@needs_faketime
class TestFakeClock:
    def test_time_moves_by_each_jump_and_back_on_reset(self, server: ServerProcess) -> None:
        assert skew(server) == pytest.approx(0, abs=TOLERANCE)
        server.clock.jump(30)
        assert skew(server) == pytest.approx(30, abs=TOLERANCE)
        server.clock.jump(-50)
        assert server.clock.offset == -20
        assert skew(server) == pytest.approx(-20, abs=TOLERANCE)
        server.clock.set_offset(3600.5)
        assert skew(server) == pytest.approx(3600.5, abs=TOLERANCE)
        server.clock.reset()
        assert skew(server) == pytest.approx(0, abs=TOLERANCE)

    def test_a_forward_jump_expires_a_key_before_its_px(self, server: ServerProcess) -> None:
        with client(server) as direct:
            direct.set("k", "v", px=60_000)
            assert direct.pttl("k") > 50_000
            server.clock.jump(120)
            # the server's own expire cycle deletes it: no command touches the key
            eventually(lambda: direct.dbsize() == 0)
            assert (direct.exists("k"), direct.pttl("k")) == (0, -2)

    def test_a_backward_jump_keeps_a_key_past_its_px(self, server: ServerProcess) -> None:
        with client(server) as direct:
            set_at = time.time()
            direct.set("k", "v", px=1000)
            server.clock.jump(-20)
            assert 19_000 < direct.pttl("k") <= 21_000
            sleep_until(set_at + 1.5)  # its PX is over on the host's clock
            assert direct.exists("k") == 1
            assert direct.pttl("k") > 18_000
            server.clock.reset()
            eventually(lambda: direct.exists("k") == 0)

    def test_the_servers_timers_keep_the_real_monotonic_clock(self, server: ServerProcess) -> None:
        """Its event loop times out a blocked command on the monotonic clock: faked
        too, a backward jump would leave this BLPOP unanswered for 20 s and more."""
        server.clock.jump(-20)
        with client(server) as direct:
            assert direct.blpop(["nothing"], timeout=0.5) is None

    @pytest.mark.parametrize("kill", [False, True], ids=["graceful", "crash"])
    def test_a_restart_keeps_the_offset(self, server: ServerProcess, *, kill: bool) -> None:
        server.clock.jump(30)
        first_pid = server.pid
        server.restart(kill=kill)
        assert server.pid != first_pid
        assert skew(server) == pytest.approx(30, abs=TOLERANCE)

    def test_the_offset_is_written_in_libfaketimes_format(self, server: ServerProcess) -> None:
        server.clock.jump(-20)
        assert server.clock.path.parent == server.workdir
        assert server.clock.path.read_text() == "-20.000000\n"

    @pytest.mark.usefixtures("fake_clock_available")
    def test_only_the_jumped_server_of_a_group_moves(self, make_servers: MakeServers) -> None:
        group = make_servers(3, fake_clock=True)
        group[0].clock.jump(30)
        assert [round(skew(server)) for server in group] == [30, 0, 0]
        assert len({server.clock.path for server in group}) == 3

    def test_a_server_without_it_has_no_clock(self) -> None:
        server = ServerProcess()
        try:
            with pytest.raises(RuntimeError, match="fake_clock=True"):
                _ = server.clock
        finally:
            server.close()


class TestUnavailable:
    def test_a_missing_library_is_named_before_anything_is_made(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        missing = tmp_path / "libfaketime.so.1"
        monkeypatch.setenv(clock_module.LIBRARY_VARIABLE, str(missing))
        made = set(registry.tempdirs)
        with pytest.raises(FakeClockUnavailableError, match=f"{clock_module.LIBRARY_VARIABLE}="):
            ServerProcess(fake_clock=True)
        with pytest.raises(ServerStartError, match=str(missing)):
            ServerGroup(2, fake_clock=True)
        assert registry.tempdirs == made

    def test_no_package_says_how_to_get_one(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv(clock_module.LIBRARY_VARIABLE, raising=False)
        monkeypatch.setattr(clock_module, "PACKAGE", "no_such_package_for_asyncredlock")
        with pytest.raises(FakeClockUnavailableError, match="pip install"):
            ServerProcess(fake_clock=True)

    def test_linux_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sys, "platform", "darwin")
        with pytest.raises(FakeClockUnavailableError, match="needs Linux"):
            ServerProcess(fake_clock=True)

    @pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
    def test_a_library_the_server_does_not_load_fails_its_start(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """The loader only warns about a preload it cannot load (another architecture,
        a text file) and runs the server on the real clock: the start checks."""
        not_a_library = tmp_path / "libfaketime.so.1"
        not_a_library.write_text("not an ELF file\n")
        monkeypatch.setenv(clock_module.LIBRARY_VARIABLE, str(not_a_library))
        server = ServerProcess(fake_clock=True)
        try:
            with pytest.raises(FakeClockUnavailableError, match="did not load"):
                server.start()
            assert not server.running
        finally:
            server.close()


# What a server that libfaketime cannot set itself up in logs, then it hangs (seen with
# Debian's redis-server 7.0.15, which links jemalloc as a shared library).
CLASHING_SERVER = """#!/bin/sh
echo "libfaketime: Unexpected recursive calls to clock_gettime() without proper \
initialization. Trying alternative." >&2
echo "libfaketime: Cannot recover from unexpected recursive calls to clock_gettime()." >&2
exec sleep 60
"""


@needs_faketime
class TestClash:
    """A server binary that libfaketime cannot run in: an error at once, not a hang
    until the start's timeout, and a reason to skip for the plugin's fixture."""

    @pytest.fixture
    def clashing(self, tmp_path: Path) -> str:
        binary = tmp_path / "redis-server"
        binary.write_text(CLASHING_SERVER)
        binary.chmod(0o755)
        return str(binary)

    def test_the_start_fails_at_once_naming_the_clash(self, clashing: str) -> None:
        server = ServerProcess(binary=clashing, fake_clock=True)
        try:
            with pytest.raises(PreloadClashError, match="libfaketime clashes") as caught:
                server.start(timeout=GUARD)  # before: ServerStartError once it ran out
            assert "Cannot recover" in str(caught.value)  # the log's tail is quoted
            assert isinstance(caught.value, FakeClockUnavailableError)
            assert not server.running  # the hung process was killed
        finally:
            server.close()

    def test_the_plugin_gives_the_clash_as_a_reason_to_skip(self, clashing: str) -> None:
        reason = fake_clock_skip_reason(clashing)
        assert reason is not None
        assert "libfaketime clashes with a library it links" in reason
        assert "log tail" not in reason

    @pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
    def test_a_configured_library_that_does_not_load_fails_rather_than_skips(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        not_a_library = tmp_path / "libfaketime.so.1"
        not_a_library.write_text("not an ELF file\n")
        monkeypatch.setenv(clock_module.LIBRARY_VARIABLE, str(not_a_library))
        fake_clock_skip_reason.cache_clear()  # answers are kept per binary
        try:
            with pytest.raises(FakeClockUnavailableError, match="did not load"):
                fake_clock_skip_reason(find_server_binary())
        finally:
            fake_clock_skip_reason.cache_clear()
