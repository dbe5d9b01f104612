"""Compare-and-delete on one master: a lease's release, and the undo of an attempt.

Both go out on the master's one connection, behind the attempt's ``SET`` there, so a
release never overtakes what it releases; both leave an undo marker where the
``SET``'s outcome is unknown (its call failed), which refuses it should it still
arrive. The undo of a failed attempt whose reply is still out waits for that reply
(`LateUndo`): a refusal needs none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._keys import aux_key, channel, queue_keys, readers_key, terms_key, undo_key
from ._node import Node, Reply
from ._protocol import holds_ours, ms
from ._quorum import TaskTracker
from ._scripts import RELEASE, RELEASE_READ

__all__ = ["LateUndo", "Owner", "Releases"]


class Owner(Protocol):
    """What the releases need of their ``Core``."""

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` failed the calls still out (nothing more is sent)."""

    @property
    def tracker(self) -> TaskTracker:
        """The background work that ``aclose()`` waits for."""


class Releases:
    """The releases of one ``AsyncRedlock`` (see the module's docstring)."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        # the last release built by _delete (keys, value, marker TTL, shared, waiter,
        # undo, script, its keys and arguments)
        self._last: tuple[Any, ...] = (None,) * 9

    def on(
        self,
        node: Node,
        keys: Sequence[str],
        value: str,
        acquired: asyncio.Future[Reply],
        ttl: float,
        *,
        shared: bool = False,
        waiter: str = "",
        undo: bool = False,
    ) -> asyncio.Future[Reply] | Reply:
        """Compare-and-delete on one master, ordered behind the ``SET`` it undoes.

        Every call to a master goes out on one connection, in order, so the
        release cannot overtake the attempt. A master that refused the lock holds
        nothing of ours and gets no call; one whose ``SET`` failed in an unknown
        way (its connection broke) gets an undo marker too, which refuses that
        ``SET`` should it still arrive. While the ``SET``'s reply is out, the
        release goes at once behind it; if both then fail, it is sent once more,
        with the marker, on the next connection. A reader (``shared``) removes its
        entry from the readers instead. ``waiter``: the id a writer's lease was
        queued as (see `Taken`); its entry leaves the queue wherever it is still
        listed, before the key is handed on. ``undo``: a failed attempt's,
        announced on the lock's channel as such (see `Waker`).
        """
        if acquired.done():
            if not holds_ours(acquired):  # refused, or never sent there
                return Reply(0)
            marker = 0 if acquired.result().error is None else ms(ttl)
            return self._delete(node, keys, value, marker, shared, waiter, undo)
        first = self._delete(node, keys, value, 0, shared, waiter, undo)
        result: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        def settle(_: object) -> None:
            reply = first.result()
            unknown = not acquired.done() or acquired.result().error is not None
            if reply.error is None or not unknown or self._owner.closed:
                result.set_result(reply)
                return
            again = self._delete(node, keys, value, ms(ttl), shared, waiter, undo)
            again.add_done_callback(lambda done: result.set_result(done.result()))

        first.add_done_callback(settle)
        return self._owner.tracker.follow(result)

    def _delete(
        self,
        node: Node,
        keys: Sequence[str],
        value: str,
        marker_ttl: int,
        shared: bool,
        waiter: str = "",
        undo: bool = False,
    ) -> asyncio.Future[Reply]:
        last = self._last
        if last[0] is keys and last[1] is value and last[2:6] == (marker_ttl, shared, waiter, undo):
            # the same release to the next master of the round: built once
            return node.call(last[6], last[7], last[8])
        script_keys = _script_keys(keys, value, shared)
        args: tuple[Any, ...]
        if shared:
            script = RELEASE_READ
            args = (value, marker_ttl, channel(keys[0]), "1" if undo else "0")
        else:
            script = RELEASE
            channels = (channel(key) for key in keys)
            args = (value, marker_ttl, *channels, waiter, "1" if undo else "0")
        self._last = (keys, value, marker_ttl, shared, waiter, undo, script, script_keys, args)
        return node.call(script, script_keys, args)


def _script_keys(keys: Sequence[str], value: str, shared: bool) -> tuple[str, ...]:
    """The keys of a release's script: ``release_read.lua``'s for a reader's entry
    (``shared``, one resource), else ``release.lua``'s, seven per resource."""
    if shared:
        (key,) = keys
        return (readers_key(key), undo_key(key, value), *queue_keys(key), terms_key(key))
    return tuple(
        each
        for key in keys
        for each in (
            key,
            undo_key(key, value),
            *queue_keys(key),
            terms_key(key),
            readers_key(key),
            aux_key(key, "fence"),
        )
    )


class LateUndo:
    """The undo, on one master, of a failed attempt whose reply is still out.

    Sent when the reply comes, only if it holds a key of ours (a grant, or a failure:
    the outcome unknown); at the latest ``within`` seconds later, or when `now` is
    called (before the acquisition's next attempt, or at its end), it goes out
    behind the ``SET`` as `Releases.on` sends it (``undo``: that call, bound to the
    master and the attempt). A failed attempt's remaining replies come a moment
    after its decision, and are refusals as a rule: no call, and no round trip
    between a release and the lock's next holder. Nothing is sent once ``owner`` is
    closed.
    """

    __slots__ = ("_owner", "_timer", "_undo", "done")

    def __init__(
        self,
        undo: Callable[[], asyncio.Future[Reply] | Reply],
        acquired: asyncio.Future[Reply],
        owner: Owner,
        within: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._undo = undo
        self._owner = owner
        #: Resolves once nothing of the attempt is left there (``aclose()`` waits).
        self.done: asyncio.Future[Reply] = owner.tracker.follow(loop.create_future())
        self._timer: asyncio.TimerHandle | None = loop.call_later(within, self.now)
        acquired.add_done_callback(self._answered)

    def _answered(self, _: object) -> None:
        if self._timer is not None:
            self.now()

    def now(self) -> None:
        """Send the undo now (behind the ``SET`` if its reply is still out), or
        nothing if the master refused; once."""
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        if self._owner.closed:  # nothing is sent any more: the key expires
            self.done.set_result(Reply(0))
            return
        undone = self._undo()
        if isinstance(undone, Reply):
            self.done.set_result(undone)
        else:
            undone.add_done_callback(lambda call: self.done.set_result(call.result()))
