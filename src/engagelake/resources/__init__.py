"""Workspace resources answered by handlers: SCIM dashboard users, preference centers,
catalogs, campaign translations, subscription group reads and writes, email lists. Each module exports `ROUTES: {pattern: {METHOD: handler}}`."""

from __future__ import annotations

from engagelake.resources import (
    campaigns,
    catalogs,
    email_lists,
    preference_centers,
    scim,
    subscription_writes,
    subscriptions,
)
from engagelake.routing import Handler

RESOURCE_ROUTES: dict[str, dict[str, Handler]] = {
    **scim.ROUTES, **preference_centers.ROUTES, **catalogs.ROUTES, **campaigns.ROUTES,
    **subscriptions.ROUTES, **subscription_writes.ROUTES, **email_lists.ROUTES,
}
