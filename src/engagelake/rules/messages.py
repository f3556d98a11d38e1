"""Every error text the engine answers with, in one place.

The engine, the in-memory reference model in tests/ and the docs all use these constants, so a
changed wording changes everywhere at once. Check order is documented in docs/semantics.md.
"""

# --- /users/track: fatal (status 400, nothing of the request applied) -------------------------
FATAL_BODY_NOT_OBJECT = "request body must be a JSON object"
FATAL_NO_ARRAYS = "request must contain at least one of attributes, events or purchases"
FATAL_NOT_ARRAY = "{array} must be an array"
FATAL_TOO_MANY = "{array} may contain at most 75 objects"
FATAL_ELEMENT_NOT_OBJECT = "{array}[{index}] must be an object"
# only with the workspace setting `monthly_active_user_plan` (docs/decisions.md)
FATAL_TOO_MANY_UPDATES = ("attributes, events and purchases may contain at most {limit} objects together "
                          "on a monthly-active-user plan")
FATAL_BLOCKED_EXTERNAL_ID = "provided external_id is blacklisted and disallowed"

# --- /users/track: non-fatal (the object at `index` is skipped) --------------------------------
# Identifier checks, in this order.
ERR_PUSH_TOKEN_IMPORT = "invalid push_token_import: must be a boolean"
ERR_UPDATE_EXISTING_ONLY = "invalid _update_existing_only: must be a boolean"
ERR_MULTIPLE_IDENTIFIERS = "multiple identifiers: give exactly one of external_id, user_alias, service_id"
ERR_MISSING_IDENTIFIER = "missing identifier: one of external_id, user_alias, service_id, email or phone is required"
ERR_EXTERNAL_ID = "invalid external_id: must be a non-empty string"
ERR_USER_ALIAS = "invalid user_alias: must be an object with non-empty string alias_name and alias_label"
ERR_SERVICE_ID = "invalid service_id: must be a non-empty string"
ERR_EMAIL = "invalid email address"
ERR_PHONE = "invalid phone number: expected E.164 (+ and 8 to 15 digits)"
# Profile fields, checked in PROFILE_FIELD_ORDER.
ERR_FIELD_STRING = "invalid {field}: expected a string of at most 255 characters"
ERR_DOB = "invalid dob: expected a real date as YYYY-MM-DD"
ERR_GENDER = "invalid gender: expected one of M, F, O, N, P"
ERR_COUNTRY = "invalid country: expected an ISO 3166-1 alpha-2 code"
ERR_LANGUAGE = "invalid language: expected an ISO 639-1 code"
ERR_TIME_ZONE = "invalid time_zone: expected an IANA time zone name"
ERR_SUBSCRIBE = "invalid {field}: expected subscribed, unsubscribed or opted_in"
ERR_COORDINATES = "invalid last_coordinates: expected [longitude, latitude] in range"
ERR_PUSH_TOKENS = "invalid push_tokens: expected an array of {app_id, token, device_id?} with string values"
ERR_SUBSCRIPTION_GROUPS = "invalid subscription_groups: expected an array of {subscription_group_id, subscription_state} with state subscribed or unsubscribed"
# Custom attributes, checked in object key order.
ERR_ATTRIBUTE_NAME = "invalid custom attribute name: must be 1 to 255 characters and not start with $"
ERR_ATTRIBUTE_STRING = "custom attribute string longer than 255 characters"
ERR_ATTRIBUTE_DEPTH = "custom attribute nested deeper than 50 object levels"
ERR_INC_VALUE = "inc value must be an integer"
ERR_ADD_REMOVE_VALUE = "add and remove values must be arrays"
# State-dependent checks, after every static check passed.
ERR_UNKNOWN_SERVICE_ID = "unknown service_id"
ERR_INC_NOT_NUMERIC = "cannot increment a non-numeric attribute"
ERR_ARRAY_OP_NOT_ARRAY = "cannot add to or remove from a non-array attribute"
# Events and purchases.
ERR_EVENT_NAME = "invalid event name: must be a non-empty string of at most 255 characters"
ERR_TIME = "invalid time: expected ISO 8601 with a UTC offset"
ERR_APP_ID = "invalid app_id: must be a string"
ERR_PROPERTIES = "invalid properties: must be an object"
ERR_PROPERTY_NAME = "invalid property name: must be 1 to 254 characters and not start with $"
ERR_PROPERTIES_SIZE = "properties too large: at most 100 KB with arrays or objects, 50 KB otherwise"
ERR_PRODUCT_ID = "invalid product_id: must be a non-empty string of at most 255 characters"
ERR_CURRENCY = "invalid currency: expected three upper-case letters"
ERR_PRICE = "invalid price: must be a number"
ERR_QUANTITY = "invalid quantity: expected an integer from 1 to 100"

