"""The fault-injection suite's checks around every test (no client process outlives
it), and its results table, written at the end of the session if asked
(``CHAOS_REPORT``: see ``report.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import STARTED
from .report import write_if_asked


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    STARTED.clear()
    yield
    alive = [process.pid for process in STARTED if process.returncode is None]
    STARTED.clear()
    assert alive == [], f"worker processes left running: {alive}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    write_if_asked()
