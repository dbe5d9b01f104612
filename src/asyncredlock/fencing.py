"""Resource-side fencing guards: the resource refuses writes from superseded holders.

A lease's fencing token (``lease.token``) strictly increases with each acquisition of
its resource. Send it with every write and let the resource keep the newest token it
accepted: a holder that was paused or delayed past the end of its lease then carries an
older token than its successor, and its writes are refused with `StaleTokenError`.

- `FenceGuard`: in memory, for resources inside one process and for tests.
- `FencedStore`: a fenced key/value store in Redis, one atomic script per write.
- `SQLFence`: fenced ``UPDATE`` and upsert statements for a table with a fence column.
- `check_token`: checks that a lease has a token before it is sent.

```python
from asyncredlock.fencing import SQLFence, check_token

fence = SQLFence("orders")
async with redlock.lock("orders:42") as lease:
    fence.update(db, 42, {"status": "paid"}, check_token(lease.token))
    db.commit()
```
"""

from __future__ import annotations

from ._errors import MissingRecordError as MissingRecordError
from ._errors import StaleTokenError as StaleTokenError
from ._fencing import FencedStore as FencedStore
from ._fencing import FencedValue as FencedValue
from ._fencing import FenceGuard as FenceGuard
from ._fencing import check_token as check_token
from ._sqlfence import SQLFence as SQLFence

__all__ = [
    "FenceGuard",
    "FencedStore",
    "FencedValue",
    "MissingRecordError",
    "SQLFence",
    "StaleTokenError",
    "check_token",
]

# Tracebacks and reprs show asyncredlock.fencing.X, not the private module (as httpx
# does). The two errors are also exported by asyncredlock, which names them.
for _name in __all__:
    if _name not in ("MissingRecordError", "StaleTokenError"):
        globals()[_name].__module__ = __name__
del _name
