"""Identity endpoints: merge, identify, external ID rename/remove, aliases, delete."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engagelake.rules.state import Changes, State

IDENTITY_PATHS: dict[str, str] = {}


@dataclass
class IdentityOutcome:
    responses: dict[int, tuple[int, Any]] = field(default_factory=dict)
    changes: Changes = field(default_factory=Changes)
    next_update_seq: int = 0


def apply_identity(state: State, kind: str, pending: list[tuple[int, str]], *, clock: datetime, seed: str,
                   batch: str) -> IdentityOutcome:
    raise NotImplementedError(kind)
