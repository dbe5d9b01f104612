"""The event loop the suite runs on, chosen by the environment variable
``ASYNCREDLOCK_TEST_LOOP``: ``asyncio`` (the default) or ``uvloop``.

The async tests follow it through the ``anyio_backend`` fixture (tests/conftest.py),
the chaos workers (tests/chaos/worker.py, separate processes that inherit the
variable) and the tests that make loops of their own (`runner`). The small child
scripts that a test kills or imports in another way stay on asyncio: what they check
is the process or the import, not the loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable
from typing import Any

VARIABLE = "ASYNCREDLOCK_TEST_LOOP"
# The anyio backend and its options, by loop name.
BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
}


def selected() -> str:
    """The loop named by ``ASYNCREDLOCK_TEST_LOOP`` (``asyncio`` when unset or empty).

    Raises:
        ValueError: The variable names no known loop, or uvloop, which is not installed.
    """
    name = os.environ.get(VARIABLE, "").strip() or "asyncio"
    if name not in BACKENDS:
        raise ValueError(f"{VARIABLE}={name!r}: expected one of {', '.join(sorted(BACKENDS))}")
    if name == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ValueError(f"{VARIABLE}=uvloop, but uvloop is not installed (the test extra)")
    return name


def backend() -> tuple[str, dict[str, Any]]:
    """The anyio backend (and its options) of the selected loop."""
    return BACKENDS[selected()]


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """Makes new event loops of the selected kind."""
    if selected() == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def runner() -> asyncio.Runner:
    """An `asyncio.Runner` on a new loop of the selected kind (``asyncio.run`` for
    tests that run coroutines from synchronous code)."""
    return asyncio.Runner(loop_factory=loop_factory())
