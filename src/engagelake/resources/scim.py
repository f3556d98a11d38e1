"""Endpoints of this resource (not built yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engagelake.routing import Handler

if TYPE_CHECKING:
    from engagelake.workspace import Workspace

ROUTES: dict[str, dict[str, Handler]] = {}


class Scim:
    """Friendly methods over `Workspace.call` for this resource (`ws.scim`)."""

    def __init__(self, ws: Workspace):
        self.ws = ws
