"""Waking waiters when a lock is released, through one subscription per master.

Release (and force-release) publish the deleted value on the lock's channel on each
master. A waiter whose attempt failed *enrolls*: its channel is subscribed on every
master through one shared pub/sub connection per master (per ``AsyncRedlock``), and
it retries once right after the subscriptions are confirmed, so a release that came
before them is seen by that attempt and one that comes after is announced. Between
later attempts it waits for a notification or its jittered retry delay, whichever
comes first: a lost message costs at most one retry delay (a lost hand-over message
too: the next attempt finds the key handed, see ``docs/algorithm.md``).

The subscriptions have a connection of their own per master (``_listener``), opened
like the command connection (redis-py's settings, then a hiredis protocol owns the
socket), never one taken from the command path, and PINGed when quiet. For a Redis
Cluster master it goes to one node of the cluster, any node: a ``PUBLISH`` there
reaches every node (see ``ClusterOpener``).

A waiter of one resource that was refused is queued on the masters (see
``acquire.lua``) under an id that names its client (``w:<client>:<random>``). Each
client listens on an inbox channel of its own (``asyncredlock:inbox:<client>``): a
release (or a queued waiter that leaves while the lock is free) publishes the id of
the first writer of the masters' queue to that writer's inbox, so only its client
hears it and only that waiter wakes: when a quorum of masters announced the same
release (the message carries the released value, or the id of a waiter that left),
so that its attempt finds the lock free on enough of them.
One release costs one attempt and one message per master, not one per client.
When the masters handed that writer the key (see ``release.lua``), the message says
so, and the writer holds the lease once a quorum of them did, with no attempt.
Messages on a lock's channel name no waiter (a release with nobody queued, or
readers first in line) and wake as below; only readers, waiters of several
resources and the writers of read-write locks listen there.

Waiters of one key are woken one at a time, in the order they enrolled, once per
release. A release publishes on every master, the copies carrying the same value:
they wake nobody else, but they wake the chosen waiter again if it went back to
waiting (its attempt came before the release had reached enough masters). A
listener that loses its connection wakes every waiter, subscribes again, and wakes
the waiters of each channel again once that subscription is confirmed: a release
in between went unheard.

The undo of a failed attempt is announced on the lock's channel too, as ``undo
<value>``: a waiter refused only because that attempt held some masters may go now.
It wakes no waiter whose own attempt it undoes, and a waiter at most once until its
pause runs out or something else wakes it (`Ticket.heeds`): while a holder keeps a
quorum, the masters that lost its key grant every waiter's attempt and undo it, and
the waiters would otherwise wake each other (and themselves) for as long as it holds.
A semaphore's attempt announces its give-back the same way (a failed one's, and the
slots a granted one got besides the one it keeps). An undo also wakes a waiter that no
queue on the masters serves (a semaphore's, a lock's on several resources, a
read-write lock's unfair writer) once a quorum of masters has what it needs free
(`Waker._freed`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Sequence

from ._deadline import wait_until
from ._line import Line
from ._listener import Listener
from ._node import Node
from ._ticket import Needs, Ticket, keep_latest, undone_by, wake_first

__all__ = ["INBOX_PREFIX", "Ticket", "Waker", "waiter_id"]

logger = logging.getLogger("asyncredlock")

#: The channel of a client's inbox is this prefix and the client's id (the scripts
#: build it from a queued waiter's id, in ``lua/queue.lua``).
INBOX_PREFIX = "asyncredlock:inbox:"


class Waker:
    """Subscriptions, queues of waiting acquisitions, and wake-ups for one redlock.

    Args:
        nodes: The masters; one listener each, on the connection its
            ``listen_opener`` opens (for a cluster master, one of its nodes).
        confirm_within: How long `enroll` waits for masters to confirm a subscription.
        quorum: How many confirmations `enroll` waits for: a release deletes on
            a quorum of masters, so a quorum of subscriptions shares a master
            with every release.
    """

    def __init__(self, nodes: Sequence[Node], confirm_within: float, quorum: int) -> None:
        #: this client's id in its waiters' ids, and its inbox channel
        self.client = secrets.token_hex(6)
        self.inbox = INBOX_PREFIX + self.client
        self.confirm_within = confirm_within
        self.quorum = quorum
        self.listeners = [
            Listener(node, i, self._on_message, self._on_lost)
            if node.listen_opener is not None
            else None
            for i, node in enumerate(nodes)
        ]
        self.queues: dict[str, Line[Ticket]] = {}
        # waiters queued on the masters, by id
        self.addressed: dict[bytes, Ticket] = {}
        # per channel: the last release heard, and the waiter it woke
        self.last: dict[str, tuple[bytes, Ticket | None]] = {}
        self.notifications = 0
        self.wakeups = 0
        self.closed = False

    async def enroll(
        self,
        channels: Sequence[str],
        *,
        everyone: bool = False,
        waiter: str | None = None,
        needs: Needs | None = None,
        own: str = "",
    ) -> Ticket:
        """Queue a waiter on ``channels`` (a release on any wakes it), subscribing
        first where needed. A ``waiter`` id (its entry in the masters' queue, made
        by `waiter_id`) also wakes it when the inbox hears that id; ``channels``
        may then be empty. A waiter that ``needs`` its keys free is also woken
        once a quorum of masters has them free (`_freed`). ``own``: the value of
        its attempt made before (the undo of which, announced, is its own).

        Returns once a quorum of masters confirmed every subscription, or after
        ``confirm_within``.
        """
        ticket = Ticket(channels, everyone=everyone, waiter=waiter, needs=needs, own=own)
        if ticket.waiter is not None:
            self.addressed[ticket.waiter] = ticket
        for channel in ticket.channels:
            self.queues.setdefault(channel, Line()).join(ticket)
        # the inbox stays subscribed until this client closes
        inbox = (self.inbox,) if ticket.waiter is not None else ()
        try:
            confirmations = [
                [listener.subscribe(channel) for listener in self.listeners if listener is not None]
                for channel in (*inbox, *ticket.channels)
            ]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.confirm_within
            for each in confirmations:
                await _wait_for_some(each, self.quorum, max(0.0, deadline - loop.time()))
        except BaseException:
            self.leave(ticket, acquired=False)
            raise
        return ticket

    def inbox_ready(self) -> bool:
        """Whether a quorum of masters confirmed the subscription to this client's
        inbox (it stays subscribed once made, until the connection is lost)."""
        confirmed = 0
        for listener in self.listeners:
            if listener is not None:
                future = listener.confirmed.get(self.inbox)
                confirmed += future is not None and future.done() and not future.cancelled()
        return confirmed >= self.quorum

    def leave(self, ticket: Ticket, *, acquired: bool) -> None:
        """Take ``ticket`` out of its queues; unsubscribe where nobody waits.

        The wake-ups it did not use (`Ticket.owes`: woken, but not ``acquired``;
        a spare one) go on to the next waiters: one in each channel whose last
        release woke it, as many as it owes, else one in every channel. One woken
        by its id passes none: its leaving the masters' queue announces the next
        one there.
        """
        if ticket.waiter is not None:
            self.addressed.pop(ticket.waiter, None)
        if ticket.nudge is not None:
            ticket.nudge.cancel()
            ticket.nudge = None
        owed = 0 if ticket.waiter is not None else ticket.owes(acquired=acquired)
        queues = {ch: self.queues[ch] for ch in ticket.channels if ch in self.queues}
        for queue in queues.values():
            queue.leave(ticket)
        if owed:
            self._bequeath(ticket, [channel for channel, queue in queues.items() if queue], owed)
        for channel, queue in queues.items():
            if not queue:
                del self.queues[channel]
                self.last.pop(channel, None)
                if not self.closed:
                    for listener in self.listeners:
                        if listener is not None:
                            listener.unsubscribe(channel)

    def _bequeath(self, ticket: Ticket, channels: list[str], owed: int) -> None:
        """Wake ``owed`` waiters of ``channels`` in place of ``ticket``, which left:
        in the channels whose last release woke it (a semaphore's waiters listen on
        every slot's channel: one wake-up per release), else one in each channel
        (it may have been woken by a lost subscription, or the release that woke
        it is no longer the channel's last)."""
        named = [ch for ch in channels if (last := self.last.get(ch)) and last[1] is ticket]
        for channel in named or channels:
            if named and not owed:
                return
            last = self.last.get(channel)
            heir = wake_first(self.queues[channel], None if last is None else undone_by(last[0]))
            if last is not None and last[1] is ticket:
                self.last[channel] = (last[0], heir)
            owed -= heir is not None

    async def wait(self, ticket: Ticket, delay: float) -> bool:
        """Wait until ``ticket`` is woken or ``delay`` passed; whether it was woken.
        Its attempt is out once it returns (`Ticket.out`)."""
        ticket.out = ticket.using = ticket.spare = False  # (a spare one: woken at once)
        try:
            # (not wait_for: that runs the wait in a task of its own, one loop
            # iteration more between the release heard and the waiter going)
            async with asyncio.timeout(delay):
                await ticket.event.wait()
        except TimeoutError:
            ticket.heeding = True  # it attempts on its own again
            ticket.out = True
            return False
        ticket.event.clear()
        ticket.out = ticket.using = True
        return True

    def _on_message(self, index: int, channel: str, value: bytes) -> None:
        self.notifications += 1
        if channel == self.inbox:
            self._on_inbox(index, value)
        else:
            self._on_release(index, channel, value)

    def _on_inbox(self, index: int, value: bytes) -> None:
        """A message for the first writer in the masters' queue: only it goes."""
        waiter, _, cause = value.partition(b" ")
        addressed = self.addressed.get(waiter)
        if addressed is None:
            return
        if cause[:7] == b"handed:":
            # master ``index`` handed it the key: it goes once a quorum did
            attempt, _, count = cause[7:].partition(b" ")
            if not count.isdigit():
                logger.debug("inbox of %s: unexpected message %r", self.client, value)
                return
            addressed.handed[index] = (attempt.decode(), int(count))
            if len(addressed.handed) == self.quorum:
                self.wakeups += 1
                addressed.wake()
            else:
                self._arm_nudge(addressed)
            return
        # wake it once a quorum of masters announced it first in line (a release,
        # or waiters leaving: not always the same one on each master), counting
        # those that handed it the key: its attempt then finds the lock free, or
        # its own, on enough
        if cause in addressed.spent or cause in addressed.own:
            return
        heard = addressed.heard
        heard[index] = cause
        if len(heard.keys() | addressed.handed.keys()) >= self.quorum:
            keep_latest(addressed.spent, heard.values(), _SPENT_KEPT)
            heard.clear()
            self.wakeups += 1
            addressed.wake()
        else:
            self._arm_nudge(addressed)

    def _arm_nudge(self, ticket: Ticket) -> None:
        """Wake ``ticket`` soon unless a quorum of masters tells it by then. The
        masters hand the key over (or announce a waiter first) within a round's
        spread of each other, far less than a node timeout. If the others do
        not, they named another waiter: its attempt finds out whom, and gives a
        key back when that one came first (see `HandOvers`); a waiter in line
        would otherwise sleep until its next refresh."""
        if ticket.nudge is None:
            loop = asyncio.get_running_loop()
            ticket.nudge = loop.call_later(self.confirm_within / 4, self._nudge, ticket)

    def pass_on(self, ticket: Ticket) -> None:
        """``ticket``, a waiter of several resources woken by a release, could not
        use it (another of its resources is held): wake the next waiter, after it,
        of each channel whose release woke it (a later set may be free to go; the
        channel's last release names whom it woke, as its wake-up flag is cleared
        by now)."""
        for channel in ticket.channels:
            last, queue = self.last.get(channel), self.queues.get(channel)
            if last is None or last[1] is not ticket or not queue:
                continue
            later = itertools.dropwhile(lambda waiting: waiting is not ticket, queue)
            next(later, None)  # the ticket itself
            self.last[channel] = (last[0], wake_first(later, undone_by(last[0])))
            ticket.using = False  # its wake-up went on: it has none to pass when leaving

    def pass_ahead(self, ticket: Ticket) -> None:
        """``ticket``, a semaphore's waiter woken by a release, was refused as
        queued behind an earlier waiter with a slot free: that one may be a waiter of
        this process whose attempt was out when the release was heard (it reached
        the masters before the release), so the release woke ``ticket`` instead (see
        `wake_first`). Wake the first waiter before it in each channel whose release
        woke it (one whose attempt is out keeps it as a spare: it tries again at once
        if that attempt fails). Once per wake-up: it has none to pass when leaving."""
        for channel in ticket.channels if ticket.using else ():
            last, queue = self.last.get(channel), self.queues.get(channel)
            if last is None or last[1] is not ticket or not queue:
                continue
            ahead = itertools.takewhile(lambda waiting: waiting is not ticket, queue)
            heir = wake_first(ahead, undone_by(last[0]))
            if heir is not None:
                self.last[channel] = (last[0], heir)
                self.wakeups += 1
                ticket.using = False

    def _nudge(self, ticket: Ticket) -> None:
        """Wake ``ticket`` if some masters, but fewer than a quorum, handed it the
        key or named it first in line."""
        ticket.nudge = None
        partial = 0 < len(ticket.handed) < self.quorum or ticket.heard
        if partial and ticket.waiter in self.addressed:
            self.wakeups += 1
            ticket.wake()

    def _on_release(self, index: int, channel: str, value: bytes) -> None:
        """A release announced on a lock's channel by master ``index``: wake its
        first waiter (all of them, when readers wait). An attempt's undo wakes only
        those that heed it (`Ticket.heeds`), and the waiters for whom a quorum of
        masters now has what they need free (`_freed`)."""
        queue = self.queues.get(channel)
        last = self.last.get(channel)
        undone = undone_by(value)
        if undone is not None and queue:
            self._freed(index, channel, queue)
        if last is not None and last[0] == value:
            # The same release, heard from another master: only the waiter it
            # woke may need it, if that waiter's attempt came too early. (Not
            # for an undo: that waiter heeds none until its pause runs out.)
            woken = last[1]
            if undone is None and woken is not None and queue and woken in queue:
                woken.wake()
            return
        chosen: Ticket | None = None
        if queue and any(ticket.everyone for ticket in queue):
            heeding = [each for each in queue if undone is None or each.heeds(undone)]
            for ticket in heeding:
                ticket.wake(undo=undone is not None)
            chosen = heeding[0] if heeding else None
        elif queue:
            chosen = wake_first(queue, undone)
        if undone is None or chosen is not None:  # (an unheeded undo: no release)
            self.last[channel] = (value, chosen)
        if chosen is not None:
            self.wakeups += 1

    def _freed(self, index: int, channel: str, queue: Line[Ticket]) -> None:
        """Master ``index`` announced an attempt's undo on ``channel``: its key (a
        semaphore's slot, a lock's resource) is free there. Wake each waiting
        waiter of that key that counts such masters (`Ticket.needs`) for which a
        quorum now has what it needs free (this one, and those that granted its
        latest attempt the key or announced an undo of it since): its attempt
        failed only because attempts of other clients split the masters' grants,
        and no holder refuses it. Never for a holder keeping a quorum: only the
        masters that lost its key grant attempts, and undo them."""
        for ticket in queue:
            ticket.free(channel, index)
            if not ticket.out and not ticket.event.is_set() and ticket.freed_on(self.quorum):
                self.wakeups += 1
                ticket.wake(undo=True)

    def _on_lost(self, channel: str | None) -> None:
        """Wake every waiter (of ``channel``, or of all): a release may have gone
        unheard while a subscription was down."""
        if channel is None or channel == self.inbox:
            for ticket in self.addressed.values():
                ticket.wake()
        queues = self.queues.values() if channel is None else [self.queues.get(channel, ())]
        for queue in queues:
            for ticket in queue:
                ticket.wake()

    def wake_all(self) -> None:
        """Wake every waiter (``aclose()`` began: each finds it closing)."""
        self._on_lost(None)

    async def aclose(self) -> None:
        """Close every subscription connection."""
        self.closed = True
        self._on_lost(None)  # waiters go on, and find the AsyncRedlock closed
        for listener in self.listeners:
            if listener is not None:
                await listener.aclose()


#: How many of the announcements that woke a waiter it remembers (their copies from
#: the other masters may come after those of the next few).
_SPENT_KEPT = 8


def waiter_id(client: str, *, reader: bool) -> str:
    """A new id for a waiter of ``client`` in the masters' queues (``r:`` for a
    reader): ``release.lua`` sends a writer's to ``client``'s inbox."""
    return f"{'r' if reader else 'w'}:{client}:{secrets.token_hex(8)}"


async def _wait_for_some(futures: Sequence[asyncio.Future[None]], need: int, within: float) -> None:
    """Wait until ``need`` of ``futures`` succeeded, all ended, or ``within`` seconds passed
    (not cut short by a busy loop: `wait_until`)."""

    def enough() -> bool:
        return sum(1 for f in futures if f.done() and not f.cancelled()) >= need

    await wait_until(futures, enough, within)
