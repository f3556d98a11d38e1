"""Request bodies of the specification, as pydantic models: they describe the API in the
server's OpenAPI document (`/openapi.json`). The rules validate every body themselves (with
the specification's own error shapes), so these models never reject a request.

Objects that carry custom attributes or properties are open by design (`extra="allow"`);
the rest are closed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class AliasIdentifier(_Closed):
    alias_name: str
    alias_label: str


class _Identified(_Open):
    """Exactly one identifier (email wins over phone when both are sent)."""

    external_id: str | None = None
    user_alias: AliasIdentifier | None = None
    service_id: str | None = None
    email: str | None = None
    phone: str | None = None
    update_existing_only: bool | None = Field(None, alias="_update_existing_only")


class PushToken(_Closed):
    app_id: str
    token: str
    device_id: str | None = None


class SubscriptionGroup(_Closed):
    subscription_group_id: str
    subscription_state: Literal["subscribed", "unsubscribed"]


class AttributesObject(_Identified):
    """Profile fields and custom attributes: any other key sets an attribute of that name
    (`null` removes it; `{"inc": n}`, `{"add": [...]}`, `{"remove": [...]}` change it)."""

    push_token_import: bool | None = None
    first_name: str | None = None
    dob: str | None = Field(None, description="YYYY-MM-DD")
    email_subscribe: Literal["subscribed", "unsubscribed", "opted_in"] | None = None
    push_tokens: list[PushToken] | None = None
    subscription_groups: list[SubscriptionGroup] | None = None


class EventObject(_Identified):
    app_id: str | None = None
    name: str
    time: str = Field(description="ISO 8601 datetime, or yyyy-MM-dd'T'HH:mm:ss:SSSZ")
    properties: dict[str, Any] | None = None


class PurchaseObject(_Identified):
    app_id: str | None = None
    product_id: str
    currency: str
    price: float
    quantity: int | None = None
    time: str
    properties: dict[str, Any] | None = None


class TrackRequest(_Closed):
    """At least one array; at most 75 objects in each."""

    attributes: list[AttributesObject] | None = None
    events: list[EventObject] | None = None
    purchases: list[PurchaseObject] | None = None


class ExportRequest(_Closed):
    external_ids: list[str] | None = Field(None, description="at most 50")
    user_aliases: list[AliasIdentifier] | None = Field(None, description="at most 50")
    service_id: str | None = None
    device_id: str | None = None
    email_address: str | None = None
    phone: str | None = None
    fields_to_export: list[str]


class MergeIdentifier(_Closed):
    external_id: str | None = None
    user_alias: AliasIdentifier | None = None
    email: str | None = None
    phone: str | None = None
    prioritization: list[str] | None = None


class MergeUpdate(_Closed):
    identifier_to_merge: MergeIdentifier
    identifier_to_keep: MergeIdentifier


class MergeRequest(_Closed):
    merge_updates: list[MergeUpdate] = Field(description="at most 50")


class AliasToIdentify(_Closed):
    external_id: str
    user_alias: AliasIdentifier


class EmailToIdentify(_Closed):
    external_id: str
    email: str
    prioritization: list[str]


class PhoneToIdentify(_Closed):
    external_id: str
    phone: str
    prioritization: list[str]


class IdentifyRequest(_Closed):
    aliases_to_identify: list[AliasToIdentify] | None = Field(None, description="at most 50")
    emails_to_identify: list[EmailToIdentify] | None = None
    phone_numbers_to_identify: list[PhoneToIdentify] | None = None
    merge_behavior: Literal["none", "merge"] | None = None


class ExternalIdRename(_Closed):
    current_external_id: str
    new_external_id: str


class RenameRequest(_Closed):
    external_id_renames: list[ExternalIdRename] = Field(description="at most 50")


class RemoveRequest(_Closed):
    external_ids: list[str] = Field(description="deprecated external IDs, at most 50")


class NewAlias(_Closed):
    external_id: str | None = None
    alias_name: str
    alias_label: str


class AliasNewRequest(_Closed):
    user_aliases: list[NewAlias] = Field(description="at most 50")


class AliasUpdate(_Closed):
    alias_label: str
    old_alias_name: str
    new_alias_name: str


class AliasUpdateRequest(_Closed):
    alias_updates: list[AliasUpdate] = Field(description="at most 50")


class DeleteRequest(_Closed):
    external_ids: list[str] | None = None
    user_aliases: list[AliasIdentifier] | None = None
    service_ids: list[str] | None = None


class PreferenceCenterRequest(_Closed):
    name: str
    preference_center_title: str
    preference_center_page_html: str
    confirmation_page_html: str
    state: Literal["active", "draft"] | None = None
    options: dict[str, Any] | None = None


class CatalogField(_Closed):
    name: str
    type: Literal["string", "number", "boolean", "time", "array", "object"]


class CatalogDefinition(_Closed):
    name: str
    description: str | None = None
    fields: list[CatalogField]


class CatalogsRequest(_Closed):
    catalogs: list[CatalogDefinition]


class CatalogItem(_Open):
    """The item's fields, which must exist in the catalog."""

    id: str


