"""`ServerGroup`: N server processes, the masters of a Redlock deployment."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from .._config import check_seconds
from ._checks import check_count, check_path, check_server_args, check_start_args
from ._servers import ServerProcess
from ._support import (
    STOP_GRACE,
    PortInUseError,
    find_server_binary,
)

__all__ = ["ServerGroup"]


class ServerGroup:
    """N independent server processes: the masters of a Redlock deployment.

    Args:
        n: Number of servers (at least 1).
        binary: Server executable shared by all; `find_server_binary()` when None.
        appendonly: Passed to each `ServerProcess`.
        workdir: Parent directory; server ``i`` uses ``workdir/node-i``. Private
            temporary directories when None.
        extra_args: Passed to each `ServerProcess`.
        fake_clock: Give each server its own `FakeClock` (``group[i].clock``), all at
            offset 0: move one master's clock and the others keep the host's.

    Raises:
        ValueError: `n` is less than 1.
        TypeError: `n` is not an int (nor a bool: ``ServerGroup(True)`` is no count).
        TypeError: `appendonly` or `fake_clock` is not a bool, `extra_args` is a
            str, or `binary` or `workdir` neither None nor a str or os.PathLike (as
            for `ServerProcess`; no server is made).
        ServerBinaryNotFoundError: `binary` is None and no server binary is found.
        FakeClockUnavailableError: `fake_clock` is set and libfaketime is unavailable.
    """

    def __init__(
        self,
        n: int,
        *,
        binary: str | None = None,
        appendonly: bool = False,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        fake_clock: bool = False,
    ) -> None:
        if check_count("n (the number of servers)", n, minimum=None) < 1:
            raise ValueError(f"a server group needs at least one server, got n={n}")
        check_server_args(appendonly=appendonly, extra_args=extra_args, fake_clock=fake_clock)
        check_path("workdir", workdir)  # before the binary is looked up
        binary = check_path("binary", binary) or find_server_binary()
        self._servers = [
            ServerProcess(
                binary=binary,
                appendonly=appendonly,
                workdir=Path(workdir) / f"node-{i}" if workdir else None,
                extra_args=extra_args,
                fake_clock=fake_clock,
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
            RuntimeError: `close()` was called (on the group or one of its servers);
                nothing is started.
            TypeError, ValueError: `timeout` is no number of seconds above 0 (nothing
                is started).
        """
        check_start_args(timeout)
        if any(server._closed for server in self._servers):
            raise RuntimeError(f"{self!r} is closed")
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
                server._reap(STOP_GRACE)
            raise

    @staticmethod
    def _finish_start(server: ServerProcess, timeout: float) -> None:
        try:
            server._await_ready(timeout)
        except PortInUseError:
            if not server._may_change_port():
                raise
            server._move_to_new_port()
            server.start(timeout)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every server, in parallel (ports and directories are kept).

        Args:
            grace: Seconds each server has after SIGTERM before SIGKILL (0: at once).

        Raises:
            TypeError, ValueError: `grace` is no finite number of seconds, or below 0 (no
                server is signalled).
        """
        check_seconds("grace", grace, allow_zero=True)
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
