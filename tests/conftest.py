"""Shared test configuration: every async test runs through anyio's plugin on the loop
that ``ASYNCREDLOCK_TEST_LOOP`` names (asyncio by default, or uvloop: tests/loops.py)."""

from __future__ import annotations

from typing import Any

import pytest

from . import loops


def pytest_configure(config: pytest.Config) -> None:
    """Refuse an unknown ``ASYNCREDLOCK_TEST_LOOP`` before any test runs."""
    try:
        loops.selected()
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_report_header(config: pytest.Config) -> str:
    return f"event loop: {loops.selected()} ({loops.VARIABLE})"


@pytest.fixture(scope="session")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return loops.backend()
