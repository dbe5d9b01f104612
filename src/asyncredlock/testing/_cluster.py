"""`ServerCluster`: a real Redis Cluster of `ServerProcess` nodes, formed without Docker
or ``valkey-cli``, that a test can reshard and fail over."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode

from .._config import check_seconds
from ._checks import check_count, check_period, check_server_args, check_start_args, check_str
from ._group import ServerGroup
from ._servers import ServerProcess
from ._slots import (
    NODE_ARGS,
    SLOTS,
    ClusterNodeProcess,
    View,
    begin_move,
    call,
    end_move,
    fields,
    knows,
    node_id,
    not_ready,
    view,
    wait_until,
)
from ._support import (
    HOST,
    STOP_GRACE,
    RespError,
    ServerStartError,
    find_server_binary,
)

__all__ = ["ServerCluster"]

#: Checks the slot map the nodes agree on: why it will not do yet, or None.
_Shape = Callable[[View], str | None]


class ServerCluster:
    """A real Redis Cluster on 127.0.0.1, from the same server binary as
    `ServerProcess`: ``shards`` primaries splitting the 16384 slots evenly, in
    order, each with ``replicas`` replicas.

    `start` forms it the way ``valkey-cli --cluster create`` would, without Docker:
    cluster mode on every node (config file ``nodes.conf`` in the node's workdir,
    bus on a port of its own), ``CLUSTER ADDSLOTSRANGE`` on each primary, ``CLUSTER
    MEET`` from the first node, ``CLUSTER REPLICATE`` on each replica; it returns
    once every node says ``cluster_state:ok``, all see the same slot map, and every
    replica is linked to its primary.

    `nodes` lists primaries first (``nodes[i]`` is shard ``i``'s primary at the
    start, for ``i < shards``), then the replicas, shard by shard. Each is a
    `ServerProcess` a test can kill, pause or restart; a node restarted in its
    workdir rejoins the cluster as it left it.

    Args:
        shards: Number of primaries, each serving a range of slots (at least 1).
        replicas: Replicas of each primary.
        node_timeout: ``--cluster-node-timeout`` in seconds: how long a node may
            be unreachable before the others count it failing (and a replica of a
            failed primary takes its place). Short for a failover test; each node
            still waits about two seconds after it starts before it serves.
        binary: Server executable shared by all; `find_server_binary()` when None.
        workdir: Parent directory; node ``i`` uses ``workdir/node-i``. Private
            temporary directories when None.
        extra_args: More command-line arguments for every node.

    Raises:
        ValueError: ``shards`` is below 1, ``replicas`` below 0, or
            ``node_timeout`` not above 0 (NaN included) or infinite.
        TypeError: ``shards`` or ``replicas`` is not an int (a bool is no count),
            ``node_timeout`` not an int or a float (a bool is no 1 s), or
            ``extra_args`` is a str (each argument must be an item of its own).
        ServerBinaryNotFoundError: ``binary`` is None and no server binary is found.
    """

    def __init__(
        self,
        shards: int = 3,
        *,
        replicas: int = 0,
        node_timeout: float = 5.0,
        binary: str | None = None,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if check_count("shards", shards, minimum=None) < 1:
            raise ValueError(f"a cluster needs at least one shard, got shards={shards}")
        if check_count("replicas", replicas, minimum=None) < 0:
            raise ValueError(f"replicas must be 0 or more, got {replicas}")
        check_period("node_timeout", node_timeout)  # True is no 1 s
        check_server_args(extra_args=extra_args)  # not spread per character below
        binary = binary or find_server_binary()
        timeout_ms = str(max(1, round(node_timeout * 1000)))
        args = (*NODE_ARGS, "--cluster-node-timeout", timeout_ms, *extra_args)
        self._shards, self._replicas, self._node_timeout = shards, replicas, node_timeout
        self._nodes = tuple(
            ClusterNodeProcess(
                binary=binary,
                workdir=None if workdir is None else Path(workdir) / f"node-{i}",
                extra_args=args,
            )
            for i in range(shards * (1 + replicas))
        )
        self._formed = False

    def __repr__(self) -> str:
        ports = ",".join(str(node.port) for node in self._nodes)
        return f"<ServerCluster shards={self._shards} replicas={self._replicas} ports={ports}>"

    @property
    def nodes(self) -> tuple[ServerProcess, ...]:
        """Every node: the primaries as started, then the replicas, shard by shard."""
        return self._nodes

    @property
    def shards(self) -> int:
        """How many primaries share the slots."""
        return self._shards

    @property
    def node_timeout(self) -> float:
        """``--cluster-node-timeout``, in seconds."""
        return self._node_timeout

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """A ``redis.asyncio.cluster.ClusterNode`` per running node, new at each
        call (a client keeps its startup nodes' connections: give each client its
        own list)."""
        return [ClusterNode(HOST, node.port) for node in self._nodes if node.running]

    def client(self, **options: Any) -> RedisCluster:
        """A new ``redis.asyncio.RedisCluster`` client of this cluster (yours to
        ``aclose()``), e.g. a master for `AsyncRedlock`.

        Args:
            options: More ``RedisCluster`` arguments (``socket_timeout``...).
        """
        return RedisCluster(startup_nodes=self.startup_nodes, **options)

    def start(self, timeout: float = 10.0) -> None:
        """Start every node that is not running, form the cluster the first time,
        and wait until it is ready (see the class). The nodes boot in parallel; on
        failure, those this call started are stopped again.

        Args:
            timeout: Seconds for each node to answer, and again for the cluster
                to form and for it to be ready.

        Raises:
            ServerStartError: A node did not come up, or the cluster did not
                become ready in time; the message says what was last seen.
            RuntimeError: `close()` was called (on the cluster or one of its nodes);
                nothing is started.
            TypeError, ValueError: `timeout` is no number of seconds above 0 (nothing
                is started).
        """
        check_start_args(timeout)
        if any(node._closed for node in self._nodes):
            raise RuntimeError(f"{self!r} is closed")
        pending = [node for node in self._nodes if not node.running]
        for node in pending:
            node._spawn()
        try:
            for node in pending:
                ServerGroup._finish_start(node, timeout)
            forming = not self._formed
            if forming:
                self._form(timeout)
            self._wait_ready(timeout, self._shape if forming else _any)
        except (OSError, RespError) as exc:  # TimeoutError too: the cluster never got ready
            self._stop(pending)
            raise ServerStartError(f"cluster {self!r} did not form: {exc}") from exc
        except BaseException:
            self._stop(pending)
            raise

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the running nodes (paused ones left out) all say
        ``cluster_state:ok``, see one slot map that covers every slot, and every
        running replica is linked to its primary: after a failover, a restart, a
        move.

        Args:
            timeout: Seconds to wait.

        Raises:
            TimeoutError: Not ready in time; the message says what was last seen.
            TypeError, ValueError: ``timeout`` is no number of seconds above 0, or
                infinite (no node is asked).
        """
        self._wait_ready(check_seconds("timeout", timeout), _any)

    def keyslot(self, key: str) -> int:
        """The slot of ``key``, as a running node computes it (``CLUSTER KEYSLOT``).

        Raises:
            TypeError: ``key`` is not a str (nothing is sent).
        """
        reply = call(self._live()[0].port, "CLUSTER", "KEYSLOT", check_str("key", key))
        if not isinstance(reply, int):
            raise TypeError(f"CLUSTER KEYSLOT answered {reply!r}")
        return reply

    def primary_for(self, slot: int) -> ServerProcess:
        """The node that serves ``slot`` now, as the running nodes see it.

        Args:
            slot: A slot, 0 to 16383.

        Raises:
            TypeError: ``slot`` is not an int (a bool is no slot).
            ValueError: ``slot`` is out of range.
            LookupError: No node serves it (the cluster is not ready).
        """
        if not 0 <= check_count("slot", slot, minimum=None) < SLOTS:
            raise ValueError(f"slot must be in 0..{SLOTS - 1}, got {slot}")
        port = view(self._live()[0].port).primary_for(slot)
        if port is None:
            raise LookupError(f"no node serves slot {slot}")
        return self._node_on(port)

    def replicas_of(self, primary: ServerProcess) -> list[ServerProcess]:
        """The nodes that replicate ``primary`` now, as the running nodes see it.

        Args:
            primary: One of `nodes`.
        """
        ports = view(self._live()[0].port).replicas_of(primary.port)
        return [self._node_on(port) for port in ports]

    def move_slot(self, slot: int, to: ServerProcess, timeout: float = 10.0) -> None:
        """Reshard: move ``slot`` and its keys to the primary ``to`` (`begin_move`,
        then `end_move`).

        Args:
            slot: The slot to move.
            to: The primary that gets it.
            timeout: Seconds for the nodes to agree afterwards.

        Raises:
            ValueError: ``to`` is not a primary of this cluster, or serves ``slot``.
            TimeoutError: The nodes did not agree in time.
            TypeError, ValueError: ``slot`` or ``timeout`` is refused as by `begin_move` or
                `end_move` (nothing is sent).
        """
        check_seconds("timeout", timeout)  # before begin_move moves any key
        self.begin_move(slot, to)
        self.end_move(slot, to, timeout)

    def begin_move(self, slot: int, to: ServerProcess) -> None:
        """First half of a move: ``CLUSTER SETSLOT IMPORTING`` on ``to``,
        ``MIGRATING`` on the slot's primary, then ``MIGRATE`` every key of the slot.
        The slot is left in migration: its primary answers ``ASK`` (to ``to``)
        for keys it no longer has, and a command on several keys of the slot that
        are not all in one place gets ``TRYAGAIN``.

        Args:
            slot: The slot to move.
            to: The primary that gets it.

        Raises:
            ValueError: ``to`` is not a primary of this cluster, or serves ``slot``.
            TypeError, ValueError: ``slot`` is refused as by `primary_for` (nothing is sent).
        """
        source = self._source(slot, to)
        begin_move(slot, source.port, to.port)

    def end_move(self, slot: int, to: ServerProcess, timeout: float = 10.0) -> None:
        """Second half of a move: ``CLUSTER SETSLOT NODE`` on ``to``, then on the
        slot's primary, then on the other primaries; wait until all agree.

        Args:
            slot: The slot moving.
            to: The primary that gets it.
            timeout: Seconds for the nodes to agree.

        Raises:
            ValueError: ``to`` is not a primary of this cluster, or serves ``slot``.
            TimeoutError: The nodes did not agree in time.
            TypeError, ValueError: ``slot`` is refused as by `primary_for`, or ``timeout``
                as by `wait_ready` (nothing is sent).
        """
        check_seconds("timeout", timeout)
        source = self._source(slot, to)
        others = [node.port for node in self._primaries() if node not in (source, to)]
        end_move(slot, source.port, to.port, others)
        self._wait_ready(timeout, lambda agreed: self._served_by(agreed, slot, to))

    def failover(self, replica: ServerProcess, timeout: float = 10.0) -> None:
        """Promote ``replica`` with ``CLUSTER FAILOVER`` (a manual failover: its
        primary stops taking writes until the replica has caught up, so nothing is
        lost), and wait until every running node sees it serve the slots.

        Args:
            replica: A replica among `nodes`.
            timeout: Seconds for the failover and for the nodes to agree.

        Raises:
            ValueError: ``replica`` is not a replica.
            TimeoutError: The failover did not complete in time.
            TypeError, ValueError: ``timeout`` is refused as by `wait_ready` (nothing
                is sent).
        """
        check_seconds("timeout", timeout)
        if fields(replica.port, "INFO", "replication").get("role") != "slave":
            raise ValueError(f"{replica!r} is not a replica")
        call(replica.port, "CLUSTER", "FAILOVER")
        self._wait_ready(timeout, lambda agreed: self._primary_now(agreed, replica))

    def flushall(self) -> None:
        """``FLUSHALL`` on every running, non-paused primary (replicas follow).

        Raises:
            OSError: A primary did not answer.
        """
        for node in self._primaries():
            node.flushall()

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every node, in parallel (ports and directories are kept).

        Args:
            grace: Seconds each node has after SIGTERM before SIGKILL (0: at once).

        Raises:
            TypeError, ValueError: `grace` is no finite number of seconds, or below 0 (no
                node is signalled).
        """
        check_seconds("grace", grace, allow_zero=True)
        self._stop(self._nodes, grace)

    def close(self) -> None:
        """Stop every node and remove the private directories. Idempotent."""
        self.stop()
        for node in self._nodes:
            node.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()  # no __exit__ follows: remove what the start made
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals --

    def _form(self, timeout: float) -> None:
        """Slots to the primaries, every node met, replicas attached."""
        primaries = self._nodes[: self._shards]
        for i, node in enumerate(primaries):
            # distinct epochs at once, rather than collisions resolved over gossip
            call(node.port, "CLUSTER", "SET-CONFIG-EPOCH", str(i + 1))
            first, last = i * SLOTS // self._shards, (i + 1) * SLOTS // self._shards - 1
            call(node.port, "CLUSTER", "ADDSLOTSRANGE", str(first), str(last))
        for node in self._nodes[1:]:
            meet = (str(node.port), str(node.bus_port))
            call(self._nodes[0].port, "CLUSTER", "MEET", HOST, *meet)
        for i, replica in enumerate(self._nodes[self._shards :]):
            primary = node_id(primaries[i // self._replicas].port)
            wait_until(
                functools.partial(knows, replica.port, primary),
                timeout,
                f"replica {replica.port} did not learn of its primary {primary}",
            )
            call(replica.port, "CLUSTER", "REPLICATE", primary)
        self._formed = True

    def _wait_ready(self, timeout: float, shape: _Shape) -> None:
        ports = [node.port for node in self._live()]
        wait_until(lambda: not_ready(ports, shape), timeout, "the cluster was not ready")

    def _shape(self, agreed: View) -> str | None:
        """Whether a newly formed cluster has its primaries and replicas."""
        primaries = self._nodes[: self._shards]
        replicas = enumerate(self._nodes[self._shards :])
        expected = sorted((each.port, primaries[i // self._replicas].port) for i, each in replicas)
        if sorted({port for _, _, port in agreed.shards}) != sorted(n.port for n in primaries):
            return f"the slots are served by other nodes than the primaries: {agreed.shards}"
        if list(agreed.replicas) != expected:
            return f"replicas (port, primary) are {agreed.replicas}, not yet {expected}"
        return None

    def _served_by(self, agreed: View, slot: int, node: ServerProcess) -> str | None:
        primary = agreed.primary_for(slot)
        return None if primary == node.port else f"slot {slot} is still served by {primary}"

    def _primary_now(self, agreed: View, node: ServerProcess) -> str | None:
        if any(primary == node.port for _, _, primary in agreed.shards):
            return None
        return f"node {node.port} does not serve any slot yet"

    def _source(self, slot: int, to: ServerProcess) -> ServerProcess:
        source = self.primary_for(slot)
        if to not in self._primaries():
            raise ValueError(f"{to!r} is not a primary of this cluster")
        if to is source:
            raise ValueError(f"{to!r} serves slot {slot} already")
        return source

    def _live(self) -> list[ServerProcess]:
        live: list[ServerProcess] = [n for n in self._nodes if n.running and not n.paused]
        if not live:
            raise RuntimeError(f"{self!r} has no running node")
        return live

    def _primaries(self) -> list[ServerProcess]:
        return [
            node
            for node in self._live()
            if fields(node.port, "INFO", "replication").get("role") == "master"
        ]

    def _node_on(self, port: int) -> ServerProcess:
        for node in self._nodes:
            if node.port == port:
                return node
        raise LookupError(f"no node of {self!r} on port {port}")

    @staticmethod
    def _stop(nodes: Sequence[ServerProcess], grace: float = STOP_GRACE) -> None:
        for node in nodes:
            node._terminate()
        for node in nodes:
            node._reap(grace)


def _any(agreed: View) -> str | None:
    """Any shape will do (after a failover, a shard may have lost its replica)."""
    return None
