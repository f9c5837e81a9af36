"""Statistics gathering for the planner: tables, Parquet metadata and samples, history.

Distinct counts are checked against ``pyarrow.compute.count_distinct`` over the whole
data (an independent exact count); Parquet row counts against what was written.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import joinstate
from joinstate.names import planner_history_key
from planner.errors import PlannerError
from planner.history import read_history, record_population
from planner.stats import MAX_SAMPLED_ROW_GROUPS, duj1, from_parquet, from_table, gather

if TYPE_CHECKING:
    from pathlib import Path


def exact_distinct(t: pa.Table, col: str) -> int:
    return int(pc.count_distinct(t.column(col), mode="only_valid").as_py())


def table(n: int, distinct: int, seed: int = 0, nulls: float = 0.0) -> pa.Table:
    """``n`` rows whose key ``k`` takes ``distinct`` values in random order."""
    rng = np.random.default_rng(seed)
    k = rng.permutation(np.arange(n) % distinct).astype(object)
    if nulls:
        k[rng.random(n) < nulls] = None
    return pa.table({"k": pa.array(k, pa.int64()), "v": rng.random(n)})


# ---- the estimator ---------------------------------------------------------------------------


def test_duj1_edges() -> None:
    assert duj1(np.array([], dtype=np.int64), 100) == 0
    assert duj1(np.array([1] * 100), 1_000_000) == 1_000_000  # never repeats: unique
    assert duj1(np.array([1000] * 7), 10**9) == 7               # all seen, often
    assert duj1(np.array([3, 1, 1]), 5) == 3                    # whole input: exact
    est = duj1(np.array([1] * 50 + [2] * 50), 10_000)           # between d and N
    assert 100 < est < 10_000


# ---- tables ----------------------------------------------------------------------------------


def test_small_table_is_counted_exactly() -> None:
    t = pa.table({"k": [1, 2, 2, None], "j": ["a", "b", "b", "c"], "v": [1.0, 2, 3, 4]})
    s = from_table(t, "t", keys=["k", ("k", "j"), "j"])
    assert (s.rows, s.bytes, s.snapshot, s.origin) == (4, t.nbytes, True, "table")
    k = s.key(["k"])
    assert (k.distinct, k.unique, k.source, k.null_fraction) == (2, False, "exact", 0.25)
    kj = s.key(["k", "j"])
    assert (kj.distinct, kj.unique) == (2, False)
    assert s.key(["j"]).distinct == 3
    assert s.bytes_per_row == t.nbytes / 4


@pytest.mark.parametrize(("n", "distinct"), [(200_000, 50_000), (200_000, 200_000),
                                             (200_000, 37), (300_000, 150_000)])
def test_sampled_distinct_count_is_close(n: int, distinct: int) -> None:
    t = table(n, distinct, seed=distinct)
    s = from_table(t, "t", keys=["k"], sample_rows=10_000, seed=1)
    k = s.key(["k"])
    truth = exact_distinct(t, "k")
    assert k.source == "sample" and s.sample_rows == 10_000
    assert abs(k.distinct - truth) <= 0.2 * truth, (k.distinct, truth)  # type: ignore[operator]
    assert k.unique is (truth == n)


def test_nulls_are_not_keys() -> None:
    t = table(100_000, 100_000, nulls=0.1)
    k = from_table(t, "t", keys=["k"]).key(["k"])
    truth = exact_distinct(t, "k")
    assert abs(k.null_fraction - 0.1) < 0.02  # type: ignore[operator]
    assert abs(k.distinct - truth) <= 0.1 * truth  # type: ignore[operator]


def test_declared_unique_key() -> None:
    t = table(50_000, 50_000)
    s = from_table(t, "t", keys=["k", ("k", "v")], unique_key=["k"])
    assert s.key(["k"]).source == "declared" and s.key(["k"]).unique is True
    assert s.key(("k", "v")).unique is True  # a superset of a unique key is unique
    # a key not gathered: still known unique from the declaration
    assert s.key(["k", "x"]).unique is True and s.key(["v"]).source == "unknown"


def test_sampling_is_reproducible_and_seeded() -> None:
    t = table(100_000, 20_000)
    a = from_table(t, keys=["k"], seed=3)
    b = from_table(t, keys=["k"], seed=3)
    assert a == b and a.sample is not None and a.sample.equals(b.sample)


def test_bad_keys_name_the_column() -> None:
    with pytest.raises(PlannerError, match=r"'nope'.*not in its columns"):
        from_table(pa.table({"k": [1]}), "t", keys=["nope"])
    with pytest.raises(PlannerError, match="rows=-1"):
        from_table(pa.table({"k": [1]})).replace(rows=-1)


# ---- Parquet ---------------------------------------------------------------------------------


def write(path: Path, t: pa.Table, row_group_size: int) -> Path:
    pq.write_table(t, str(path), row_group_size=row_group_size)
    return path


def test_parquet_rows_and_bytes_come_from_the_footer(tmp_path: Path,
                                                     monkeypatch: Any) -> None:
    t = table(50_000, 1_000)
    f = write(tmp_path / "a.parquet", t, 5_000)
    md = pq.ParquetFile(str(f)).metadata
    reads: list[Any] = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, *a, **kw: reads.append(kw) or real(self, *a, **kw))
    s = from_parquet(f, "a")  # no keys: nothing but footers
    assert (s.rows, s.origin, s.snapshot) == (50_000, "parquet", True)
    assert s.bytes == sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    assert reads == []
    s = from_parquet(f, "a", keys=["k"], sample_rows=8_000)
    # only the key column of at most MAX_SAMPLED_ROW_GROUPS row groups (here 2 are enough)
    assert reads and all(kw["columns"] == ["k"] for kw in reads)
    assert len(reads) == 2 <= MAX_SAMPLED_ROW_GROUPS
    assert abs(s.key(["k"]).distinct - 1_000) <= 100  # type: ignore[operator]


def test_parquet_directory_and_list(tmp_path: Path) -> None:
    d = tmp_path / "dir"
    d.mkdir()
    parts = [table(20_000, 20_000, seed=i) for i in range(3)]
    for i, t in enumerate(parts):
        write(d / f"part-{i}.parquet", t, 4_000)
    s = from_parquet(d, "d", keys=["k"])
    assert s.rows == 60_000
    listed = from_parquet(sorted(d.iterdir()), "d")
    assert listed.rows == 60_000 and listed.bytes == s.bytes
    with pytest.raises(PlannerError, match="no Parquet files"):
        from_parquet([], "x")
    with pytest.raises(PlannerError, match="cannot read Parquet"):
        from_parquet(tmp_path / "missing.parquet", "x")


def test_sorted_parquet_is_not_mistaken_for_few_keys(tmp_path: Path) -> None:
    # 200,000 rows, 4 per key, sorted by key: a sample from a few row groups sees every
    # key of those groups 4 times, which a repeat-based estimate would read as "all seen"
    n = 200_000
    t = pa.table({"k": pa.array(np.arange(n) // 4, pa.int64()), "v": np.ones(n)})
    f = write(tmp_path / "sorted.parquet", t, 10_000)
    k = from_parquet(f, "s", keys=["k"], sample_rows=20_000).key(["k"])
    truth = exact_distinct(t, "k")
    assert abs(k.distinct - truth) <= 0.1 * truth, (k.distinct, truth)  # type: ignore[operator]
    # the integer range bounds the estimate: keys 0..9 in 1,000 unsorted rows
    r = pa.table({"k": pa.array(np.random.default_rng(0).integers(0, 10, 100_000))})
    f = write(tmp_path / "range.parquet", r, 10_000)
    assert from_parquet(f, "r", keys=["k"], sample_rows=50).key(["k"]).distinct <= 10  # type: ignore[operator]


# ---- gather -------------------------------------------------------------------------------------


def test_gather_never_consumes_a_stream(tmp_path: Path) -> None:
    batches = table(1_000, 10).to_batches(max_chunksize=100)
    it = iter(batches)
    s = gather(it, "s", keys=["k"])
    assert (s.rows, s.snapshot, s.origin) == (None, False, "stream")
    assert sum(b.num_rows for b in it) == 1_000  # nothing was read
    listed = gather(batches, "l", keys=["k"])
    assert (listed.rows, listed.key(["k"]).distinct) == (1_000, 10)
    f = write(tmp_path / "g.parquet", table(1_000, 10), 100)
    assert gather(str(f), "p").rows == 1_000
    assert gather([], "e").rows == 0
    assert json.loads(json.dumps(listed.to_dict()))["rows"] == 1_000


# ---- history -----------------------------------------------------------------------------------


def test_history_records_and_pools_comparable_runs(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        assert read_history(store, "j").empty
        record_population(store, "j", strategy="bulk", rows=1_000_000, seconds=2.0,
                          inputs={"left": (100, 0.001), "right": (999_900, 1.9)},
                          indexes={"ix": {"rows": 10, "entries": 10}}, operators={"join3": 5})
        record_population(store, "j", strategy="bulk", rows=1_200_000, seconds=2.0)
        record_population(store, "j", strategy="symmetric", rows=1_000_000, seconds=4.0)
        h = read_history(store, "j")
        assert (h.population["bulk"].rows, h.population["bulk"].runs) == (2_200_000, 2)
        assert h.population["bulk"].rows_per_second == 550_000
        assert h.push_us_per_row == {"left": 10.0, "right": round(1.9 / 999_900 * 1e6, 4)}
        assert h.indexes["ix"]["rows"] == 10 and h.operators == {"join3": 5}
        # a run at another scale replaces the strategy's figures
        record_population(store, "j", strategy="bulk", rows=50_000_000, seconds=50.0)
        h = read_history(store, "j")
        assert (h.population["bulk"].rows, h.population["bulk"].runs) == (50_000_000, 1)
        assert set(h.comparable(1_000_000, ("bulk", "symmetric"))) == {"symmetric"}
        assert set(h.comparable(None, ("bulk", "symmetric"))) == {"bulk", "symmetric"}
        # nothing measured: nothing written
        assert record_population(store, "k", strategy="bulk", rows=0, seconds=1.0).empty
        assert read_history(store, "k").empty
    with joinstate.StateStore(tmp_path / "s", read_only=True) as ro:
        assert read_history(ro, "j").population["bulk"].rows == 50_000_000
        record_population(ro, "j", strategy="bulk", rows=10, seconds=1.0)  # skipped
        assert read_history(ro, "j").population["bulk"].rows == 50_000_000


def test_a_damaged_history_is_ignored_with_a_warning(tmp_path: Path, caplog: Any) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        store.meta_put(planner_history_key("j"), b"{not json")
        with caplog.at_level(logging.WARNING, logger="planner.history"):
            assert read_history(store, "j").empty
        assert "unreadable planner history" in caplog.text
        store.meta_put(planner_history_key("j"), json.dumps({"version": 99}).encode())
        assert read_history(store, "j").empty
