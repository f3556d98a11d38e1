"""Store tables of SCIM dashboard users and the company directory their permissions name.

Permissions are stored by ID (compact JSON text) and rendered with the directory's current
names, so renaming a workspace in the directory renames it on every user.
"""

from __future__ import annotations

import polars as pl

from engagelake.tables.types import UTC_TS

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # one row per dashboard user; `user_name_key` is the lower-cased userName (uniqueness, filter)
    "scim_users": {
        "id": pl.String(),
        "user_name": pl.String(),
        "user_name_key": pl.String(),
        "given_name": pl.String(),
        "family_name": pl.String(),
        "department": pl.String(),
        # {companyPermissions: [..], roles: [roleId..], appGroup: [{appGroupId, appGroupPermissions,
        #  team: [{teamId, teamPermissions}], appGroupPermissionSets: [setId..]}]}
        "permissions": pl.String(),
        "last_sign_in_at": UTC_TS,
        "created_at": UTC_TS,
        "created_seq": pl.Int64(),  # users ever created before this one: the listing order
        "updated_at": UTC_TS,
    },
    # lineage of user changes: create, update, delete, sign_in (also counts users ever created)
    "scim_user_log": {
        "id": pl.String(), "op": pl.String(), "user_name": pl.String(), "at": UTC_TS,
    },
    # the company directory
    "scim_permissions": {"permission": pl.String()},
    "scim_workspaces": {"app_group_id": pl.String(), "name": pl.String()},
    "scim_teams": {"team_id": pl.String(), "app_group_id": pl.String(), "name": pl.String()},
    "scim_permission_sets": {
        "permission_set_id": pl.String(), "app_group_id": pl.String(), "name": pl.String(),
        "permissions": pl.String(),  # JSON array of permission strings
    },
    "scim_roles": {
        "role_id": pl.String(), "name": pl.String(),
        "app_groups": pl.String(),  # JSON: the role's workspaces, shaped as a user's appGroup by ID
    },
}

KEYS: dict[str, tuple[str, ...] | None] = {
    "scim_users": ("id",),
    "scim_user_log": None,
    "scim_permissions": ("permission",),
    "scim_workspaces": ("app_group_id",),
    "scim_teams": ("team_id",),
    "scim_permission_sets": ("permission_set_id",),
    "scim_roles": ("role_id",),
}
