"""engagelake: the customer-engagement API as vectorized rules over Delta Lake tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["IdempotencyKeyReused", "Response", "Workspace", "__version__"]

from engagelake.errors import IdempotencyKeyReused  # light: no heavy imports

if TYPE_CHECKING:
    from engagelake.routing import Response
    from engagelake.workspace import Workspace


def __getattr__(name: str) -> Any:
    # lazy, so that `engagelake --help` does not import polars, duckdb and deltalake
    if name in ("Workspace", "Response"):
        from engagelake import workspace

        return getattr(workspace, name)
    raise AttributeError(name)
