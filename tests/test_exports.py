"""The public surface: exactly these names, importable, documented, shown as public."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import inspect
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

import asyncredlock
import asyncredlock.fencing
import asyncredlock.testing

PUBLIC = {
    asyncredlock: [
        "AsyncRedlock",
        "DurationStatistics",
        "HoldLimitError",
        "Lease",
        "LeaseStatistics",
        "Lock",
        "LockLostError",
        "LockNotOwnedError",
        "LockState",
        "LockStatistics",
        "LockTimeoutError",
        "LostLeaseError",
        "MissingRecordError",
        "NodeLockState",
        "NodeOutcome",
        "QuorumUnavailableError",
        "RWLock",
        "RWLockStatistics",
        "RedlockError",
        "RedlockStatistics",
        "ResourceStatistics",
        "Semaphore",
        "StaleTokenError",
        "acl_rules",
    ],
    asyncredlock.fencing: [
        "FenceGuard",
        "FencedStore",
        "FencedValue",
        "MissingRecordError",
        "SQLFence",
        "StaleTokenError",
        "check_token",
    ],
    asyncredlock.testing: [
        "ClientState",
        "FakeClock",
        "FakeClockUnavailableError",
        "FaultProxy",
        "HeldCalls",
        "SentinelProcess",
        "ServerBinaryNotFoundError",
        "ServerCluster",
        "ServerGroup",
        "ServerProcess",
        "ServerStartError",
        "Waits",
        "client_state",
        "deafened",
        "find_server_binary",
        "hold_calls",
        "whole_retry_delay",
    ],
}

EXPORTED = [(module, name) for module, names in PUBLIC.items() for name in names]

# Names a public module re-exports from another one, which they are shown as part of.
REEXPORTED = {
    (asyncredlock.fencing, "MissingRecordError"): asyncredlock,
    (asyncredlock.fencing, "StaleTokenError"): asyncredlock,
}


def ids(param: object) -> str:
    return param.__name__ if isinstance(param, ModuleType) else str(param)


@pytest.mark.parametrize("module", list(PUBLIC), ids=ids)
def test_all_is_exactly_the_public_names(module: ModuleType) -> None:
    assert module.__all__ == PUBLIC[module]


@pytest.mark.parametrize("module", list(PUBLIC), ids=ids)
def test_no_other_public_names(module: ModuleType) -> None:
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert public - {"annotations"} == set(PUBLIC[module])


@pytest.mark.parametrize(("module", "name"), EXPORTED, ids=ids)
def test_importable_by_name(module: ModuleType, name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module.__name__} import {name}", namespace)
    assert namespace[name] is getattr(importlib.import_module(module.__name__), name)


@pytest.mark.parametrize(("module", "name"), EXPORTED, ids=ids)
def test_shown_as_defined_in_the_public_module(module: ModuleType, name: str) -> None:
    home = REEXPORTED.get((module, name), module)
    assert getattr(module, name) is getattr(home, name)
    assert getattr(module, name).__module__ == home.__name__


@pytest.mark.parametrize(("module", "name"), EXPORTED, ids=ids)
def test_documented(module: ModuleType, name: str) -> None:
    obj = getattr(module, name)
    assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"
    if not inspect.isclass(obj):
        return
    undocumented = [
        attr
        for attr, value in vars(obj).items()
        if not attr.startswith("_")
        and (inspect.isfunction(value) or isinstance(value, property))
        and not inspect.getdoc(value)
    ]
    assert undocumented == [], f"{name} has undocumented public members"


@pytest.mark.parametrize("module", list(PUBLIC), ids=ids)
def test_modules_documented(module: ModuleType) -> None:
    assert inspect.getdoc(module)


def test_errors_form_one_tree() -> None:
    errors = [
        asyncredlock.LockTimeoutError,
        asyncredlock.QuorumUnavailableError,
        asyncredlock.LockLostError,
        asyncredlock.LockNotOwnedError,
        asyncredlock.StaleTokenError,
        asyncredlock.MissingRecordError,
    ]
    assert all(issubclass(error, asyncredlock.RedlockError) for error in errors)
    assert asyncredlock.RedlockError.__bases__ == (Exception,)
    assert issubclass(asyncredlock.MissingRecordError, LookupError)
    assert asyncredlock.HoldLimitError.__bases__ == (asyncredlock.LockLostError,)
    # a lost lease's release/extend: what they raised before, and a loss
    lost_lease = (asyncredlock.LockNotOwnedError, asyncredlock.LockLostError)
    assert asyncredlock.LostLeaseError.__bases__ == lost_lease


def test_py_typed_is_shipped() -> None:
    assert importlib.resources.files("asyncredlock").joinpath("py.typed").is_file()


def test_version_matches_the_distribution() -> None:
    assert asyncredlock.__version__ == importlib.metadata.version("asyncredlock")


def test_no_pytest_plugin_is_registered_on_install() -> None:
    points = importlib.metadata.entry_points(group="pytest11")
    assert [p.value for p in points if p.value.startswith("asyncredlock")] == []


def test_the_logger_has_a_null_handler() -> None:
    import logging

    handlers = logging.getLogger("asyncredlock").handlers
    assert any(isinstance(handler, logging.NullHandler) for handler in handlers)


def test_the_pytest_plugin_is_opt_in(tmp_path: Path) -> None:
    """A project that installs asyncredlock sees none of its fixtures unless it opts in."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")

    def fixtures(*options: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider", *options],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    with ThreadPoolExecutor(2) as pool:  # the two interpreters boot side by side
        without = pool.submit(fixtures)
        opted_in = pool.submit(fixtures, "-p", "asyncredlock.testing.pytest_plugin")
        assert "make_servers" not in without.result()
        assert "make_servers" in opted_in.result()
