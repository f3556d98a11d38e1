"""Pydantic models of the response bodies, named by role.

Bodies are built by the rules, then validated through these models and dumped with
`exclude_unset`, so a field the engine did not set is omitted (the specification reads a
missing field as null, false or empty) while nested custom values keep their nulls.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrackError(_Closed):
    type: str
    input_array: Literal["attributes", "events", "purchases"]
    index: int


class TrackResponse(_Closed):
    message: str
    attributes_processed: int | None = None
    events_processed: int | None = None
    purchases_processed: int | None = None
    errors: list[TrackError] | None = None


class TrackFatalResponse(_Closed):
    message: str
    errors: list[str]


class UserAlias(_Closed):
    alias_name: str
    alias_label: str


class Summary(_Closed):
    """A custom event or purchase over the last 90 days."""

    name: str
    first: str
    last: str
    count: int


class PushToken(_Closed):
    app: str
    platform: Literal["iOS", "Android", "Web"] | None = None  # from the token's shape; absent when unknown
    token: str
    device_id: str | None = None
    notifications_enabled: bool


class Device(_Closed):
    device_id: str


class ExportedUser(_Closed):
    created_at: str | None = None
    external_id: str | None = None
    user_aliases: list[UserAlias] | None = None
    service_id: str | None = None
    random_bucket: int | None = None
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = None
    home_city: str | None = None
    phone: str | None = None
    dob: str | None = None
    country: str | None = None
    language: str | None = None
    time_zone: str | None = None
    last_coordinates: list[float] | None = None
    gender: str | None = None
    total_revenue: float | None = None
    attributed_campaign: str | None = None
    attributed_source: str | None = None
    attributed_adgroup: str | None = None
    attributed_ad: str | None = None
    push_subscribe: str | None = None
    email_subscribe: str | None = None
    push_opted_in_at: str | None = None
    # open by design: custom attribute names and JSON values are the caller's
    custom_attributes: dict[str, Any] | None = None
    custom_events: list[Summary] | None = None
    purchases: list[Summary] | None = None
    devices: list[Device] | None = None
    push_tokens: list[PushToken] | None = None


class ExportResponse(_Closed):
    message: str
    users: list[ExportedUser]
    invalid_user_ids: list[str] | None = None


class MessageResponse(_Closed):
    """Validation errors of most endpoints: 400 `{"message": ...}`."""

    message: str


def dump(model: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """Validate a response body against its model and return it as JSON-ready data."""
    return model.model_validate(body).model_dump(mode="json", exclude_unset=True)
