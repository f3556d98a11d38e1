"""Which API key permission each endpoint needs over HTTP: one table for the server, the key
commands and the docs (`docs/server.md` prints it).

The specification names the permissions of its endpoints; the referenced user endpoints take
the names the hosted platform gives them; the rest are named in the same style
(`<resource>.<verb>`). SCIM endpoints take a SCIM token instead of a key, and a preference
center's form submit takes the signed link it was rendered with.
"""

from __future__ import annotations

SCIM = "scim"  # a SCIM token and its X-Request-Origin
SIGNED_LINK = "signed_link"  # the token of a rendered page's submit URL
ALL = "all"  # a key holding every permission, today's and future ones

# (method, route pattern) -> the permission of an API key, or SCIM / SIGNED_LINK
ENDPOINT_PERMISSIONS: dict[tuple[str, str], str] = {
    ("POST", "/users/track"): "users.track",
    ("POST", "/users/merge"): "users.merge",
    ("POST", "/users/identify"): "users.identify",
    ("POST", "/users/export/ids"): "users.export.ids",
    ("POST", "/users/external_ids/rename"): "users.external_ids.rename",
    ("POST", "/users/external_ids/remove"): "users.external_ids.remove",
    ("POST", "/users/alias/new"): "users.alias.new",
    ("POST", "/users/alias/update"): "users.alias.update",
    ("POST", "/users/delete"): "users.delete",
    ("POST", "/preference_center/v1"): "preference_center.update",
    ("PUT", "/preference_center/v1/{preferenceCenterExternalID}"): "preference_center.update",
    ("GET", "/preference_center/v1/list"): "preference_center.list",
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}"): "preference_center.get",
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}/page"): "preference_center.get",
    ("POST", "/preference_center/v1/{preferenceCenterExternalID}/submit"): SIGNED_LINK,
    # a link lets its holder change a user's subscriptions: a permission of its own
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}/link"): "preference_center.link",
    ("PUT", "/preference_center/v1/public_url"): "preference_center.update",
    ("GET", "/preferences/{preferenceCenterExternalID}"): SIGNED_LINK,
    ("POST", "/preferences/{preferenceCenterExternalID}"): SIGNED_LINK,
    ("GET", "/catalogs"): "catalogs.get",
    ("POST", "/catalogs"): "catalogs.create",
    ("PUT", "/catalogs/{catalog_name}/items"): "catalogs.replace_items",
    ("DELETE", "/catalogs/{catalog_name}/items"): "catalogs.delete_items",
    ("GET", "/campaigns/translations"): "campaigns.translations.get",
    ("GET", "/campaign/translations"): "campaigns.translations.get",
    # the hosted API's names (issue 53)
    ("GET", "/subscription/status/get"): "subscription.status.get",
    ("GET", "/subscription/user/status"): "subscription.groups.get",
    ("POST", "/subscription/status/set"): "subscription.status.set",
    ("POST", "/v2/subscription/status/set"): "subscription.status.set",
    ("POST", "/email/status"): "email.status",
    ("POST", "/email/blocklist"): "email.blacklist",  # the hosted API's name, from before "blocklist"
    ("POST", "/email/bounce/remove"): "email.bounce.remove",
    ("POST", "/email/spam/remove"): "email.spam.remove",
    ("GET", "/email/unsubscribes"): "email.unsubscribe",
    ("GET", "/email/hard_bounces"): "email.hard_bounces",
    ("POST", "/scim/v2/Users"): SCIM,
    ("GET", "/scim/v2/Users"): SCIM,
    ("GET", "/scim/v2/Users/{id}"): SCIM,
    ("PUT", "/scim/v2/Users/{id}"): SCIM,
    ("DELETE", "/scim/v2/Users/{id}"): SCIM,
}

KEY_PERMISSIONS: tuple[str, ...] = tuple(sorted(
    {p for p in ENDPOINT_PERMISSIONS.values() if p not in (SCIM, SIGNED_LINK)}))


def check_permissions(names: list[str]) -> list[str]:
    """The permissions a key is created with, checked: `all`, or known names (sorted, once each).
    Raises ValueError naming what is unknown and what is known."""
    cleaned = sorted({n.strip() for n in names if n.strip()})
    if not cleaned:
        raise ValueError(f"a key needs at least one permission; known: {ALL}, {', '.join(KEY_PERMISSIONS)}")
    if ALL in cleaned:
        if len(cleaned) > 1:
            raise ValueError(f"'{ALL}' already holds every permission: give it alone")
        return [ALL]
    unknown = [n for n in cleaned if n not in KEY_PERMISSIONS]
    if unknown:
        raise ValueError(f"unknown permission {', '.join(map(repr, unknown))}; known: {ALL}, "
                         f"{', '.join(KEY_PERMISSIONS)}")
    return cleaned
