"""Core push benchmark: the join operator against the raw RocksDB write ceiling.

Measured in one process, on one data set (100k customer-like rows unique on their key,
3M sales-like rows over the same keys, 64k-row batches):

(a) left push into an empty join;
(b) right push probing the full left side (input rows/s and output rows/s);
(c) left push into a join whose right side is full (fan-out ~30);
(e) (b) again with the big side's unique key declared ((ss_ticket_number, ss_item_sk));
(d) the raw rocksdict ``WriteBatch`` put rate for the same number of keys and the same
    key/value sizes as (b) wrote, into the same column family of a fresh store (same
    options): the practical ceiling of any Python engine writing that state.

Target: (b) >= 50% of (d).  Ratios are only meaningful within one run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import rocksdict as rd

import joinstate
from population.synthetic import CUSTOMER_SCHEMA, SALES_SCHEMA, customers, sales_batches

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["CoreResult", "run_core", "to_markdown"]


@dataclass
class CoreResult:
    """Figures of one run (rates in rows per second)."""

    left_rows: int
    right_rows: int
    batch_rows: int
    a_left_into_empty: float
    b_right_probe_left: float
    b_output_rows_per_s: float
    c_left_into_full_right: float
    c_output_rows_per_s: float
    d_raw_writebatch: float
    e_right_unique_key: float
    d_raw_before: float
    d_raw_after: float
    ratio_b_over_d: float
    ratio_e_over_d: float
    b_key_bytes: float
    b_value_bytes: float


JOIN = "customer_sales"


SALES_UNIQUE_KEY = ["ss_ticket_number", "ss_item_sk"]
"""How TPC-DS users declare store_sales' primary key."""


def _join(store: joinstate.StateStore, unique_sales: bool = False) -> joinstate.Join:
    """The benchmark's join: customers unique on their key, sales as a bag (or unique)."""
    return store.join(
        JOIN,
        left=joinstate.Side(CUSTOMER_SCHEMA, ["c_customer_sk"], ["c_customer_sk"]),
        right=joinstate.Side(SALES_SCHEMA, ["ss_customer_sk"],
                             SALES_UNIQUE_KEY if unique_sales else None),
    )


def _timed_pushes(
    join: joinstate.Join, side: joinstate.SideName, batches: Iterable[pa.RecordBatch]
) -> tuple[float, int, int]:
    rows = out_rows = 0
    elapsed = 0.0
    for b in batches:
        t0 = time.perf_counter()
        out = join.push(side, b)
        elapsed += time.perf_counter() - t0
        rows += b.num_rows
        out_rows += out.num_rows
    return elapsed, rows, out_rows


def stored_entry_sizes(path: Path, options: joinstate.StoreOptions, rows: int = 4_096
                       ) -> tuple[int, int]:
    """Key and value bytes of one right-side entry, as the join stores a sales row.

    Measured, not computed from the layout: a few sales rows are pushed into a fresh
    store and the first entry of the right side's rows column family is read back.
    """
    with joinstate.StateStore(path, options) as store:
        join = _join(store)
        join.push("right", pa.Table.from_batches(list(sales_batches(rows, 100, rows))))
        ro = rd.ReadOptions()
        ro.set_total_order_seek(True)  # prefix extractor: a plain seek may miss memtable rows
        it = store.cf(join.index("right").column_family).iter(ro)
        try:
            it.seek_to_first()
            if not it.valid():
                raise RuntimeError("the right side's column family is empty after a push")
            return len(it.key()), len(it.value())
        finally:
            del it


def raw_writebatch_rate(
    path: Path, options: joinstate.StoreOptions, n: int, key_bytes: int, value_bytes: int,
    batch_rows: int, seed: int = 7,
) -> float:
    """Puts/s of pre-built random keys and values through WriteBatches.

    They go into the right side's rows column family of a fresh store holding the
    benchmark's (empty) join, so the family's options are the ones (b) writes with.
    """
    with joinstate.StateStore(path, options) as store:
        cf = _join(store).index("right").column_family
        h = store.handle(cf)
        rng = np.random.default_rng(seed)
        value = rng.bytes(value_bytes)
        keys_all = rng.bytes(n * key_bytes)
        keys = [keys_all[i : i + key_bytes] for i in range(0, n * key_bytes, key_bytes)]
        t0 = time.perf_counter()
        for s in range(0, n, batch_rows):
            wb = rd.WriteBatch(raw_mode=True)
            for k in keys[s : s + batch_rows]:
                wb.put(k, value, h)
            store.write(wb)
        elapsed = time.perf_counter() - t0
    return n / elapsed


