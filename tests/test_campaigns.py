"""Campaign translations end to end: definitions loaded from tests/data/campaigns.json (and
dicts), `GET /campaigns/translations` (and the `/campaign/translations` alias) with every error
code, replacement on reload, batches and reopening."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.helpers import NOW, SEED, copy_of, open_ws

from engagelake import Response, Workspace
from engagelake.errors import ConfigError, RequestError
from engagelake.resources import campaigns as C

DATA = Path(__file__).parent / "data" / "campaigns.json"
CAMPAIGN = "6f0c1e2a-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
VARIANT_A = "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"  # email, multi-language, es-MX and fr-FR
VARIANT_B = "b2c3d4e5-f6a7-4b8c-9d0e-1f2a3b4c5d6e"  # email, multi-language off
PUSH = "c3d4e5f6-a7b8-4c9d-8e1f-2a3b4c5d6e7f"  # push
VARIANT_C = "d4e5f6a7-b8c9-4d0e-9f2a-3b4c5d6e7f80"  # email, multi-language, no translations
OTHER_CAMPAIGN = "11111111-2222-4333-8444-555555555555"
OTHER_VARIANT = "66666666-7777-4888-9999-aaaaaaaaaaaa"
OTHER_PUSH = "77777777-8888-4999-8aaa-bbbbbbbbbbbb"  # push, multi-language off
HELLO, SALE = "0f8fad5b-d9cb-469f-a165-70867728950e", "7c9e6679-7425-40de-944b-e07fc1f90ae7"
ES = {"name": "es-MX", "country": "MX", "language": "es"}
FR = {"name": "fr-FR", "country": "FR", "language": "fr"}
DE = {"name": "de-DE", "country": "DE", "language": "de"}
VARIANT_A_TRANSLATIONS = [
    {"locale": ES, "translation_map": {HELLO: "¡Hola!", SALE: "Ofertas de primavera"}},
    {"locale": FR, "translation_map": {HELLO: "Bonjour !", SALE: "Soldes de printemps"}},
]
PATH = "/campaigns/translations"


def get(ws: Workspace, campaign_id: Any = CAMPAIGN, variation_id: Any = VARIANT_A, path: str = PATH) -> Response:
    query = {k: v for k, v in (("campaign_id", campaign_id), ("message_variation_id", variation_id)) if v is not None}
    return ws.call("GET", path, query=query)


def failed(*codes: str) -> Response:
    return Response(400, {"errors": [{"message": code} for code in codes]})


def definition() -> dict[str, Any]:
    return orjson.loads(DATA.read_bytes())


def other_campaign(**variation: Any) -> dict[str, Any]:
    return {"campaign_id": OTHER_CAMPAIGN, "name": "Other", "message_variations": [
        {"message_variation_id": OTHER_VARIANT, "channel": "email", **variation},
        {"message_variation_id": OTHER_PUSH, "channel": "push"}]}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A store with tests/data/campaigns.json and one more campaign; only read by the tests."""
    w = open_ws(tmp_path_factory.mktemp("campaigns"))
    w.campaigns.load(DATA)
    w.campaigns.put({"campaigns": [other_campaign(multi_language=True, translations={"de-DE": {HELLO: "Hallo"}})]})
    return w


@pytest.fixture
def ws(tmp_path):
    """A store with tests/data/campaigns.json loaded: a copy of one built once."""
    return copy_of(tmp_path, _loaded_data)


def _loaded_data(w):
    w.campaigns.load(DATA)


# --- success -------------------------------------------------------------------------------------
def test_get_answers_the_translations_in_the_workspace_locale_order(loaded):
    assert get(loaded) == Response(200, {"translations": VARIANT_A_TRANSLATIONS})


@pytest.mark.parametrize("path", [PATH, "/campaign/translations"])
def test_query_string_and_alias_path(loaded, path):
    r = loaded.call("GET", f"{path}?campaign_id={CAMPAIGN}&message_variation_id={VARIANT_A}")
    assert r == Response(200, {"translations": VARIANT_A_TRANSLATIONS})