# --- /users/export/ids (status 400, {"message": ...}) ------------------------------------------
EXPORT_BODY_NOT_OBJECT = "request body must be a JSON object"
EXPORT_NO_IDENTIFIER = "at least one of external_ids, user_aliases, service_id, device_id, email_address or phone is required"
EXPORT_EXTERNAL_IDS = "external_ids must be an array of strings"
EXPORT_USER_ALIASES = "user_aliases must be an array of {alias_name, alias_label} objects with string values"
EXPORT_TOO_MANY = "at most 50 external_ids and user_aliases together"
EXPORT_ONE_OF = "only one of device_id, email_address or phone may be given"
EXPORT_STRING_FIELD = "{field} must be a string"
EXPORT_FIELDS_REQUIRED = "fields_to_export is required"
EXPORT_FIELDS_SHAPE = "fields_to_export must be an array of strings"
EXPORT_UNKNOWN_FIELDS = "unknown fields_to_export: {names}"

# --- dispatch ----------------------------------------------------------------------------------
NOT_FOUND = "no such endpoint: {method} {path}"
METHOD_NOT_ALLOWED = "method {method} not allowed on {path}; allowed: {allowed}"
BAD_JSON = "request body is not valid JSON"
NON_FINITE_NUMBER = (
    "invalid number at {where}: beyond the range of a 64-bit float (or NaN), which JSON cannot carry; "
    "send a finite number, or the value as a string"
)
# Python values of a body or a query given to `call`/`apply` that JSON text cannot hold (issue 56);
# `where` names the place as NON_FINITE_NUMBER does (`attributes[0].score`, `query.filter`, `body`)
VALUE_NOT_JSON = (
    "invalid value at {where}: a Python {kind}, which JSON cannot hold; send text, a number, true, false, "
    "null, an array or an object"
)
KEY_NOT_TEXT = "invalid key at {where}: {key} (a Python {kind}); the keys of a JSON object are text"
INTEGER_BEYOND_64_BITS = (
    "invalid number at {where}: an integer beyond 64 bits, which this API cannot carry exactly; send it as a "
    "string"
)
LONE_SURROGATE = (
    "invalid text at {where}: a lone surrogate (half of a UTF-16 pair), which UTF-8, and so JSON text, cannot "
    "carry; send whole characters"
)
# the most levels of arrays and objects a body may nest (orjson writes no deeper: 254)
MAX_BODY_DEPTH = 254
BODY_TOO_DEEP = "request body nests arrays and objects more than {most} levels deep"
BAD_REQUEST = "a request must be an object with string method and path"
BAD_QUERY = "query must be an object of query parameters (names are strings), not {kind}"

# Profile fields settable through /users/track, in validation order.
PROFILE_FIELD_ORDER = (
    "first_name",
    "last_name",
    "email",
    "phone",
    "dob",
    "gender",
    "country",
    "language",
    "home_city",
    "time_zone",
    "email_subscribe",
    "push_subscribe",
    "last_coordinates",
    "attributed_campaign",
    "attributed_source",
    "attributed_adgroup",
    "attributed_ad",
)
STRING_FIELDS = (
    "first_name",
    "last_name",
    "home_city",
    "attributed_campaign",
    "attributed_source",
    "attributed_adgroup",
    "attributed_ad",
)
IDENTIFIER_FIELDS = ("external_id", "user_alias", "service_id", "email", "phone")
RESERVED_NAMES = frozenset(
    (*IDENTIFIER_FIELDS, *PROFILE_FIELD_ORDER, "_update_existing_only", "push_token_import",
     "push_tokens", "subscription_groups")
)
BLOCKED_EXTERNAL_IDS = frozenset(
    ("", "null", "none", "nil", "undefined", "n/a", "na", "unknown", "0", "-1",
     "[object object]", "anonymous", "guest", "user", "test")
)
SUBSCRIBE_STATES = ("subscribed", "unsubscribed", "opted_in")
GROUP_STATES = ("subscribed", "unsubscribed")
GENDERS = ("M", "F", "O", "N", "P")

