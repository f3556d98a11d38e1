"""The route table of the one dispatch: the user endpoints the batch runs itself (`batch.py`)
and every resource handler (`resources/`), compiled into the router `apply` routes by
(`routing.Router`) and the server checks permissions by (`route_of`).

It lives here, above `resources/`, because `resources/` import `routing.py`: the router
cannot import the handlers it routes to without an import circle.
"""

from __future__ import annotations

from engagelake.resources import RESOURCE_ROUTES
from engagelake.resources.catalogs import CHECKS_NUMBERS
from engagelake.routing import Handler, Router
from engagelake.rules.identity.endpoints import IDENTITY_PATHS

# Endpoints the batch runs itself: track passes, export reads, identity runs.
USER_ROUTES: dict[str, dict[str, str]] = {
    "/users/track": {"POST": "track"},
    "/users/export/ids": {"POST": "export"},
    **{path: {"POST": kind} for kind, path in IDENTITY_PATHS.items()},
}
ROUTE_TABLE: dict[str, dict[str, str | Handler]] = {
    **{p: dict(m) for p, m in USER_ROUTES.items()}, **{p: dict(m) for p, m in RESOURCE_ROUTES.items()}}
ROUTER = Router(ROUTE_TABLE, checks_numbers=CHECKS_NUMBERS)
route_of = ROUTER.route_of
