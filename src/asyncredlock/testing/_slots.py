"""The nodes of a `ServerCluster`: how they run (`ClusterNodeProcess`), and what it asks
them over the minimal RESP client: who they are, how they see the slot map, whether
they are ready; and how a slot moves between shards. Each function takes the port of
one node on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._servers import ServerProcess
from ._support import HOST, POLL_INTERVAL, RespError, pick_port, registry, resp_call

__all__ = [
    "NODE_ARGS",
    "SLOTS",
    "ClusterNodeProcess",
    "View",
    "array",
    "begin_move",
    "call",
    "end_move",
    "fields",
    "knows",
    "node_id",
    "not_ready",
    "text",
    "view",
    "wait_until",
]

SLOTS = 16384
CALL_TIMEOUT = 2.0
MIGRATE_BATCH = 100
MIGRATE_TIMEOUT_MS = 5000


#: What makes a server a node of a test cluster.
NODE_ARGS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",  # in the node's workdir (its --dir): a restart rejoins as it left
    # A replica takes over however long it was cut off from its primary: a test may
    # cut it off on purpose before it kills the primary.
    "--cluster-replica-validity-factor",
    "0",
    # Replicas stay with the primary they were given, whatever happens to others.
    "--cluster-allow-replica-migration",
    "no",
    # A replica's first sync starts at once (not after 5 s, waiting for more replicas).
    "--repl-diskless-sync-delay",
    "0",
)


class ClusterNodeProcess(ServerProcess):
    """A cluster node: its bus listens on a port picked like the client port
    (``--cluster-port``), not ``port + 10000``, which may be taken or past 65535."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.bus_port = pick_port()

    def _command(self) -> list[str]:
        return [*super()._command(), "--cluster-port", str(self.bus_port)]

    def _move_to_new_port(self) -> None:
        super()._move_to_new_port()
        registry.ports.discard(self.bus_port)
        self.bus_port = pick_port()

    def close(self) -> None:
        super().close()
        registry.ports.discard(self.bus_port)


def call(port: int, *args: str | bytes) -> object:
    """One command to the node on ``port``; its reply."""
    return resp_call(port, *args, timeout=CALL_TIMEOUT)


def text(reply: object) -> str:
    """A bulk string reply as text."""
    if not isinstance(reply, bytes):
        raise RespError(f"expected a string reply, got {reply!r}")
    return reply.decode()


def array(reply: object) -> list[object]:
    """An array reply."""
    if not isinstance(reply, list):
        raise RespError(f"expected an array reply, got {reply!r}")
    return reply


def node_id(port: int) -> str:
    """The node's id in the cluster (``CLUSTER MYID``)."""
    return text(call(port, "CLUSTER", "MYID"))


def knows(port: int, node: str) -> str | None:
    """None once the node on ``port`` has heard of the node ``node`` (by its id)."""
    return None if node in text(call(port, "CLUSTER", "NODES")) else f"{port} knows no {node}"


def fields(port: int, *command: str) -> dict[str, str]:
    """The ``name:value`` lines of an ``INFO`` or ``CLUSTER INFO`` reply."""
    lines = text(call(port, *command)).splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))


@dataclass(frozen=True, slots=True)
class View:
    """The topology as one node sees it.

    Attributes:
        shards: Each range of slots, in order: first slot, last slot, and the
            port of the primary that serves it (``CLUSTER SLOTS``).
        replicas: Each replica not failing, as (its port, its primary's port),
            sorted (``CLUSTER NODES``).
    """

    shards: tuple[tuple[int, int, int], ...]
    replicas: tuple[tuple[int, int], ...]

    def primary_for(self, slot: int) -> int | None:
        """The port of the primary serving ``slot``."""
        return next((port for first, last, port in self.shards if first <= slot <= last), None)

    def replicas_of(self, primary: int) -> list[int]:
        """The ports of the replicas of the primary on port ``primary``."""
        return [port for port, of in self.replicas if of == primary]


