"""The docs checked against what the code does (from the docs review of 2026-11-29):
API reference docstrings and the architecture page (no server needed: each case fails
before any I/O)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _raises_section(doc: str | None) -> str:
    assert doc is not None
    return doc.split("Raises:", 1)[1] if "Raises:" in doc else ""


class TestLockedDocstringsNameTheMissingSetup:
    """docs/api.md renders the docstrings of ``contrib.aiohttp.locked`` and
    ``contrib.fastapi.locked``; their "Raises:" list what a request can raise, the
    `RuntimeError` of an app without ``setup()`` / ``lifespan()`` too, which
    docs/aiohttp.md and docs/fastapi.md describe."""

    @pytest.mark.anyio
    async def test_aiohttp(self) -> None:
        aiohttp = pytest.importorskip("aiohttp")
        from aiohttp.test_utils import make_mocked_request

        from asyncredlock.contrib import aiohttp as contrib

        app = aiohttp.web.Application()  # no setup()

        @contrib.locked("orders:{order_id}")
        async def handler(request: object) -> object:
            raise AssertionError("ran without a lock")

        request = make_mocked_request("PUT", "/orders/7", app=app, match_info={"order_id": "7"})
        with pytest.raises(RuntimeError, match=r"call asyncredlock\.contrib\.aiohttp\.setup\(\)"):
            await handler(request)
        assert "RuntimeError" in _raises_section(contrib.locked.__doc__)

    def test_fastapi(self) -> None:
        fastapi = pytest.importorskip("fastapi")
        from fastapi.testclient import TestClient

        from asyncredlock.contrib import fastapi as contrib

        app = fastapi.FastAPI()  # no lifespan()

        @app.put(
            "/orders/{order_id}", dependencies=[fastapi.Depends(contrib.locked("o:{order_id}"))]
        )
        async def update(order_id: int) -> dict[str, int]:
            raise AssertionError("ran without a lock")

        with TestClient(app) as client, pytest.raises(RuntimeError, match="lifespan"):
            client.put("/orders/7")
        assert "RuntimeError" in _raises_section(contrib.locked.__doc__)


def test_architecture_names_the_module_that_times_round_deadlines() -> None:
    """docs/architecture.md, "two clocks": `_quorum` holds no timer; the rounds'
    deadlines are `_deadline.Waiting`'s (``loop.call_at``), and `_deadline.wait_until`
    times the waits for some replies (a semaphore's slot, the subscriptions): the
    paragraph on the loop's clock names `_deadline`."""
    quorum = (ROOT / "src/asyncredlock/_quorum.py").read_text(encoding="utf-8")
    deadline = (ROOT / "src/asyncredlock/_deadline.py").read_text(encoding="utf-8")
    assert "loop.call_at" in deadline
    assert "call_at" not in quorum
    assert ".time()" not in quorum
    page = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    clocks = re.search(r"The event loop's clock .*?\n\n", page, re.S)
    assert clocks is not None
    assert "`_deadline`" in clocks.group(0), clocks.group(0)
