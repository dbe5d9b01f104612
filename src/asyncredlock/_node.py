"""One master: how scripts reach it, whether it answers, and how to subscribe to it."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from ._keys import key_slot
from ._log import log_master_readmitted, turned_silent
from ._scripts import SCRIPTS, Script, evalsha
from ._telemetry import master_error
from ._transport import Link
from ._wire import ClosedError, Opener, Reply, pack

__all__ = ["Node", "Reply"]


class Node:
    """A master and the way calls reach it.

    Most masters are reached through a `Link`: one pipelined connection that
    asyncredlock opens with redis-py's connection settings (from a URL, or copied
    from a ``redis.asyncio.Redis`` client) and owns. A ``RedisCluster`` client
    routes each key to its shard itself, so its calls go through the client, one
    task per call; the tasks of one cluster slot (one lock's keys) run one after
    the other, as calls on one connection would. Its silence is judged from those
    calls (`ClusterSilence`), as a `Link` judges its connection's.

    Args:
        name: Display name used in errors and inspection.
        opener: Opens a connection to the master (``None`` for a cluster client).
        client: The cluster client, when there is no opener.
        listen_opener: Opens the connection for wake-up subscriptions; ``opener``
            when ``None`` (a cluster client's comes from `ClusterOpener`).
        owned: Whether asyncredlock made ``client`` and must close it.
        node_timeout: Silence after which the master counts as silent.
        socket_timeout: Silence after which a connection is dropped.
        busy_poll: Seconds to poll for a reply before the loop sleeps (see `Link`).
    """

    def __init__(
        self,
        name: str,
        *,
        opener: Opener | None = None,
        client: Any = None,
        listen_opener: Opener | None = None,
        owned: bool = False,
        node_timeout: float = 0.1,
        socket_timeout: float = 5.0,
        busy_poll: float = 0.0,
    ) -> None:
        self.name = name
        self.opener = opener
        self.listen_opener = listen_opener or opener
        self.client = client
        self.owned = owned
        self.socket_timeout = socket_timeout
        self.link: Link | None = None
        if opener is not None:
            preload = [("SCRIPT", "LOAD", script.source) for script in SCRIPTS]
            self.link = Link(
                name,
                opener,
                node_timeout=node_timeout,
                socket_timeout=socket_timeout,
                preload=preload,
                busy_poll=busy_poll,
            )
        self._tasks: set[asyncio.Task[Reply]] = set()
        # the last call to a cluster master, per slot: the next one there waits for it
        self._last: dict[int, asyncio.Task[Reply]] = {}
        self.silence = ClusterSilence(name, node_timeout, socket_timeout)

    def __repr__(self) -> str:
        return f"Node({self.name!r})"

    @property
    def cluster(self) -> bool:
        """Whether this master is a Redis Cluster (reached through its client)."""
        return self.link is None

    @property
    def in_flight(self) -> int:
        """Calls sent (or waiting for the connection) and not answered yet; not the
        connection's own PING."""
        return self.link.calls if self.link is not None else len(self._tasks)

    @property
    def silent(self) -> bool:
        """Whether calls have been out for ``node_timeout`` with nothing heard back."""
        return self.link.silent if self.link is not None else self.silence.silent

    def unread(self) -> bool:
        """Whether bytes from the master wait unread in its connection's socket (a busy
        loop); False for a cluster master (whose sockets its client owns)."""
        return self.link is not None and self.link.unread()

    def watch(self, watcher: Callable[[], None]) -> None:
        """Call ``watcher`` when the master turns silent."""
        if self.link is not None:
            self.link.watchers.add(watcher)
        else:
            self.silence.watchers.add(watcher)

    def call(
        self, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> asyncio.Future[Reply]:
        """Run ``script`` here; the future never raises, failures are in the reply.

        Calls to one master run there in the order they were made (on a cluster
        master, the calls on one slot: each lock's calls, in order).
        """
        if self.link is not None:
            command, packed = _LAST.pack(script, keys, args)
            return self.link.call(command, script.source, packed=packed)
        # Without a connection to keep them in order, a call waits for the one
        # before it on the same keys: a release sent while its SET is still out
        # must not run first (it would find nothing, and the SET would stay).
        slot = key_slot(keys[0]) if keys else -1
        before = self._last.get(slot)
        loop = asyncio.get_running_loop()
        task = loop.create_task(_through(self, script, keys, args, before))
        self._tasks.add(task)
        self._last[slot] = task
        # not the task itself: one cancelled before its first step never ran
        # _through's handler, and would raise where its caller reads it
        reply: asyncio.Future[Reply] = loop.create_future()
        task.add_done_callback(functools.partial(self._done, slot, reply))
        return reply

    def _done(self, slot: int, reply: asyncio.Future[Reply], task: asyncio.Task[Reply]) -> None:
        self._tasks.discard(task)
        if self._last.get(slot) is task:
            del self._last[slot]
        if task.cancelled():  # only Node.aclose() cancels these
            reply.set_result(Reply(error=ClosedError(_CLOSED)))
        else:
            reply.set_result(task.result())

    def listen(
        self, future: asyncio.Future[Reply], hook: Callable[[int, Reply], None], index: int
    ) -> bool:
        """Have ``hook(index, reply)`` called as soon as the reply of ``future`` (a
        call made here) is read. ``False`` when that cannot be done (the future is
        done, already hooked, not made by this master's connection, or a cluster
        client's call): use a done callback."""
        return self.link is not None and self.link.listen(future, hook, index)

    def unlisten(self, future: asyncio.Future[Reply]) -> None:
        """Undo `listen`."""
        if self.link is not None:
            self.link.unlisten(future)

    async def wait_idle(self) -> None:
        """Wait until no call is out here."""
        if self.link is not None:
            await self.link.wait_idle()
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def aclose(self) -> None:
        """Fail the calls still out, close the connection (and the client if ours)."""
        if self.link is not None:
            await self.link.aclose()
        self.silence.close()
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self.owned and self.client is not None:
            await self.client.aclose()


class ClusterSilence:
    """Whether a cluster master is silent: calls out there for ``node_timeout`` and
    not one of them ended (what a `Link` judges from its connection's bytes, judged
    here from the calls, which the cluster client makes on connections of its own).

    A call is out from when it is sent (not while it waits for the call before it on
    its slot). Judged only by a timer that fired on time (a busy loop says nothing
    about the master), looking twice, ``node_timeout / 4`` apart (a reply already
    read may be a task step or a callback away from ending its call), and only once
    the master has ended a call: until then the cluster client may still be learning
    the slots and connecting, as a `Link`'s connection being opened is not judged.
    Any call that ends readmits it. After ``socket_timeout`` of silence it is judged
    afresh: the next round sends it its call again (a call of the cluster client may
    hang longer than that, for as long as its own ``socket_timeout``); the calls
    still out then are not judged again, so a master that gets no new call is not
    found silent again (nor logged) for the same calls.

    Args:
        name: The master's display name, for the log.
        node_timeout: Silence, with calls out, after which the master is silent.
        socket_timeout: Silence after which it is judged afresh.
    """

    __slots__ = (
        "_due", "_out", "_quiet_since", "_stale", "_suspect", "_timer", "_unheard", "_warm",
        "closed", "name", "node_timeout", "silent", "socket_timeout", "watchers",
    )  # fmt: skip

    def __init__(self, name: str, node_timeout: float, socket_timeout: float) -> None:
        self.name = name
        self.node_timeout = node_timeout
        self.socket_timeout = socket_timeout
        #: Whether calls have been out for ``node_timeout`` with none of them ended.
        self.silent = False
        #: Called when the master turns silent (rounds waiting on it decide).
        self.watchers: set[Callable[[], None]] = set()
        self.closed = False
        self._out = 0  # calls made and not ended
        self._stale = 0  # of those, the ones out when it was judged afresh (not judged)
        self._unheard = False  # judged afresh while silent, no call ended since
        self._warm = False  # a call has ended: the client knows the cluster
        self._quiet_since = math.inf  # since when no call ended with calls out
        self._suspect = False  # found quiet once: silent if still so at the next look
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    def sent(self) -> None:
        """A call was sent."""
        if self._out == self._stale:  # the first call out that is judged
            self._quiet_since = asyncio.get_running_loop().time()
            self._arm(self.node_timeout)
        self._out += 1

    def answered(self) -> None:
        """A call ended (answered, failed or cancelled): the master is not silent."""
        self._out -= 1
        self._warm, self._suspect, self._stale = True, False, 0
        self._quiet_since = asyncio.get_running_loop().time() if self._out else math.inf
        if self._out:  # the calls still out are judged (again) from now
            self._arm(self.node_timeout)
        if self.silent or self._unheard:
            self.silent = self._unheard = False
            log_master_readmitted(self.name)

    def close(self) -> None:
        """Stop judging (the client is closing)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, delay: float) -> None:
        if self._timer is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._due = loop.time() + delay
            self._timer = loop.call_at(self._due, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._out == self._stale:  # no call out that is judged
            return
        now = asyncio.get_running_loop().time()
        if now - self._due > self.node_timeout / 2 or not self._warm:
            # our loop is late (calls may have ended unseen), or the client is new
            self._arm(self.node_timeout / 4 if self._warm else self.node_timeout)
            return
        quiet = now - self._quiet_since
        if quiet >= self.socket_timeout:
            # judged afresh: the next round sends it its call, judged from its send
            self._stale, self._unheard = self._out, self._unheard or self.silent
            self.silent = self._suspect = False
        elif quiet >= self.node_timeout and not (self.silent or self._suspect):
            self._suspect = True  # look again: a reply in may not have ended its call
            self._arm(self.node_timeout / 4)
        elif quiet >= self.node_timeout:
            if not self.silent:
                self._turn_silent(quiet)
            self._arm(min(self.node_timeout, self._quiet_since + self.socket_timeout - now))
        else:
            self._arm(self._quiet_since + self.node_timeout - now)

    def _turn_silent(self, quiet: float) -> None:
        self.silent = True
        turned_silent(self.name, quiet, self.watchers)


class _LastPacked:
    """The last ``EVALSHA`` built and packed, kept for the next master.

    A round sends the same script with the same keys and arguments (the same
    tuple objects) to every master: it is packed once, not once per master.
    Tuples only (of strings and numbers), so that being the same object means
    holding the same command.
    """

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry: tuple[Script, object, object, tuple[Any, ...], bytes] | None = None

    def pack(
        self, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[tuple[Any, ...], bytes]:
        entry = self._entry  # one read: consistent even if another thread replaces it
        if entry is not None and entry[0] is script and entry[1] is keys and entry[2] is args:
            return entry[3], entry[4]
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        packed = pack(*command)
        if type(keys) is tuple and type(args) is tuple:
            self._entry = (script, keys, args, command, packed)
        return command, packed


_LAST = _LastPacked()
_CLOSED = "this AsyncRedlock was closed while the call was out"


async def _through(
    node: Node,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Any],
    before: asyncio.Task[Reply] | None,
) -> Reply:
    """Run ``script`` through the master's redis-py client by its SHA1, sending
    its source once if not cached there; once ``before`` (the call made there
    before it on the same slot) has ended."""
    try:
        if before is not None and not before.done():
            await asyncio.wait([before])
        node.silence.sent()  # out from now on (not while it waited for ``before``)
        try:
            value = await evalsha(node.client, script, keys, args)
        finally:
            node.silence.answered()
    except asyncio.CancelledError:  # only Node.aclose() cancels these
        return Reply(error=ClosedError(_CLOSED))
    except Exception as exc:
        master_error(node.name, exc)
        return Reply(error=exc)
    return Reply(value)
