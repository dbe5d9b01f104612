"""``asyncredlock watch`` against real servers: a line per change of holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, LockState
from asyncredlock.__main__ import main
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

WAIT = 30.0  # a bound on each wait, far above what it takes


async def cli(*argv: str) -> int:
    """``main(argv)`` in a worker thread, as from a shell; a test that gives up on
    it (``fail_after``) leaves the thread behind rather than hang."""
    return await anyio.to_thread.run_sync(main, list(argv), abandon_on_cancel=True)


def master_args(urls: list[str]) -> list[str]:
    return [arg for url in urls for arg in ("--master", url)]


class Lines:
    """Standard output for the command run by `cli`: each line it prints is
    passed to the test's event loop, to be awaited with `next`."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[str](100)
        self._partial = ""
        _MADE.append(self)

    def close(self) -> None:
        self._send.close()
        self._receive.close()

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:  # called in the command's thread: hand the line over
            anyio.from_thread.run_sync(self._send.send_nowait, line)
        return len(text)

    def flush(self) -> None:
        pass

    async def next(self) -> str:
        """The next line printed (within `WAIT` seconds)."""
        with anyio.fail_after(WAIT):
            return await self._receive.receive()


class Polls:
    """Counts the reads of a lock (``AsyncRedlock.inspect()`` calls) the command
    makes in its thread, so that a test can wait for it to look again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._moved = anyio.Event()
        read = AsyncRedlock.inspect

        async def counted(redlock: AsyncRedlock, name: str) -> LockState:
            state = await read(redlock, name)
            anyio.from_thread.run_sync(self._bump)  # in the command's thread
            return state

        monkeypatch.setattr(AsyncRedlock, "inspect", counted)

    def _bump(self) -> None:
        self.count += 1
        self._moved.set()
        self._moved = anyio.Event()

    async def more(self, reads: int) -> None:
        """Wait until the command has made ``reads`` more reads (within `WAIT`)."""
        target = self.count + reads
        with anyio.fail_after(WAIT):
            while self.count < target:
                await self._moved.wait()


def print_to_lines(monkeypatch: pytest.MonkeyPatch) -> Lines:
    """Make `Lines` standard output, from inside the test (pytest sets its own
    capture again between a fixture's setup and the test)."""
    out = Lines()
    monkeypatch.setattr(sys, "stdout", out)
    return out


#: The `Lines` a test made: closed after it (an unclosed stream warns, ResourceWarning).
_MADE: list[Lines] = []


@pytest.fixture(autouse=True)
def _no_masters_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("REDLOCK_MASTERS", raising=False)
    yield
    while _MADE:
        _MADE.pop().close()


async def test_a_line_per_change_until_count(
    servers: ServerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines, polls, codes = print_to_lines(monkeypatch), Polls(monkeypatch), list[int]()

    async def watch() -> None:
        argv = ["--count", "3", "--interval", "0.01", *master_args(servers.urls)]
        codes.append(await cli("watch", "cli:watched", *argv))

    with anyio.fail_after(WAIT):
        async with (
            AsyncRedlock(servers.urls, identity="web-3") as redlock,
            anyio.create_task_group() as tasks,
        ):
            tasks.start_soon(watch)
            first = await lines.next()
            await polls.more(2)  # it looked again, and saw no change
            lease = await redlock.lock("cli:watched").acquire()
            second = await lines.next()  # held until the watcher has seen it
            await polls.more(2)
            await lease.release()
            third = await lines.next()
    assert codes == [0]
    assert first.endswith("  free")
    assert second.endswith(f"  held by web-3 (value {lease.value})")
    assert third.endswith("  free")


async def test_readers_and_silent_masters(
    servers: ServerGroup, make_servers: MakeServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = print_to_lines(monkeypatch)
    down = make_servers(3, start=False)  # ports reserved, nothing listening
    with anyio.fail_after(WAIT):
        async with AsyncRedlock(servers.urls, identity="reporter") as redlock:
            rw = redlock.rwlock("cli:read")
            async with rw.read(), rw.read():
                await redlock.settle()  # the masters beyond the quorum have listed them
                read = await cli("watch", "cli:read", "--count", "1", *master_args(servers.urls))
                urls = servers.urls[:2] + down.urls
                silent = await cli("watch", "cli:read", "--count", "1", *master_args(urls))
    assert (read, silent) == (0, 0)
    assert (await lines.next()).endswith("  read by 2 readers (reporter)")
    assert (await lines.next()).endswith("  unknown (3 of 5 masters did not answer)")


async def test_control_characters_in_a_value_are_escaped(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value any client may write: a newline in it printed a forged line (here,
    one claiming the lock free), an ANSI escape reached the terminal."""
    forged = "evil\n2099-01-01T00:00:00.000+00:00  free\x1b[2J"
    for url in servers.urls:
        async with Redis.from_url(url) as client:
            await client.set("cli:forged", forged, px=60_000)
    with anyio.fail_after(WAIT):
        code = await cli("watch", "cli:forged", "--count", "1", *master_args(servers.urls))
    (line,) = capsys.readouterr().out.splitlines()
    assert code == 0
    assert line.endswith(
        "  held by (not asyncredlock's) (value evil\\n2099-01-01T00:00:00.000+00:00  free\\x1b[2J)"
    )


async def test_ctrl_c_exits_130(servers: ServerGroup) -> None:
    argv = ["-m", "asyncredlock", "watch", "cli:ctrl-c", *master_args(servers.urls)]
    with anyio.fail_after(WAIT):
        async with await anyio.open_process(
            [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as process:
            assert process.stdout is not None
            assert process.stderr is not None
            first = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 1000)
            process.send_signal(signal.SIGINT)  # it is watching: its first line is out
            err = b"".join([chunk async for chunk in process.stderr])
            code = await process.wait()
    assert first.endswith(b"  free")
    assert code == 130
    assert err == b"asyncredlock: error: interrupted\n"


async def test_a_closed_pipe_ends_it_quietly_with_141(servers: ServerGroup) -> None:
    """``asyncredlock watch NAME | head -n1``: once the reader has gone, the next line
    it prints ends it, exit 141 (128 + SIGPIPE), nothing on stderr (it ended with a
    BrokenPipeError traceback, exit 1)."""
    argv = ["-m", "asyncredlock", "watch", "cli:pipe", "--interval", "0.01"]
    read_end, write_end = os.pipe()
    try:
        with anyio.fail_after(WAIT):
            async with (
                AsyncRedlock(servers.urls) as redlock,
                await anyio.open_process(
                    [sys.executable, *argv, *master_args(servers.urls)],
                    stdout=write_end,
                    stderr=subprocess.PIPE,
                ) as process,
            ):
                os.close(write_end)
                write_end = -1
                first = await anyio.to_thread.run_sync(_read_line, read_end)
                os.close(read_end)  # the reader went away (head -n1 exited)
                read_end = -1
                assert process.stderr is not None
                async with redlock.lock("cli:pipe"):  # a change: watch prints again
                    err = b"".join([chunk async for chunk in process.stderr])
                    code = await process.wait()
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    assert first.endswith(b"  free")
    assert (code, err) == (141, b"")


def _read_line(fd: int) -> bytes:
    """One line from ``fd`` (a few hundred bytes at most), unbuffered: nothing
    beyond it is taken from the pipe."""
    line = b""
    while not line.endswith(b"\n") and len(line) < 1000:
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    return line.rstrip(b"\n")
