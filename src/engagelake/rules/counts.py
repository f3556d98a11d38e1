"""The request-level count limits of the bulk endpoints, read on a body's data before its pass.

A pass parses its bodies in DuckDB, which expands every element of every array before the
validation counts them: a 2.9 MiB track body of a million `{}` objects took 1.5 GiB. The router
reads each body as data anyway (`routing.Router._json_body`), so the counts are taken there, and
a body past a limit is refused before it joins a batch. Each function answers the message the
pass's own check gives, and only where the pass would give that very message: an earlier check
in the pass's order (a body that is no object, an array that is no list, an element that is no
object in an earlier array) is left to the pass, which answers it cheaply.
"""

from __future__ import annotations

from typing import Any

from engagelake.rules import messages as M
from engagelake.rules.identity.bulk_requests import IDENTIFY_ARRAYS
from engagelake.rules.identity.requests import MAX_ITEMS

TRACK_ARRAYS = ("attributes", "events", "purchases")
TRACK_MOST = 75  # objects in each of a track request's arrays


def track_too_many(body: Any) -> str | None:
    """`validate.fatal_errors`'s "at most 75 objects" for the first array past it, when the
    checks before it in that order (body, no arrays, and each earlier array: a list of at most
    75 objects) pass."""
    if not isinstance(body, dict) or not any(a in body for a in TRACK_ARRAYS):
        return None
    for array in TRACK_ARRAYS:
        if array not in body:
            continue
        items = body[array]
        if not isinstance(items, list):
            return None
        if len(items) > TRACK_MOST:
            return M.FATAL_TOO_MANY.format(array=array)
        if not all(isinstance(item, dict) for item in items):
            return None
    return None


def merge_too_many(body: Any) -> str | None:
    """`bulk_requests.parse_merges`'s "at most 50 objects" of `merge_updates`."""
    if isinstance(body, dict) and isinstance(items := body.get("merge_updates"), list) and len(items) > MAX_ITEMS:
        return M.LIST_TOO_MANY.format(field="merge_updates")
    return None


def identify_too_many(body: Any) -> str | None:
    """`bulk_requests.parse_identifies`'s limit of 50 elements in its three arrays together,
    when every one given is a list (a request with none, or with one that is no list, fails
    an earlier check)."""
    if not isinstance(body, dict):
        return None
    given = [body[field] for field, _ in IDENTIFY_ARRAYS if field in body]
    if given and all(isinstance(items, list) for items in given) and sum(map(len, given)) > MAX_ITEMS:
        return M.IDENTIFY_TOO_MANY
    return None


TOO_MANY = {"track": track_too_many, "merge": merge_too_many, "identify": identify_too_many}
