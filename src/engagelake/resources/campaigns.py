"""Campaign translations: `GET /campaigns/translations` (alias `/campaign/translations`), and
the library-level definitions it reads (campaigns, message variations, multi-language settings,
translation maps), loaded from JSON files or dicts. Decisions: docs/campaigns.md.

Definition shape (a file or a dict):

    {"multi_language": {"enabled": true,
                        "locales": [{"name": "es-MX", "country": "MX", "language": "es"}]},
     "campaigns": [{"campaign_id": <uuid>, "name": "...", "channel": "email",
                    "message_variations": [{"message_variation_id": <uuid>, "name": "...",
                                            "channel": "email", "multi_language": true,
                                            "translations": {"es-MX": {<uuid>: "Hola"}}}]}]}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from engagelake.errors import ConfigError, RequestError
from engagelake.routing import Client, Context, Handler, Request, Response
from engagelake.rules.state import Changes, State

CHANNELS = ("email", "push", "sms", "webhook", "in_app_message", "content_card", "whatsapp")
TRANSLATABLE_CHANNELS = ("email",)
UUID_PATTERN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
MULTI_LANGUAGE = "multi_language"  # the campaign_settings row of the workspace setting

# --- error codes of GET /campaigns/translations (400, {"errors": [{"message": <code>}]}) -------
INVALID_CAMPAIGN_ID = "INVALID_CAMPAIGN_ID"
INVALID_MESSAGE_VARIATION_ID = "INVALID_MESSAGE_VARIATION_ID"
MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND"
MULTI_LANGUAGE_NOT_ENABLED = "MULTI_LANGUAGE_NOT_ENABLED"
MULTI_LANGUAGE_NOT_ENABLED_ON_MESSAGE = "MULTI_LANGUAGE_NOT_ENABLED_ON_MESSAGE"
UNSUPPORTED_CHANNEL = "UNSUPPORTED_CHANNEL"

# --- definition errors (ConfigError) -------------------------------------------------------------
DEF_NOT_OBJECT = "a campaign definition must be a JSON object with multi_language and/or campaigns"
DEF_UNKNOWN_KEYS = "unknown keys {keys} in {where}; allowed: {allowed}"
DEF_MULTI_LANGUAGE = "multi_language must be an object {enabled, locales}"
DEF_ENABLED = "multi_language.enabled must be true or false"
DEF_LOCALES = "multi_language.locales must be an array of {name, country, language} objects with string values"
DEF_LOCALE_DUPLICATE = "locale {name!r} is listed twice in multi_language.locales"
DEF_CAMPAIGNS = "campaigns must be an array of objects"
DEF_ID = "{where}: {key} must be a UUID such as 0f8fad5b-d9cb-469f-a165-70867728950e, got {value!r}"
DEF_DUPLICATE = "{where}: {key} {value!r} appears twice"
DEF_STRING = "{where}: {key} must be a string"
DEF_VARIATIONS = "{where}: message_variations must be an array of objects"
DEF_CHANNEL = "{where}: channel must be one of {channels}, got {value!r}"
DEF_FLAG = "{where}: multi_language must be true or false"
DEF_TRANSLATIONS = "{where}: translations must map a locale name to {{<uuid>: <text>}}"
DEF_TRANSLATION_ID = "{where}: translation IDs must be UUIDs, got {value!r}"
DEF_UNKNOWN_LOCALE = "{where}: unknown locale {locale!r}; the workspace's locales: {known} (set them in multi_language.locales)"
DEF_FILE = "cannot read campaign definitions from {path}: {reason}"
TRANSLATIONS_FAILED = "GET /campaigns/translations answered {status}: {codes}"

CAMPAIGN_KEYS = {"campaign_id", "name", "channel", "message_variations"}
VARIATION_KEYS = {"message_variation_id", "name", "channel", "multi_language", "translations"}


# --- reading the store -------------------------------------------------------------------------
def read_multi_language(state: State) -> dict[str, Any]:
    """The workspace's multi-language setting; disabled, with no locales, until one is set."""
    rows = state["campaign_settings"].filter(pl.col("setting") == MULTI_LANGUAGE)
    return orjson.loads(rows["value"][0]) if rows.height else {"enabled": False, "locales": []}


