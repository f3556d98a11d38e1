"""engagelake: the customer-engagement API as vectorized rules over Delta Lake tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from engagelake.version import __version__

if TYPE_CHECKING:
    from engagelake.routing import Response
    from engagelake.workspace import Workspace


def __getattr__(name: str) -> Any:
    # lazy, so that `engagelake --help` does not import polars, duckdb and deltalake
    if name in ("Workspace", "Response"):
        from engagelake import workspace

        return getattr(workspace, name)
    raise AttributeError(name)
