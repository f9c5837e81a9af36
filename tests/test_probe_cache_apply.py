"""Keeping a probe cache coherent costs in proportion to the write, not to rows per key.

A write to a cached side finds its rows in the cache (to change their weights). Rows of
a bag share keys (sales per date): finding the written rows by key and then comparing
them with every row of that key would cost written rows x rows per key. The lookup is
by row hash, so a write of m rows under one key shared by n cached rows reads O(m + n)
strings, and the result is the same as a fresh scan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

import joinstate
from joinstate import _bytes
from joinstate.options import StoreOptions

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

N = 3000
SIDE = joinstate.Side(pa.schema([("k", pa.int64()), ("v", pa.int64())]), key=["k"])


def test_write_to_a_cached_bag_under_one_key_reads_no_cross_product(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with joinstate.StateStore(tmp_path / "s", StoreOptions(probe="scan")) as store:
        j = store.join("j", left=SIDE, right=SIDE)
        j.push("right", pa.table({"k": np.ones(N, np.int64), "v": np.arange(N)}))
        out = j.push("left", pa.table({"k": [1], "v": [0]}))  # builds the right's cache
        assert out.num_rows == N
        biggest = [0]
        take = _bytes.Bytes.take

        def counting(self: _bytes.Bytes, idx: np.ndarray) -> _bytes.Bytes:
            biggest[0] = max(biggest[0], len(np.asarray(idx)))
            return take(self, idx)

        monkeypatch.setattr(_bytes.Bytes, "take", counting)
        # a quarter of the rows retracted, as many new ones under the same key (a write
        # smaller than the cache: it is kept coherent, not dropped)
        m = N // 4
        gone = pa.table({"k": np.ones(m, np.int64), "v": np.arange(m),
                         "_weight": -np.ones(m, np.int64)})
        new = pa.table({"k": np.ones(m, np.int64), "v": np.arange(N, N + m),
                        "_weight": np.ones(m, np.int64)})
        j.push("right", pa.concat_tables([gone, new]))
        monkeypatch.undo()
        assert biggest[0] <= 4 * N, f"a lookup gathered {biggest[0]:,} strings"
        got = j.push("left", pa.table({"k": [1], "v": [1]}))
        assert sorted(got["v_right"].to_pylist()) == list(range(m, N + m))


def test_small_write_to_a_cached_keyed_side_sorts_nothing_and_stays_exact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row per key: a small write compares rows of its keys only (no row-hash sort).

    Then random writes, some under a key held by many rows (that lookup sorts the row
    hashes once), each checked against what the side holds.
    """
    from joinstate import _probe

    rng = np.random.default_rng(3)
    n = 20_000
    sorts = [0]  # row-hash lookups built over a segment of the cached side
    row_index = _probe._row_index  # noqa: SLF001 - counting what builds the row lookup

    def counting(b: _bytes.Bytes) -> tuple[np.ndarray, np.ndarray]:
        sorts[0] += len(b) >= n // 2
        return row_index(b)

    right = {k: 1 for k in range(n)}  # key -> v (v == 1 for every key)
    with joinstate.StateStore(tmp_path / "s", StoreOptions(probe="scan")) as store:
        j = store.join("j", left=SIDE, right=SIDE)
        big = 2000  # rows under key -1 (a bag), from the start
        j.push("right", pa.table({"k": np.r_[np.arange(n), -np.ones(big)].astype(np.int64),
                                  "v": np.r_[np.ones(n), np.arange(big)].astype(np.int64)}))
        j.push("left", pa.table({"k": [1], "v": [0]}))  # builds the right's cache
        monkeypatch.setattr(_probe, "_row_index", counting)
        bag = list(range(big))  # v values of the rows under key -1
        fresh = big
        sorted_once = False
        for step in range(12):
            ks = rng.choice(n, 30, replace=False)
            rows = [(int(k), right[int(k)], -1) for k in ks[:20]]
            rows += [(int(k), right[int(k)] + 1, 1) for k in ks[:20]]
            if step >= 6:  # rows under one key shared by many rows
                extra = list(range(fresh, fresh + 200))
                fresh += 200
                rows += [(-1, v, 1) for v in extra]
                gone = bag[: len(bag) // 3]
                rows += [(-1, v, -1) for v in gone]
                bag = [v for v in bag if v not in set(gone)] + extra
            for k in ks[:20]:
                right[int(k)] += 1
            j.push("right", pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows],
                                      "_weight": [r[2] for r in rows]}))
            assert j.index("right").cached
            built = sorts[0] > 0
            if step < 6:
                assert not built, f"step {step}: a small keyed write sorted the cache"
            sorted_once = sorted_once or built
            probe = [*rng.choice(n, 50, replace=False).tolist(), -1]
            got = j.push("left", pa.table({"k": probe, "v": [7] * len(probe)}))
            j.push("left", pa.table({"k": probe, "v": [7] * len(probe),
                                     "_weight": [-1] * len(probe)}))
            want = sorted([(k, right[k]) for k in probe if k >= 0] + [(-1, v) for v in bag])
            assert sorted(zip(got["k"].to_pylist(), got["v_right"].to_pylist(),
                              strict=True)) == want, step
        assert sorted_once, "the bag's writes never took the row-hash lookup"


def test_row_lookup_sorts_by_64_bits_and_falls_back_when_two_rows_share_them() -> None:
    """Row hashes sorted by their first 8 bytes, unless two rows share them (all 16)."""
    from joinstate import _probe

    rng = np.random.default_rng(5)
    for shared in (False, True):
        m = rng.integers(0, 256, size=(500, 16), dtype=np.uint8)
        if shared:  # rows 3 and 7 agree on their first 64 bits only
            m[7, :8] = m[3, :8]
        rh = _bytes.Bytes.from_fixed(m)
        by_row, _ = _probe._row_index(rh)  # noqa: SLF001
        assert (by_row.dtype.kind == "V") == shared
        seg = _probe._Segment(  # noqa: SLF001
            pa.table({"x": np.arange(500)}), np.ones(500, np.int64), rh, rh, rh,
            np.arange(500, dtype=np.uint64))
        seg._paired = 10**9  # noqa: SLF001 - take the row lookup, not the key pairs
        ask = np.array([7, 3, 250, 499], np.int64)
        q, e = seg.find(rh.take(ask), np.arange(500, dtype=np.uint64)[ask], rh.take(ask),
                        rh.take(ask))
        assert sorted(zip(q.tolist(), e.tolist(), strict=True)) == [
            (0, 7), (1, 3), (2, 250), (3, 499)]
        missing = _bytes.Bytes.from_fixed(np.full((1, 16), 255, np.uint8))
        q, _ = seg.find(missing, np.zeros(1, np.uint64), missing, missing)
        assert len(q) == 0 or bool((m == 255).all(axis=1).any())