def find_message(state: State, campaign_id: str, variation_id: str) -> dict[str, Any] | None:
    rows = state["campaign_messages"].filter(
        (pl.col("campaign_id") == campaign_id) & (pl.col("message_variation_id") == variation_id))
    return rows.row(0, named=True) if rows.height else None


def message_translations(state: State, campaign_id: str, variation_id: str) -> dict[str, dict[str, str]]:
    """{locale name: translation map} of one message variation."""
    rows = state["campaign_translations"].filter(
        (pl.col("campaign_id") == campaign_id) & (pl.col("message_variation_id") == variation_id))
    return {row["locale"]: orjson.loads(row["translation_map"]) for row in rows.iter_rows(named=True)}


# --- the endpoint ------------------------------------------------------------------------------
def read_uuid(value: Any) -> str | None:
    """A well-formed UUID in lower case, or None."""
    return value.lower() if isinstance(value, str) and UUID_PATTERN.match(value) else None


def failure(*codes: str) -> Response:
    return Response(400, {"errors": [{"message": code} for code in codes]})


def get_translations(ctx: Context, req: Request) -> Response:
    """The translations of one message variation, in the order of the workspace's locales."""
    campaign_id = read_uuid(req.query.get("campaign_id"))
    variation_id = read_uuid(req.query.get("message_variation_id"))
    malformed = [code for code, value in ((INVALID_CAMPAIGN_ID, campaign_id),
                                          (INVALID_MESSAGE_VARIATION_ID, variation_id)) if value is None]
    if malformed or campaign_id is None or variation_id is None:
        return failure(*malformed)
    settings = read_multi_language(ctx.state)
    if not settings["enabled"]:
        return failure(MULTI_LANGUAGE_NOT_ENABLED)
    if ctx.state["campaigns"].filter(pl.col("campaign_id") == campaign_id).height == 0:
        return failure(INVALID_CAMPAIGN_ID)
    message = find_message(ctx.state, campaign_id, variation_id)
    if message is None:
        return failure(MESSAGE_NOT_FOUND)
    if message["channel"] not in TRANSLATABLE_CHANNELS:
        return failure(UNSUPPORTED_CHANNEL)
    if not message["multi_language"]:
        return failure(MULTI_LANGUAGE_NOT_ENABLED_ON_MESSAGE)
    maps = message_translations(ctx.state, campaign_id, variation_id)
    translations = [{"locale": dict(locale), "translation_map": maps[locale["name"]]}
                    for locale in settings["locales"] if locale["name"] in maps]
    return Response(200, {"translations": translations})


ROUTES: dict[str, dict[str, Handler]] = {
    "/campaigns/translations": {"GET": get_translations},
    "/campaign/translations": {"GET": get_translations},  # the path of the interface's example
}


# --- definitions -------------------------------------------------------------------------------
def check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(DEF_UNKNOWN_KEYS.format(keys=", ".join(unknown), where=where,
                                                  allowed=", ".join(sorted(allowed))))


