"""A real Sentinel process (``valkey-server --sentinel``) watching test servers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .._config import check_seconds
from ._checks import check_count, check_period, check_str
from ._servers import ServerProcess
from ._support import HOST, resp_call

__all__ = ["SentinelProcess"]


class SentinelProcess(ServerProcess):
    """One Sentinel on 127.0.0.1, from the same binary as the servers, monitoring
    each of ``monitor``'s servers under its service name.

    Its configuration file (which Sentinel rewrites as it learns) is in `workdir`,
    so a restart remembers the masters and any failover. A server made with a
    ``password`` is monitored with it (``sentinel auth-pass``), and so are its
    replicas, which must share it.

    Args:
        monitor: Service name to the server it starts monitoring as master.
        quorum: Sentinels that must agree a master is down (1: this one alone).
        down_after: Seconds of silence after which it counts a master down.
        binary: As for `ServerProcess`.
        port: As for `ServerProcess`.
        workdir: As for `ServerProcess`.

    Raises:
        ValueError: ``monitor`` is empty or has a service name that is not one word
            (empty, or with whitespace or control characters), ``quorum`` is below
            1, or ``down_after`` is not above 0 (NaN included) or infinite.
        TypeError: ``monitor`` has a service name that is not a str or a server
            that is not a `ServerProcess`, ``port`` or ``quorum`` is not an int (a
            bool is no count), or ``down_after`` not an int or a float (a bool is
            no 1 s).
    """

    def __init__(
        self,
        monitor: Mapping[str, ServerProcess],
        *,
        quorum: int = 1,
        down_after: float = 1.0,
        binary: str | None = None,
        port: int = 0,
        workdir: str | Path | None = None,
    ) -> None:
        monitor = dict(monitor)  # once: pairs given by a one-shot iterable are read once
        if not monitor:
            raise ValueError("monitor names no server to watch")
        for service, server in monitor.items():  # before a port is picked
            _check_service(service, server)
        check_count("quorum", quorum, minimum=1)  # else only the started sentinel fails
        check_period("down_after", down_after)  # True is no 1 s
        super().__init__(binary=binary, port=port, workdir=workdir)
        self._monitor = monitor
        self._quorum = quorum
        self._down_after_ms = max(1, round(down_after * 1000))

    def __repr__(self) -> str:
        return f"<SentinelProcess {HOST}:{self.port} services={sorted(self._monitor)}>"

    def master_url(self, service: str) -> str:
        """``redis-sentinel://127.0.0.1:PORT/SERVICE``: the master of ``service``,
        found through this sentinel (for `AsyncRedlock`)."""
        return f"redis-sentinel://{HOST}:{self.port}/{service}"

    def master_address(self, service: str, timeout: float = 1.0) -> tuple[str, int] | None:
        """Where this sentinel says the master of ``service`` is now (None: it names none).

        Args:
            service: A service name of ``monitor``.
            timeout: Seconds for the connection, and for each read of the reply.

        Raises:
            TypeError: ``service`` is not a str (nothing is sent).
            TypeError, ValueError: ``timeout`` is no number of seconds above 0, or
                infinite (nothing is sent; ``True`` is no 1 s).
            OSError: The sentinel did not answer.
        """
        check_str("service", service)
        check_seconds("timeout", timeout)  # 0 would connect without blocking
        reply = resp_call(
            self.port, "SENTINEL", "get-master-addr-by-name", service, timeout=timeout
        )
        if not isinstance(reply, list) or len(reply) != 2:
            return None
        host, port = reply
        return bytes(host).decode(), int(port)

    def _command(self) -> list[str]:
        config = self.workdir / "sentinel.conf"
        if not config.exists():  # later starts keep what Sentinel wrote there
            config.write_text(self._config(), encoding="utf-8")
        args = [self._binary, str(config), "--sentinel", "--port", str(self.port)]
        args += ["--bind", HOST, "--dir", str(self.workdir), "--daemonize", "no"]
        return [*args, "--protected-mode", "no", "--logfile", str(self.log_path)]

    def _config(self) -> str:
        lines: list[str] = []
        for service, server in self._monitor.items():
            lines += _monitor_lines(service, server, self._quorum, self._down_after_ms)
        return "\n".join(lines) + "\n"


def _check_service(service: object, server: object) -> None:
    """Refuse a ``monitor`` entry the sentinel's configuration cannot hold.

    Raises:
        TypeError: ``service`` is not a str, or ``server`` not a `ServerProcess`.
        ValueError: ``service`` is empty, or holds whitespace, a control character,
            a quote or a backslash (Sentinel reads its configuration a word at a time).
    """
    if not isinstance(service, str):
        raise TypeError(f"monitor's service names must be str, not {type(service).__name__}")
    if (
        not service
        or not service.isprintable()
        or any(c.isspace() or c in "\"'\\" for c in service)
    ):
        raise ValueError(
            "monitor's service name must be one word, without whitespace, control"
            f" characters, quotes or backslashes, got {service!r}"
        )
    if not isinstance(server, ServerProcess):
        raise TypeError(
            f"monitor maps each service name to a ServerProcess, not {type(server).__name__}"
            f" (for {service!r})"
        )


def _monitor_lines(service: str, server: ServerProcess, quorum: int, down_ms: int) -> Sequence[str]:
    lines = [
        f"sentinel monitor {service} {HOST} {server.port} {quorum}",
        f"sentinel down-after-milliseconds {service} {down_ms}",
        f"sentinel failover-timeout {service} {max(1000, 3 * down_ms)}",
    ]
    if server._password is not None:  # its replicas are taken to share it
        lines.append(f"sentinel auth-pass {service} {_quoted(server._password)}")
    return lines


def _quoted(value: str) -> str:
    """``value`` as one double-quoted argument of a configuration line."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
