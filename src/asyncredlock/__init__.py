"""asyncredlock: asyncio-native Redlock over N Redis/Valkey masters.

```python
from asyncredlock import AsyncRedlock

async with AsyncRedlock(["redis://h1", "redis://h2", "redis://h3"]) as redlock:
    async with redlock.lock("orders:42", ttl=10.0) as lease:
        ...  # held on a majority; extended until the block exits
```
"""

from __future__ import annotations

import logging

from ._acl import acl_rules as acl_rules
from ._errors import HoldLimitError as HoldLimitError
from ._errors import LockLostError as LockLostError
from ._errors import LockNotOwnedError as LockNotOwnedError
from ._errors import LockTimeoutError as LockTimeoutError
from ._errors import LostLeaseError as LostLeaseError
from ._errors import MissingRecordError as MissingRecordError
from ._errors import NodeOutcome as NodeOutcome
from ._errors import QuorumUnavailableError as QuorumUnavailableError
from ._errors import RedlockError as RedlockError
from ._errors import StaleTokenError as StaleTokenError
from ._inspect import LockState as LockState
from ._inspect import NodeLockState as NodeLockState
from ._lease import Lease as Lease
from ._lock import Lock as Lock
from ._redlock import AsyncRedlock as AsyncRedlock
from ._rwlock import RWLock as RWLock
from ._semaphore import Semaphore as Semaphore
from ._stats import LeaseStatistics as LeaseStatistics
from ._stats import LockStatistics as LockStatistics
from ._stats import RedlockStatistics as RedlockStatistics
from ._stats import RWLockStatistics as RWLockStatistics
from ._timings import DurationStatistics as DurationStatistics
from ._timings import ResourceStatistics as ResourceStatistics
from ._version import __version__ as __version__

__all__ = [
    "AsyncRedlock",
    "DurationStatistics",
    "HoldLimitError",
    "Lease",
    "LeaseStatistics",
    "Lock",
    "LockLostError",
    "LockNotOwnedError",
    "LockState",
    "LockStatistics",
    "LockTimeoutError",
    "LostLeaseError",
    "MissingRecordError",
    "NodeLockState",
    "NodeOutcome",
    "QuorumUnavailableError",
    "RWLock",
    "RWLockStatistics",
    "RedlockError",
    "RedlockStatistics",
    "ResourceStatistics",
    "Semaphore",
    "StaleTokenError",
    "acl_rules",
]

# A library's logger: silent unless the application configures logging (the
# "No handlers could be found" fallback to stderr never applies).
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Tracebacks and reprs show asyncredlock.X, not the private module (as httpx does).
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