def check_uuid(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = read_uuid(obj.get(key))
    if value is None:
        raise ConfigError(DEF_ID.format(where=where, key=key, value=obj.get(key)))
    return value


def check_string(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(DEF_STRING.format(where=where, key=key))
    return value


def check_unique(ids: list[str], key: str, where: Callable[[int], str]) -> None:
    """Raise on the first ID that repeats an earlier one (`where(i)` names its place)."""
    for i, value in enumerate(ids):
        if value in ids[:i]:
            raise ConfigError(DEF_DUPLICATE.format(where=where(i), key=key, value=value))


def check_multi_language(setting: Any) -> dict[str, Any]:
    """The workspace setting, validated: {enabled, locales: [{name, country, language}]}."""
    if not isinstance(setting, dict):
        raise ConfigError(DEF_MULTI_LANGUAGE)
    check_keys(setting, {"enabled", "locales"}, "multi_language")
    if not isinstance(setting.get("enabled"), bool):
        raise ConfigError(DEF_ENABLED)
    locales = setting.get("locales", [])
    if not isinstance(locales, list) or not all(
            isinstance(loc, dict) and set(loc) == {"name", "country", "language"}
            and all(isinstance(v, str) for v in loc.values()) for loc in locales):
        raise ConfigError(DEF_LOCALES)
    names = [loc["name"] for loc in locales]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(DEF_LOCALE_DUPLICATE.format(name=name))
    return {"enabled": setting["enabled"],
            "locales": [{k: loc[k] for k in ("name", "country", "language")} for loc in locales]}


def check_translations(value: Any, where: str) -> dict[str, dict[str, str]]:
    """{locale name: {uuid (lower case): text}}."""
    if not isinstance(value, dict) or not all(
            isinstance(m, dict) and all(isinstance(t, str) for t in m.values()) for m in value.values()):
        raise ConfigError(DEF_TRANSLATIONS.format(where=where))
    out: dict[str, dict[str, str]] = {}
    for locale, mapping in value.items():
        for key in mapping:
            if read_uuid(key) is None:
                raise ConfigError(DEF_TRANSLATION_ID.format(where=where, value=key))
        out[locale] = {key.lower(): text for key, text in mapping.items()}
    return out


def check_variation(variation: Any, default_channel: Any, where: str) -> dict[str, Any]:
    if not isinstance(variation, dict):
        raise ConfigError(DEF_VARIATIONS.format(where=where))
    check_keys(variation, VARIATION_KEYS, where)
    channel = variation.get("channel", default_channel)
    if channel not in CHANNELS:
        raise ConfigError(DEF_CHANNEL.format(where=where, channels=", ".join(CHANNELS), value=channel))
    flag = variation.get("multi_language", False)
    if not isinstance(flag, bool):
        raise ConfigError(DEF_FLAG.format(where=where))
    return {
        "message_variation_id": check_uuid(variation, "message_variation_id", where),
        "name": check_string(variation, "name", where),
        "channel": channel, "multi_language": flag,
        "translations": check_translations(variation.get("translations", {}), where),
    }


def check_campaign(campaign: Any, index: int) -> dict[str, Any]:
    where = f"campaigns[{index}]"
    if not isinstance(campaign, dict):
        raise ConfigError(DEF_CAMPAIGNS)
    check_keys(campaign, CAMPAIGN_KEYS, where)
    campaign_id = check_uuid(campaign, "campaign_id", where)
    variations = campaign.get("message_variations", [])
    if not isinstance(variations, list):
        raise ConfigError(DEF_VARIATIONS.format(where=where))
    checked = [check_variation(v, campaign.get("channel"), f"{where}.message_variations[{i}]")
               for i, v in enumerate(variations)]
    check_unique([v["message_variation_id"] for v in checked], "message_variation_id", lambda _: where)
    return {"campaign_id": campaign_id, "name": check_string(campaign, "name", where), "variations": checked}


def check_definition(data: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(multi-language setting or None, campaigns) of a definition, validated."""
    if not isinstance(data, Mapping):
        raise ConfigError(DEF_NOT_OBJECT)
    check_keys(data, {"multi_language", "campaigns"}, "the definition")
    setting = check_multi_language(data["multi_language"]) if "multi_language" in data else None
    campaigns = data.get("campaigns", [])
    if not isinstance(campaigns, list):
        raise ConfigError(DEF_CAMPAIGNS)
    checked = [check_campaign(c, i) for i, c in enumerate(campaigns)]
    check_unique([c["campaign_id"] for c in checked], "campaign_id", lambda i: f"campaigns[{i}]")
    return setting, checked


def check_locales(campaigns: list[dict[str, Any]], setting: dict[str, Any]) -> None:
    """Every translation's locale must be one of the workspace's locales."""
    known = [loc["name"] for loc in setting["locales"]]
    for i, campaign in enumerate(campaigns):
        for j, variation in enumerate(campaign["variations"]):
            for locale in variation["translations"]:
                if locale not in known:
                    raise ConfigError(DEF_UNKNOWN_LOCALE.format(
                        where=f"campaigns[{i}].message_variations[{j}]", locale=locale,
                        known=", ".join(known) or "(none)"))


def campaign_changes(state: State, campaigns: list[dict[str, Any]], ctx: Context) -> Changes:
    """Rows that make each campaign exactly as defined: its old variations and translations go."""
    changes = Changes()
    ids = [c["campaign_id"] for c in campaigns]
    for table, key in (("campaign_messages", ["campaign_id", "message_variation_id"]),
                       ("campaign_translations", ["campaign_id", "message_variation_id", "locale"])):
        changes.delete(table, state[table].filter(pl.col("campaign_id").is_in(ids)).select(key))
    changes.upsert("campaigns", pl.DataFrame({
        "campaign_id": ids, "name": [c["name"] for c in campaigns], "updated_at": [ctx.clock] * len(ids),
    }, schema={"campaign_id": pl.String, "name": pl.String, "updated_at": pl.Datetime("us", "UTC")}))
    messages = [
        {"campaign_id": c["campaign_id"], "message_variation_id": v["message_variation_id"], "name": v["name"],
         "channel": v["channel"], "multi_language": v["multi_language"], "position": position}
        for c in campaigns for position, v in enumerate(c["variations"])]
    translations = [
        {"campaign_id": c["campaign_id"], "message_variation_id": v["message_variation_id"], "locale": locale,
         "translation_map": orjson.dumps(mapping).decode()}
        for c in campaigns for v in c["variations"] for locale, mapping in v["translations"].items()]
    if messages:
        changes.upsert("campaign_messages", pl.DataFrame(messages))
    if translations:
        changes.upsert("campaign_translations", pl.DataFrame(translations))
    return changes


def write_definition(ctx: Context, setting: dict[str, Any] | None, campaigns: list[dict[str, Any]]) -> None:
    """One batch: the workspace setting (when given), then every campaign, replacing old ones."""
    changes = Changes()
    if setting is not None:
        changes.upsert("campaign_settings", pl.DataFrame({
            "setting": [MULTI_LANGUAGE], "value": [orjson.dumps(setting).decode()], "updated_at": [ctx.clock]}))
    check_locales(campaigns, setting if setting is not None else read_multi_language(ctx.state))
    changes.extend(campaign_changes(ctx.state, campaigns, ctx))
    ctx.write(changes)


class Campaigns:
    """Friendly methods for campaigns and their translations (`ws.campaigns`)."""

    def __init__(self, ws: Client):
        self.ws = ws

    def put(self, definition: Mapping[str, Any]) -> None:
        """Store a definition (module docstring shape) in one batch: the multi-language setting
        when given, and each campaign, replacing a stored campaign with the same ID entirely.
        Raises ConfigError naming the first problem; nothing is written then."""
        setting, campaigns = check_definition(definition)
        self.ws.write(lambda ctx: write_definition(ctx, setting, campaigns))

    def load(self, path: str | Path) -> None:
        """`put` the definition in a JSON file."""
        try:
            data = orjson.loads(Path(path).read_bytes())
        except (OSError, orjson.JSONDecodeError) as error:
            raise ConfigError(DEF_FILE.format(path=path, reason=error)) from None
        self.put(data)

    def set_multi_language(self, *, enabled: bool, locales: list[Mapping[str, str]] | None = None) -> None:
        """Set the workspace's multi-language setting (`locales`: [{name, country, language}])."""
        self.put({"multi_language": {"enabled": enabled, "locales": [dict(loc) for loc in locales or []]}})

    def translations(self, campaign_id: str, message_variation_id: str) -> list[dict[str, Any]]:
        """The message's translations (`GET /campaigns/translations`); RequestError with the
        codes when the API answers 400."""
        query = {"campaign_id": campaign_id, "message_variation_id": message_variation_id}
        response = self.ws.call("GET", "/campaigns/translations", query=query)
        if response.status != 200:
            codes = ", ".join(e["message"] for e in response.body.get("errors", []))
            raise RequestError(TRANSLATIONS_FAILED.format(status=response.status, codes=codes), response.status,
                               response.body)
        return list(response.body["translations"])
