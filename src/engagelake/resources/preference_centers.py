"""Endpoints of this resource (not built yet)."""

from __future__ import annotations

from engagelake.routing import Handler

ROUTES: dict[str, dict[str, Handler]] = {}
