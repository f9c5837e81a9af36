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
