"""Writes the fault-injection results table at the end of the session, if asked
(``CHAOS_REPORT``: see ``report.py``)."""

from __future__ import annotations

import pytest

from .report import write_if_asked


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    write_if_asked()