class CatalogItemsRequest(_Closed):
    items: list[CatalogItem] = Field(description="at most 50")


class CatalogItemIdsRequest(_Closed):
    items: list[CatalogItem] = Field(description="at most 50; each carries the id to delete")


class ScimUserRequest(_Open):
    """RFC 7644 user: `schemas`, `userName` (create only), `name`, `department`, `permissions`."""

    schemas: list[str]
    userName: str | None = None  # noqa: N815 - SCIM's own name
    name: dict[str, str]
    department: str
    permissions: dict[str, Any]


class SubscriptionStatusSetRequest(_Closed):
    """One group's state for users: external IDs, and emails or phones (not both)."""

    subscription_group_id: str
    subscription_state: Literal["subscribed", "unsubscribed"]
    external_id: str | list[str] | None = Field(None, description="at most 50")
    email: str | list[str] | None = Field(None, description="at most 50")
    phone: str | list[str] | None = Field(None, description="at most 50, E.164")
    use_double_opt_in_logic: bool | None = None


class SubscriptionGroupEntry(_Closed):
    subscription_group_id: str
    subscription_state: Literal["subscribed", "unsubscribed"]
    external_ids: list[str] | None = Field(None, description="at most 50")
    emails: list[str] | None = Field(None, description="at most 50")
    phones: list[str] | None = Field(None, description="at most 50, E.164")
    use_double_opt_in_logic: bool | None = None


class SubscriptionStatusSetV2Request(_Closed):
    subscription_groups: list[SubscriptionGroupEntry] = Field(description="1 to 50, written in order")


class EmailStatusRequest(_Closed):
    email: str | list[str] = Field(description="an address, or at most 50")
    subscription_state: Literal["subscribed", "unsubscribed", "opted_in"]


class EmailsRequest(_Closed):
    email: str | list[str] = Field(description="an address, or at most 50")


# (method, route pattern) -> the model of its body
REQUEST_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("POST", "/users/track"): TrackRequest,
    ("POST", "/users/export/ids"): ExportRequest,
    ("POST", "/users/merge"): MergeRequest,
    ("POST", "/users/identify"): IdentifyRequest,
    ("POST", "/users/external_ids/rename"): RenameRequest,
    ("POST", "/users/external_ids/remove"): RemoveRequest,
    ("POST", "/users/alias/new"): AliasNewRequest,
    ("POST", "/users/alias/update"): AliasUpdateRequest,
    ("POST", "/users/delete"): DeleteRequest,
    ("POST", "/preference_center/v1"): PreferenceCenterRequest,
    ("PUT", "/preference_center/v1/{preferenceCenterExternalID}"): PreferenceCenterRequest,
    ("POST", "/catalogs"): CatalogsRequest,
    ("PUT", "/catalogs/{catalog_name}/items"): CatalogItemsRequest,
    ("DELETE", "/catalogs/{catalog_name}/items"): CatalogItemIdsRequest,
    ("POST", "/scim/v2/Users"): ScimUserRequest,
    ("PUT", "/scim/v2/Users/{id}"): ScimUserRequest,
    ("POST", "/subscription/status/set"): SubscriptionStatusSetRequest,
    ("POST", "/v2/subscription/status/set"): SubscriptionStatusSetV2Request,
    ("POST", "/email/status"): EmailStatusRequest,
    ("POST", "/email/blocklist"): EmailsRequest,
    ("POST", "/email/bounce/remove"): EmailsRequest,
    ("POST", "/email/spam/remove"): EmailsRequest,
}
