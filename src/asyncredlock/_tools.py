"""The operator's calls on an ``AsyncRedlock``: read a lock's state, force it free,
the statistics, and waiting for background calls (`OperatorTools`, its base)."""

from __future__ import annotations

from ._config import Settings, check_name
from ._core import Core
from ._inspect import LockState
from ._operator import Freed, force_free, read_state
from ._stats import RedlockStatistics
from ._timings import ResourceStatistics

__all__ = ["OperatorTools"]


class OperatorTools:
    """What ``AsyncRedlock`` offers operators and tests besides its locks."""

    _core: Core
    _settings: Settings

    async def inspect(self, name: str) -> LockState:
        """Read a lock's state on every master: holder (the writer), time left,
        fence counter, readers and queue.

        Waits for every master, at most ``max(node_timeout, socket_timeout)``; one
        that did not answer by then is reported with its error.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: ``name`` is empty, holds a NUL, does not encode as UTF-8,
                or makes a key that is one of the library's auxiliary keys.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        return await read_state(self._core, check_name(name))

    async def _read_state(self, name: str, failed: dict[int, str]) -> LockState:
        """`inspect`, asking no master in ``failed`` and adding those where it gets
        no reply (the command line's ``list``: a silent master waited for once; see
        `read_state`)."""
        return await read_state(self._core, check_name(name), failed)

    async def force_release(self, name: str) -> int:
        """Delete a lock's key on every master, whoever holds it: an operator's tool.

        The readers of a read-write lock on ``name`` are removed too.

        A holder elsewhere is not told until its next extension finds the lock
        gone (then its lease is lost); leases of this ``AsyncRedlock`` on the
        lock are lost at once (their ``async with`` blocks are cancelled), and its
        tasks waiting for the lock go on to acquire it. Use it only to free a lock
        whose holder is known dead.
        Waits for every master up to ``max(node_timeout, socket_timeout)`` in all;
        a master that did not answer by then is not counted (its delete may still
        land). Cancelled, the deletes go on all the same, and this client's leases
        on the lock are lost at once.

        Returns:
            On how many masters a key was deleted.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: ``name`` is empty, holds a NUL, does not encode as UTF-8,
                or makes a key that is one of the library's auxiliary keys.
            QuorumUnavailableError: So many masters failed or did not answer that
                the lock may still be held (this client's leases on it are lost
                all the same: the deletes were sent).
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        return (await self._force_free(name)).deleted

    async def _force_free(self, name: str) -> Freed:
        """`force_release`, telling also which masters missed the delete (the
        command line's ``force-release`` names them)."""
        return await force_free(self._core, check_name(name))

    def statistics(self) -> RedlockStatistics:
        """A snapshot of this ``AsyncRedlock``'s counters, gauges, wait and hold times."""
        core = self._core
        wait, hold = core.timings.wait.summary(), core.timings.hold.summary()
        return RedlockStatistics(**core.counters.totals(), **core.describe(), wait=wait, hold=hold)

    def resource_statistics(self) -> dict[str, ResourceStatistics]:
        """Per resource: acquisitions, timeouts, losses, wait and hold times, for the
        1,024 resources used most recently (least recent first; memory stays
        bounded). A lock on several resources counts under their joined names."""
        return self._core.timings.resources()

    async def settle(self) -> None:
        """Wait until no call to any master is still out.

        Rounds return at quorum; the other masters' replies, and the cleanup after a
        failed or cancelled attempt, finish in the background: await this to know
        they are done (tests, graceful shutdown). Lease extenders keep running."""
        if self._core.loop is None:  # never used: nothing was ever sent
            return
        self._core.check_loop()
        await self._core.settle()