def test_ids_are_matched_case_insensitively(loaded):
    assert get(loaded, CAMPAIGN.upper(), VARIANT_A.upper()) == Response(200, {"translations": VARIANT_A_TRANSLATIONS})


def test_message_without_translations_answers_an_empty_list(loaded):
    assert get(loaded, variation_id=VARIANT_C) == Response(200, {"translations": []})


def test_each_campaign_answers_its_own_translations(loaded):
    assert get(loaded, OTHER_CAMPAIGN, OTHER_VARIANT) == Response(
        200, {"translations": [{"locale": DE, "translation_map": {HELLO: "Hallo"}}]})


def test_library_translations_returns_the_list_or_raises_with_the_codes(loaded):
    assert loaded.campaigns.translations(CAMPAIGN, VARIANT_A) == VARIANT_A_TRANSLATIONS
    with pytest.raises(RequestError, match="GET /campaigns/translations answered 400: UNSUPPORTED_CHANNEL"):
        loaded.campaigns.translations(CAMPAIGN, PUSH)


# --- error codes ---------------------------------------------------------------------------------
ERROR_CASES = [
    (None, VARIANT_A, [C.INVALID_CAMPAIGN_ID]),
    ("", VARIANT_A, [C.INVALID_CAMPAIGN_ID]),
    ("spring-sale", VARIANT_A, [C.INVALID_CAMPAIGN_ID]),
    (["x"], VARIANT_A, [C.INVALID_CAMPAIGN_ID]),
    ("99999999-9999-4999-8999-999999999999", VARIANT_A, [C.INVALID_CAMPAIGN_ID]),  # no such campaign
    (CAMPAIGN, None, [C.INVALID_MESSAGE_VARIATION_ID]),
    (CAMPAIGN, "variant-a", [C.INVALID_MESSAGE_VARIATION_ID]),
    (CAMPAIGN, 5, [C.INVALID_MESSAGE_VARIATION_ID]),
    (None, None, [C.INVALID_CAMPAIGN_ID, C.INVALID_MESSAGE_VARIATION_ID]),
    ("bad", "bad", [C.INVALID_CAMPAIGN_ID, C.INVALID_MESSAGE_VARIATION_ID]),
    (CAMPAIGN, "99999999-9999-4999-8999-999999999999", [C.MESSAGE_NOT_FOUND]),
    (CAMPAIGN, OTHER_VARIANT, [C.MESSAGE_NOT_FOUND]),  # a variation of another campaign
    (CAMPAIGN, PUSH, [C.UNSUPPORTED_CHANNEL]),
    (OTHER_CAMPAIGN, OTHER_PUSH, [C.UNSUPPORTED_CHANNEL]),  # the channel is checked first
    (CAMPAIGN, VARIANT_B, [C.MULTI_LANGUAGE_NOT_ENABLED_ON_MESSAGE]),
]


@pytest.mark.parametrize(("campaign_id", "variation_id", "codes"), ERROR_CASES)
def test_errors_answer_400_with_the_codes(loaded, campaign_id, variation_id, codes):
    assert get(loaded, campaign_id, variation_id) == failed(*codes)


def test_multi_language_not_enabled_for_the_workspace(tmp_path):
    w = open_ws(tmp_path)
    assert get(w) == failed(C.MULTI_LANGUAGE_NOT_ENABLED)  # nothing defined at all
    data = definition()
    data["multi_language"]["enabled"] = False
    w.campaigns.put(data)
    assert get(w) == failed(C.MULTI_LANGUAGE_NOT_ENABLED)
    assert get(w, variation_id="bad") == failed(C.INVALID_MESSAGE_VARIATION_ID)  # ID shape first
    w.campaigns.set_multi_language(enabled=True, locales=[FR, ES])
    assert get(w) == Response(200, {"translations": VARIANT_A_TRANSLATIONS[::-1]})


