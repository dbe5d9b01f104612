"""Settings validation: every bad value is refused at construction, naming the parameter."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock._config import DEFAULTS, LockOptions, Settings, check_name, check_seconds

NOT_A_NUMBER = [True, False, "10", None, b"1", [1.0]]


@contextmanager
def refusing_ports(n: int) -> Iterator[list[int]]:
    """Ports bound but not listening: connections are refused, and no one else takes them."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        yield [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def nowhere(n: int = 3) -> list[str]:
    """URLs that no construction-time I/O could survive: nothing there can answer."""
    return [f"redis://127.0.0.1:{port}" for port in range(1, n + 1)]


class TestCheckSeconds:
    @pytest.mark.parametrize("value", [3, 2.5, 1e-6])
    def test_positive_numbers_become_floats(self, value: float) -> None:
        seconds = check_seconds("ttl", value)
        assert seconds == value
        assert type(seconds) is float

    @pytest.mark.parametrize("value", NOT_A_NUMBER)
    def test_non_numbers_and_bools_are_type_errors(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^ttl must be a number of seconds, not "):
            check_seconds("ttl", value)

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
    def test_nan_and_infinity_are_refused_by_default(self, value: float) -> None:
        with pytest.raises(ValueError, match=r"^ttl must be a finite number"):
            check_seconds("ttl", value)

    @pytest.mark.parametrize("value", [0, 0.0, -0.0, -1, -1e-9])
    def test_zero_and_negative_are_refused_by_default(self, value: float) -> None:
        with pytest.raises(ValueError, match=r"^ttl must be > 0 seconds"):
            check_seconds("ttl", value)

    def test_zero_allowed_when_asked(self) -> None:
        assert check_seconds("timeout", 0, allow_zero=True) == 0.0
        # -0.0 is zero, returned as 0.0: it would show as "-0s" in a repr
        assert math.copysign(1.0, check_seconds("patience", -0.0, allow_zero=True)) == 1.0
        with pytest.raises(ValueError, match=r"^timeout must be >= 0 seconds"):
            check_seconds("timeout", -0.5, allow_zero=True)

    def test_a_billion_seconds_is_the_longest(self) -> None:
        assert check_seconds("ttl", 1e9) == 1e9
        with pytest.raises(ValueError, match=r"^ttl must be at most 1e\+09 seconds"):
            check_seconds("ttl", 1e9 + 1)
        with pytest.raises(ValueError, match=r"^ttl must be at most"):
            check_seconds("ttl", 10**400, allow_inf=True)  # too large for a float

    def test_positive_infinity_allowed_when_asked(self) -> None:
        assert check_seconds("timeout", math.inf, allow_inf=True) == math.inf
        for refused in (-math.inf, math.nan):
            with pytest.raises(ValueError, match=r"^timeout must be a finite number"):
                check_seconds("timeout", refused, allow_inf=True)


class TestCheckName:
    def test_a_non_empty_str_is_returned_as_is(self) -> None:
        assert check_name("orders:42") == "orders:42"

    @pytest.mark.parametrize("name", [b"orders", 42, None, ["a"]])
    def test_non_str_is_a_type_error(self, name: object) -> None:
        with pytest.raises(TypeError, match="lock name must be a str"):
            check_name(name)

    def test_empty_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match="lock name must not be empty"):
            check_name("")


