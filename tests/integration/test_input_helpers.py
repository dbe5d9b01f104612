"""Bad arguments to the testing package's and the framework helpers' entry points get a
clear, typed error naming the argument, before anything is made (from the input
validation review, branch ``rinput``: tests/integration/test_review_input.py)."""

from __future__ import annotations

import pytest
from aiohttp import web

from asyncredlock.contrib.aiohttp import setup
from asyncredlock.testing import FaultProxy, ServerGroup

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


class TestFaultProxyArguments:
    """``FaultProxy``'s arguments and fault switches were not type-checked, unlike
    ``ServerProcess(port=...)`` (``TypeError: port must be an int, not bool``)."""

    @pytest.mark.parametrize("port", [True, 1.5, "6379"])
    def test_a_target_port_that_is_no_int_is_a_type_error(self, port: object) -> None:
        """``True`` and ``1.5`` were accepted; ``"6379"`` was an unnamed TypeError
        (``'<=' not supported between instances of 'int' and 'str'``)."""
        with pytest.raises(TypeError, match="target_port"):
            FaultProxy("127.0.0.1", port)  # type: ignore[arg-type]

    @pytest.mark.parametrize("port", [False, 2.0, "0"])
    def test_a_listen_port_that_is_no_int_is_a_type_error(self, port: object) -> None:
        with pytest.raises(TypeError, match="listen_port"):
            FaultProxy("127.0.0.1", 6379, listen_port=port)  # type: ignore[arg-type]

    @pytest.mark.parametrize("port", [-1, 65536])
    def test_a_port_out_of_range_is_still_a_value_error(self, port: int) -> None:
        with pytest.raises(ValueError, match="target_port"):
            FaultProxy("127.0.0.1", port)

    @pytest.mark.parametrize("argument", ["target_host", "listen_host"])
    def test_a_host_that_is_no_str_is_a_type_error(self, argument: str) -> None:
        """``FaultProxy(None, port)`` was accepted (an error at the first connection)."""
        hosts = {"target_host": "127.0.0.1", "listen_host": "127.0.0.1", argument: b"::1"}
        with pytest.raises(TypeError, match=argument):
            FaultProxy(hosts["target_host"], 6379, listen_host=hosts["listen_host"])

    def test_a_delay_of_true_is_refused(self, servers: ServerGroup) -> None:
        """``proxy.delay = True`` was taken for 1 second."""
        proxy = FaultProxy("127.0.0.1", servers[0].port)
        with pytest.raises(TypeError, match="delay"):
            proxy.delay = True
        assert proxy.delay == 0.0

    def test_a_delay_too_large_for_a_float_is_a_value_error(self, servers: ServerGroup) -> None:
        """``proxy.delay = 10**400`` was an ``OverflowError`` from ``math.isfinite``."""
        proxy = FaultProxy("127.0.0.1", servers[0].port)
        with pytest.raises(ValueError, match="delay"):
            proxy.delay = 10**400
        assert proxy.delay == 0.0

    @pytest.mark.parametrize("switch", ["blackhole", "refuse"])
    def test_a_fault_switch_takes_only_a_bool(self, servers: ServerGroup, switch: str) -> None:
        """``proxy.blackhole = "no"`` turned the blackhole ON (a truthy str)."""
        proxy = FaultProxy("127.0.0.1", servers[0].port)
        with pytest.raises(TypeError, match=switch):
            setattr(proxy, switch, "no")
        assert getattr(proxy, switch) is False
        setattr(proxy, switch, True)  # a bool still switches it
        assert getattr(proxy, switch) is True
