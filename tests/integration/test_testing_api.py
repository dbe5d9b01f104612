"""The public testing helpers (asyncredlock.testing) used as a user's test suite uses
them: client-side faults nested or given a client twice, ``Waits``, constructor
arguments, working directories, and a sentinel over password-protected servers."""

from __future__ import annotations

import asyncio
import pathlib
import time

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock.testing import (
    SentinelProcess,
    ServerCluster,
    ServerGroup,
    ServerProcess,
    Waits,
    hold_calls,
    whole_retry_delay,
)
from asyncredlock.testing._support import registry, resp_call

pytestmark = pytest.mark.anyio


async def test_waits_given_one_client_twice_counts_each_wait_once(servers: ServerGroup) -> None:
    """`Waits(*clients)` with a client listed twice (a list built by a helper) counts
    each wait once: one queued task reads ``queued == 1``."""
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await redlock.lock("testing-api:waits").acquire()
        with Waits(redlock, redlock) as waits, anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def take() -> None:
                    async with redlock.lock("testing-api:waits", timeout=10):
                        pass

                tg.start_soon(take)
                await waits.reach(queued=1)
                queued = waits.queued
                await lease.release()
        assert queued == 1, f"one task queued, Waits counted {queued}"


async def test_whole_retry_delay_nested_or_given_a_client_twice(servers: ServerGroup) -> None:
    """`whole_retry_delay(redlock, redlock)`, or one block nested in another for the
    same client, ends cleanly and leaves the client's own retry pause behind."""
    async with AsyncRedlock(servers.urls) as redlock:
        core = redlock._core
        with whole_retry_delay(redlock, redlock):
            pass
        assert "retry_pause" not in vars(core)
        with whole_retry_delay(redlock):
            outer = vars(core)["retry_pause"]
            with whole_retry_delay(redlock):
                pass
            assert vars(core)["retry_pause"] is outer, "the inner block undid the outer one"
        assert "retry_pause" not in vars(core)


async def test_hold_calls_of_two_scripts_at_once(servers: ServerGroup) -> None:
    """Holding two scripts at once (``hold_calls(r, "acquire")`` with
    ``hold_calls(r, "release")`` inside) holds both: the acquire is held by the
    outer block, and both blocks end cleanly."""
    async with AsyncRedlock(servers.urls) as redlock:
        with (
            anyio.fail_after(10),
            hold_calls(redlock, "acquire") as acquires,
            hold_calls(redlock, "release"),
        ):
            task = asyncio.ensure_future(redlock.lock("testing-api:held").acquire())
            reached = asyncio.ensure_future(acquires.reached.wait())
            await asyncio.wait({task, reached}, return_when=asyncio.FIRST_COMPLETED)
            held, done = acquires.held, task.done()
            acquires.let_go()
            lease = await task
            reached.cancel()
        await lease.release()
        assert (held >= 1, done) == (True, False), "the outer hold let the acquire through"
        assert all("call" not in vars(node) for node in redlock._core.nodes)


def test_a_relative_workdir_is_usable(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``workdir="data"`` (relative to the current directory, as a user may write it
    in a test, or give `make_servers`) starts, for a server, a group and a sentinel,
    each with its files in that directory."""
    monkeypatch.chdir(tmp_path)
    with ServerProcess(workdir="data") as server:
        assert server.ping()
        assert server.log_path == tmp_path / "data" / "server.log"
        with SentinelProcess({"svc": server}, workdir="sentinel") as sentinel:
            assert sentinel.master_address("svc") == (server.host, server.port)
        assert (tmp_path / "sentinel" / "sentinel.conf").exists()
    with ServerGroup(2, workdir="group") as group:
        assert all(server.ping() for server in group)
        assert group[1].workdir == tmp_path / "group" / "node-1"


def test_a_sentinel_watches_a_password_protected_master() -> None:
    """A `SentinelProcess` over a `ServerProcess(password=...)` authenticates to it:
    it does not flag it down, and learns its replica (a failover can happen)."""
    password = 's3 "cr\\et'  # quoted in the sentinel's configuration
    master = ServerProcess(password=password)
    with master:
        replica_args = ("--replicaof", master.host, str(master.port), "--masterauth", password)
        with (
            ServerProcess(extra_args=replica_args, password=password),
            SentinelProcess({"svc": master}, down_after=0.5) as sentinel,
        ):
            deadline = time.monotonic() + 8
            replicas: object = []
            flags = b""
            while time.monotonic() < deadline:
                replicas = resp_call(sentinel.port, "SENTINEL", "replicas", "svc", timeout=1)
                reply = resp_call(sentinel.port, "SENTINEL", "master", "svc", timeout=1)
                assert isinstance(reply, list)
                flags = reply[reply.index(b"flags") + 1]
                if replicas:
                    break
                time.sleep(0.1)  # polling the sentinel's view; no event to await
            assert b"s_down" not in flags, f"the sentinel flags its master {flags!r}"
            assert replicas, "the sentinel never learned the master's replica"


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"extra_args": "--maxmemory 1mb"}, id="extra_args-a-string"),
        pytest.param({"port": 6379.5}, id="port-a-float"),
        pytest.param({"appendonly": "no"}, id="appendonly-a-string"),
    ],
)
def test_a_bad_argument_is_a_typed_error_before_any_process(bad: dict[str, object]) -> None:
    """A wrong type is refused by the constructor with `TypeError`, before any
    process is spawned (a string ``extra_args`` was split into one argument per
    character, a float port passed to the server, and ``appendonly="no"`` started a
    server *with* an AOF)."""
    before = set(registry.processes)
    server = None
    try:
        with pytest.raises(TypeError):
            server = ServerProcess(**bad)  # type: ignore[arg-type]
        assert set(registry.processes) == before
    finally:
        if server is not None:
            server.close()


def test_a_bad_argument_is_refused_through_groups_clusters_and_restarts() -> None:
    """`ServerGroup`, `ServerCluster` and `SentinelProcess` pass the same checks on,
    and `restart(appendonly="no")` is refused before the server is stopped."""
    before = set(registry.processes)
    with pytest.raises(TypeError):
        ServerGroup(2, appendonly="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ServerCluster(1, extra_args="--maxmemory 1mb")
    with ServerProcess() as server:
        with pytest.raises(TypeError):
            SentinelProcess({"svc": server}, port=26379.5)  # type: ignore[arg-type]
        pid = server.pid
        with pytest.raises(TypeError):
            server.restart(appendonly="no")  # type: ignore[arg-type]
        assert server.pid == pid, "the refused restart stopped the server"
        assert not server.appendonly
    assert set(registry.processes) == before
