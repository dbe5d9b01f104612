"""Helpers shared by the benchmark scripts: servers and proxies, statistics, the
environment stamp, and publishing.

- `ServerGroup` servers plus a `ProxyHost`: one ``FaultProxy`` per server, hosted in a
  *separate process* so that forwarding bytes does not compete with the measured client
  for its event loop (this machine may have only two cores).
- `summarize()`: percentiles and mean of latency samples, in milliseconds (`Summary`);
  `spread()`: median, min and max of a measure over repeated runs (`Spread`).
- `environment()`: what the numbers were measured on (`Environment`), and `machine_line()`.
- Writers for JSON, markdown and the docs page, and a headless matplotlib.

Scripts import this as ``lockbench.harness`` (Python puts a script's own directory on
``sys.path``), so each runs as ``python benchmarks/<name>.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import signal
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, NotRequired, Self, TypedDict

import redis

import asyncredlock
from asyncredlock.testing import FaultProxy, ServerGroup, find_server_binary

__all__ = [
    "Environment",
    "ProxyHost",
    "Spread",
    "Summary",
    "add_report_option",
    "environment",
    "machine_line",
    "publish_between",
    "publish_section",
    "pyplot",
    "read_report",
    "redlock_counters",
    "servers_behind_proxies",
    "spread",
    "summarize",
    "write_json",
    "write_text",
]

_HOST = "127.0.0.1"
_PIPE_TIMEOUT = 15.0  # seconds the parent waits for the proxy process to answer
_JOIN_TIMEOUT = 5.0


# --- proxies in their own process ---------------------------------------------------


class ProxyHost:
    """``FaultProxy`` instances in a child process, one per target port.

    The child runs an asyncio loop hosting every proxy and obeys commands sent over a
    ``multiprocessing`` pipe; each command is applied before it is acknowledged, so a
    fault set by the parent is in force when the call returns. The child ignores
    Ctrl-C (the parent stops it) and exits on its own if the parent goes away.

    Args:
        targets: The server ports to proxy, in order.
    """

    def __init__(self, targets: Sequence[int]) -> None:
        self._targets = list(targets)
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self.ports: list[int] = []

    def start(self) -> None:
        """Start the child process and wait until every proxy listens.

        Raises:
            RuntimeError: The child did not come up in time.
        """
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._conn = parent
        process = ctx.Process(
            target=_proxy_main, args=(child, self._targets), name="fault-proxies", daemon=True
        )
        try:
            process.start()
        finally:
            child.close()
        self._process = process
        self.ports = self._reply()

    @property
    def pid(self) -> int | None:
        """The process id of the child hosting the proxies; None while it is not running."""
        return None if self._process is None else self._process.pid

    def urls(self, n: int) -> list[str]:
        """``redis://`` URLs of the first ``n`` proxies."""
        return [f"redis://{_HOST}:{port}" for port in self.ports[:n]]

    def set_delay(self, seconds: float) -> None:
        """Set the one-way delay of every proxy (the round trip gains twice that)."""
        self._request("delay", seconds)

    def set_blackhole(self, index: int, on: bool) -> None:
        """Blackhole (or heal) the proxy in front of server ``index``."""
        self._request("blackhole", index, on)

    def close(self) -> None:
        """Stop every proxy and the child process; kill it if it does not exit. Idempotent."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            with contextlib.suppress(OSError, RuntimeError, EOFError):
                conn.send(("stop",))
                _await(conn, process)
            conn.close()
        if process is not None:
            process.join(_JOIN_TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()

    def _request(self, *message: object) -> Any:
        if self._conn is None:
            raise RuntimeError("the proxy process is not running")
        self._conn.send(message)
        return self._reply()

    def _reply(self) -> Any:
        assert self._conn is not None
        return _await(self._conn, self._process)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _await(conn: Connection, process: multiprocessing.process.BaseProcess | None) -> Any:
    """The value of the child's next ``("ok", value)`` reply.

    Raises:
        RuntimeError: The child replied with an error, exited, or stayed silent.
    """
    waitables: list[Any] = [conn] if process is None else [conn, process.sentinel]
    if conn not in multiprocessing.connection.wait(waitables, _PIPE_TIMEOUT):
        raise RuntimeError(f"the proxy process did not answer within {_PIPE_TIMEOUT:g} s")
    try:
        status, value = conn.recv()
    except EOFError:
        code = None if process is None else process.exitcode
        raise RuntimeError(f"the proxy process exited (exit code {code})") from None
    if status != "ok":
        raise RuntimeError(f"proxy process: {value}")
    return value


def _proxy_main(conn: Connection, targets: list[int]) -> None:
    """Entry point of the proxy process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    try:
        asyncio.run(_host_proxies(conn, targets))
    finally:
        conn.close()


