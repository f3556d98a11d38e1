"""Prefect flows over `engagelake.Workspace`: bulk batches in, exports out.

The flows are thin: they find and read files, call `Workspace.apply` / `Workspace.call` /
`Workspace.export_users`, and write files. Tasks retry only on I/O errors (`OSError`), and
every flow is safe to re-run.

- `flows.track_batch.track_batch(folder, store)`: apply each request file as one batch.
- `flows.track_batch.merge_batch(folder, store)` / `identify_batch(folder, store)`: the same for
  files of merge / identify requests only (a file with another endpoint is refused).
- `flows.track_batch.compact_store(store, parts=1)`: rewrite tables to their current rows, drop old
  files; with `parts` > 1 the big tables' key ranges are written as tasks (on a Dask cluster, given
  a `DaskTaskRunner`) and committed together.
- `flows.track_batch.publish_current(store, out)`: write current rows as plain Delta tables for
  readers outside engagelake (Spark, DuckDB's `delta_scan`).
- `flows.cleanup_push_tokens.cleanup_push_token_profiles(store)`: monthly, delete the temporary
  anonymous profiles of `push_token_import` that hold no push token any more.
- `flows.export_batch.export_batch(identifiers, out_dir, store)`: export users by external ID.
- `flows.export_batch.export_all(out_dir, store, parts=1)`: export every user of the store, in
  `parts` tasks that a `DaskTaskRunner` runs on a Dask cluster (`docs/scale-out.md`).

`flows.serve` holds the deployments (`build_deployments()`) and serves them (`main()`, or
`python flows/serve.py`); every flow run creates a Prefect artifact keyed by its flow's name
with dashes (`flows._artifacts`).
"""
