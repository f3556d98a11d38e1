"""Validate the bodies of the small identity endpoints (rename, remove, alias new/update,
delete) and flatten them into item rows.

These requests carry at most 50 small items and rarely come in bulk, so each body is checked with
plain Python as it is decoded; the bulk endpoints (merge, identify) are checked as whole runs in
`bulk_requests`. Every rule that reads the store then runs over all items of a run at once.
A request with any invalid part raises `Invalid` with its 400 message: nothing of it applies.
"""

from __future__ import annotations

from typing import Any

import orjson

from engagelake.rules import messages as M

ALIAS_SEP = "\x1f"  # joins alias_label and alias_name into one key
MAX_ITEMS = 50


class Invalid(Exception):
    """A request-level error: the request answers 400 with this message."""


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def alias_key(alias: Any) -> str | None:
    if isinstance(alias, dict) and _text(alias.get("alias_label")) and _text(alias.get("alias_name")):
        return f"{alias['alias_label']}{ALIAS_SEP}{alias['alias_name']}"
    return None


def blocked(external_id: str) -> bool:
    return external_id.strip().lower() in M.BLOCKED_EXTERNAL_IDS


def _items(body: Any, field: str, *, required: bool = True) -> list[Any]:
    if not isinstance(body, dict):
        raise Invalid(M.BODY_NOT_OBJECT)
    if field not in body and not required:
        return []
    items = body.get(field)
    if not isinstance(items, list):
        raise Invalid(M.LIST_NOT_ARRAY.format(field=field))
    return items


def _checked_list(body: Any, field: str) -> list[dict[str, Any]]:
    items = _items(body, field)
    if not items:
        raise Invalid(M.LIST_EMPTY.format(field=field))
    if len(items) > MAX_ITEMS:
        raise Invalid(M.LIST_TOO_MANY.format(field=field))
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise Invalid(M.ITEM_NOT_OBJECT.format(field=field, index=i))
    return items


def rename_items(body: Any) -> list[dict[str, Any]]:
    """Rename rows; an item that is not a pair of strings carries its error (a per-item error)."""
    items = _items(body, "external_id_renames")
    if not items:
        raise Invalid(M.LIST_EMPTY.format(field="external_id_renames"))
    if len(items) > MAX_ITEMS:
        raise Invalid(M.LIST_TOO_MANY.format(field="external_id_renames"))
    rows = []
    for i, item in enumerate(items):
        cur = item.get("current_external_id") if isinstance(item, dict) else None
        new = item.get("new_external_id") if isinstance(item, dict) else None
        error = None
        if not (_text(cur) and _text(new)):
            error, cur, new = M.RENAME_SHAPE, None, None
        elif cur == new:
            error = M.RENAME_SAME
        elif blocked(str(new)):
            error = M.RENAME_BLOCKED
        rows.append({"item": i, "current": cur, "new": new, "static_error": error})
    return rows


def remove_items(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        raise Invalid(M.BODY_NOT_OBJECT)
    items = body.get("external_ids")
    if not isinstance(items, list):
        raise Invalid(M.IDS_NOT_STRINGS)
    if not items:
        raise Invalid(M.LIST_EMPTY.format(field="external_ids"))
    if len(items) > MAX_ITEMS:
        raise Invalid(M.LIST_TOO_MANY.format(field="external_ids"))
    return [{"item": i, "current": v if _text(v) else None, "static_error": None if _text(v) else M.REMOVE_SHAPE}
            for i, v in enumerate(items)]


def alias_new_items(body: Any) -> list[dict[str, Any]]:
    rows = []
    for i, item in enumerate(_checked_list(body, "user_aliases")):
        where = f"user_aliases[{i}]"
        key = alias_key(item)
        if key is None:
            raise Invalid(M.ALIAS_SHAPE.format(where=where))
        ext = item.get("external_id")
        if ext is not None and not _text(ext):
            raise Invalid(M.ALIAS_EXTERNAL_ID.format(where=where))
        rows.append({"item": i, "alias": key, "label": item["alias_label"], "external_id": ext,
                     "source": _json({k: item[k] for k in ("alias_label", "alias_name")}),
                     "target": _json({"external_id": ext}) if ext is not None else None})
    return rows


def alias_update_items(body: Any) -> list[dict[str, Any]]:
    rows = []
    for i, item in enumerate(_checked_list(body, "alias_updates")):
        label, old, new = (item.get(k) for k in ("alias_label", "old_alias_name", "new_alias_name"))
        if not (_text(label) and _text(old) and _text(new)):
            raise Invalid(M.ALIAS_UPDATE_SHAPE.format(where=f"alias_updates[{i}]"))
        rows.append({"item": i, "old": f"{label}{ALIAS_SEP}{old}", "new": f"{label}{ALIAS_SEP}{new}",
                     "source": _json({"alias_label": label, "alias_name": old}),
                     "target": _json({"alias_label": label, "alias_name": new})})
    return rows


DELETE_ARRAYS = ("external_ids", "user_aliases", "service_ids")


def delete_items(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        raise Invalid(M.BODY_NOT_OBJECT)
    if all(f not in body for f in DELETE_ARRAYS):  # a key holding null is present
        raise Invalid(M.DELETE_NO_IDS)
    rows = []
    for field in DELETE_ARRAYS:
        if field not in body:
            continue
        values = body[field]
        kind = {"external_ids": "external_id", "user_aliases": "user_alias", "service_ids": "service_id"}[field]
        if field == "user_aliases":
            keys = [alias_key(v) for v in values] if isinstance(values, list) else [None]
            if any(k is None for k in keys):
                raise Invalid(M.DELETE_ALIASES)
        else:
            if not isinstance(values, list) or not all(_text(v) for v in values):
                raise Invalid(M.DELETE_STRINGS.format(field=field))
            keys = list(values)
        rows += [{"item": i, "src_kind": kind, "src_key": k, "source": _json({kind: v})}
                 for i, (k, v) in enumerate(zip(keys, values, strict=True))]
    if len(rows) > MAX_ITEMS:
        raise Invalid(M.DELETE_TOO_MANY)
    return rows
