"""The /items demo: the race without a lock is real, the lock makes the limit hold."""

from __future__ import annotations

import io
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

import anyio
import pytest

from asyncredlock.testing._demo import DemoResult, run_demo

pytestmark = pytest.mark.anyio

REQUESTS, LIMIT = 5, 3
URL = re.compile(r"redis://127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class Demo:
    """One in-process run of the demo and what it printed."""

    result: DemoResult
    text: str


@pytest.fixture(scope="module")
async def demo() -> Demo:
    """The demo, run once for the module (it starts six servers)."""
    out = io.StringIO()
    result = await run_demo(masters=5, requests=REQUESTS, limit=LIMIT, out=out)
    return Demo(result, out.getvalue())


async def assert_not_listening(ports: list[str]) -> None:
    for port in ports:
        with pytest.raises(OSError, match="connection attempts failed"):
            await anyio.connect_tcp("127.0.0.1", int(port))


async def test_without_a_lock_the_limit_is_broken(demo: Demo) -> None:
    unlocked = demo.result.unlocked
    assert unlocked.stored > LIMIT
    assert unlocked.count(201) == unlocked.stored
    assert demo.result.race_shown


async def test_with_the_lock_exactly_limit_requests_succeed(demo: Demo) -> None:
    locked = demo.result.locked
    assert locked.count(201) == LIMIT
    assert locked.count(400) == REQUESTS - LIMIT
    assert locked.stored == LIMIT
    assert demo.result.lock_held_limit


async def test_the_lock_serialized_every_request(demo: Demo) -> None:
    stats = demo.result.statistics
    # each request held the lock once: taken on the masters, or passed on by the
    # handler before it in this process; and each hold ended once
    assert stats.acquisitions + stats.handoffs == REQUESTS
    assert stats.releases + stats.handoffs == REQUESTS
    assert (stats.lost, stats.held) == (0, 0)


async def test_report_shows_both_runs_side_by_side(demo: Demo) -> None:
    text = demo.text
    header = next(line for line in text.splitlines() if line.startswith("request"))
    assert "without a lock" in header
    assert 'with redlock.lock("items:create")' in header
    assert text.count('{"detail":"Cannot create more than 3 items."}') == REQUESTS - LIMIT
    assert "5 items stored: limit broken" in text
    assert "3 x 201, 2 x 400" in text
    assert "3 items stored: limit held" in text
    assert "OK: with the lock, exactly 3 created and 2 refused." in text


async def test_every_server_is_stopped_after_the_demo(demo: Demo) -> None:
    ports = URL.findall(demo.text)
    assert len(ports) == 6  # five masters and the database
    await assert_not_listening(ports)


class CancelOnFirstWrite(io.StringIO):
    """Output that cancels the demo as soon as it reports its servers."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        super().__init__()
        self.scope = scope

    def write(self, text: str) -> int:
        self.scope.cancel()
        return super().write(text)


async def test_a_cancelled_demo_stops_its_servers() -> None:
    with anyio.CancelScope() as scope:
        out = CancelOnFirstWrite(scope)
        await run_demo(out=out)
    assert scope.cancelled_caught
    assert "without a lock" not in out.getvalue()  # stopped before the first round
    ports = URL.findall(out.getvalue())
    assert len(ports) == 6
    await assert_not_listening(ports)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"masters": 0}, "masters must be >= 1"),
        ({"requests": 0}, "requests must be >= 1"),
        ({"limit": -1}, "limit must be >= 0"),
    ],
)
async def test_bad_counts_are_refused_before_anything_starts(
    kwargs: dict[str, int], message: str
) -> None:
    out = io.StringIO()
    with pytest.raises(ValueError, match=message):
        await run_demo(out=out, **kwargs)
    assert out.getvalue() == ""


def test_importing_the_cli_and_demo_does_not_import_fastapi_or_httpx() -> None:
    code = (
        "import sys, asyncredlock, asyncredlock.__main__, asyncredlock.testing._demo\n"
        "print(sorted({'fastapi', 'httpx'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_demo_without_fastapi_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncredlock.__main__ import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # makes `import fastapi` fail
    assert main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert 'pip install "asyncredlock[demo]"' in err


def test_cli_demo_exits_zero() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncredlock", "demo"],
        capture_output=True,
        text=True,
        timeout=300,  # a safety net against a hang, far above the few seconds it takes
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "OK: with the lock, exactly 3 created and 2 refused." in done.stdout
    assert done.stderr == ""


def test_a_sigterm_to_the_demo_leaves_no_server_behind() -> None:
    """The demo starts its servers in a worker thread, where no signal handler can be
    installed: it installs the SIGTERM reaper first, so `timeout` or a stopped job
    leaves no server running."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "asyncredlock", "demo", "--servers", "3", "--requests", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None
    try:
        ports = [int(port) for port in URL.findall(demo.stdout.readline())]
        assert len(ports) == 3
        demo.send_signal(signal.SIGTERM)
        _, stderr = demo.communicate(timeout=60)
        assert demo.returncode == -signal.SIGTERM, stderr
        for port in ports:
            with pytest.raises(ConnectionRefusedError), socket.socket() as sock:
                sock.connect(("127.0.0.1", port))
    finally:
        demo.kill()
        demo.communicate()
