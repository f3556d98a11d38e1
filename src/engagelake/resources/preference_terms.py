"""What the preference center handlers (`preference_centers.py`) and their Liquid pages
(`pages.py`) share: form field names, the link tag keys, the page messages and the refusal that
ends a handler with an error response. A module of its own, so that neither imports the other
for them (`preference_centers` imports `pages` on first use; `pages` imports only this)."""

from __future__ import annotations

LINK_KEYS = ("rel", "type", "sizes", "color", "href")  # of each options.links-tags object
# form field names the `form_field_name` tag writes and a submit accepts
FIELD_GLOBAL = "email_global_state"
FIELD_GROUP_PREFIX = "subscription_group:"
# the key `subscribed_state` uses for the global email state (not usable as a group id)
GLOBAL_KEY = "email_global"

# --- error texts of the pages (400 unless noted) ----------------------------------------------
ERR_TEMPLATE = "invalid {field}: {error} (line {line})"
ERR_TEMPLATE_SIZE = ("invalid {field}: {size:,} characters, over the limit of {most:,}: link large images, "
                     "styles and scripts from the page instead of writing them into it")
ERR_PARTIAL = "include and render are not supported: a page cannot load template '{name}'"
ERR_RENDER = "the page of preference center {center_id} cannot be rendered: {error}"  # 422
ERR_FORM_TAG = "form_field_name expects ':subscription_group <subscription_group_api_id>' or ':email_global_state'"


