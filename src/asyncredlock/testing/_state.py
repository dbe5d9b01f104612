"""`client_state`: what one ``AsyncRedlock`` keeps in this process, for tests that
check that an operation, a cancellation or a shutdown left nothing behind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._redlock import AsyncRedlock

__all__ = ["ClientState", "client_state"]


@dataclass(frozen=True, slots=True)
class ClientState:
    """A snapshot of one ``AsyncRedlock``'s state in this process.

    Attributes:
        client: The id that names this client's waiters on the masters
            (``w:<client>:...`` for a writer, ``r:<client>:...`` for a reader) and
            its inbox channel (``asyncredlock:inbox:<client>``).
        held: Leases held.
        slots: The keys whose slot a task of this client holds (acquiring, or
            holding the lease), each with the number of its tasks queued behind it;
            a lock on several resources has one slot, its keys joined by ``"\0"``.
        listening: The lock channels that ``acquire()`` calls of this client wait
            on for a release, each with the number of them.
        addressed: ``acquire()`` calls waiting for their own id in the inbox.
        contended: The keys whose last ``acquire()`` here had to wait (the next one
            queues on the masters from its first attempt).
        connections: Per master, the command connections opened so far (``None``
            for a Redis Cluster master, reached through its client).
        in_flight: Per master, the calls sent there and not answered yet.
        silent: Per master, whether it is judged silent (calls out, nothing heard
            back for ``node_timeout``): acquisitions send it nothing until it
            answers.
        subscribed: Per master, whether its subscription connection is open and the
            master refused none of its SUBSCRIBEs (an ACL without ``+subscribe`` or
            the channels: waiters then poll at their retry delay).
    """

    client: str
    held: int
    slots: Mapping[str, int]
    listening: Mapping[str, int]
    addressed: int
    contended: tuple[str, ...]
    connections: tuple[int | None, ...]
    in_flight: tuple[int, ...]
    silent: tuple[bool, ...]
    subscribed: tuple[bool, ...]


def client_state(redlock: AsyncRedlock) -> ClientState:
    """What ``redlock`` keeps in this process right now.

    Raises:
        TypeError: ``redlock`` is not an ``AsyncRedlock``.
    """
    if not isinstance(redlock, AsyncRedlock):
        raise TypeError(f"client_state() takes an AsyncRedlock, not {type(redlock).__name__}")
    core = redlock._core
    waker = core.waker
    return ClientState(
        client=waker.client,
        held=len(core.held),
        slots=core.gates.slots(),
        listening={channel: len(queue) for channel, queue in waker.queues.items()},
        addressed=len(waker.addressed),
        contended=tuple(core.contended),
        connections=tuple(None if n.link is None else n.link.connections for n in core.nodes),
        in_flight=tuple(node.in_flight for node in core.nodes),
        silent=tuple(node.silent for node in core.nodes),
        subscribed=tuple(
            listener is not None and listener.connection is not None and listener.refusal is None
            for listener in waker.listeners
        ),
    )
