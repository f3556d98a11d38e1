"""Polars' allocator setting, as `import engagelake` leaves it for Polars to read (docs/decisions.md)."""

from __future__ import annotations

import os
import subprocess
import sys

# jemalloc reads the options of `_RJEM_MALLOC_CONF` in order: a later one overrides an earlier one
READ_BACK = "import engagelake, polars, os; print(os.environ['_RJEM_MALLOC_CONF'])"


def _conf(env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", READ_BACK], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().split(",")


def test_engagelake_imported_first_keeps_polars_freed_pages_10_s() -> None:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    options = _conf(env)
    last = {key: value for key, value in (option.split(":", 1) for option in options)}
    assert last["dirty_decay_ms"] == "10000" and last["muzzy_decay_ms"] == "10000"


def test_a_setting_of_the_environment_wins() -> None:
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:0"}
    assert _conf(env)[-1] == "dirty_decay_ms:0"