def view(port: int) -> View:
    """The topology as the node on ``port`` sees it."""
    shards = []
    for entry in array(call(port, "CLUSTER", "SLOTS")):
        first, last, primary, *_ = array(entry)
        shards.append((_int(first), _int(last), _int(array(primary)[1])))
    return View(tuple(sorted(shards)), _replicas(text(call(port, "CLUSTER", "NODES"))))


def _replicas(nodes: str) -> tuple[tuple[int, int], ...]:
    """(port, primary's port) of each replica in a ``CLUSTER NODES`` reply that is
    not failing, or failing in the eyes of this node."""
    ports: dict[str, int] = {}
    lines = [line.split() for line in nodes.splitlines() if line.strip()]
    for line in lines:
        ports[line[0]] = int(line[1].partition("@")[0].rpartition(":")[2])
    found = [
        (ports[line[0]], ports[line[3]])
        for line in lines
        if "slave" in line[2].split(",")
        and not {"fail", "fail?", "handshake", "noaddr"} & set(line[2].split(","))
        and line[3] in ports
    ]
    return tuple(sorted(found))


def _int(reply: object) -> int:
    if not isinstance(reply, int):
        raise RespError(f"expected an integer reply, got {reply!r}")
    return reply


def not_ready(ports: Sequence[int], shape: Callable[[View], str | None]) -> str | None:
    """Why the cluster of the nodes on ``ports`` is not ready, or None when it is:
    every node says ``cluster_state:ok``, every replica's link to its primary is
    up, and all nodes see one topology, whose slot ranges cover every slot, and
    which ``shape`` accepts (it returns why not, or None)."""
    views = set()
    for port in ports:
        state = fields(port, "CLUSTER", "INFO").get("cluster_state")
        if state != "ok":
            return f"node {port} says cluster_state:{state}"
        replication = fields(port, "INFO", "replication")
        if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
            return f"replica {port} has no link to its primary yet"
        views.add(view(port))
    if len(views) > 1:
        return f"the nodes see {len(views)} different topologies: {sorted(map(str, views))}"
    (agreed,) = views
    if sum(last - first + 1 for first, last, _ in agreed.shards) != SLOTS:
        return f"the slot map does not cover all {SLOTS} slots: {agreed.shards}"
    return shape(agreed)


def wait_until(check: Callable[[], str | None], timeout: float, what: str) -> None:
    """Poll ``check`` (it returns why the wait goes on, or None) until it returns
    None; `TimeoutError` with the last reason after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    reason: str | None = "never checked"
    while time.monotonic() < deadline:
        try:
            reason = check()
        except (OSError, RespError) as exc:  # a node restarting, or not a cluster yet
            reason = f"{type(exc).__name__}: {exc}"
        if reason is None:
            return
        time.sleep(POLL_INTERVAL * 4)
    raise TimeoutError(f"{what} within {timeout} s: {reason}")


def begin_move(slot: int, source: int, target: int) -> None:
    """Start moving ``slot`` from the primary on port ``source`` to the one on
    ``target``: ``IMPORTING`` there, ``MIGRATING`` here, then ``MIGRATE`` every key
    of the slot. The slot stays in migration: the source answers ``ASK`` for the
    keys it no longer has, until `end_move`."""
    call(target, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", node_id(source))
    call(source, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", node_id(target))
    for _ in range(SLOTS):  # bounded: a batch per round, far more rounds than needed
        keys = array(call(source, "CLUSTER", "GETKEYSINSLOT", str(slot), str(MIGRATE_BATCH)))
        if not keys:
            return
        timeout = str(MIGRATE_TIMEOUT_MS)
        names = [key for key in keys if isinstance(key, bytes)]
        call(source, "MIGRATE", HOST, str(target), "", "0", timeout, "KEYS", *names)
    raise RuntimeError(f"slot {slot} never emptied on node {source}")


def end_move(slot: int, source: int, target: int, others: Sequence[int]) -> None:
    """Finish a move begun by `begin_move`: the slot is the target's (told to the
    target first, then the source, then the ``others``, as ``valkey-cli`` does)."""
    owner = node_id(target)
    for port in (target, source, *others):
        call(port, "CLUSTER", "SETSLOT", str(slot), "NODE", owner)
