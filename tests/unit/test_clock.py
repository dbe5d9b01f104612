"""`FakeClock` without a server: the offset file and the environment it gives."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from asyncredlock.testing import FakeClock

LIBRARY = "/opt/faketime/libfaketime.so.1"  # never loaded here


@pytest.fixture
def clock(tmp_path: Path) -> FakeClock:
    return FakeClock(tmp_path / "faketime", library=LIBRARY)


def test_it_starts_at_offset_zero(clock: FakeClock) -> None:
    assert clock.offset == 0
    assert clock.path.read_text() == "+0.000000\n"


def test_jumps_add_up_and_reset_clears_them(clock: FakeClock) -> None:
    clock.jump(30)
    assert clock.path.read_text() == "+30.000000\n"
    clock.jump(-50.25)
    assert clock.offset == -20.25
    assert clock.path.read_text() == "-20.250000\n"
    clock.set_offset(7)
    assert clock.offset == 7
    clock.reset()
    assert clock.path.read_text() == "+0.000000\n"


def test_the_file_is_replaced_whole(clock: FakeClock) -> None:
    """Written beside and renamed over: no staged file is left, the inode changes."""
    inode = clock.path.stat().st_ino
    clock.jump(1)
    assert clock.path.stat().st_ino != inode
    assert sorted(p.name for p in clock.path.parent.iterdir()) == ["faketime"]


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf])
def test_an_offset_must_be_finite(clock: FakeClock, seconds: float) -> None:
    clock.jump(5)
    with pytest.raises(ValueError, match="finite"):
        clock.set_offset(seconds)
    with pytest.raises(ValueError, match="finite"):
        clock.jump(seconds)
    assert (clock.offset, clock.path.read_text()) == (5, "+5.000000\n")


def test_the_environment_puts_the_library_first_and_owns_faketime(clock: FakeClock) -> None:
    base = {
        "PATH": "/usr/bin",
        "LD_PRELOAD": "/lib/other.so",
        "FAKETIME": "@2000-01-01 00:00:00",  # would win over the file
        "FAKETIME_DONT_FAKE_MONOTONIC": "0",
        "DONT_FAKE_MONOTONIC": "0",
    }
    assert clock.environ(base) == {
        "PATH": "/usr/bin",
        "LD_PRELOAD": f"{LIBRARY}:/lib/other.so",
        "FAKETIME_TIMESTAMP_FILE": str(clock.path),
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    assert clock.environ({})["LD_PRELOAD"] == LIBRARY


def test_a_process_without_the_library_is_seen(clock: FakeClock) -> None:
    assert not clock.loaded_by(2**22 + 1)  # above the default pid_max: no such process
