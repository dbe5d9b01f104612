"""Bad arguments to the testing package's and the framework helpers' entry points get a
clear, typed error naming the argument, before anything is made (from the input
validation review, branch ``rinput``: tests/integration/test_review_input.py)."""

from __future__ import annotations

import pytest
from aiohttp import web

from asyncredlock.contrib.aiohttp import setup
from asyncredlock.testing import ServerGroup

from .conftest import Masters

pytestmark = pytest.mark.anyio


async def _no_keys(masters: Masters) -> None:
    """Nothing written, not even a fence counter (``masters.keys()`` hides those)."""
    for client in masters.clients:
        assert await client.keys("*") == []


class TestContribSetup:
    async def test_aiohttp_setup_refuses_an_app_that_is_no_application(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """``setup("app", masters)`` raised ``AttributeError: 'str' object has no
        attribute 'cleanup_ctx'``, not the ``TypeError`` the project uses for a wrong
        type (``setup`` checked ``errors``' type, not ``app``'s)."""
        with pytest.raises(TypeError, match="app"):
            setup("app", servers.urls)  # type: ignore[arg-type]
        await _no_keys(masters)

    async def test_aiohttp_setup_still_works_for_an_application(self, servers: ServerGroup) -> None:
        """Control: a real ``web.Application`` is accepted."""
        app = web.Application()
        setup(app, servers.urls)
        assert len(app.middlewares) == 1

    def test_aiohttp_setup_twice_on_one_app_is_refused(self, servers: ServerGroup) -> None:
        """A second ``setup()`` on one app was accepted silently: two cleanup contexts
        (two ``AsyncRedlock`` clients, the second one's in ``app[REDLOCK]``) and two
        middlewares answering the same errors. It is refused, and adds nothing."""
        app = web.Application()
        setup(app, servers.urls)
        added = (len(app.cleanup_ctx), len(app.on_response_prepare), len(app.middlewares))
        with pytest.raises(RuntimeError, match=r"setup\(\)"):
            setup(app, servers.urls)
        after = (len(app.cleanup_ctx), len(app.on_response_prepare), len(app.middlewares))
        assert after == added == (1, 1, 1)