def test_every_error_code_is_tested():
    tested = {code for *_, codes in ERROR_CASES for code in codes} | {C.MULTI_LANGUAGE_NOT_ENABLED}
    assert tested == {C.INVALID_CAMPAIGN_ID, C.INVALID_MESSAGE_VARIATION_ID, C.MESSAGE_NOT_FOUND,
                      C.MULTI_LANGUAGE_NOT_ENABLED, C.MULTI_LANGUAGE_NOT_ENABLED_ON_MESSAGE, C.UNSUPPORTED_CHANNEL}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_translations_path_answers_get_only(loaded, method):
    assert loaded.call(method, PATH, body={}).status == 405


# --- definitions ---------------------------------------------------------------------------------
def test_reloading_a_campaign_replaces_it_entirely(ws):
    data = definition()
    variant_a = data["campaigns"][0]["message_variations"][0]
    variant_a["translations"] = {"fr-FR": {HELLO: "Salut"}}
    data["campaigns"][0]["message_variations"] = [variant_a]
    del data["multi_language"]  # the workspace setting stays as it is
    ws.campaigns.put(data)
    assert get(ws) == Response(200, {"translations": [{"locale": FR, "translation_map": {HELLO: "Salut"}}]})
    assert get(ws, variation_id=VARIANT_B) == failed(C.MESSAGE_NOT_FOUND)
    assert ws.table("campaign_translations").collect().height == 1


def test_translations_of_a_locale_removed_from_the_workspace_are_left_out(ws):
    ws.campaigns.set_multi_language(enabled=True, locales=[FR])
    assert get(ws) == Response(200, {"translations": VARIANT_A_TRANSLATIONS[1:]})


def test_uppercase_uuids_in_definitions_are_stored_lower_case(tmp_path):
    w = open_ws(tmp_path)
    data = definition()
    data["campaigns"][0]["campaign_id"] = CAMPAIGN.upper()
    data["campaigns"][0]["message_variations"][0]["translations"]["es-MX"] = {HELLO.upper(): "Hola"}
    w.campaigns.put(data)
    assert get(w).body["translations"][0] == {"locale": ES, "translation_map": {HELLO: "Hola"}}


def broken(path: list[Any], value: Any) -> dict[str, Any]:
    """The sample definition with the value at `path` replaced, appended (one past a list's
end) or deleted (value `...`)."""
    data = definition()
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    elif isinstance(node, list) and path[-1] == len(node):
        node.append(value)
    else:
        node[path[-1]] = value
    return data


V0 = ["campaigns", 0, "message_variations", 0]
WHERE = "campaigns[0].message_variations[0]"
DEFINITION_ERRORS = [
    ([], C.DEF_NOT_OBJECT),
    ({"campaign": []}, C.DEF_UNKNOWN_KEYS.format(keys="campaign", where="the definition", allowed="campaigns, multi_language")),
    (broken(["multi_language"], True), C.DEF_MULTI_LANGUAGE),
    (broken(["multi_language", "enabled"], "yes"), C.DEF_ENABLED),
    (broken(["multi_language", "locales"], [{"name": "es"}]), C.DEF_LOCALES),
    (broken(["multi_language", "locales", 1], ES), C.DEF_LOCALE_DUPLICATE.format(name="es-MX")),
    (broken(["campaigns"], {}), C.DEF_CAMPAIGNS),
    (broken(["campaigns", 0], "x"), C.DEF_CAMPAIGNS),
    (broken(["campaigns", 0, "campaign_id"], "spring"),
     C.DEF_ID.format(where="campaigns[0]", key="campaign_id", value="spring")),
    (broken(["campaigns", 1], definition()["campaigns"][0]),
     C.DEF_DUPLICATE.format(where="campaigns[1]", key="campaign_id", value=CAMPAIGN)),
    (broken(["campaigns", 0, "name"], 5), C.DEF_STRING.format(where="campaigns[0]", key="name")),
    (broken(["campaigns", 0, "message_variations"], "x"), C.DEF_VARIATIONS.format(where="campaigns[0]")),
    (broken([*V0, "colour"], "red"),
     C.DEF_UNKNOWN_KEYS.format(keys="colour", where=WHERE, allowed=", ".join(sorted(C.VARIATION_KEYS)))),
    (broken([*V0, "message_variation_id"], ...),
     C.DEF_ID.format(where=WHERE, key="message_variation_id", value=None)),
    (broken(["campaigns", 0, "message_variations", 1, "message_variation_id"], VARIANT_A),
     C.DEF_DUPLICATE.format(where="campaigns[0]", key="message_variation_id", value=VARIANT_A)),
    (broken([*V0, "channel"], "fax"), C.DEF_CHANNEL.format(where=WHERE, channels=", ".join(C.CHANNELS), value="fax")),
    (broken(["campaigns", 0, "channel"], ...),
     C.DEF_CHANNEL.format(where=WHERE, channels=", ".join(C.CHANNELS), value=None)),
    (broken([*V0, "multi_language"], "on"), C.DEF_FLAG.format(where=WHERE)),
    (broken([*V0, "translations"], ["x"]), C.DEF_TRANSLATIONS.format(where=WHERE)),
    (broken([*V0, "translations", "es-MX", HELLO], 5), C.DEF_TRANSLATIONS.format(where=WHERE)),
    (broken([*V0, "translations", "es-MX", "greeting"], "Hola"),
     C.DEF_TRANSLATION_ID.format(where=WHERE, value="greeting")),
    (broken([*V0, "translations", "it-IT"], {HELLO: "Ciao"}),
     C.DEF_UNKNOWN_LOCALE.format(where=WHERE, locale="it-IT", known="es-MX, fr-FR, de-DE")),
]


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    """A store that invalid definitions must leave empty."""
    return open_ws(tmp_path_factory.mktemp("definitions"))


