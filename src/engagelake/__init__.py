"""engagelake: the customer-engagement API as vectorized rules over Delta Lake tables."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Polars' allocator (jemalloc) gives freed pages back to the system after 0.5-1 s, and a batch
# then faults them in again, zeroed: a pass of 200k objects faulted 1.2 GiB of pages, half of
# them again (about 5 us each here: a fifth of P1's CPU was the kernel's). Kept 10 s, jemalloc's
# own default, a batch reuses them: 1M objects took 0.57x the page faults and 0.70x the system
# time (docs/performance.md). Read once, when Polars is loaded: this takes effect when
# engagelake is imported first, and a value the environment sets wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:10000,muzzy_decay_ms:10000")

__version__ = "0.1.0"
__all__ = [
    "IdempotencyKeyReused", "IdempotentResponsesExpired", "NotAStore", "Response", "StoreDamaged", "StoreError", "StoreExists", "StoreReadOnly",
    "Workspace", "__version__",
]  # fmt: skip

from engagelake.errors import (  # light: no heavy imports
    IdempotencyKeyReused,
    IdempotentResponsesExpired,
    NotAStore,
    StoreDamaged,
    StoreError,
    StoreExists,
    StoreReadOnly,
)

if TYPE_CHECKING:
    from engagelake.routing import Response
    from engagelake.workspace import Workspace


def __getattr__(name: str) -> Any:
    # lazy, so that `engagelake --help` does not import polars, duckdb and deltalake
    if name in ("Workspace", "Response"):
        from engagelake import workspace

        return getattr(workspace, name)
    raise AttributeError(name)
