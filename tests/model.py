"""In-memory reference model of the user endpoints: track, export, the identity endpoints and
the subscription group writes.

This is the oracle the property tests run beside the vectorized engine. It is deliberately plain:
profiles are dicts in a list, every object is processed one at a time, in the documented order
(each request in turn; inside a track request all attributes, then events, then purchases; inside
an identity request every item in array order). Every rule comes from the specification,
`docs/semantics.md` and `docs/identity.md`; error texts
are imported from `engagelake.rules.messages`.

Identity endpoints: `/users/merge`, `/users/identify`, `/users/external_ids/rename`,
`/users/external_ids/remove`, `/users/alias/new`, `/users/alias/update`, `/users/delete`. Each
item of an identity request takes the next update sequence number, applied or skipped. A merged,
identified-away or deleted profile leaves `self.profiles` (and with it every identifier, attribute,
event, purchase and token it still held). The lineage (`merges`) table is not modelled.

Choices made where the documents are silent are marked `DECISION:` in the code.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import zoneinfo
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

from engagelake.resources import email_lists as el
from engagelake.resources import subscription_writes as sw
from engagelake.rules import messages as m
from engagelake.rules.reference import COUNTRY_CODES, LANGUAGE_CODES

TRACK_PATH = "/users/track"
EXPORT_PATH = "/users/export/ids"
MERGE_PATH = "/users/merge"
IDENTIFY_PATH = "/users/identify"
RENAME_PATH = "/users/external_ids/rename"
REMOVE_PATH = "/users/external_ids/remove"
ALIAS_NEW_PATH = "/users/alias/new"
ALIAS_UPDATE_PATH = "/users/alias/update"
DELETE_PATH = "/users/delete"
IDENTITY_PATHS = (
    MERGE_PATH,
    IDENTIFY_PATH,
    RENAME_PATH,
    REMOVE_PATH,
    ALIAS_NEW_PATH,
    ALIAS_UPDATE_PATH,
    DELETE_PATH,
)
# the subscription group writes of the hosted API (issue 53, docs/semantics.md)
SUBSCRIPTION_SET_PATH = "/subscription/status/set"
SUBSCRIPTION_SET_V2_PATH = "/v2/subscription/status/set"
# the email lists (issue 53, docs/semantics.md "Email lists")
EMAIL_STATUS_PATH = "/email/status"
EMAIL_BLOCKLIST_PATH = "/email/blocklist"
EMAIL_BOUNCE_REMOVE_PATH = "/email/bounce/remove"
EMAIL_SPAM_REMOVE_PATH = "/email/spam/remove"
EMAIL_UNSUBSCRIBES_PATH = "/email/unsubscribes"
EMAIL_HARD_BOUNCES_PATH = "/email/hard_bounces"
EMAIL_WRITE_PATHS = (EMAIL_STATUS_PATH, EMAIL_BLOCKLIST_PATH, EMAIL_BOUNCE_REMOVE_PATH, EMAIL_SPAM_REMOVE_PATH)
ENDPOINTS = {
    **{
        path: ("POST",)
        for path in (TRACK_PATH, EXPORT_PATH, *IDENTITY_PATHS, SUBSCRIPTION_SET_PATH, SUBSCRIPTION_SET_V2_PATH,
                     *EMAIL_WRITE_PATHS)
    },
    EMAIL_UNSUBSCRIBES_PATH: ("GET",),
    EMAIL_HARD_BOUNCES_PATH: ("GET",),
}
MAX_SUBSCRIPTION_USERS = 50  # of each kind, per entry
MAX_SUBSCRIPTION_ENTRIES = 50  # of a v2 request

MAX_IDENTITY_ITEMS = 50
# Profile fields a merge copies where the target has none (docs/identity.md, merge).
MERGE_FIELDS = (
    "first_name",
    "last_name",
    "email",
    "gender",
    "dob",
    "phone",
    "time_zone",
    "home_city",
    "country",
    "language",
)
# Identify with merge_behavior "merge": the same list without email.
IDENTIFY_MERGE_FIELDS = tuple(f for f in MERGE_FIELDS if f != "email")

MAX_OBJECTS = 75
MAX_ARRAY = 500
MAX_DEPTH = 50
MAX_STRING = 255
EXPORT_MAX_IDS = 50
WINDOW = timedelta(days=90)
# DECISION: "KB" is 1024 bytes.
PROPERTIES_LIMIT_NESTED = 100 * 1024
PROPERTIES_LIMIT_FLAT = 50 * 1024

_TIME_ZONES = frozenset(zoneinfo.available_timezones())
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_PHONE_RE = re.compile(r"\+?([1-9][0-9]{7,14})")
_DOB_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_CURRENCY_RE = re.compile(r"[A-Z]{3}")
_TIME_RE = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})T(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})"
    r"(?:\.(?P<frac>[0-9]+)|:(?P<ms>[0-9]{3}))?"
    r"(?P<zone>Z|[+-][0-9]{2}:?[0-9]{2})"
)


# --------------------------------------------------------------------------------------------
# small pure helpers
# --------------------------------------------------------------------------------------------


def service_id_for(seed: str, n: int) -> str:
    """The service_id of the n-th profile ever created in a store with this seed."""
    return hashlib.sha256(f"{seed}:{n}".encode()).hexdigest()[:24]


def random_bucket_for(service_id: str) -> int:
    return int(service_id[:8], 16) % 10000


def format_ts(dt: datetime) -> str:
    """ISO 8601 UTC with milliseconds (truncated): 2026-11-22T00:00:00.000Z."""
    dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def canonical(value: Any) -> str:
    """Canonical JSON: the equality of values inside arrays (1 and 1.0 differ, so do 1 and true)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def normalize_email(v: Any) -> str | None:
    """Trimmed, lower-cased address, or None when not a valid address."""
    if not isinstance(v, str):
        return None
    s = v.strip().lower()
    if len(s) > MAX_STRING or not _EMAIL_RE.fullmatch(s):
        return None
    return s


def normalize_phone(v: Any) -> str | None:
    """E.164 `+digits`, or None when not valid."""
    if not isinstance(v, str):
        return None
    s = v
    for ch in " .-()":
        s = s.replace(ch, "")
    match = _PHONE_RE.fullmatch(s)
    return "+" + match.group(1) if match else None


def parse_time(v: Any) -> datetime | None:
    """Event/purchase time in UTC (microsecond precision), or None when invalid."""
    if not isinstance(v, str):
        return None
    match = _TIME_RE.fullmatch(v)
    if not match:
        return None
    try:
        day = date.fromisoformat(match["date"])
        if match["frac"] is not None:
            # DECISION: digits beyond microseconds are truncated.
            micro = int((match["frac"] + "000000")[:6])
        elif match["ms"] is not None:
            micro = int(match["ms"]) * 1000
        else:
            micro = 0
        zone = match["zone"]
        if zone == "Z":
            tz = UTC
        else:
            digits = zone[1:].replace(":", "")
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            if int(digits[2:]) >= 60:
                return None
            tz = timezone(-offset if zone[0] == "-" else offset)
        dt = datetime(
            day.year,
            day.month,
            day.day,
            int(match["h"]),
            int(match["mi"]),
            int(match["s"]),
            micro,
            tzinfo=tz,
        )
    except ValueError:
        return None
    return dt.astimezone(UTC)


def valid_dob(v: Any) -> bool:
    if not isinstance(v, str) or not _DOB_RE.fullmatch(v):
        return False
    try:
        datetime.strptime(v, "%Y-%m-%d")
    except ValueError:
        return False
    return True


