"""The operator's tools on one lock (read its state on every master, force it
free), and the end of an ``AsyncRedlock`` (`shut_down`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import anyio

from ._core import Core
from ._errors import QuorumUnavailableError
from ._inspect import LockState, NodeLockState, no_reply, node_state, not_asked, reply_error
from ._keys import aux_key, channel, lock_key, queue_keys, readers_key, terms_key
from ._node import Reply
from ._protocol import classify_deleted
from ._quorum import Decision
from ._refusal import why_unavailable
from ._scripts import DELETE, INSPECT

__all__ = ["Freed", "end_leases", "force_free", "lose_leases", "read_state", "shut_down"]


async def read_state(core: Core, name: str, failed: dict[int, str] | None = None) -> LockState:
    """``inspect()``: every master's view, each waited for up to the longest wait.

    ``failed`` (the command line's ``list``, reading lock after lock): the masters
    where a call failed for want of a reply (`no_reply`), by index, with its error.
    They are not asked (their state reads `not_asked`), so that a silent master is
    waited for once, not once per read; a master where this read fails so is added.
    """
    failed = {} if failed is None else failed
    skipped = frozenset(failed)  # as the calls go out (other reads may add to it meanwhile)
    key = lock_key(core.settings.prefix, name)
    keys = (key, aux_key(key, "fence"), readers_key(key), *queue_keys(key), terms_key(key))
    unasked = Reply()  # never read: a master in ``failed`` gets no call
    rnd = core.fan_out(lambda i, node: unasked if i in skipped else node.call(INSPECT, keys, ()))
    asked = [task for i, task in enumerate(rnd.tasks) if i not in skipped]
    if asked:
        await asyncio.wait(asked, timeout=core.timing.max_wait)
    nodes: list[NodeLockState] = []
    for i, (node, task) in enumerate(zip(core.nodes, rnd.tasks, strict=True)):
        if i in skipped:
            nodes.append(NodeLockState(node.name, None, None, None, not_asked(failed[i])))
            continue
        reply = task.result() if task.done() else None
        nodes.append(state := node_state(node.name, reply, core.settings))
        if no_reply(reply) and state.error is not None:
            failed.setdefault(i, state.error)
    return LockState(name, key, tuple(nodes))


@dataclass(frozen=True, slots=True)
class Freed:
    """What ``force_release()`` did: on how many masters it deleted a key, of them on
    how many the lock key (a writer's) and the readers' entries, and the masters that
    did not answer in time or failed (name, why), where a key may stay."""

    deleted: int
    missed: tuple[tuple[str, str], ...]
    key: int
    readers: int


async def force_free(core: Core, name: str) -> Freed:
    """``force_release()``: delete the key everywhere, lose this client's leases on
    it, and tell on which masters a key was deleted and which ones missed it."""
    key = lock_key(core.settings.prefix, name)
    args = (channel(key),)
    keys = (key, readers_key(key), *queue_keys(key), terms_key(key))
    rnd = core.fan_out(lambda _, node: node.call(DELETE, keys, args))
    wait = core.timing.max_wait
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    try:
        decision = await core.decide(rnd, classify_deleted, wait=wait)
    except asyncio.CancelledError:  # the DELETEs are out all the same
        lose_leases(core, key, None)
        raise
    if decision.unavailable:  # its deletes went out all the same: this client's leases end
        lose_leases(core, key, decision)
        raise QuorumUnavailableError(
            f"could not force {name!r} free: {why_unavailable(decision)}",
            resource=name,
            outcomes=decision.outcomes,
        )
    lose_leases(core, key, decision)
    await asyncio.wait(rnd.tasks, timeout=max(0.0, deadline - loop.time()))
    replies = [task.result() if task.done() else None for task in rnd.tasks]
    missed = (
        (node.name, error)
        for node, reply in zip(core.nodes, replies, strict=True)
        if (error := reply_error(reply, core.settings)) is not None
    )
    # delete.lua's reply: 1 the lock key deleted, 2 the readers' entries, 3 both
    gone = [int(reply.value) for reply in replies if reply is not None and not reply.error]
    key_on, readers_on = sum(what & 1 for what in gone), sum(what >> 1 for what in gone)
    return Freed(sum(map(bool, gone)), tuple(missed), key_on, readers_on)


def lose_leases(core: Core, key: str, decision: Decision | None) -> None:
    """End lost this client's leases on ``key`` (forced free): their blocks are
    cancelled (``decision`` is ``None`` when the force was cancelled before it was
    decided: its deletes were sent, so the leases are as good as gone)."""
    for lease in [each for each in core.held if key in each.keys]:
        lease._lose(decision, "forced free (force_release)")


def end_leases(core: Core) -> None:
    """The client closes: each lease it holds is lost (its holder still counted on
    it: blocks cancelled, loss callbacks run); the releases go out at once."""
    for lease in list(core.held):
        lease._lose(None, "its AsyncRedlock was closed")


async def shut_down(core: Core, wait: float | None = None) -> None:
    """``aclose()``: end the leases still held and the ``acquire()`` calls still
    waiting, wait up to ``wait`` (``node_timeout`` when ``None``) for their releases,
    their leaving the masters' queues and the calls still out, fail what is left,
    close the connections."""
    core.gates.close()
    core.begin_closing()  # lock() and acquire() refuse from now on; waiters wake
    closing = asyncio.get_running_loop().create_task(_closing(core, wait))
    cancelled: asyncio.CancelledError | None = None
    # anyio's scopes outside wait (they deliver nothing into a shielded one, where
    # they would cancel again at every turn of the loop); a task.cancel() is caught
    with anyio.CancelScope(shield=True):
        while not closing.done():
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError as exc:
                if closing.cancelled():  # the close itself (the loop is shutting down)
                    raise
                cancelled = exc  # the caller: it ends once the client is closed
    if cancelled is not None:
        raise cancelled
    closing.result()


async def _closing(core: Core, wait: float | None) -> None:
    try:
        await _shut_down(core, core.settings.node_timeout if wait is None else wait)
    finally:
        core.shut.set()  # an aclose() called meanwhile returns now


async def _shut_down(core: Core, wait: float) -> None:
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(wait):
            end_leases(core)
            # the acquire() calls still waiting leave the masters' queues (and give
            # back a key a release handed them) while the connections are open
            await core.left()
            await core.settle()
            while core.held:  # taken by an acquisition that was still out
                end_leases(core)
                await core.settle()
        core.closed = True
        # Fail every call still out: the rounds waiting on them decide, and
        # their callers get an error instead of waiting for a hung master.
        for node in core.nodes:
            await node.aclose()
        await core.waker.aclose()
        await core.tracker.aclose()
        # their deadline timers would stay in the loop up to max_wait, keeping the nodes
        core.timing.rounds.close()
        core.patient.rounds.close()