class TestSettings:
    def test_defaults(self) -> None:
        assert Settings() == DEFAULTS
        assert (DEFAULTS.ttl, DEFAULTS.timeout, DEFAULTS.node_timeout) == (10.0, 10.0, 0.1)
        assert (DEFAULTS.retry_delay, DEFAULTS.drift_factor) == (0.2, 0.01)
        assert (DEFAULTS.max_connections, DEFAULTS.prefix, DEFAULTS.auto_extend) == (
            None,  # deprecated: one pipelined connection per master
            "",
            True,
        )
        assert (DEFAULTS.fencing, DEFAULTS.busy_poll) == (True, 0.0001)
        assert Settings().identity == f"{socket.gethostname()}:{os.getpid()}"

    def test_asyncredlock_takes_every_default_from_settings(self) -> None:
        parameters = inspect.signature(AsyncRedlock).parameters
        settings = [field.name for field in dataclasses.fields(Settings)]
        assert set(settings) <= set(parameters)
        for name in settings:
            if name != "identity":  # None: the process's own, when the AsyncRedlock is made
                assert parameters[name].default == getattr(DEFAULTS, name), name
        assert parameters["identity"].default is None

    def test_a_long_host_name_is_cut_to_fit_the_default_identity(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(socket, "gethostname", lambda: "h" * 255)
        identity = AsyncRedlock(nowhere()).identity
        assert len(identity) == 128
        assert identity.endswith(f":{os.getpid()}")

    def test_identity_is_the_process_of_the_maker_unless_given(self) -> None:
        assert AsyncRedlock(nowhere()).identity == f"{socket.gethostname()}:{os.getpid()}"
        assert AsyncRedlock(nowhere(), identity="web-3").identity == "web-3"

    def test_frozen(self) -> None:
        settings = Settings()
        with pytest.raises(AttributeError):
            settings.ttl = 1.0

    @pytest.mark.parametrize(
        ("ttl", "drift_factor", "expected"),
        [(10.0, 0.01, 0.102), (1.0, 0.0, 0.002), (30.0, 0.1, 3.002), (0.5, 0.25, 0.127)],
    )
    def test_drift_is_ttl_times_factor_plus_2_ms(
        self, ttl: float, drift_factor: float, expected: float
    ) -> None:
        settings = Settings(drift_factor=drift_factor)
        assert settings.drift(ttl) == pytest.approx(expected)

    @pytest.mark.parametrize("param", ["ttl", "node_timeout", "socket_timeout"])
    @pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf])
    def test_positive_finite_durations(self, param: str, value: float) -> None:
        with pytest.raises(ValueError, match=rf"^{param} must be"):
            Settings(**{param: value})

    @pytest.mark.parametrize(
        "param", ["ttl", "timeout", "node_timeout", "retry_delay", "socket_timeout"]
    )
    @pytest.mark.parametrize("value", NOT_A_NUMBER)
    def test_durations_must_be_numbers(self, param: str, value: object) -> None:
        with pytest.raises(TypeError, match=rf"^{param} must be a number of seconds"):
            Settings(**{param: value})

    @pytest.mark.parametrize("value", [-1, -1e-9, math.nan, -math.inf])
    def test_timeout_negative_or_nan_refused(self, value: float) -> None:
        with pytest.raises(ValueError, match=r"^timeout must be"):
            Settings(timeout=value)

    @pytest.mark.parametrize("value", [0, 0.0, 2.5, math.inf])
    def test_timeout_zero_and_infinity_accepted(self, value: float) -> None:
        assert Settings(timeout=value).timeout == value

    def test_retry_delay_zero_accepted_negative_refused(self) -> None:
        assert Settings(retry_delay=0).retry_delay == 0
        with pytest.raises(ValueError, match=r"^retry_delay must be >= 0"):
            Settings(retry_delay=-0.1)

    @pytest.mark.parametrize("value", [0, 0.0, 0.01, 0.499])
    def test_drift_factor_in_range_accepted(self, value: float) -> None:
        assert Settings(drift_factor=value).drift_factor == value

    @pytest.mark.parametrize("name", ["ttl", "max_hold"])
    @pytest.mark.parametrize("value", [0.001, 0.0099])
    def test_a_ttl_the_drift_allowance_would_use_up_is_refused(
        self, name: str, value: float
    ) -> None:
        """Validity is the TTL less 2 ms and ``drift_factor`` of it: a TTL of about 2 ms
        leaves none (never acquired, every extension a loss)."""
        with pytest.raises(ValueError, match=rf"^{name} must be at least 0\.01 s"):
            Settings(**{name: value})
        assert Settings(**{name: 0.01}).drift(0.01) < 0.01  # the shortest: some validity

    @pytest.mark.parametrize("value", [-0.01, 0.5, 1, math.nan, math.inf])
    def test_drift_factor_out_of_range_refused(self, value: float) -> None:
        with pytest.raises(ValueError, match=r"^drift_factor must be in \[0, 0\.5\)"):
            Settings(drift_factor=value)

    @pytest.mark.parametrize("value", [True, "0.01", None])
    def test_drift_factor_must_be_a_number(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^drift_factor must be a number"):
            Settings(drift_factor=value)

    @pytest.mark.parametrize("value", [0, -5])
    def test_max_connections_below_one_refused(self, value: int) -> None:
        with pytest.raises(ValueError, match=r"^max_connections must be >= 1"):
            Settings(max_connections=value)

    @pytest.mark.parametrize("value", [True, 1.0, "8"])
    def test_max_connections_must_be_an_int(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^max_connections must be an int"):
            Settings(max_connections=value)

    @pytest.mark.parametrize("value", [b"app:", None, 1])
    def test_prefix_must_be_a_str(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^prefix must be a str"):
            Settings(prefix=value)

    @pytest.mark.parametrize("value", [1, 0, "yes", None])
    def test_auto_extend_must_be_a_bool(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^auto_extend must be a bool"):
            Settings(auto_extend=value)

    @pytest.mark.parametrize("value", [1, 0, "yes", None])
    def test_fencing_must_be_a_bool(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^fencing must be a bool"):
            Settings(fencing=value)

    def test_clock_must_be_callable(self) -> None:
        with pytest.raises(TypeError, match=r"^clock must be a callable"):
            Settings(clock=1.0)


class TestAsyncRedlockSettings:
    """The constructor validates every setting before it builds anything."""

    @pytest.mark.parametrize(
        ("kwargs", "error", "pattern"),
        [
            ({"ttl": 0}, ValueError, r"^ttl must be > 0"),
            ({"ttl": -2.0}, ValueError, r"^ttl must be > 0"),
            ({"ttl": math.nan}, ValueError, r"^ttl must be a finite"),
            ({"ttl": math.inf}, ValueError, r"^ttl must be a finite"),
            ({"ttl": True}, TypeError, r"^ttl must be a number"),
            ({"ttl": "10"}, TypeError, r"^ttl must be a number"),
            ({"timeout": -1}, ValueError, r"^timeout must be >= 0"),
            ({"timeout": math.nan}, ValueError, r"^timeout must be a finite"),
            ({"timeout": "1"}, TypeError, r"^timeout must be a number"),
            ({"node_timeout": 0}, ValueError, r"^node_timeout must be > 0"),
            ({"retry_delay": -1}, ValueError, r"^retry_delay must be >= 0"),
            ({"socket_timeout": math.inf}, ValueError, r"^socket_timeout must be a finite"),
            ({"drift_factor": 0.5}, ValueError, r"^drift_factor must be in"),
            ({"drift_factor": -0.1}, ValueError, r"^drift_factor must be in"),
            ({"drift_factor": "0.01"}, TypeError, r"^drift_factor must be a number"),
            ({"prefix": b"app:"}, TypeError, r"^prefix must be a str"),
            ({"prefix": "app\udfff:"}, ValueError, r"^prefix cannot be encoded as UTF-8"),
            ({"prefix": "app\0"}, ValueError, r"^prefix must not contain a NUL character"),
            ({"ttl": 1e20}, ValueError, r"^ttl must be at most 1e\+09 seconds"),
            ({"node_timeout": 2e9}, ValueError, r"^node_timeout must be at most"),
            ({"retry_delay": 1e10}, ValueError, r"^retry_delay must be at most"),
            ({"socket_timeout": 10**30}, ValueError, r"^socket_timeout must be at most"),
            ({"busy_poll": -1e-6}, ValueError, r"^busy_poll must be >= 0 seconds"),
            ({"busy_poll": math.nan}, ValueError, r"^busy_poll must be a finite"),
            ({"busy_poll": math.inf}, ValueError, r"^busy_poll must be a finite"),
            ({"busy_poll": 0.0011}, ValueError, r"^busy_poll must be at most 0\.001 seconds"),
            ({"busy_poll": True}, TypeError, r"^busy_poll must be a number of seconds"),
            ({"busy_poll": "1e-4"}, TypeError, r"^busy_poll must be a number of seconds"),
            ({"auto_extend": 1}, TypeError, r"^auto_extend must be a bool"),
            ({"fencing": "no"}, TypeError, r"^fencing must be a bool"),
            ({"clock": "monotonic"}, TypeError, r"^clock must be a callable"),
            ({"identity": b"web-3"}, TypeError, r"^identity must be a str"),
            ({"identity": ""}, ValueError, r"^identity must have 1 to 128 characters"),
            ({"identity": "w" * 129}, ValueError, r"^identity must have 1 to 128 characters"),
            ({"identity": "web 3"}, ValueError, r"^identity must have no whitespace"),
            ({"identity": "web\x003"}, ValueError, r"^identity must have no whitespace"),
            ({"identity": "web-\ud800"}, ValueError, r"^identity cannot be encoded"),
        ],
    )
    def test_bad_setting_refused_naming_it(
        self, kwargs: dict[str, Any], error: type[Exception], pattern: str
    ) -> None:
        with pytest.raises(error, match=pattern):
            AsyncRedlock(nowhere(), **kwargs)

    def test_max_connections_is_deprecated_and_ignored(self) -> None:
        with pytest.warns(DeprecationWarning, match=r"^max_connections is deprecated and ignored"):
            redlock = AsyncRedlock(nowhere(), max_connections=64)
        assert redlock.quorum == 2

    @pytest.mark.parametrize(
        ("value", "error", "pattern"),
        [
            (0, ValueError, r"^max_connections must be >= 1"),
            (True, TypeError, r"^max_connections must be an int"),
        ],
    )
    def test_a_bad_max_connections_is_still_refused(
        self, value: object, error: type[Exception], pattern: str
    ) -> None:
        with (
            pytest.warns(DeprecationWarning, match="max_connections"),
            pytest.raises(error, match=pattern),
        ):
            AsyncRedlock(nowhere(), max_connections=value)  # type: ignore[arg-type]

    @pytest.mark.parametrize("timeout", [0, math.inf])
    def test_timeout_zero_and_infinity_accepted(self, timeout: float) -> None:
        redlock = AsyncRedlock(nowhere(), timeout=timeout)
        assert redlock.lock("x").timeout == timeout

    def test_settings_are_checked_before_the_masters(self) -> None:
        with pytest.raises(ValueError, match=r"^ttl"):
            AsyncRedlock(["http://not-a-master"], ttl=0)


class TestLockSettings:
    """``redlock.lock(...)`` validates its overrides the same way, at once."""

    @pytest.mark.parametrize(
        ("kwargs", "error", "pattern"),
        [
            ({"ttl": 0}, ValueError, r"^ttl must be > 0"),
            ({"ttl": -1}, ValueError, r"^ttl must be > 0"),
            ({"ttl": math.nan}, ValueError, r"^ttl must be a finite"),
            ({"ttl": math.inf}, ValueError, r"^ttl must be a finite"),
            ({"ttl": False}, TypeError, r"^ttl must be a number"),
            ({"ttl": "5"}, TypeError, r"^ttl must be a number"),
            ({"timeout": -0.001}, ValueError, r"^timeout must be >= 0"),
            ({"timeout": math.nan}, ValueError, r"^timeout must be a finite"),
            ({"timeout": -math.inf}, ValueError, r"^timeout must be a finite"),
            ({"timeout": True}, TypeError, r"^timeout must be a number"),
            ({"auto_extend": 0}, TypeError, r"^auto_extend must be a bool"),
            ({"auto_extend": "no"}, TypeError, r"^auto_extend must be a bool"),
            ({"fencing": 1}, TypeError, r"^fencing must be a bool"),
            ({"fencing": None, "auto_extend": 1}, TypeError, r"^auto_extend must be a bool"),
        ],
    )
    def test_bad_override_refused_naming_it(
        self, kwargs: dict[str, Any], error: type[Exception], pattern: str
    ) -> None:
        redlock = AsyncRedlock(nowhere())
        with pytest.raises(error, match=pattern):
            redlock.lock("x", **kwargs)

    def test_overrides_and_defaults(self) -> None:
        redlock = AsyncRedlock(nowhere(), ttl=7, timeout=3, auto_extend=False, prefix="app:")
        default = redlock.lock("orders:42")
        assert (default.ttl, default.timeout, default.auto_extend) == (7.0, 3.0, False)
        assert (default.name, default.key) == ("orders:42", "app:orders:42")
        custom = redlock.lock("orders:42", ttl=2, timeout=0, auto_extend=True)
        assert (custom.ttl, custom.timeout, custom.auto_extend) == (2.0, 0.0, True)
        assert default.fencing is True
        assert redlock.lock("orders:42", fencing=False).fencing is False
        assert AsyncRedlock(nowhere(), fencing=False).lock("x").fencing is False

    def test_no_prefix_by_default_the_key_is_the_name(self) -> None:
        assert AsyncRedlock(nowhere()).lock("orders:42").key == "orders:42"


class TestConstructionDoesNoIO:
    def test_construction_needs_no_event_loop_and_no_server(self) -> None:
        redlock = AsyncRedlock(nowhere(5))
        assert redlock.masters == tuple(nowhere(5))
        assert redlock.quorum == 3
        stats = redlock.statistics()
        assert (stats.attempts, stats.in_flight, stats.background_tasks) == (0, 0, 0)

    @pytest.mark.anyio
    async def test_errors_only_when_used(self) -> None:
        with refusing_ports(3) as ports:
            redlock = AsyncRedlock([f"redis://127.0.0.1:{port}" for port in ports])
            assert redlock.statistics().attempts == 0
            with anyio.fail_after(10):
                with pytest.raises(QuorumUnavailableError):
                    await redlock.lock("x", timeout=0).acquire()
                await redlock.aclose()
        assert redlock.statistics().attempts == 1


class TestLockOptions:
    """What lock() takes besides the name, checked before any lock is made."""

    def test_none_takes_the_setting(self) -> None:
        options = LockOptions(ttl=5, timeout=0)
        assert options.ttl == 5.0
        assert isinstance(options.ttl, float)
        assert options.spec_values(DEFAULTS) == (5.0, 0.0, True, True, math.inf)
        assert LockOptions(auto_extend=False, fencing=False).spec_values(DEFAULTS) == (
            10.0,
            10.0,
            False,
            False,
            math.inf,
        )
        assert LockOptions(max_hold=60).spec_values(DEFAULTS)[4] == 60.0

    @pytest.mark.parametrize(
        ("kwargs", "error", "pattern"),
        [
            ({"ttl": 0}, ValueError, r"^ttl must be > 0"),
            ({"timeout": -1}, ValueError, r"^timeout must be >= 0"),
            ({"auto_extend": 1}, TypeError, r"^auto_extend must be a bool"),
            ({"fencing": "yes"}, TypeError, r"^fencing must be a bool"),
            ({"fair": None}, TypeError, r"^fair must be a bool"),
            ({"max_hold": 0}, ValueError, r"^max_hold must be > 0"),
            ({"max_hold": "1"}, TypeError, r"^max_hold must be a number"),
        ],
    )
    def test_bad_values_refused(
        self, kwargs: dict[str, Any], error: type[Exception], pattern: str
    ) -> None:
        with pytest.raises(error, match=pattern):
            LockOptions(**kwargs)
