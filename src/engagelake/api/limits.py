"""Rate limits of the specification's Limits table, per workspace (one server process), in
fixed windows aligned on the epoch: a window of 60 s resets on the minute, and
`X-RateLimit-Reset` is the unix second it does. The routes the specification does not limit
take the hosted API's published limits (catalog definitions, preference center reads), so that
every route counts against one. An operator may also bound each key on its own (`key_limits`,
`serve --key-limit`): one key then cannot spend a workspace's whole budget.

Requests are counted after they are authenticated: a caller without a key cannot use up a
workspace's quota. Requests refused for their credential (no key, an unknown key or SCIM token,
a forged or expired link) count apart, per client address (`anonymous`). Per-object limits
(75 objects per array, 50 items) are the rules' business.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    requests: int
    seconds: int


DEFAULT_LIMITS: dict[str, Limit] = {
    "track": Limit(3_000, 3),
    "users": Limit(20_000, 60),  # merge, delete, alias new/update and identify, shared
    "export": Limit(250, 60),
    "external_ids": Limit(1_000, 60),  # rename (and remove, which the table does not name)
    "scim": Limit(5_000, 86_400),
    "preference_center": Limit(10, 60),  # POST and PUT
    # not in the specification: the hosted API's published limits of these routes (issue 56)
    "preference_center_reads": Limit(1_000, 60),  # list, details, link (the hosted "url"), staff page
    "catalogs": Limit(50, 60),  # GET and POST /catalogs, shared
    "catalog_items": Limit(16_000, 60),  # PUT and DELETE, shared
    "translations": Limit(250_000, 86_400),
    # the hosted API's: among the endpoints sharing 250,000 requests per hour (issue 53)
    "subscription_reads": Limit(250_000, 3_600),  # GET status/get and user/status, shared
    "subscription_writes": Limit(5_000, 60),  # POST status/set and v2, shared
    "email_lists": Limit(250_000, 3_600),  # the six /email/ endpoints, shared
    # not in the specification: a recipient's page and its form, counted per link (its token),
    # so that one leaked link cannot keep the writer busy; a person opens and saves a few times
    "recipient_page": Limit(60, 60),
    # not in the specification either: requests refused for their credential (no key, an
    # unknown or revoked key or SCIM token, a forged or expired link), per client address;
    # past it they answer 429 (issue 56). A credential that holds is never counted here
    "anonymous": Limit(60, 60),
}
PER_LINK = "recipient_page"
PER_ADDRESS = "anonymous"
WINDOWS_KEPT = 10_000  # windows of per-link limits kept before those that ended are dropped

# (method, route pattern) -> the limit it counts against: every route an API key or SCIM token
# opens (the signed-link routes count per link, PER_LINK)
LIMITED: dict[tuple[str, str], str] = {
    ("POST", "/users/track"): "track",
    ("POST", "/users/merge"): "users",
    ("POST", "/users/delete"): "users",
    ("POST", "/users/alias/new"): "users",
    ("POST", "/users/alias/update"): "users",
    ("POST", "/users/identify"): "users",
    ("POST", "/users/export/ids"): "export",
    ("POST", "/users/external_ids/rename"): "external_ids",
    ("POST", "/users/external_ids/remove"): "external_ids",
    ("POST", "/scim/v2/Users"): "scim",
    ("GET", "/scim/v2/Users"): "scim",
    ("GET", "/scim/v2/Users/{id}"): "scim",
    ("PUT", "/scim/v2/Users/{id}"): "scim",
    ("DELETE", "/scim/v2/Users/{id}"): "scim",
    ("POST", "/preference_center/v1"): "preference_center",
    ("PUT", "/preference_center/v1/{preferenceCenterExternalID}"): "preference_center",
    ("PUT", "/preference_center/v1/public_url"): "preference_center",
    ("GET", "/preference_center/v1/list"): "preference_center_reads",
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}"): "preference_center_reads",
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}/link"): "preference_center_reads",
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}/page"): "preference_center_reads",
    ("GET", "/catalogs"): "catalogs",
    ("POST", "/catalogs"): "catalogs",
    ("PUT", "/catalogs/{catalog_name}/items"): "catalog_items",
    ("DELETE", "/catalogs/{catalog_name}/items"): "catalog_items",
    ("GET", "/campaigns/translations"): "translations",
    ("GET", "/campaign/translations"): "translations",
    ("GET", "/subscription/status/get"): "subscription_reads",
    ("GET", "/subscription/user/status"): "subscription_reads",
    ("POST", "/subscription/status/set"): "subscription_writes",
    ("POST", "/v2/subscription/status/set"): "subscription_writes",
    ("POST", "/email/status"): "email_lists",
    ("POST", "/email/blocklist"): "email_lists",
    ("POST", "/email/bounce/remove"): "email_lists",
    ("POST", "/email/spam/remove"): "email_lists",
    ("GET", "/email/unsubscribes"): "email_lists",
    ("GET", "/email/hard_bounces"): "email_lists",
}


# the limits a key can be held to on its own: the endpoints', not those counted per link or address
KEY_LIMIT_NAMES = tuple(dict.fromkeys(LIMITED.values()))


def parse_limit(text: str, names: tuple[str, ...] = tuple(DEFAULT_LIMITS)) -> tuple[str, Limit]:
    """`track=3000/3` -> ("track", Limit(3000, 3)), NAME one of `names`; ValueError saying what
    is expected."""
    name, _, value = text.partition("=")
    count, _, seconds = value.partition("/")
    if name not in names or not count.isdigit() or not seconds.isdigit() or int(seconds) < 1:
        raise ValueError(f"expected NAME=REQUESTS/SECONDS with NAME one of {', '.join(names)}, "
                         f"got {text!r}")
    return name, Limit(int(count), int(seconds))


class RateLimiter:
    """Counts requests per limit and window. `clock()` gives unix seconds (injectable)."""

    def __init__(self, limits: dict[str, Limit], clock: Callable[[], float] = time.time):
        self.limits = limits
        self.clock = clock
        # (name, who: "" for a workspace's limit, what a link names for PER_LINK, a client
        # address for PER_ADDRESS) -> (window start, requests counted)
        self._windows: dict[tuple[str, str], tuple[int, int]] = {}
        self._prune_at = WINDOWS_KEPT  # drop the windows that ended once this many are kept
        self._lock = threading.Lock()

    def hit(self, name: str, who: str = "") -> tuple[bool, dict[str, str]]:
        """Count one request against `name` (for `who`, when the limit is not the workspace's):
        (allowed, the X-RateLimit-* headers)."""
        limit = self.limits[name]
        now = self.clock()
        start = math.floor(now / limit.seconds) * limit.seconds
        with self._lock:
            if len(self._windows) > self._prune_at:  # windows that ended count nothing any more
                self._windows = {k: w for k, w in self._windows.items()
                                 if w[0] + self.limits[k[0]].seconds > now}
                # many links live at once: the next pass waits until the windows have doubled,
                # so that each request's share of the passes stays constant
                self._prune_at = max(WINDOWS_KEPT, 2 * len(self._windows))
            window, used = self._windows.get((name, who), (start, 0))
            if window != start:
                used = 0
            allowed = used < limit.requests
            used += allowed
            self._windows[(name, who)] = (start, used)
        headers = {"X-RateLimit-Limit": str(limit.requests),
                   "X-RateLimit-Remaining": str(limit.requests - used),
                   "X-RateLimit-Reset": str(start + limit.seconds)}
        return allowed, headers
