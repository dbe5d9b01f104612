"""pytest plugin: real Redis/Valkey servers as fixtures, and Docker and fake-clock checks.

Opt-in: nothing is loaded by installing asyncredlock. Load it with
``pytest -p asyncredlock.testing.pytest_plugin`` (or ``addopts`` in the pytest
configuration), or with ``pytest_plugins = ["asyncredlock.testing.pytest_plugin"]`` in
the top-level ``conftest.py``. Fixtures:

- ``redlock_server_group`` (session): five servers started once for the whole run.
  Shared: tests must not stop, pause or restart them.
- ``servers``: that group, emptied (``FLUSHALL``) before the test.
- ``make_servers``: a factory ``make_servers(n, **options) -> ServerGroup`` for
  destructive tests; every group it made is closed after the test, pass or fail.
- ``docker_available``: skips the test when no Docker engine answers or testcontainers
  is not installed. Tests marked ``docker`` should request it, e.g. with
  ``pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_available")]``.
- ``fake_clock_available``: skips the test when servers cannot run on a `FakeClock`
  here (not Linux, libfaketime not installed, or a server binary that clashes with it,
  such as Debian's ``redis-server``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from ._clock import LIBRARY_VARIABLE, FakeClockUnavailableError, PreloadClashError
from ._group import ServerGroup
from ._servers import ServerProcess

__all__ = [
    "MakeServers",
    "docker_available",
    "docker_skip_reason",
    "fake_clock_available",
    "fake_clock_skip_reason",
    "make_servers",
    "redlock_server_group",
    "servers",
]

SESSION_GROUP_SIZE = 5
NO_DOCKER_REASON = "no Docker engine reachable (testcontainers needs one)"
NO_TESTCONTAINERS_REASON = "testcontainers is not installed (pip install 'asyncredlock[compat]')"
_DOCKER_PING_TIMEOUT = 3.0


class MakeServers(Protocol):
    """The type of the ``make_servers`` fixture, for annotating test parameters."""

    def __call__(
        self,
        n: int,
        *,
        binary: str | None = None,
        appendonly: bool = False,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        fake_clock: bool = False,
        start: bool = True,
    ) -> ServerGroup:
        """Make a `ServerGroup` of `n` servers, started unless ``start=False``.

        Args:
            n: Number of servers.
            binary: Server executable; found automatically when None.
            appendonly: Persist writes to an AOF (``appendfsync always``).
            workdir: Parent directory for the servers' data; private when None.
            extra_args: More server command-line arguments.
            fake_clock: Give each server a `FakeClock` (``group[i].clock``).
            start: Start the servers before returning.

        Raises:
            ServerStartError: A server did not come up.
            FakeClockUnavailableError: `fake_clock` is set and libfaketime is
                unavailable.
        """
        ...


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``docker`` marker, so ``--strict-markers`` accepts it anywhere."""
    config.addinivalue_line(
        "markers", "docker: needs a Docker engine (testcontainers); skipped where none runs"
    )


@pytest.fixture(scope="session")
def redlock_server_group() -> Iterator[ServerGroup]:
    """Five real servers for the whole session, closed at its end.

    Raises:
        ServerBinaryNotFoundError: No server binary is available.
        ServerStartError: A server did not come up.
    """
    with ServerGroup(SESSION_GROUP_SIZE) as group:
        yield group


@pytest.fixture
def servers(redlock_server_group: ServerGroup) -> ServerGroup:
    """The session's server group, empty at the start of the test.

    A server that a test paused or stopped despite the rule is resumed or restarted
    (on its port) first, so one faulty test does not break the ones after it.
    """
    for server in redlock_server_group:
        if server.paused:
            server.resume()
    redlock_server_group.start()
    redlock_server_group.flushall()
    return redlock_server_group


@pytest.fixture
def make_servers() -> Iterator[MakeServers]:
    """A factory of private server groups, all closed when the test ends."""
    made: list[ServerGroup] = []

    def make(
        n: int,
        *,
        binary: str | None = None,
        appendonly: bool = False,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        fake_clock: bool = False,
        start: bool = True,
    ) -> ServerGroup:
        group = ServerGroup(
            n,
            binary=binary,
            appendonly=appendonly,
            workdir=workdir,
            extra_args=extra_args,
            fake_clock=fake_clock,
        )
        made.append(group)
        if start:
            group.start()
        return group

    try:
        yield make
    finally:
        for group in made:
            group.close()


@pytest.fixture(scope="session")
def docker_available() -> None:
    """Skip the test unless a Docker engine answers and testcontainers is installed."""
    reason = docker_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def docker_skip_reason() -> str | None:
    """Why Docker-based tests cannot run here, or None when they can.

    Returns:
        None, or a reason suitable for `pytest.skip`.
    """
    if not _docker_engine_answers():
        return NO_DOCKER_REASON
    if importlib.util.find_spec("testcontainers") is None:
        return NO_TESTCONTAINERS_REASON
    return None


@pytest.fixture(scope="session")
def fake_clock_available() -> None:
    """Skip the test unless servers of the session's binary can run on a `FakeClock`."""
    reason = fake_clock_skip_reason()
    if reason is not None:
        pytest.skip(reason)


@functools.cache
def fake_clock_skip_reason(binary: str | None = None) -> str | None:
    """Why servers of `binary` cannot run on a `FakeClock` here, or None when they can.

    Starts one such server to find out (once per binary: the answer is kept).

    Args:
        binary: The server executable; the one `find_server_binary` picks when None.

    Returns:
        None, or a reason suitable for `pytest.skip`: not Linux, libfaketime not
        installed, or a server binary that libfaketime cannot run in (one linking
        jemalloc as a shared library, as Debian's ``redis-server`` does).

    Raises:
        FakeClockUnavailableError: ``REDLOCK_FAKETIME_LIB`` names a library that cannot
            be used: a configuration error fails the test rather than skipping it.
        ServerStartError: The server did not start for another reason.
    """
    try:
        with ServerProcess(binary=binary, fake_clock=True):
            return None
    except PreloadClashError as error:
        return str(error).split("; log tail:", 1)[0]
    except FakeClockUnavailableError as error:
        if os.environ.get(LIBRARY_VARIABLE):
            raise
        return str(error)


@functools.cache
def _docker_engine_answers() -> bool:
    """Ping the engine with the Docker SDK, or with the ``docker`` CLI without it."""
    try:
        docker = importlib.import_module("docker")
    except ImportError:
        return _docker_cli_answers()
    try:
        client = docker.from_env(timeout=int(_DOCKER_PING_TIMEOUT))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # the SDK raises many kinds (DockerException, requests errors...)
        return False


def _docker_cli_answers() -> bool:
    cli = shutil.which("docker")
    if cli is None:
        return False
    try:
        subprocess.run(  # noqa: S603 - fixed arguments, the CLI found on PATH
            [cli, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=_DOCKER_PING_TIMEOUT,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return True
