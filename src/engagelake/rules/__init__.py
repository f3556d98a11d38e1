"""The rules: frames in, changes and responses out, grouped by what they own.

- `profile/`: `/users/track` (parse, validate, attributes, track);
- `identity/`: merge, identify, external ID rename/remove, aliases, delete, and lineage;
- `export.py`: `/users/export/ids` and the export of every user;
- shared by the groups: `state.py` (a batch's view of the store), `messages.py`, `formats.py`,
  `reference.py`.

Rules never import `store/`: they read stored rows through `state.State` (see `rules/ruff.toml`).
"""
