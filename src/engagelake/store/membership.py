"""Bloom filters of the keys of a data file: which keys a file of a sorted run may hold.

Fences (`store/runs.py`) tell where a key would lie in a file, not whether it is there: a key
absent from a big run still names one of its row groups. So a probe of many keys that a big
run lacks (the users of a batch who live in newer runs, created a little earlier) named about
half of the bottom run's row groups, and the run was read whole. Paimon and RocksDB keep a
Bloom filter per sorted run for this. Here each indexed file keeps one beside its footer index
(`store/footers.py`: `bloom_path`), built from its sort column when the index is written: 10
bits a distinct key and 3 probes, about 1.7% false positives (one costs a row group read, never
a wrong row); 32 bits a key in a file of at most `SMALL_FILE_KEYS` keys, about 0.07%.

The hash is Polars' (fixed seeds): the same in every process of one Polars version. A filter's
file name carries that version, so a process of another version finds none and probes without.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

BITS_PER_KEY = 10
PROBES = 3
# A small run (a day's batches above a compacted store) holds few of the keys a probe asks
# for, so its false positives are most of its reads: 50 keys against 1.7% cost a read of
# about every other small file an export met. 32 bits a key there: about 0.07%.
SMALL_FILE_KEYS = 1 << 20
SMALL_FILE_BITS_PER_KEY = 32
SET_SLICE = 1 << 20  # hashes whose bits are set at once (their positions: 24 bytes each)
# part of a filter's file name: a filter built by another Polars version is not found
HASH_VERSION = f"polars-{pl.__version__}"


def hashes(keys: pl.Series) -> np.ndarray:
    """64-bit hashes of string keys, as filters take them."""
    return keys.cast(pl.String).hash(seed=0).to_numpy()


def _positions(hashed: np.ndarray, bits: int) -> np.ndarray:
    """The PROBES bit positions of each hash (double hashing: h1 + i * h2), shape (n, PROBES);
    `bits` is a power of two, so the modulo is a mask."""
    low = hashed & np.uint64(0xFFFFFFFF)
    step = (hashed >> np.uint64(32)) | np.uint64(1)
    probes = np.arange(PROBES, dtype=np.uint64)
    return (low[:, None] + probes[None, :] * step[:, None]) & np.uint64(bits - 1)


def build(keys: pl.Series | Iterable[pl.Series]) -> np.ndarray:
    """The filter of `keys` (nulls are no keys), as packed bits. Keys may come in parts (a
    file's row groups, read a batch at a time): only their distinct hashes are kept, 8 bytes
    a key, and the bits are set into the packed filter a slice of hashes at a time, so a file
    of any size is indexed in bounded memory (a 10M-user compaction's indexing had peaked at
    4.3 GiB with each file's key column read whole and a byte per filter bit)."""
    parts = [keys] if isinstance(keys, pl.Series) else keys
    distinct = np.sort(np.concatenate(
        [hashes(part.drop_nulls().unique()) for part in parts] or [np.array([], dtype=np.uint64)]))
    # distinct by a sort (`np.unique` took 14.6 s for 10M hashes, this 0.13)
    distinct = distinct[np.concatenate([[True], distinct[1:] != distinct[:-1]])] if distinct.size else distinct
    per_key = SMALL_FILE_BITS_PER_KEY if distinct.size <= SMALL_FILE_KEYS else BITS_PER_KEY
    bits = 1 << max(6, int(np.ceil(np.log2(max(distinct.size, 1) * per_key))))
    packed = np.zeros(bits // 8, dtype=np.uint8)
    for start in range(0, distinct.size, SET_SLICE):
        positions = _positions(distinct[start:start + SET_SLICE], bits).ravel()
        np.bitwise_or.at(packed, (positions >> np.uint64(3)).astype(np.intp),
                         np.left_shift(1, positions & np.uint64(7)).astype(np.uint8))
    return packed


def may_hold(packed: np.ndarray, hashed: np.ndarray) -> np.ndarray:
    """Per hash, whether the filter's file may hold its key (false: it surely does not)."""
    positions = _positions(hashed, packed.size * 8)
    return ((packed[positions >> np.uint64(3)] >> (positions & np.uint64(7)).astype(np.uint8)) & 1).astype(
        bool).all(axis=1)