def object_depth(v: Any) -> int:
    """Nesting depth counting object levels only: {"a": {"b": 1}} is 2, [{"a": 1}] is 1."""
    if isinstance(v, dict):
        return 1 + max((object_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return max((object_depth(x) for x in v), default=0)
    return 0


def ordered_set(values: list[Any]) -> list[Any]:
    """A plain array as an ordered set: a repeated value keeps its last place only."""
    out: list[Any] = []
    for v in values:
        key = canonical(v)
        out = [x for x in out if canonical(x) != key]
        out.append(copy.deepcopy(v))
    return out


def cap(values: list[Any]) -> list[Any]:
    """At most the 500 newest (last) values."""
    return values[-MAX_ARRAY:]


def attribute_op(value: Any) -> str:
    """ "inc", "array" (add/remove) or "set"."""
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"inc"}:
            return "inc"
        if keys and keys <= {"add", "remove"}:
            return "array"
    return "set"


def _present(obj: dict, key: str) -> bool:
    """A key holding null counts as absent."""
    return obj.get(key) is not None


# --------------------------------------------------------------------------------------------
# static validation of one /users/track object
# --------------------------------------------------------------------------------------------


def _identifier(obj: dict) -> tuple[str | None, Any, str | None]:
    """(kind, normalized value, error). kind in external_id, user_alias, service_id, email, phone."""
    strong = [k for k in ("external_id", "user_alias", "service_id") if _present(obj, k)]
    if len(strong) >= 2:
        return None, None, m.ERR_MULTIPLE_IDENTIFIERS
    if strong == ["external_id"]:
        v = obj["external_id"]
        if not isinstance(v, str) or v == "":
            return None, None, m.ERR_EXTERNAL_ID
        return "external_id", v, None
    if strong == ["user_alias"]:
        v = obj["user_alias"]
        ok = (
            isinstance(v, dict)
            and isinstance(v.get("alias_name"), str)
            and v["alias_name"] != ""
            and isinstance(v.get("alias_label"), str)
            and v["alias_label"] != ""
        )
        if not ok:
            return None, None, m.ERR_USER_ALIAS
        return "user_alias", (v["alias_name"], v["alias_label"]), None
    if strong == ["service_id"]:
        v = obj["service_id"]
        if not isinstance(v, str) or v == "":
            return None, None, m.ERR_SERVICE_ID
        return "service_id", v, None
    if _present(obj, "email"):
        e = normalize_email(obj["email"])
        return ("email", e, None) if e is not None else (None, None, m.ERR_EMAIL)
    if _present(obj, "phone"):
        p = normalize_phone(obj["phone"])
        return ("phone", p, None) if p is not None else (None, None, m.ERR_PHONE)
    return None, None, m.ERR_MISSING_IDENTIFIER


def _field_error(field: str, v: Any) -> str | None:
    """Error of one profile field value (null already excluded)."""
    if field in m.STRING_FIELDS:
        ok = isinstance(v, str) and len(v) <= MAX_STRING
        return None if ok else m.ERR_FIELD_STRING.format(field=field)
    if field == "email":
        return None if normalize_email(v) is not None else m.ERR_EMAIL
    if field == "phone":
        return None if normalize_phone(v) is not None else m.ERR_PHONE
    if field == "dob":
        return None if valid_dob(v) else m.ERR_DOB
    if field == "gender":
        return None if isinstance(v, str) and v in m.GENDERS else m.ERR_GENDER
    if field == "country":
        return None if isinstance(v, str) and v.upper() in COUNTRY_CODES else m.ERR_COUNTRY
    if field == "language":
        return None if isinstance(v, str) and v.lower() in LANGUAGE_CODES else m.ERR_LANGUAGE
    if field == "time_zone":
        return None if isinstance(v, str) and v in _TIME_ZONES else m.ERR_TIME_ZONE
    if field in ("email_subscribe", "push_subscribe"):
        ok = isinstance(v, str) and v in m.SUBSCRIBE_STATES
        return None if ok else m.ERR_SUBSCRIBE.format(field=field)
    if field == "last_coordinates":
        ok = (
            isinstance(v, list)
            and len(v) == 2
            and all(is_number(x) for x in v)
            and -180 <= v[0] <= 180
            and -90 <= v[1] <= 90
        )
        return None if ok else m.ERR_COORDINATES
    raise AssertionError(field)


def _push_tokens_error(v: Any) -> str | None:
    """push_tokens: null or absent is fine (nothing to do)."""
    if v is None:
        return None
    if not isinstance(v, list):
        return m.ERR_PUSH_TOKENS
    for t in v:
        if not isinstance(t, dict):
            return m.ERR_PUSH_TOKENS
        for key in ("app_id", "token"):
            if not isinstance(t.get(key), str) or t[key] == "":
                return m.ERR_PUSH_TOKENS
        # DECISION: device_id null is the same as absent.
        if t.get("device_id") is not None and not isinstance(t["device_id"], str):
            return m.ERR_PUSH_TOKENS
    return None


def _subscription_groups_error(v: Any) -> str | None:
    if not isinstance(v, list):
        return m.ERR_SUBSCRIPTION_GROUPS
    for g in v:
        ok = (
            isinstance(g, dict)
            and isinstance(g.get("subscription_group_id"), str)
            and g["subscription_group_id"] != ""
            and g.get("subscription_state") in m.GROUP_STATES
        )
        if not ok:
            return m.ERR_SUBSCRIPTION_GROUPS
    return None


def _custom_attribute_error(name: str, value: Any) -> str | None:
    if name == "" or len(name) > MAX_STRING or name.startswith("$"):
        return m.ERR_ATTRIBUTE_NAME
    op = attribute_op(value)
    if op == "inc":
        return None if is_int(value["inc"]) else m.ERR_INC_VALUE
    if op == "array":
        for key in ("add", "remove"):
            if key in value and not isinstance(value[key], list):
                return m.ERR_ADD_REMOVE_VALUE
        # DECISION: the elements added or removed obey the same nesting limit as stored values.
        if object_depth([value.get("add", []), value.get("remove", [])]) > MAX_DEPTH:
            return m.ERR_ATTRIBUTE_DEPTH
        return None
    if isinstance(value, str) and len(value) > MAX_STRING:
        return m.ERR_ATTRIBUTE_STRING
    if object_depth(value) > MAX_DEPTH:
        return m.ERR_ATTRIBUTE_DEPTH
    return None


def _properties_error(obj: dict) -> str | None:
    props = obj.get("properties")
    if props is None:  # null is treated as absent
        return None
    if not isinstance(props, dict):
        return m.ERR_PROPERTIES
    for key in props:
        if key == "" or len(key) >= MAX_STRING or key.startswith("$"):
            return m.ERR_PROPERTY_NAME
    nested = any(isinstance(v, dict | list) for v in props.values())
    limit = PROPERTIES_LIMIT_NESTED if nested else PROPERTIES_LIMIT_FLAT
    if len(canonical_compact(props).encode()) > limit:
        return m.ERR_PROPERTIES_SIZE
    return None


def canonical_compact(value: Any) -> str:
    """Compact JSON in key order as sent (the properties size)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _app_id_error(obj: dict) -> str | None:
    # DECISION: app_id null is the same as absent.
    v = obj.get("app_id")
    return None if v is None or isinstance(v, str) else m.ERR_APP_ID


def _event_error(obj: dict) -> str | None:
    name = obj.get("name")
    if not isinstance(name, str) or name == "" or len(name) > MAX_STRING:
        return m.ERR_EVENT_NAME
    if parse_time(obj.get("time")) is None:
        return m.ERR_TIME
    return _app_id_error(obj) or _properties_error(obj)


def _purchase_error(obj: dict) -> str | None:
    pid = obj.get("product_id")
    if not isinstance(pid, str) or pid == "" or len(pid) > MAX_STRING:
        return m.ERR_PRODUCT_ID
    cur = obj.get("currency")
    if not isinstance(cur, str) or not _CURRENCY_RE.fullmatch(cur):
        return m.ERR_CURRENCY
    if not is_number(obj.get("price")):
        return m.ERR_PRICE
    # DECISION: quantity null is the same as absent (default 1).
    qty = obj.get("quantity")
    if qty is not None and not (is_int(qty) and 1 <= qty <= 100):
        return m.ERR_QUANTITY
    if parse_time(obj.get("time")) is None:
        return m.ERR_TIME
    return _app_id_error(obj) or _properties_error(obj)


def field_updates(obj: dict, kind: str) -> list[str]:
    """Profile fields the attributes object updates (the identifying email/phone excluded)."""
    return [f for f in m.PROFILE_FIELD_ORDER if f in obj and f != kind]


def custom_names(obj: dict) -> list[str]:
    return [k for k in obj if k not in m.RESERVED_NAMES]


def static_error(array: str, obj: dict) -> tuple[str | None, str | None, Any]:
    """(error, identifier kind, identifier value) after every static check of one object."""
    if array == "attributes":
        pti = obj.get("push_token_import")
        # DECISION: push_token_import null counts as absent (like _update_existing_only null).
        if pti is not None and not isinstance(pti, bool):
            return m.ERR_PUSH_TOKEN_IMPORT, None, None
        if pti is True:
            return _push_tokens_error(obj.get("push_tokens")), "push_token_import", None
    ueo = obj.get("_update_existing_only")
    if ueo is not None and not isinstance(ueo, bool):
        return m.ERR_UPDATE_EXISTING_ONLY, None, None
    kind, ident, err = _identifier(obj)
    if err:
        return err, None, None
    assert kind is not None
    if array == "attributes":
        for f in field_updates(obj, kind):
            if obj[f] is not None and (err := _field_error(f, obj[f])):
                return err, None, None
        if err := _push_tokens_error(obj.get("push_tokens")):
            return err, None, None
        if obj.get("subscription_groups") is not None and (
            err := _subscription_groups_error(obj["subscription_groups"])
        ):
            return err, None, None
        for name in custom_names(obj):
            if err := _custom_attribute_error(name, obj[name]):
                return err, None, None
    elif array == "events":
        if err := _event_error(obj):
            return err, None, None
    else:
        if err := _purchase_error(obj):
            return err, None, None
    return None, kind, ident


# --------------------------------------------------------------------------------------------
# identity request checks
# --------------------------------------------------------------------------------------------

IDENTIFY_ARRAYS = {
    "aliases_to_identify": "user_alias",
    "emails_to_identify": "email",
    "phone_numbers_to_identify": "phone",
}
DELETE_KEYS = {
    "external_ids": "external_id",
    "user_aliases": "user_alias",
    "service_ids": "service_id",
}


def _non_empty_string(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _valid_alias(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _non_empty_string(v.get("alias_name"))
        and _non_empty_string(v.get("alias_label"))
    )


def _blocked(ext: str) -> bool:
    return ext.strip().lower() in m.BLOCKED_EXTERNAL_IDS


def _recency(p: dict) -> tuple:
    """ "Most recently updated" order: updated_at, then update sequence, then creation."""
    return (p["updated_at"], p["update_seq"], p["n"])


def identifier_value(kind: str, v: Any) -> tuple[Any, str | None]:
    """(normalized value, None) or (None, track's error text) for one identifier kind."""
    if kind == "external_id":
        return (v, None) if _non_empty_string(v) else (None, m.ERR_EXTERNAL_ID)
    if kind == "service_id":
        return (v, None) if _non_empty_string(v) else (None, m.ERR_SERVICE_ID)
    if kind == "user_alias":
        if _valid_alias(v):
            return (v["alias_name"], v["alias_label"]), None
        return None, m.ERR_USER_ALIAS
    if kind == "email":
        e = normalize_email(v)
        return (e, None) if e is not None else (None, m.ERR_EMAIL)
    ph = normalize_phone(v)
    return (ph, None) if ph is not None else (None, m.ERR_PHONE)


def prioritization_error(rules: Any, where: str) -> str | None:
    if (
        not isinstance(rules, list)
        or not rules
        or not all(isinstance(r, str) and r in m.PRIORITIZATION_VALUES for r in rules)
    ):
        return m.PRIORITIZATION.format(where=where)
    if "identified" in rules and "unidentified" in rules:
        return m.PRIORITIZATION_BOTH.format(where=where)
    return None


def parse_identifier(side: dict, where: str) -> tuple[str | None, Any]:
    """(error, None) or (None, (kind, normalized value, prioritization or None)) of a merge side.

    Exactly one identifier kind; `prioritization` is required beside email/phone and ignored
    beside the others. DECISION: a key counts as given whatever it holds (null too: unlike
    track, the contract says "exactly one of"); the value is checked before the prioritization.
    """
    present = [k for k in m.IDENTIFIER_FIELDS if k in side]
    if len(present) != 1:
        return m.IDENTIFIER_ONE_OF.format(where=where), None
    kind = present[0]
    value, err = identifier_value(kind, side[kind])
    if err:
        return m.IDENTIFIER_INVALID.format(where=where, error=err), None
    rules = None
    if kind in ("email", "phone"):
        if err := prioritization_error(side.get("prioritization"), where):
            return err, None
        rules = list(side["prioritization"])
    return None, (kind, value, rules)


# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------


class Model:
    """Sequential in-memory reference of track, export and the identity endpoints."""

    def __init__(self, clock: Callable[[], datetime], seed: str) -> None:
        self.clock = clock
        self.seed = seed
        self.profiles: list[dict] = []  # live profiles in creation order
        self.created = 0  # profiles ever created (the n of service_id)
        # store-wide update_seq counter: one step per applied track object, per push token
        # import object, and per identity item (applied or skipped)
        self.seq = 0
        self.tokens_received = 0  # stamps push token rows in the order received
        self.now = datetime.min.replace(tzinfo=UTC)  # the reading of the current batch
        # an address's own state and lists: {email: {"state", "state_at", "hard_bounced_at", "spam_at"}}
        self.addresses: dict[str, dict] = {}

    # -- dispatch -----------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, query: dict | None = None) -> tuple[int, dict | None]:
        """One request; the clock is read once."""
        return self.apply([{"method": method, "path": path, "body": body, "query": query}])[0]

    def apply(self, requests: list[dict]) -> list[tuple[int, dict | None]]:
        """Many requests sharing one clock reading, strictly in order."""
        self.now = self.clock()
        return [self._dispatch(r["method"], r["path"], r.get("body"), r.get("query") or {}) for r in requests]

    def _dispatch(self, method: str, path: str, body: Any, query: dict | None = None) -> tuple[int, dict | None]:
        if path not in ENDPOINTS:
            return 404, {"message": m.NOT_FOUND.format(method=method, path=path)}
        allowed = ENDPOINTS[path]
        if method not in allowed:
            msg = m.METHOD_NOT_ALLOWED.format(method=method, path=path, allowed=", ".join(allowed))
            return 405, {"message": msg}
        if isinstance(body, str | bytes | bytearray):
            try:
                body = json.loads(body)
            except ValueError:
                return 400, {"message": m.BAD_JSON}
        body = copy.deepcopy(body)
        if path == EMAIL_UNSUBSCRIBES_PATH:
            return self._email_unsubscribes(query or {})
        if path == EMAIL_HARD_BOUNCES_PATH:
            return self._email_hard_bounces(query or {})
        if path in EMAIL_WRITE_PATHS:
            return self._email_write(path, body)
        if path == TRACK_PATH:
            return self._track(body)
        if path == EXPORT_PATH:
            return self._export(body)
        handler = {
            MERGE_PATH: self._merge,
            IDENTIFY_PATH: self._identify,
            RENAME_PATH: self._rename,
            REMOVE_PATH: self._remove,
            ALIAS_NEW_PATH: self._alias_new,
            ALIAS_UPDATE_PATH: self._alias_update,
            DELETE_PATH: self._delete,
            SUBSCRIPTION_SET_PATH: self._subscription_set,
            SUBSCRIPTION_SET_V2_PATH: self._subscription_set_v2,
        }[path]
        if not isinstance(body, dict):
            return 400, {"message": m.BODY_NOT_OBJECT}
        return handler(body)

    # -- profiles -----------------------------------------------------------------------------

    def _new_profile(self) -> dict:
        sid = service_id_for(self.seed, self.created)
        profile = {
            "n": self.created,
            "service_id": sid,
            "random_bucket": random_bucket_for(sid),
            "created_at": self.now,
            "updated_at": self.now,
            "update_seq": self.seq,
            "external_id": None,  # the primary external ID
            "deprecated": [],  # deprecated external IDs (renamed away, not yet removed)
            "aliases": [],  # [(alias_name, alias_label)]
            "fields": {},  # profile fields with a value (email, phone normalized)
            "language_explicit": False,
            "push_opted_in_at": None,
            "email_unsubscribed_at": None,  # when email_subscribe last changed to unsubscribed
            "custom": {},
            "push_tokens": [],  # [{"app_id", "token", "device_id"}] in the order received
            "subscription_groups": {},
            "events": [],
            "purchases": [],
            "push_anonymous": False,
        }
        self.created += 1
        self.profiles.append(profile)
        return profile

    def _touch(self, profile: dict) -> None:
        profile["updated_at"] = self.now
        profile["update_seq"] = self.seq

    def _token_row(self, t: dict) -> dict:
        self.tokens_received += 1
        return {
            "app_id": t["app_id"],
            "token": t["token"],
            "device_id": t.get("device_id"),
            "received": self.tokens_received,
        }

    def _drop(self, profile: dict) -> None:
        """Delete a profile with everything it holds; its service_id never resolves again."""
        self.profiles = [p for p in self.profiles if p is not profile]

    @staticmethod
    def _most_recent(candidates: list[dict]) -> dict:
        """Profiles with an external_id first; then the most recently updated.

        DECISION: several profiles touched by one object (same updated_at and update_seq, e.g.
        same-email propagation) are ordered by creation: the later-created one is more recent.
        """
        with_external_id = [p for p in candidates if p["external_id"] is not None]
        pool = with_external_id or candidates
        return max(pool, key=lambda p: (p["updated_at"], p["update_seq"], p["n"]))

    def _find(self, kind: str, ident: Any) -> dict | None:
        if kind == "external_id":
            found = [p for p in self.profiles if _holds_external_id(p, ident)]
        elif kind == "user_alias":
            found = [p for p in self.profiles if ident in p["aliases"]]
        elif kind == "service_id":
            found = [p for p in self.profiles if p["service_id"] == ident]
        else:  # email or phone
            candidates = [p for p in self.profiles if p["fields"].get(kind) == ident]
            return self._most_recent(candidates) if candidates else None
        return found[0] if found else None

    def _resolve(self, array: str, obj: dict, kind: str, ident: Any) -> tuple[str, dict | None]:
        """("found", profile) | ("create", None) | ("skip", None) | ("error", None).

        "error" is an unknown service_id; "skip" an update-only object for an unknown user, or an
        alias that may not create (accepted silently).
        """
        profile = self._find(kind, ident)
        if profile is not None:
            return "found", profile
        update_only = obj.get("_update_existing_only")
        if kind == "service_id":
            return "error", None
        if kind == "user_alias":
            # an alias creates only for attributes with an explicit _update_existing_only: false
            creates = array == "attributes" and update_only is False
        else:
            creates = update_only is not True
        return ("create", None) if creates else ("skip", None)

    def _create_for(self, kind: str, ident: Any) -> dict:
        profile = self._new_profile()
        if kind == "external_id":
            profile["external_id"] = ident
        elif kind == "user_alias":
            profile["aliases"].append(ident)
        else:  # email-only or phone-only profile
            profile["fields"][kind] = ident
        return profile

    def _state_error(self, obj: dict, profile: dict | None) -> str | None:
        """State-dependent custom attribute checks, in key order."""
        current = profile["custom"] if profile is not None else {}
        for name in custom_names(obj):
            value = obj[name]
            op = attribute_op(value)
            if name not in current:
                continue
            if op == "inc" and not is_number(current[name]):
                return m.ERR_INC_NOT_NUMERIC
            if op == "array" and not isinstance(current[name], list):
                return m.ERR_ARRAY_OP_NOT_ARRAY
        return None

    # -- /users/track -------------------------------------------------------------------------

    @staticmethod
    def _fatal(body: Any) -> str | None:
        if not isinstance(body, dict):
            return m.FATAL_BODY_NOT_OBJECT
        arrays = [a for a in ("attributes", "events", "purchases") if a in body]
        if not arrays:
            return m.FATAL_NO_ARRAYS
        for array in arrays:
            items = body[array]
            if not isinstance(items, list):
                return m.FATAL_NOT_ARRAY.format(array=array)
            if len(items) > MAX_OBJECTS:
                return m.FATAL_TOO_MANY.format(array=array)
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    return m.FATAL_ELEMENT_NOT_OBJECT.format(array=array, index=i)
        for array in arrays:
            for item in body[array]:
                # DECISION: this also covers push_token_import objects and events/purchases.
                v = item.get("external_id")
                if isinstance(v, str) and v.strip().lower() in m.BLOCKED_EXTERNAL_IDS:
                    return m.FATAL_BLOCKED_EXTERNAL_ID
        return None

    def _track(self, body: Any) -> tuple[int, dict]:
        fatal = self._fatal(body)
        if fatal is not None:
            return 400, {"message": fatal, "errors": [fatal]}
        errors: list[dict] = []
        out: dict[str, Any] = {"message": "success"}
        for array in ("attributes", "events", "purchases"):
            if array not in body:
                continue
            accepted = 0
            for index, obj in enumerate(body[array]):
                err = self._track_object(array, obj)
                if err is None:
                    accepted += 1
                else:
                    errors.append({"type": err, "input_array": array, "index": index})
            out[f"{array}_processed"] = accepted
        if errors:
            out["errors"] = errors
        return 201, out

    def _track_object(self, array: str, obj: dict) -> str | None:
        """Apply one object; the non-fatal error text, or None when accepted."""
        err, kind, ident = static_error(array, obj)
        if err is not None:
            return err
        assert kind is not None
        if kind == "push_token_import":
            self._push_token_import(obj)
            return None
        status, profile = self._resolve(array, obj, kind, ident)
        if status == "error":
            return m.ERR_UNKNOWN_SERVICE_ID
        if array == "attributes" and (err := self._state_error(obj, profile)):
            return err
        if status == "skip":
            return None
        self.seq += 1  # one applied object
        email_before = None if profile is None else profile["fields"].get("email")
        if profile is None:
            profile = self._create_for(kind, ident)
        self._touch(profile)
        self._take_address_state(profile, email_before)
        if array == "attributes":
            self._apply_attributes(obj, kind, profile)
        elif array == "events":
            profile["events"].append(
                {
                    "name": obj["name"],
                    "time": parse_time(obj["time"]),
                    "app_id": obj.get("app_id"),
                    "properties": obj.get("properties"),
                }
            )
        else:
            profile["purchases"].append(
                {
                    "product_id": obj["product_id"],
                    "currency": obj["currency"],
                    "price": obj["price"],
                    "quantity": 1 if obj.get("quantity") is None else obj["quantity"],
                    "time": parse_time(obj["time"]),
                    "app_id": obj.get("app_id"),
                    "properties": obj.get("properties"),
                }
            )
        return None

    def _take_address_state(self, profile: dict, email_before: str | None) -> None:
        """A profile created with an address takes the state the address kept for itself."""
        email = profile["fields"].get("email")
        if email is not None and email != email_before:
            self._address_state(profile)

    def _address_state(self, profile: dict) -> None:
        row = self.addresses.get(profile["fields"].get("email"))
        if row is not None and row["state"] is not None:
            self._email_subscribe(profile, row["state"])
            profile["fields"]["email_subscribe"] = row["state"]

    def _push_token_import(self, obj: dict) -> None:
        """Each token held by nobody creates one anonymous profile holding it."""
        self.seq += 1
        for t in obj.get("push_tokens") or []:
            if self._token_owner(t["app_id"], t["token"]) is not None:
                continue
            profile = self._new_profile()
            profile["push_anonymous"] = True
            profile["push_tokens"].append(self._token_row(t))

    def _token_owner(self, app_id: str, token: str) -> dict | None:
        for p in self.profiles:
            if any(t["app_id"] == app_id and t["token"] == token for t in p["push_tokens"]):
                return p
        return None

    def _apply_attributes(self, obj: dict, kind: str, profile: dict) -> None:
        fields = profile["fields"]
        for f in field_updates(obj, kind):
            v = obj[f]
            if v is None:
                fields.pop(f, None)
                if f == "language":
                    profile["language_explicit"] = False
                continue
            if f == "email":
                v = normalize_email(v)
            elif f == "phone":
                v = normalize_phone(v)
            elif f == "country":
                v = v.upper()
            elif f == "language":
                v = v.lower()
                profile["language_explicit"] = True
            elif f == "last_coordinates":
                v = [float(v[0]), float(v[1])]
            elif f == "push_subscribe" and v == "opted_in" and fields.get(f) != "opted_in":
                profile["push_opted_in_at"] = self.now
            elif f == "email_subscribe":
                self._email_subscribe(profile, v)
            changed_email = f == "email" and fields.get("email") != v
            fields[f] = v
            if changed_email and "email_subscribe" not in obj:
                # DECISION (docs/semantics.md, "Email lists"): a user taking an address takes the
                # state the address kept; the object's own email_subscribe wins over it
                self._address_state(profile)

        for t in obj.get("push_tokens") or []:
            owner = self._token_owner(t["app_id"], t["token"])
            if owner is not None and owner is not profile:
                owner["push_tokens"] = [x for x in owner["push_tokens"] if not _same_token(x, t)]
                self._touch(owner)
            # DECISION: an upserted token is replaced and moves to the end (latest received).
            profile["push_tokens"] = [x for x in profile["push_tokens"] if not _same_token(x, t)]
            profile["push_tokens"].append(self._token_row(t))

        groups = obj.get("subscription_groups") or []
        for g in groups:
            profile["subscription_groups"][g["subscription_group_id"]] = g["subscription_state"]

        custom = profile["custom"]
        for name in custom_names(obj):
            value = obj[name]
            op = attribute_op(value)
            if value is None:
                custom.pop(name, None)
            elif op == "inc":
                custom[name] = custom.get(name, 0) + value["inc"]
            elif op == "array":
                current = list(custom.get(name, []))
                for v in value.get("add", []):
                    key = canonical(v)
                    current = [x for x in current if canonical(x) != key]
                    current.append(copy.deepcopy(v))
                removed = {canonical(v) for v in value.get("remove", [])}
                current = [x for x in current if canonical(x) not in removed]
                custom[name] = cap(current)
            elif isinstance(value, list):
                custom[name] = cap(ordered_set(value))
            else:
                custom[name] = copy.deepcopy(value)

        # Same-email propagation: only when identified by external_id, after the fields.
        # DECISION: only a non-null email_subscribe and a non-empty subscription_groups propagate;
        # every other profile holding the email gets the state and an updated_at bump.
        email = fields.get("email")
        state = obj.get("email_subscribe")
        if kind == "external_id" and email is not None and (state is not None or groups):
            for other in self.profiles:
                if other is profile or other["fields"].get("email") != email:
                    continue
                if state is not None:
                    self._email_subscribe(other, state)
                    other["fields"]["email_subscribe"] = state
                for g in groups:
                    other["subscription_groups"][g["subscription_group_id"]] = g[
                        "subscription_state"
                    ]
                self._touch(other)

    # -- identity endpoints: shared pieces ------------------------------------------------------

    @staticmethod
    def _list_error(body: dict, field: str) -> str | None:
        """A required list of 1 to 50 objects: LIST_NOT_ARRAY, LIST_EMPTY, LIST_TOO_MANY, then
        ITEM_NOT_OBJECT for the first element that is not an object.

        DECISION: every element's shape is checked before any item-specific check.
        """
        items = body.get(field)
        if not isinstance(items, list):
            return m.LIST_NOT_ARRAY.format(field=field)
        if not items:
            return m.LIST_EMPTY.format(field=field)
        if len(items) > MAX_IDENTITY_ITEMS:
            return m.LIST_TOO_MANY.format(field=field)
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                return m.ITEM_NOT_OBJECT.format(field=field, index=i)
        return None

    def _pick(self, ident: tuple[str, Any, list[str] | None]) -> dict | None:
        """The live profile an identity identifier names, or None (unresolvable or ambiguous).

        external_id (primary or deprecated), user_alias and service_id name at most one profile;
        email/phone candidates are narrowed by the prioritization rules in the order given.
        """
        kind, value, rules = ident
        if kind not in ("email", "phone"):
            return self._find(kind, value)
        candidates = [p for p in self.profiles if p["fields"].get(kind) == value]
        for rule in rules or []:
            if rule == "identified":
                candidates = [p for p in candidates if p["external_id"] is not None] or candidates
            elif rule == "unidentified":
                candidates = [p for p in candidates if p["external_id"] is None] or candidates
            elif candidates:
                choose = max if rule == "most_recently_updated" else min
                candidates = [choose(candidates, key=_recency)]
        # none left: unresolvable; several left: ambiguous
        return candidates[0] if len(candidates) == 1 else None

    @staticmethod
    def _absorb(target: dict, source: dict, fields: tuple[str, ...]) -> None:
        """Fill the target from the source (merge, identify with merge_behavior merge): the listed
        profile fields and the custom attributes the target has no value for; events and
        purchases move to the target."""
        for f in fields:
            if f not in target["fields"] and f in source["fields"]:
                target["fields"][f] = copy.deepcopy(source["fields"][f])
                if f == "language":
                    target["language_explicit"] = source["language_explicit"]
        for name, value in source["custom"].items():
            if name not in target["custom"]:
                target["custom"][name] = copy.deepcopy(value)
        target["events"].extend(source["events"])
        target["purchases"].extend(source["purchases"])
        source["events"], source["purchases"] = [], []

    @staticmethod
    def _move_tokens(source: dict, target: dict) -> None:
        """Push tokens move to the target.

        DECISION: a moved token keeps its place in the order received (tokens are listed by
        when they were received, whoever received them).
        """
        moved = target["push_tokens"] + source["push_tokens"]
        target["push_tokens"] = sorted(moved, key=lambda t: t["received"])
        source["push_tokens"] = []

    # -- POST /users/merge ----------------------------------------------------------------------

    def _merge_check(self, body: dict) -> tuple[str | None, list]:
        """(first request-level error, [(merge side, keep side)] parsed identifiers)."""
        if err := self._list_error(body, "merge_updates"):
            return err, []
        parsed = []
        for i, update in enumerate(body["merge_updates"]):
            sides = [update.get("identifier_to_merge"), update.get("identifier_to_keep")]
            if not all(isinstance(side, dict) for side in sides):
                return m.MERGE_SIDES.format(index=i), []
            pair = []
            for name, side in zip(
                ("identifier_to_merge", "identifier_to_keep"), sides, strict=True
            ):
                err, ident = parse_identifier(side, f"merge_updates[{i}].{name}")
                if err:
                    return err, []
                pair.append(ident)
            parsed.append(pair)
        return None, parsed

    def _merge(self, body: dict) -> tuple[int, dict]:
        err, updates = self._merge_check(body)
        if err:
            return 400, {"message": err}
        for merge_side, keep_side in updates:
            self.seq += 1
            source = self._pick(merge_side)
            if source is None:
                continue  # skipped: identifier_to_merge unresolvable or ambiguous
            target = self._pick(keep_side)
            if target is None or target is source:
                continue  # skipped: identifier_to_keep unresolvable or ambiguous, or same user
            self._absorb(target, source, MERGE_FIELDS)
            self._move_tokens(source, target)
            self._drop(source)  # with its external IDs, aliases, attributes, groups
            self._touch(target)
        return 202, {"message": "success"}

    # -- POST /users/identify -------------------------------------------------------------------

    @staticmethod
    def _identify_check(body: dict) -> tuple[str | None, list]:
        """(first request-level error, [(alias or None, identifier, external_id)] in order)."""
        arrays = [f for f in IDENTIFY_ARRAYS if f in body]
        if not arrays:
            return m.IDENTIFY_NO_ARRAYS, []
        for f in arrays:
            if not isinstance(body[f], list):
                return m.LIST_NOT_ARRAY.format(field=f), []
            for i, item in enumerate(body[f]):
                if not isinstance(item, dict):
                    return m.ITEM_NOT_OBJECT.format(field=f, index=i), []
        # DECISION: an empty array is accepted (LIST_EMPTY is not among identify's errors).
        if sum(len(body[f]) for f in arrays) > MAX_IDENTITY_ITEMS:
            return m.IDENTIFY_TOO_MANY, []
        # merge_behavior absent, "none" or "merge" (null is none of them)
        if "merge_behavior" in body and body["merge_behavior"] not in ("none", "merge"):
            return m.IDENTIFY_MERGE_BEHAVIOR, []
        items = []
        for f in arrays:
            kind = IDENTIFY_ARRAYS[f]
            for i, item in enumerate(body[f]):
                where = f"{f}[{i}]"
                ext = item.get("external_id")
                if not isinstance(ext, str) or ext == "":
                    return m.IDENTIFY_EXTERNAL_ID.format(where=where), []
                if _blocked(ext):
                    return m.IDENTIFY_BLOCKED.format(where=where), []
                # DECISION: an invalid alias/email/phone is IDENTIFIER_INVALID with track's text,
                # and a bad prioritization is PRIORITIZATION(_BOTH), both at `where` = f[i].
                value, err = identifier_value(kind, item.get(kind))
                if err:
                    return m.IDENTIFIER_INVALID.format(where=where, error=err), []
                rules = None
                if kind != "user_alias":
                    if err := prioritization_error(item.get("prioritization"), where):
                        return err, []
                    rules = list(item["prioritization"])
                alias = value if kind == "user_alias" else None
                items.append((alias, (kind, value, rules), ext))
        return None, items

    def _identify(self, body: dict) -> tuple[int, dict]:
        err, items = self._identify_check(body)
        if err:
            return 400, {"message": err}
        merge = body.get("merge_behavior") == "merge"
        for alias, ident, ext in items:
            self.seq += 1
            anonymous = self._pick(ident)
            if anonymous is None or anonymous["external_id"] is not None:
                continue  # skipped: no (single) profile, or already identified
            holder = self._find("external_id", ext)
            if holder is None:
                anonymous["external_id"] = ext
                self._touch(anonymous)
                continue
            if alias is not None and any(label == alias[1] for _, label in holder["aliases"]):
                continue  # skipped: the identified user has an alias with that label
            if merge:
                self._absorb(holder, anonymous, IDENTIFY_MERGE_FIELDS)
            self._move_tokens(anonymous, holder)
            if alias is not None:  # the identified alias moves; the others go with the profile
                anonymous["aliases"].remove(alias)
                holder["aliases"].append(alias)
            self._drop(anonymous)
            self._touch(holder)
        return 200, {"aliases_processed": len(items), "message": "success"}

    # -- POST /users/external_ids/rename and /remove --------------------------------------------

    def _rename(self, body: dict) -> tuple[int, dict]:
        items = body.get("external_id_renames")
        if not isinstance(items, list):
            return 400, {"message": m.LIST_NOT_ARRAY.format(field="external_id_renames")}
        if not items:
            return 400, {"message": m.LIST_EMPTY.format(field="external_id_renames")}
        if len(items) > MAX_IDENTITY_ITEMS:
            return 400, {"message": m.LIST_TOO_MANY.format(field="external_id_renames")}
        renamed: list[str] = []
        errors: list[list] = []
        for index, item in enumerate(items):
            self.seq += 1
            err = self._rename_one(item)
            if err is None:
                renamed.append(item["current_external_id"])
            else:
                errors.append([err, index])
        return 200, {"message": "success", "external_ids": renamed, "rename_errors": errors}

    def _rename_one(self, item: Any) -> str | None:
        if not isinstance(item, dict) or not all(
            _non_empty_string(item.get(k)) for k in ("current_external_id", "new_external_id")
        ):
            return m.RENAME_SHAPE
        current, new = item["current_external_id"], item["new_external_id"]
        if current == new:
            return m.RENAME_SAME
        if _blocked(new):
            return m.RENAME_BLOCKED
        owner = next((p for p in self.profiles if p["external_id"] == current), None)
        if owner is None:
            if any(current in p["deprecated"] for p in self.profiles):
                return m.RENAME_DEPRECATED
            return m.RENAME_UNKNOWN
        if any(_holds_external_id(p, new) for p in self.profiles):
            return m.RENAME_IN_USE
        owner["deprecated"].append(current)
        owner["external_id"] = new
        self._touch(owner)
        return None

    def _remove(self, body: dict) -> tuple[int, dict]:
        ids = body.get("external_ids")
        if not isinstance(ids, list):
            return 400, {"message": m.IDS_NOT_STRINGS}
        if not ids:
            return 400, {"message": m.LIST_EMPTY.format(field="external_ids")}
        if len(ids) > MAX_IDENTITY_ITEMS:
            return 400, {"message": m.LIST_TOO_MANY.format(field="external_ids")}
        removed: list[str] = []
        errors: list[list] = []
        for index, ext in enumerate(ids):
            self.seq += 1
            owner = None
            if not _non_empty_string(ext):
                err = m.REMOVE_SHAPE
            elif any(p["external_id"] == ext for p in self.profiles):
                err = m.REMOVE_PRIMARY
            else:
                owner = next((p for p in self.profiles if ext in p["deprecated"]), None)
                err = m.REMOVE_UNKNOWN if owner is None else None
            if err is not None:
                errors.append([err, index])
                continue
            assert owner is not None
            # DECISION: removing a deprecated ID does not touch the profile (updated_at is set
            # by merge, identify and rename; remove is not listed).
            owner["deprecated"].remove(ext)
            removed.append(ext)
        return 200, {"message": "success", "removed_ids": removed, "removal_errors": errors}

    # -- POST /users/alias/new and /users/alias/update ------------------------------------------

    def _alias_new(self, body: dict) -> tuple[int, dict]:
        err = self._list_error(body, "user_aliases")
        for i, item in enumerate(body["user_aliases"] if err is None else []):
            where = f"user_aliases[{i}]"
            if not _valid_alias(item):
                err = m.ALIAS_SHAPE.format(where=where)
            # DECISION: external_id null counts as absent.
            elif item.get("external_id") is not None and not _non_empty_string(item["external_id"]):
                err = m.ALIAS_EXTERNAL_ID.format(where=where)
            if err:
                break
        if err:
            return 400, {"message": err}
        for item in body["user_aliases"]:
            self.seq += 1
            alias = (item["alias_name"], item["alias_label"])
            if self._find("user_alias", alias) is not None:
                continue  # skipped: alias exists
            ext = item.get("external_id")
            if ext is None:
                self._new_profile()["aliases"].append(alias)  # an alias-only profile
                continue
            owner = self._find("external_id", ext)
            if owner is None:
                continue  # skipped: no such user
            if any(label == alias[1] for _, label in owner["aliases"]):
                continue  # skipped: alias label taken
            owner["aliases"].append(alias)
            self._touch(owner)
        return 200, {"aliases_processed": len(body["user_aliases"]), "message": "success"}

    def _alias_update(self, body: dict) -> tuple[int, dict]:
        err = self._list_error(body, "alias_updates")
        for i, item in enumerate(body["alias_updates"] if err is None else []):
            keys = ("alias_label", "old_alias_name", "new_alias_name")
            if not all(_non_empty_string(item.get(k)) for k in keys):
                err = m.ALIAS_UPDATE_SHAPE.format(where=f"alias_updates[{i}]")
                break
        if err:
            return 400, {"message": err}
        for item in body["alias_updates"]:
            self.seq += 1
            label = item["alias_label"]
            old, new = (item["old_alias_name"], label), (item["new_alias_name"], label)
            owner = self._find("user_alias", old)
            if owner is None:
                continue  # skipped: no such user
            if self._find("user_alias", new) is not None:
                continue  # skipped: alias exists (also when old = new)
            owner["aliases"] = [new if a == old else a for a in owner["aliases"]]
            self._touch(owner)
        return 200, {"message": "success"}

    # -- POST /users/delete ---------------------------------------------------------------------

    def _delete(self, body: dict) -> tuple[int, dict]:
        # DECISION: a key counts as present whatever it holds (null then fails its shape check).
        present = [k for k in DELETE_KEYS if k in body]
        if not present:
            return 400, {"message": m.DELETE_NO_IDS}
        for k in present:
            v = body[k]
            if k == "user_aliases":
                if not isinstance(v, list) or not all(_valid_alias(a) for a in v):
                    return 400, {"message": m.DELETE_ALIASES}
            elif not isinstance(v, list) or not all(_non_empty_string(x) for x in v):
                return 400, {"message": m.DELETE_STRINGS.format(field=k)}
        if sum(len(body[k]) for k in present) > MAX_IDENTITY_ITEMS:
            return 400, {"message": m.DELETE_TOO_MANY}
        deleted = 0
        for k in present:
            kind = DELETE_KEYS[k]
            for x in body[k]:
                self.seq += 1
                ident = (x["alias_name"], x["alias_label"]) if kind == "user_alias" else x
                profile = self._find(kind, ident)
                if profile is None:
                    continue  # skipped: no such user (or deleted by an earlier identifier)
                self._drop(profile)
                deleted += 1
                # DECISION (docs/semantics.md, "Email lists"): erasure takes the address off
                # the lists once no current user holds it
                email = profile["fields"].get("email")
                if email is not None and not any(p["fields"].get("email") == email for p in self.profiles):
                    self.addresses.pop(email, None)
        return 200, {"deleted": deleted, "message": "success"}

    # -- /users/export/ids --------------------------------------------------------------------

    @staticmethod
    def _export_error(body: Any) -> str | None:
        if not isinstance(body, dict):
            return m.EXPORT_BODY_NOT_OBJECT
        # DECISION: every optional key holding null counts as absent.
        ext = body.get("external_ids")
        if ext is not None and not (isinstance(ext, list) and all(isinstance(x, str) for x in ext)):
            return m.EXPORT_EXTERNAL_IDS
        aliases = body.get("user_aliases")
        if aliases is not None and not (
            isinstance(aliases, list)
            and all(
                isinstance(a, dict)
                and isinstance(a.get("alias_name"), str)
                and isinstance(a.get("alias_label"), str)
                for a in aliases
            )
        ):
            return m.EXPORT_USER_ALIASES
        for f in ("service_id", "device_id", "email_address", "phone"):
            if body.get(f) is not None and not isinstance(body[f], str):
                return m.EXPORT_STRING_FIELD.format(field=f)
        if len(ext or []) + len(aliases or []) > EXPORT_MAX_IDS:
            return m.EXPORT_TOO_MANY
        if sum(body.get(f) is not None for f in ("device_id", "email_address", "phone")) > 1:
            return m.EXPORT_ONE_OF
        # DECISION: empty external_ids / user_aliases arrays do not count as identifiers.
        if (
            not ext
            and not aliases
            and all(
                body.get(f) is None for f in ("service_id", "device_id", "email_address", "phone")
            )
        ):
            return m.EXPORT_NO_IDENTIFIER
        fields = body.get("fields_to_export")
        if fields is None:
            return m.EXPORT_FIELDS_REQUIRED
        if not isinstance(fields, list) or not all(isinstance(x, str) for x in fields):
            return m.EXPORT_FIELDS_SHAPE
        unknown = list(dict.fromkeys(x for x in fields if x not in m.EXPORT_FIELDS))
        if unknown:
            # DECISION: unknown names once each, in request order, joined by ", ".
            return m.EXPORT_UNKNOWN_FIELDS.format(names=", ".join(unknown))
        return None

    def _export(self, body: Any) -> tuple[int, dict]:
        err = self._export_error(body)
        if err is not None:
            return 400, {"message": err}
        # (request identifier as reported in invalid_user_ids, matching profiles in creation order)
        lookups: list[tuple[str, list[dict]]] = []
        for ext in body.get("external_ids") or []:
            lookups.append((ext, [p for p in self.profiles if _holds_external_id(p, ext)]))
        for a in body.get("user_aliases") or []:
            key = (a["alias_name"], a["alias_label"])
            lookups.append((a["alias_name"], [p for p in self.profiles if key in p["aliases"]]))
        if body.get("service_id") is not None:
            sid = body["service_id"]
            lookups.append((sid, [p for p in self.profiles if p["service_id"] == sid]))
        if body.get("device_id") is not None:
            dev = body["device_id"]
            found = [
                p for p in self.profiles if any(t["device_id"] == dev for t in p["push_tokens"])
            ]
            lookups.append((dev, found))
        if body.get("email_address") is not None:
            e = normalize_email(body["email_address"])
            found = [p for p in self.profiles if e is not None and p["fields"].get("email") == e]
            lookups.append((body["email_address"], found))
        if body.get("phone") is not None:
            ph = normalize_phone(body["phone"])
            found = [p for p in self.profiles if ph is not None and p["fields"].get("phone") == ph]
            lookups.append((body["phone"], found))

        users: list[dict] = []
        seen: set[int] = set()
        invalid: list[str] = []
        for requested, found in lookups:
            if not found and requested not in invalid:
                # DECISION: unmatched identifiers as sent (raw email/phone), each string once.
                invalid.append(requested)
            for p in found:
                if p["n"] not in seen:
                    seen.add(p["n"])
                    users.append(self._export_user(p, body["fields_to_export"]))
        out: dict[str, Any] = {"message": "success", "users": users}
        if invalid:
            out["invalid_user_ids"] = invalid
        return 200, out

    # -- subscription group writes ---------------------------------------------------------------

    @staticmethod
    def _subscription_entry(entry: dict, fields: dict[str, str], where: str) -> tuple[str | None, Any]:
        """(error, None) or (None, (group, state, {kind: identifiers}))."""
        group = entry.get("subscription_group_id")
        if not isinstance(group, str) or not group.strip():
            return sw.ERR_GROUP.format(where=where), None
        state = entry.get("subscription_state")
        if state not in ("subscribed", "unsubscribed"):
            return sw.ERR_STATE.format(where=where), None
        double_opt_in = entry.get("use_double_opt_in_logic")
        if double_opt_in is not None and not isinstance(double_opt_in, bool):
            return sw.ERR_DOUBLE_OPT_IN.format(where=where), None
        users: dict[str, list[str]] = {}
        for kind, field in fields.items():
            given = entry.get(field)
            items = [] if given is None else given if isinstance(given, list) else [given]
            if any(not isinstance(v, str) or not v.strip() for v in items):
                return sw.ERR_VALUES.format(where=where, field=field), None
            values = list(dict.fromkeys(items))
            if len(values) > MAX_SUBSCRIPTION_USERS:
                most = MAX_SUBSCRIPTION_USERS
                return sw.ERR_TOO_MANY.format(where=where, field=field, most=most, count=len(values)), None
            users[kind] = values
        if users["email"] and users["phone"]:
            return sw.ERR_EMAIL_AND_PHONE, None
        if not any(users.values()):
            return sw.ERR_NO_USER.format(where=where, fields=", ".join(fields.values())), None
        return None, (group, state, users)

    def _subscription_objects(self, group: str, state: str, users: dict[str, list[str]]) -> list[dict]:
        """The track attribute objects of one entry: each current user named, once, in the
        order named (external IDs, then emails, then phones; an address's holders by creation),
        by its primary external ID when an external ID named it, else by service_id."""
        named: list[tuple[str, dict]] = []
        seen: set[int] = set()
        for kind in ("external_id", "email", "phone"):
            for v in users[kind]:
                if kind == "external_id":
                    found = [p for p in self.profiles if _holds_external_id(p, v)]
                else:
                    key = normalize_email(v) if kind == "email" else normalize_phone(v)
                    found = [p for p in self.profiles if key is not None and p["fields"].get(kind) == key]
                for p in found:
                    if p["n"] not in seen:
                        seen.add(p["n"])
                        named.append((kind, p))
        groups = [{"subscription_group_id": group, "subscription_state": state}]
        return [
            {"external_id": p["external_id"], "subscription_groups": groups}
            if kind == "external_id" and p["external_id"] is not None
            else {"service_id": p["service_id"], "subscription_groups": groups}
            for kind, p in named
        ]

    def _subscription_write(self, entries: list[tuple[str, str, dict]]) -> tuple[int, dict]:
        # every entry resolved before any is written: a state names no one anew
        objects = [obj for group, state, users in entries for obj in self._subscription_objects(group, state, users)]
        for obj in objects:
            assert self._track_object("attributes", obj) is None
        return 201, {"message": "success"}

    def _subscription_set(self, body: dict) -> tuple[int, dict]:
        fields = {"external_id": "external_id", "email": "email", "phone": "phone"}
        err, entry = self._subscription_entry(body, fields, "")
        if err is not None:
            return 400, {"message": err}
        return self._subscription_write([entry])

    def _subscription_set_v2(self, body: dict) -> tuple[int, dict]:
        entries = body.get("subscription_groups")
        if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_SUBSCRIPTION_ENTRIES:
            return 400, {"message": sw.ERR_ENTRIES.format(most=MAX_SUBSCRIPTION_ENTRIES)}
        fields = {"external_id": "external_ids", "email": "emails", "phone": "phones"}
        checked = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return 400, {"message": sw.ERR_ENTRY.format(index=i)}
            err, one = self._subscription_entry(entry, fields, f"subscription_groups[{i}]: ")
            if err is not None:
                return 400, {"message": err}
            checked.append(one)
        return self._subscription_write(checked)

    # -- email lists ----------------------------------------------------------------------------

    def _email_subscribe(self, profile: dict, state: str) -> None:
        """Note the time a user's email_subscribe changes to unsubscribed (before it is set)."""
        if state == "unsubscribed" and profile["fields"].get("email_subscribe") != "unsubscribed":
            profile["email_unsubscribed_at"] = self.now

    @staticmethod
    def _email_addresses(body: Any) -> tuple[str | None, list[str]]:
        if not isinstance(body, dict):
            return m.BODY_NOT_OBJECT, []
        given = body.get("email")
        items = given if isinstance(given, list) else [given]
        if given is None or not items:
            return el.ERR_EMAIL.format(most=el.MAX_EMAILS), []
        # DECISION: addresses that are not text are named first, then invalid ones
        for item in items:
            if not isinstance(item, str):
                return el.ERR_EMAIL_VALUE.format(value=repr(item)), []
        emails: list[str] = []
        for item in items:
            email = normalize_email(item)
            if email is None:
                return el.ERR_EMAIL_VALUE.format(value=repr(item)), []
            emails.append(email)
        emails = list(dict.fromkeys(emails))
        if len(emails) > el.MAX_EMAILS:
            return el.ERR_TOO_MANY.format(most=el.MAX_EMAILS, count=len(emails)), []
        return None, emails

    def _email_write(self, path: str, body: Any) -> tuple[int, dict]:
        err, emails = self._email_addresses(body)
        if err is None and path == EMAIL_STATUS_PATH and body.get("subscription_state") not in el.STATES:
            err = el.ERR_STATE
        if err is not None:
            return 400, {"message": err}
        blank = {"state": None, "state_at": None, "hard_bounced_at": None, "spam_at": None}
        rows = {e: dict(self.addresses.get(e, blank)) for e in emails}
        if path in (EMAIL_STATUS_PATH, EMAIL_BLOCKLIST_PATH):
            state = body["subscription_state"] if path == EMAIL_STATUS_PATH else "unsubscribed"
            # every current holder, in creation order, as a track object by service_id
            for p in [p for p in self.profiles if p["fields"].get("email") in rows]:
                assert self._track_object("attributes", {"service_id": p["service_id"], "email_subscribe": state}) is None
            for row in rows.values():
                row["state"], row["state_at"] = state, self.now
                if path == EMAIL_BLOCKLIST_PATH and row["hard_bounced_at"] is None:
                    row["hard_bounced_at"] = self.now
        else:
            column = "hard_bounced_at" if path == EMAIL_BOUNCE_REMOVE_PATH else "spam_at"
            for row in rows.values():
                row[column] = None
        for e, row in rows.items():
            if any(v is not None for k, v in row.items() if k != "state_at"):
                self.addresses[e] = row
            else:
                self.addresses.pop(e, None)
        return 201, {"message": "success"}

    @staticmethod
    def _list_window(query: dict) -> tuple[str | None, Any]:
        """(error, (email, start, end)) of a list's query, checked in the engine's order."""
        dates = []
        for name in ("start_date", "end_date"):
            v = query.get(name)
            d = None
            if v is not None:
                try:
                    if not isinstance(v, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", v.strip()):
                        raise ValueError(v)
                    d = datetime.fromisoformat(v.strip()).replace(tzinfo=UTC)
                except ValueError:
                    return el.ERR_DATE.format(name=name), None
            dates.append(d)
        start, end = dates
        if query.get("email") is not None:
            email = normalize_email(query["email"])
            if email is None:
                return el.ERR_EMAIL_VALUE.format(value=repr(query["email"])), None
            return None, (email, None, None)
        if start is None or end is None:
            return el.ERR_RANGE, None
        if start > end:
            return el.ERR_ORDER, None
        return None, (None, start, end)

    @staticmethod
    def _whole(query: dict, name: str, default: int, low: int, high: int | None) -> int | None:
        v = query.get(name, default)
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v.strip())
        if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
            return None
        return v

    def _email_page(self, query: dict, listed: dict[str, datetime], newest_first: bool, column: str,
                    shown: Callable[[datetime], str]) -> tuple[int, dict]:
        err, window = self._list_window(query)
        if err is not None:
            return 400, {"message": err}
        limit = self._whole(query, "limit", el.DEFAULT_LIMIT, 1, el.MAX_LIMIT)
        if limit is None:
            return 400, {"message": el.ERR_LIMIT.format(most=el.MAX_LIMIT)}
        offset = self._whole(query, "offset", 0, 0, None)
        if offset is None:
            return 400, {"message": el.ERR_OFFSET}
        email, start, end = window
        rows = [(e, at) for e, at in listed.items()
                if (e == email if email is not None else start <= at < end)]
        rows.sort(key=lambda r: r[0])  # ties by address, then by time
        rows.sort(key=lambda r: r[1], reverse=newest_first)
        page = rows[offset:offset + limit]
        return 200, {"emails": [{"email": e, column: shown(at)} for e, at in page], "message": "success"}

    def unsubscribed(self) -> dict[str, datetime]:
        """Every unsubscribed address and since when (docs/semantics.md, "Email lists")."""
        out: dict[str, datetime] = {}
        for p in self.profiles:
            email = p["fields"].get("email")
            if email is not None and p["fields"].get("email_subscribe") == "unsubscribed":
                at = p["email_unsubscribed_at"] or p["updated_at"]
                out[email] = max(out.get(email, at), at)
        held = {p["fields"].get("email") for p in self.profiles}
        for e, row in self.addresses.items():
            if row["state"] == "unsubscribed" and e not in held:
                out[e] = row["state_at"]
        return out

    def _email_unsubscribes(self, query: dict) -> tuple[int, dict]:
        direction = query.get("sort_direction", "desc")
        if direction not in ("asc", "desc"):
            return 400, {"message": el.ERR_SORT}
        return self._email_page(query, self.unsubscribed(), direction == "desc", "unsubscribed_at",
                                lambda at: at.strftime("%Y-%m-%d %H:%M:%S +0000"))

    def _email_hard_bounces(self, query: dict) -> tuple[int, dict]:
        bounced = {e: row["hard_bounced_at"] for e, row in self.addresses.items() if row["hard_bounced_at"]}
        return self._email_page(query, bounced, True, "hard_bounced_at", format_ts)

    def email_address_rows(self) -> list[tuple]:
        """(email, state, state_at, hard_bounced_at, spam_at), sorted: the engine's table."""
        return sorted((e, r["state"], r["state_at"], r["hard_bounced_at"], r["spam_at"])
                      for e, r in self.addresses.items())

    def subscription_states(self) -> list[tuple[str, str, str]]:
        """(service_id, group, state) of every live profile, sorted."""
        return sorted(
            (p["service_id"], group, state)
            for p in self.profiles
            for group, state in p["subscription_groups"].items()
        )

    def export_users(self, fields_to_export: list[str] | None = None) -> list[dict]:
        """Every user in creation order, shaped like an export (all fields when None).

        The clock is read once, for the 90-day window.
        """
        self.now = self.clock()
        return [self._export_user(p, fields_to_export) for p in self.profiles]

    def _export_user(self, p: dict, fields_to_export: list[str] | None) -> dict:
        full: dict[str, Any] = {
            "created_at": format_ts(p["created_at"]),
            "service_id": p["service_id"],
            "random_bucket": p["random_bucket"],
        }
        if p["external_id"] is not None:
            full["external_id"] = p["external_id"]
        if p["aliases"]:
            full["user_aliases"] = [
                {"alias_name": n, "alias_label": lbl}
                for n, lbl in sorted(p["aliases"], key=lambda a: (a[1], a[0]))
            ]
        for f, v in p["fields"].items():
            full[f] = copy.deepcopy(v)
        if p["push_opted_in_at"] is not None:
            full["push_opted_in_at"] = format_ts(p["push_opted_in_at"])
        if p["custom"]:
            full["custom_attributes"] = copy.deepcopy(p["custom"])
        events = self._summaries([(e["name"], e["time"]) for e in p["events"]])
        if events:
            full["custom_events"] = events
        purchases = self._summaries([(x["product_id"], x["time"]) for x in p["purchases"]])
        if purchases:
            full["purchases"] = purchases
        if p["purchases"]:
            total = 0.0
            for x in p["purchases"]:
                total += x["price"] * x["quantity"]
            full["total_revenue"] = float(round(total, 6))
        if p["push_tokens"]:
            # DECISION: notifications are enabled unless the profile opted out of push
            enabled = p["fields"].get("push_subscribe") != "unsubscribed"
            full["push_tokens"] = [
                {"app": t["app_id"]}
                | ({"platform": platform} if (platform := token_platform(t["token"])) else {})
                | {"token": t["token"]}
                | ({"device_id": t["device_id"]} if t["device_id"] is not None else {})
                | {"notifications_enabled": enabled}
                for t in p["push_tokens"]
            ]
            devices = list(
                dict.fromkeys(
                    t["device_id"] for t in p["push_tokens"] if t["device_id"] is not None
                )
            )
            if devices:
                full["devices"] = [{"device_id": d} for d in devices]
        if fields_to_export is None:
            return full
        return {f: full[f] for f in dict.fromkeys(fields_to_export) if f in full}

    def _summaries(self, rows: list[tuple[str, datetime]]) -> list[dict]:
        """{name, first, last, count} per name over [clock - 90 days, clock], sorted by name."""
        start = self.now - WINDOW
        by_name: dict[str, list[datetime]] = {}
        for name, t in rows:
            if start <= t <= self.now:
                by_name.setdefault(name, []).append(t)
        return [
            {
                "name": name,
                "first": format_ts(min(times)),
                "last": format_ts(max(times)),
                "count": len(times),
            }
            for name, times in sorted(by_name.items())
        ]


def token_platform(token: str) -> str | None:
    """DECISION: the platform of a push token from its shape: APNs hex (32 bytes or more),
    FCM `<instance>:APA91b...`, a Web Push endpoint URL; anything else unknown."""
    if len(token) >= 64 and len(token) % 2 == 0 and all(c in "0123456789abcdefABCDEF" for c in token):
        return "iOS"
    head, sep, tail = token.partition(":APA91b")
    word = re.compile(r"[A-Za-z0-9_-]+")
    if sep and word.fullmatch(head) and word.fullmatch(tail):
        return "Android"
    if token.startswith("https://"):
        return "Web"
    return None


def _same_token(row: dict, t: dict) -> bool:
    return row["app_id"] == t["app_id"] and row["token"] == t["token"]


def _holds_external_id(p: dict, ext: Any) -> bool:
    """The profile's primary or one of its deprecated external IDs."""
    return p["external_id"] == ext or ext in p["deprecated"]
