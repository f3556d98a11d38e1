"""P4: identity runs into a big store.

- merge: `--merges` merge updates (default 100k) in chains of length 1 to 5 (u0 into u1, u1 into
  u2, ...), 50 per request, applied as one batch into a store of `--users` users (default 1M);
  target: at most 5 s on this machine.
- alias/new: `--identifies` aliases (default 100k) created as alias-only profiles, one batch.
- identify: the same number of identify elements, one batch: half to new external IDs (the alias
  profile is identified), half to existing users with `merge_behavior: merge`.
Prints seconds, items per second, peak RSS and a check of the resulting store.

    uv run python benchmarks/bench_identity.py [--users 1000000] [--merges 100000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from engagelake import Workspace
from harness import RssSampler, build_store, console, max_rss, mib
from workload import ext_ids

TARGET_MERGE_S = 5.0


def survivors_of(groups: list[list[int]], users: int) -> np.ndarray:
    """User numbers not merged away by `groups` (each chain keeps its last user)."""
    gone = np.array([u for chain in groups for u in chain[:-1]], dtype=np.int64)
    return np.setdiff1d(np.arange(users), gone)


def chains(users: int, updates: int, rng: np.random.Generator, *, pool: np.ndarray | None = None
           ) -> list[list[int]]:
    """Disjoint chains of user numbers, lengths 1..5 merges, `updates` merges in all, drawn from
    0..users-1 or from `pool` (the users still there)."""
    pool = np.arange(users) if pool is None else pool
    users = len(pool)
    out, used, start = [], 0, int(rng.integers(0, max(1, users // 10)))
    order = pool[rng.permutation(users)]
    while used < updates:
        k = min(int(rng.integers(1, 6)), updates - used)
        if start + k + 1 > users:
            raise SystemExit(f"not enough users for {updates:,} merges")
        out.append(order[start:start + k + 1].tolist())
        start += k + 1
        used += k
    return out


def merge_requests(groups: list[list[int]], *, by_email: bool = False) -> list[dict[str, Any]]:
    """Merge updates along each chain, by external ID or by email (`most_recently_updated`)."""
    def ident(name: str) -> dict[str, Any]:
        if by_email:  # the store's users have the email <external_id>@example.com
            return {"email": f"{name}@example.com", "prioritization": ["identified", "most_recently_updated"]}
        return {"external_id": name}

    updates = []
    for chain in groups:
        names = ext_ids(np.array(chain))
        updates += [{"identifier_to_merge": ident(a), "identifier_to_keep": ident(b)}
                    for a, b in zip(names, names[1:], strict=False)]
    return [{"method": "POST", "path": "/users/merge", "body": {"merge_updates": updates[i:i + 50]}}
            for i in range(0, len(updates), 50)]


def timed(ws: Workspace, requests: list[dict[str, Any]]) -> tuple[float, int, list[int]]:
    ws.store.wait_for_merges()  # the previous phase's merges are not this one's
    ws.store.merges.clear()
    with RssSampler() as rss:
        t = time.perf_counter()
        responses = ws.apply(requests)
        seconds = time.perf_counter() - t
        t = time.perf_counter()
        ws.store.wait_for_merges()
        waited = time.perf_counter() - t
    if ws.store.merges:  # the store merges its sorted runs after the commit, in a thread
        console.print(f"  run merges after the commit (off the apply's latency) "
                      f"{sum(s for _, _, s in ws.store.merges):.2f} s, still running {waited:.2f} s after it "
                      f"({', '.join(f'{t} {n} runs {s:.2f} s' for t, n, s in ws.store.merges)})")
    return seconds, rss.peak, sorted({r.status for r in responses})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--merges", type=int, default=100_000)
    ap.add_argument("--email-merges", type=int, default=100_000, help="merge updates identified by email")
    ap.add_argument("--identifies", type=int, default=100_000)
    ap.add_argument("--store", type=Path, default=None, help="store folder (default: a temporary one)")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    root = args.store or Path(tempfile.mkdtemp(prefix="bench-identity-"))
    console.print(f"building a store of {args.users:,} users in {root}")
    built = build_store(root / "store", args.users, 100_000, rng, "load")
    ws: Workspace = built["ws"]
    before = ws.table("profiles").collect().height

    groups = chains(args.users, args.merges, rng)
    requests = merge_requests(groups)
    seconds, peak, codes = timed(ws, requests)
    after = ws.table("profiles").collect().height
    met = "met" if seconds <= TARGET_MERGE_S else "NOT met"
    console.print(f"P4 merge: {args.merges:,} updates in {len(groups):,} chains (1-5), {len(requests):,} requests: "
                  f"{seconds:.2f} s ({args.merges / seconds:,.0f} updates/s), target <= {TARGET_MERGE_S} s: {met}; "
                  f"peak RSS {mib(peak)}; statuses {codes}; profiles {before:,} -> {after:,} "
                  f"({'ok' if before - after == args.merges else 'UNEXPECTED'})")

    # the same shape by email: candidates, prioritization and recency as of each update
    email_groups = chains(after, args.email_merges, np.random.default_rng(9), pool=survivors_of(groups, args.users))
    requests = merge_requests(email_groups, by_email=True)
    before = after
    seconds, peak, codes = timed(ws, requests)
    after = ws.table("profiles").collect().height
    console.print(f"P4 merge by email: {args.email_merges:,} updates in {len(email_groups):,} chains: {seconds:.2f} s "
                  f"({args.email_merges / seconds:,.0f} updates/s); peak RSS {mib(peak)}; statuses {codes}; "
                  f"profiles {before:,} -> {after:,} ({'ok' if before - after == args.email_merges else 'UNEXPECTED'})")

    n = args.identifies
    aliases = [{"alias_name": f"anon-{i}", "alias_label": "bench"} for i in range(n)]
    new_reqs = [{"method": "POST", "path": "/users/alias/new", "body": {"user_aliases": aliases[i:i + 50]}}
                for i in range(0, n, 50)]
    seconds, peak, codes = timed(ws, new_reqs)
    console.print(f"alias/new: {n:,} alias-only profiles: {seconds:.2f} s ({n / seconds:,.0f}/s), "
                  f"peak RSS {mib(peak)}, statuses {codes}")

    gone = [u for chain in email_groups for u in chain[:-1]]
    survivors = np.setdiff1d(survivors_of(groups, args.users), np.array(gone, dtype=np.int64))  # still there
    targets = ext_ids(survivors[: n // 2])
    elements = [{"external_id": targets[i] if i < len(targets) else f"fresh-{i}",
                 "user_alias": {"alias_name": f"anon-{i}", "alias_label": "bench"}} for i in range(n)]
    id_reqs = [{"method": "POST", "path": "/users/identify",
                "body": {"aliases_to_identify": elements[i:i + 50], "merge_behavior": "merge"}}
               for i in range(0, n, 50)]
    profiles = ws.table("profiles").collect().height
    seconds, peak, codes = timed(ws, id_reqs)
    merged = profiles - ws.table("profiles").collect().height
    console.print(f"identify: {n:,} elements ({len(targets):,} into existing users, {n - len(targets):,} to new IDs): "
                  f"{seconds:.2f} s ({n / seconds:,.0f}/s), peak RSS {mib(peak)}, statuses {codes}, "
                  f"profiles merged away {merged:,} ({'ok' if merged == len(targets) else 'UNEXPECTED'})")
    console.print(f"process peak RSS {mib(max_rss())}")


if __name__ == "__main__":
    main()
