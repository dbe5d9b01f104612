"""The suite's choice of event loop (tests/loops.py): ``ASYNCREDLOCK_TEST_LOOP``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .. import loops

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("value", "name"),
    [(None, "asyncio"), ("", "asyncio"), ("asyncio", "asyncio"), ("uvloop", "uvloop")],
)
def test_the_variable_picks_the_loop(
    monkeypatch: pytest.MonkeyPatch, value: str | None, name: str
) -> None:
    if value is None:
        monkeypatch.delenv(loops.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(loops.VARIABLE, value)
    assert loops.selected() == name
    assert loops.backend() == loops.BACKENDS[name]
    with loops.runner() as runner:
        kind = runner.run(running_loop_module())
    assert kind == ("uvloop" if name == "uvloop" else "asyncio")


async def running_loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loops.VARIABLE, "trio")
    with pytest.raises(ValueError, match=r"ASYNCREDLOCK_TEST_LOOP='trio': expected one of"):
        loops.selected()


def test_pytest_stops_at_once_on_an_unknown_loop() -> None:
    """A usage error before any test runs, naming the variable and the choices."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/unit/test_keys.py"],
        cwd=ROOT,
        env={**os.environ, loops.VARIABLE: "tokio"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "ASYNCREDLOCK_TEST_LOOP='tokio': expected one of asyncio, uvloop" in done.stderr
