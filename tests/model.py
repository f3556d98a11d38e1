"""In-memory reference model of `/users/track` and `/users/export/ids`.

This is the oracle the property tests run beside the vectorized engine. It is deliberately plain:
profiles are dicts in a list, every object is processed one at a time, in the documented order
(each request in turn; inside a request all attributes, then events, then purchases). Every rule
comes from `../shared/spec`, `../shared/SEMANTICS.md` (sections 1-4, export rows of section 6)
and `docs/semantics.md`; error texts are imported from `engagelake.rules.messages`.

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

from engagelake.rules import messages as m
from engagelake.rules.reference import COUNTRY_CODES, LANGUAGE_CODES

TRACK_PATH = "/users/track"
EXPORT_PATH = "/users/export/ids"
ENDPOINTS = {TRACK_PATH: ("POST",), EXPORT_PATH: ("POST",)}

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
# the model
# --------------------------------------------------------------------------------------------


class Model:
    """Sequential in-memory reference of /users/track and /users/export/ids."""

    def __init__(self, clock: Callable[[], datetime], seed: str) -> None:
        self.clock = clock
        self.seed = seed
        self.profiles: list[dict] = []  # creation order; none is ever deleted here
        self.created = 0  # profiles ever created (the n of service_id)
        self.seq = 0  # store-wide update_seq counter, one step per applied object
        self.now = datetime.min.replace(tzinfo=UTC)  # the reading of the current batch

    # -- dispatch -----------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict | None]:
        """One request; the clock is read once."""
        return self.apply([{"method": method, "path": path, "body": body}])[0]

    def apply(self, requests: list[dict]) -> list[tuple[int, dict | None]]:
        """Many requests sharing one clock reading, strictly in order."""
        self.now = self.clock()
        return [self._dispatch(r["method"], r["path"], r.get("body")) for r in requests]

    def _dispatch(self, method: str, path: str, body: Any) -> tuple[int, dict | None]:
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
        if path == TRACK_PATH:
            return self._track(body)
        return self._export(body)

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
            "external_id": None,
            "aliases": [],  # [(alias_name, alias_label)]
            "fields": {},  # profile fields with a value (email, phone normalized)
            "language_explicit": False,
            "push_opted_in_at": None,
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
            found = [p for p in self.profiles if p["external_id"] == ident]
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
        if profile is None:
            profile = self._create_for(kind, ident)
        self._touch(profile)
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

    def _push_token_import(self, obj: dict) -> None:
        """Each token held by nobody creates one anonymous profile holding it."""
        self.seq += 1
        for t in obj.get("push_tokens") or []:
            if self._token_owner(t["app_id"], t["token"]) is not None:
                continue
            profile = self._new_profile()
            profile["push_anonymous"] = True
            profile["push_tokens"].append(_token_row(t))

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
            fields[f] = v

        for t in obj.get("push_tokens") or []:
            owner = self._token_owner(t["app_id"], t["token"])
            if owner is not None and owner is not profile:
                owner["push_tokens"] = [x for x in owner["push_tokens"] if not _same_token(x, t)]
                self._touch(owner)
            # DECISION: an upserted token is replaced and moves to the end (latest received).
            profile["push_tokens"] = [x for x in profile["push_tokens"] if not _same_token(x, t)]
            profile["push_tokens"].append(_token_row(t))

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
                    other["fields"]["email_subscribe"] = state
                for g in groups:
                    other["subscription_groups"][g["subscription_group_id"]] = g[
                        "subscription_state"
                    ]
                self._touch(other)

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
            lookups.append((ext, [p for p in self.profiles if p["external_id"] == ext]))
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
            full["push_tokens"] = [
                {"app": t["app_id"], "token": t["token"]}
                | ({"device_id": t["device_id"]} if t["device_id"] is not None else {})
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


def _same_token(row: dict, t: dict) -> bool:
    return row["app_id"] == t["app_id"] and row["token"] == t["token"]


def _token_row(t: dict) -> dict:
    return {"app_id": t["app_id"], "token": t["token"], "device_id": t.get("device_id")}