@pytest.mark.parametrize(("data", "message"), DEFINITION_ERRORS)
def test_invalid_definitions_raise_and_write_nothing(empty, data, message):
    with pytest.raises(ConfigError) as raised:
        empty.campaigns.put(copy.deepcopy(data))
    assert str(raised.value) == message
    assert all(empty.table(t).collect().height == 0 for t in ("campaign_settings", "campaigns", "campaign_messages"))


def test_unknown_locale_is_checked_against_the_stored_setting(ws):
    with pytest.raises(ConfigError) as raised:
        ws.campaigns.put({"campaigns": [other_campaign(translations={"it-IT": {HELLO: "Ciao"}})]})
    assert str(raised.value) == C.DEF_UNKNOWN_LOCALE.format(
        where=WHERE, locale="it-IT", known="es-MX, fr-FR, de-DE")
    assert ws.table("campaigns").collect().height == 1


@pytest.mark.parametrize(("content", "reason"), [(None, "No such file"), (b"{nope", "unexpected character")])
def test_load_reports_unreadable_files(tmp_path, content, reason):
    path = tmp_path / "campaigns.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"cannot read campaign definitions from {path}: .*{reason}"):
        open_ws(tmp_path).campaigns.load(path)


# --- batches and reopening -----------------------------------------------------------------------
def test_apply_equals_calling_one_by_one(loaded):
    requests = [{"method": "GET", "path": PATH, "query": {"campaign_id": c, "message_variation_id": v}}
                for c, v, _ in ERROR_CASES] + [
        {"method": "GET", "path": f"/campaign/translations?campaign_id={CAMPAIGN}&message_variation_id={VARIANT_A}"}]
    batched = loaded.apply(requests)
    assert batched == [loaded.call(r["method"], r["path"], query=r.get("query")) for r in requests]
    assert batched[-1] == Response(200, {"translations": VARIANT_A_TRANSLATIONS})


def test_reopened_store_answers_the_same(tmp_path):
    w = open_ws(tmp_path)
    w.campaigns.load(DATA)
    again = Workspace.open(tmp_path / "store", clock=lambda: NOW, seed=SEED)
    assert get(again) == Response(200, {"translations": VARIANT_A_TRANSLATIONS})
    assert get(again, variation_id=VARIANT_B) == failed(C.MULTI_LANGUAGE_NOT_ENABLED_ON_MESSAGE)
