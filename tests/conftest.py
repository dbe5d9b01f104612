"""Shared test configuration: every async test runs through anyio's plugin on the loop
that ``ASYNCREDLOCK_TEST_LOOP`` names (asyncio by default, or uvloop: tests/loops.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from . import loops


def pytest_configure(config: pytest.Config) -> None:
    """Refuse an unknown ``ASYNCREDLOCK_TEST_LOOP`` before any test runs, and a chaos
    report asked of a run in several worker processes (each would write the results
    of its own scenarios alone, over the others')."""
    try:
        loops.selected()
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    if os.environ.get("CHAOS_REPORT") and config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "CHAOS_REPORT collects every scenario's result in one process: add -n 0"
        )


def pytest_report_header(config: pytest.Config) -> str:
    return f"event loop: {loops.selected()} ({loops.VARIABLE})"


@pytest.fixture(scope="session")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return loops.backend()