async def _host_proxies(conn: Connection, targets: list[int]) -> None:
    proxies = [FaultProxy(_HOST, port) for port in targets]
    try:
        for proxy in proxies:
            await proxy.start()
        conn.send(("ok", [proxy.port for proxy in proxies]))
        await _obey(conn, proxies)
    except Exception as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", repr(exc)))
    finally:
        for proxy in proxies:
            await proxy.aclose()


async def _obey(conn: Connection, proxies: list[FaultProxy]) -> None:
    """Apply commands from the pipe until ``stop`` or until the parent is gone."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...] | None] = asyncio.Queue()

    def readable() -> None:
        try:
            inbox.put_nowait(conn.recv())
        except (EOFError, OSError):  # the parent died: shut down
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(None)

    loop.add_reader(conn.fileno(), readable)
    try:
        while (message := await inbox.get()) is not None and message[0] != "stop":
            conn.send(_apply(proxies, message))
    finally:
        loop.remove_reader(conn.fileno())
    if message is not None:
        conn.send(("ok", None))


def _apply(proxies: list[FaultProxy], message: tuple[Any, ...]) -> tuple[str, object]:
    try:
        match message:
            case ("delay", float(seconds)):
                for proxy in proxies:
                    proxy.delay = seconds
            case ("blackhole", int(index), bool(on)):
                proxies[index].blackhole = on
            case _:
                return "error", f"unknown command {message!r}"
    except (ValueError, IndexError) as exc:
        return "error", repr(exc)
    return "ok", None


@contextlib.contextmanager
def servers_behind_proxies(n: int) -> Iterator[tuple[ServerGroup, ProxyHost]]:
    """Start ``n`` servers and a proxy process in front of them; stop all at exit."""
    with ServerGroup(n) as servers, ProxyHost([server.port for server in servers]) as proxies:
        yield servers, proxies


# --- statistics ----------------------------------------------------------------------


class Summary(TypedDict):
    """`summarize()`'s record of latency samples, in milliseconds."""

    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float


def summarize(seconds: Sequence[float]) -> Summary:
    """p50, p90, p99, mean, min and max of latency samples, in milliseconds.

    Percentiles interpolate linearly between order statistics (the "inclusive"
    method, as numpy's default), so they are defined for any sample size.

    Raises:
        ValueError: No samples.
    """
    if not seconds:
        raise ValueError("no samples to summarize")
    ms = sorted(s * 1000 for s in seconds)
    cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {
        "iterations": len(ms),
        "p50_ms": round(cuts[49], 4),
        "p90_ms": round(cuts[89], 4),
        "p99_ms": round(cuts[98], 4),
        "mean_ms": round(statistics.fmean(ms), 4),
        "min_ms": round(ms[0], 4),
        "max_ms": round(ms[-1], 4),
    }


#: Below this many samples a p99 is about the largest sample: every report's tables show
#: "n/a" (peers, fan-out).
P99_MIN_SAMPLES = 100


def p99_text(summary: Summary, *, counted: bool = False) -> str:
    """A summary's p99 for a cell, or "n/a (3 samples)" below `P99_MIN_SAMPLES` (just
    "n/a" where the cell ``counted`` its samples already)."""
    if summary["iterations"] >= P99_MIN_SAMPLES:
        return f"{summary['p99_ms']:.2f}"
    return "n/a" if counted else f"n/a ({summary['iterations']} samples)"


class Spread(TypedDict):
    """`spread()`'s record: median, min and max of one measure over repeated runs."""

    median: float
    min: float
    max: float


