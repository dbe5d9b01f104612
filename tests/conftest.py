"""Shared test configuration: every async test runs on asyncio through anyio's plugin."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