def run_core(
    left_rows: int = 100_000, right_rows: int = 3_000_000, batch_rows: int = 65_536,
    workdir: Path | None = None, options: joinstate.StoreOptions | None = None,
) -> CoreResult:
    """Run (a)-(d) in fresh directories under ``workdir`` and return the figures."""
    options = options or joinstate.StoreOptions()
    tmp = Path(workdir or tempfile.mkdtemp(prefix="joinstate-bench-"))
    for sub in ("join", "joinu", "sizes", "raw0", "raw1"):
        shutil.rmtree(tmp / sub, ignore_errors=True)
    cust = customers(left_rows)
    key_bytes, value_bytes = stored_entry_sizes(tmp / "sizes", options)
    shutil.rmtree(tmp / "sizes", ignore_errors=True)
    # (d) is measured before and after the join run, and the faster figure is used, so a
    # noisy neighbour cannot flatter the ratio.
    d_before = raw_writebatch_rate(
        tmp / "raw0", options, right_rows, key_bytes, value_bytes, batch_rows
    )
    with joinstate.StateStore(tmp / "join", options) as store:
        join = _join(store)
        ta, na, _ = _timed_pushes(join, "left", cust.to_batches(max_chunksize=batch_rows))
        tb, nb, ob = _timed_pushes(
            join, "right", sales_batches(right_rows, left_rows, batch_rows=batch_rows)
        )
        # (c): retract the left side, then insert it again while the right side is full.
        retract = cust.append_column("_weight", pa.array(np.full(left_rows, -1, np.int64)))
        _timed_pushes(join, "left", retract.to_batches(max_chunksize=batch_rows))
        tc, nc, oc = _timed_pushes(join, "left", cust.to_batches(max_chunksize=batch_rows))
    # (e): (b) with the big side's unique key declared, as TPC-DS users declare it.
    with joinstate.StateStore(tmp / "joinu", options) as store:
        join = _join(store, unique_sales=True)
        _timed_pushes(join, "left", cust.to_batches(max_chunksize=batch_rows))
        te, ne, _ = _timed_pushes(
            join, "right", sales_batches(right_rows, left_rows, batch_rows=batch_rows)
        )
    shutil.rmtree(tmp / "joinu", ignore_errors=True)
    d_after = raw_writebatch_rate(
        tmp / "raw1", options, right_rows, key_bytes, value_bytes, batch_rows
    )
    d = max(d_before, d_after)
    b = nb / tb
    return CoreResult(
        left_rows=left_rows, right_rows=right_rows, batch_rows=batch_rows,
        a_left_into_empty=na / ta, b_right_probe_left=b, b_output_rows_per_s=ob / tb,
        c_left_into_full_right=nc / tc, c_output_rows_per_s=oc / tc,
        d_raw_writebatch=d, d_raw_before=d_before, d_raw_after=d_after,
        ratio_b_over_d=b / d, e_right_unique_key=ne / te, ratio_e_over_d=ne / te / d,
        b_key_bytes=key_bytes,
        b_value_bytes=value_bytes,
    )


def to_markdown(r: CoreResult) -> str:
    """A small table for notes and the README."""
    rows = [
        ("(a) left push into empty join", f"{r.a_left_into_empty:,.0f} rows/s", ""),
        ("(b) right push probing full left", f"{r.b_right_probe_left:,.0f} rows/s",
         f"{r.b_output_rows_per_s:,.0f} output rows/s"),
        ("(c) left push into full right", f"{r.c_left_into_full_right:,.0f} rows/s",
         f"{r.c_output_rows_per_s:,.0f} output rows/s"),
        ("(d) raw WriteBatch puts, same sizes", f"{r.d_raw_writebatch:,.0f} rows/s",
         f"{r.b_key_bytes:.0f} B keys, {r.b_value_bytes:.0f} B values; best of "
         f"{r.d_raw_before:,.0f} before / {r.d_raw_after:,.0f} after"),
        ("(e) (b) with the big side's unique key declared",
         f"{r.e_right_unique_key:,.0f} rows/s", f"unique key {SALES_UNIQUE_KEY}"),
        ("(b) / (d)", f"{r.ratio_b_over_d:.0%}", "target >= 50%"),
        ("(e) / (d)", f"{r.ratio_e_over_d:.0%}", "target >= 50%"),
    ]
    lines = ["| measurement | rate | note |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)