def spread(values: Sequence[float], digits: int | None = None) -> Spread:
    """The median, min and max of ``values``, rounded to ``digits`` decimals if given.

    Raises:
        statistics.StatisticsError: No values.
    """
    stats = (statistics.median(values), min(values), max(values))
    median, low, high = stats if digits is None else (round(v, digits) for v in stats)
    return {"median": median, "min": low, "max": high}


# --- environment -----------------------------------------------------------------------


class Environment(TypedDict):
    """`environment()`'s stamp: the machine, software versions and time of a run."""

    date: str
    python: str
    implementation: str
    platform: str
    cpu_count: int | None
    cpu_model: str
    redis_py: str
    hiredis: str | None
    asyncredlock: str
    server: str
    server_binary: str
    event_loop: NotRequired[str]  # set by the scripts that run on a chosen loop


def environment() -> Environment:
    """The machine, software versions and time of a run."""
    binary = find_server_binary()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "redis_py": redis.__version__,
        "hiredis": _version_of("hiredis"),
        "asyncredlock": asyncredlock.__version__,
        "server": _server_version(binary),
        "server_binary": binary,
    }


def process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux ``/proc``), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redlock_counters(redlock: asyncredlock.AsyncRedlock) -> dict[str, int]:
    """``redlock.statistics()``'s counters and gauges by name (its wait and hold
    summaries left out: the benchmarks add counters up across clients)."""
    stats = dataclasses.asdict(redlock.statistics())
    return {name: value for name, value in stats.items() if isinstance(value, int)}


def machine_line(env: Environment) -> str:
    """Where and when the numbers were measured, as one sentence."""
    return (
        f"Measured {env['date']} on {env['cpu_count']} CPUs ({env['cpu_model']}), "
        f"{env['platform']}; Python {env['python']}, redis-py {env['redis_py']} "
        f"(hiredis {env['hiredis']}), {env['server']}, asyncredlock {env['asyncredlock']}"
        + ("." if env.get("event_loop", "asyncio") == "asyncio" else f"; on {env['event_loop']}.")
    )


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version_of(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except (ImportError, AttributeError):
        return None


def _server_version(binary: str) -> str:
    """``valkey-server 8.1.8`` from the binary's ``--version`` line."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    words = out.stdout.split()
    version = next((w.removeprefix("v=") for w in words if w.startswith("v=")), "?")
    return f"{Path(binary).name} {version}"


# --- output ----------------------------------------------------------------------------


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a ``.tmp`` sibling, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def add_report_option(parser: argparse.ArgumentParser, results: str) -> None:
    """``--report JSON``: the script's report step alone, on results already written
    (``results``, e.g. ``peers.json``): it measures nothing and writes the same files
    as a run that measured them."""
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help=f"measure nothing: write the report of results already written (a {results})",
    )


def read_report(path: Path) -> Any:
    """Results written by an earlier run (see `add_report_option`)."""
    return json.loads(path.read_text())


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as indented JSON, atomically."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def publish_section(page: Path, marker: str, body: str) -> None:
    """Replace everything after the line ``marker`` in ``page`` by ``body``.

    The marker line is kept, so the next run replaces the section again.

    Raises:
        ValueError: ``page`` has no line equal to ``marker``.
    """
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.strip() == marker), None)
    if at is None:
        raise ValueError(f"{page} has no line {marker!r}")
    head = "".join(lines[:at]) + marker + "\n"
    write_text(page, f"{head}\n{body.strip()}\n")


def publish_between(page: Path, start: str, end: str, body: str) -> None:
    """Replace the lines between the lines ``start`` and ``end`` in ``page`` by ``body``.

    Both marker lines are kept, so the next run replaces the section again.

    Raises:
        ValueError: ``page`` lacks either marker line, or has them in the wrong order.
    """
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    stripped = [line.strip() for line in lines]
    if start not in stripped or end not in stripped:
        raise ValueError(f"{page} needs the lines {start!r} and {end!r}")
    first, last = stripped.index(start), stripped.index(end)
    if last < first:
        raise ValueError(f"{page}: {end!r} comes before {start!r}")
    head = "".join(lines[: first + 1])
    tail = "".join(lines[last:])
    write_text(page, f"{head}\n{body.strip()}\n\n{tail}")


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
