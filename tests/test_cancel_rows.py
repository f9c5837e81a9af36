"""Consolidating a change that both retracts and inserts keeps its Z-set."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from joinstate.codec import RowCodec
from joinstate.ops.base import cancel_rows


def _zset(table: pa.Table, w: np.ndarray) -> Counter[Any]:
    out: Counter[Any] = Counter()
    for row, x in zip(table.to_pylist(), w.tolist(), strict=True):
        out[tuple(row.values())] += x
    return Counter({k: v for k, v in out.items() if v})


def test_random_changes_keep_their_zset() -> None:
    rng = np.random.default_rng(2)
    for trial in range(200):
        n = int(rng.integers(2, 40))
        t = pa.table({
            "k": pa.array(rng.integers(0, 4, n), pa.int64()),
            "s": pa.array([None if x == 0 else f"v{x}" for x in rng.integers(0, 3, n)],
                          pa.string()),
            "last": pa.array([None if x == 0 else int(x) for x in rng.integers(0, 3, n)],
                             pa.int64()),
        })
        w = rng.choice([-2, -1, 1, 1, 2], n).astype(np.int64)
        kept = cancel_rows(t, w, RowCodec(t.schema), "test")
        if kept is None:
            continue
        idx, sums = kept
        assert len(np.unique(idx)) == len(idx), trial  # each position once
        assert _zset(t.take(pa.array(idx)), sums) == _zset(t, w), trial


def test_rows_that_cancel_go_and_the_others_stay() -> None:
    t = pa.table({"a": [1, 1, 2, 3], "last": [10, 10, 20, 30]})
    w = np.array([-1, 1, 1, -1], np.int64)  # rows 0 and 1 cancel; 2 and 3 stay
    idx, sums = cancel_rows(t, w, RowCodec(t.schema), "test") or (None, None)
    assert idx is not None and sums is not None
    assert sorted(zip(idx.tolist(), sums.tolist(), strict=True)) == [(2, 1), (3, -1)]
    only_inserts = cancel_rows(t, np.ones(4, np.int64), RowCodec(t.schema), "test")
    assert only_inserts is None