EXPORT_FIELDS = (
    "apps", "attributed_campaign", "attributed_source", "attributed_adgroup", "attributed_ad",
    "service_id", "country", "created_at", "custom_attributes", "custom_events", "devices", "dob",
    "email", "external_id", "first_name", "gender", "home_city", "language", "last_coordinates",
    "last_name", "phone", "purchases", "push_tokens", "random_bucket", "time_zone",
    "total_revenue", "uninstalled_at", "user_aliases",
    # accepted besides the specification's list (docs/semantics.md, export)
    "email_subscribe", "push_subscribe", "push_opted_in_at",
)

# --- identity endpoints (status 400, {"message": ...}; nothing of the request applied) ----------
BODY_NOT_OBJECT = "request body must be a JSON object"
LIST_NOT_ARRAY = "{field} must be an array of objects"
LIST_EMPTY = "{field} must not be empty"
LIST_TOO_MANY = "{field} may contain at most 50 objects"
ITEM_NOT_OBJECT = "{field}[{index}] must be an object"
# merge
MERGE_SIDES = "merge_updates[{index}] must have identifier_to_merge and identifier_to_keep objects"
IDENTIFIER_ONE_OF = "{where} must contain exactly one of external_id, user_alias, service_id, email or phone"
IDENTIFIER_INVALID = "{where}: {error}"
PRIORITIZATION = ("{where}: prioritization must be a non-empty array of identified, unidentified, "
                  "most_recently_updated, least_recently_updated")
PRIORITIZATION_BOTH = "{where}: prioritization may contain only one of identified and unidentified"
PRIORITIZATION_VALUES = ("identified", "unidentified", "most_recently_updated", "least_recently_updated")
# identify
IDENTIFY_NO_ARRAYS = "at least one of aliases_to_identify, emails_to_identify or phone_numbers_to_identify is required"
IDENTIFY_TOO_MANY = ("aliases_to_identify, emails_to_identify and phone_numbers_to_identify may contain "
                     "at most 50 objects together")
IDENTIFY_MERGE_BEHAVIOR = "merge_behavior must be none or merge"
IDENTIFY_EXTERNAL_ID = "{where}: external_id must be a non-empty string"
IDENTIFY_BLOCKED = "{where}: " + "provided external_id is blacklisted and disallowed"
# external IDs: rename and remove (per-item errors listed with the item's index)
IDS_NOT_STRINGS = "external_ids must be an array of strings"
RENAME_SHAPE = "current_external_id and new_external_id must be non-empty strings"
RENAME_SAME = "current_external_id and new_external_id must differ"
RENAME_BLOCKED = "new_external_id is blacklisted and disallowed"
RENAME_DEPRECATED = "current_external_id is a deprecated external ID; only primary IDs can be renamed"
RENAME_UNKNOWN = "current_external_id does not exist"
RENAME_IN_USE = "new_external_id is already in use"
REMOVE_SHAPE = "external ID must be a non-empty string"
REMOVE_PRIMARY = "external ID is a primary ID; only deprecated IDs can be removed"
REMOVE_UNKNOWN = "external ID does not exist"
# aliases
ALIAS_SHAPE = "{where} must have non-empty string alias_name and alias_label"
ALIAS_EXTERNAL_ID = "{where}: external_id must be a non-empty string"
ALIAS_UPDATE_SHAPE = "{where} must have non-empty string alias_label, old_alias_name and new_alias_name"
# delete
DELETE_NO_IDS = "at least one of external_ids, user_aliases or service_ids is required"
DELETE_TOO_MANY = "external_ids, user_aliases and service_ids may contain at most 50 identifiers together"
DELETE_STRINGS = "{field} must be an array of non-empty strings"
DELETE_ALIASES = "user_aliases must be an array of {alias_name, alias_label} objects with non-empty string values"
# lineage reasons of skipped items (the merges audit table)
SKIP_UNRESOLVABLE = "unresolvable: {side}"
SKIP_AMBIGUOUS = "ambiguous: {side}"
SKIP_SAME_USER = "same user"
SKIP_IDENTIFIED = "already identified"
SKIP_LABEL_TAKEN = "alias label taken"
SKIP_ALIAS_EXISTS = "alias exists"
SKIP_NO_USER = "no such user"
