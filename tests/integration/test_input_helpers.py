"""Bad arguments to the testing package's and the framework helpers' entry points get a
clear, typed error naming the argument, before anything is made (from the input
validation review, branch ``rinput``: tests/integration/test_review_input.py)."""

from __future__ import annotations

import anyio
import pytest
from aiohttp import web

from asyncredlock import AsyncRedlock
from asyncredlock.contrib.aiohttp import setup
from asyncredlock.testing import FaultProxy, ServerGroup, Waits

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


class TestServerGroupArguments:
    def test_a_server_count_of_true_is_refused(self) -> None:
        """``ServerGroup(True)`` made one server (``ServerProcess`` refuses a bool
        port; the group's count gets the same treatment)."""
        with pytest.raises(TypeError, match=r"\bn\b"):
            ServerGroup(True)

    @pytest.mark.parametrize("n", [1.5, 3.0, "3"])
    def test_a_server_count_that_is_no_int_names_the_argument(self, n: object) -> None:
        """``ServerGroup(1.5)``: ``'float' object cannot be interpreted as an
        integer`` from ``range()``, which does not say which argument."""
        with pytest.raises(TypeError, match=r"\bn\b"):
            ServerGroup(n)  # type: ignore[arg-type]

    @pytest.mark.parametrize("n", [0, -1])
    def test_fewer_than_one_server_is_still_a_value_error(self, n: int) -> None:
        with pytest.raises(ValueError, match=r"\bn\b"):
            ServerGroup(n)


class TestWaitsReach:
    @pytest.mark.parametrize(
        ("count", "error"),
        [(float("nan"), TypeError), (-1, ValueError), (True, TypeError), (1.5, TypeError)],
    )
    @pytest.mark.parametrize("argument", ["waiting", "queued"])
    async def test_reach_takes_a_count(
        self, servers: ServerGroup, argument: str, count: object, error: type[Exception]
    ) -> None:
        """``reach(float("nan"))`` returned at once (every comparison with NaN is
        false), so a test that meant to wait for a parked waiter went on without it;
        so did ``reach(-1)``. ``reach(True)`` and ``reach(1.5)`` were taken as counts
        (they waited). A count that is no int is a ``TypeError``, a negative one a
        ``ValueError``, each naming the argument."""
        async with AsyncRedlock(servers.urls) as redlock:
            with Waits(redlock) as waits, anyio.fail_after(5), pytest.raises(error, match=argument):
                await waits.reach(**{argument: count})

    async def test_reach_zero_returns_at_once(self, servers: ServerGroup) -> None:
        """Control: zero (the default) is a count, already reached."""
        async with AsyncRedlock(servers.urls) as redlock:
            with Waits(redlock) as waits, anyio.fail_after(5):
                await waits.reach(0, queued=0)
