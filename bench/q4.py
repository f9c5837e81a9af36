"""``python -m bench q4``: TPC-DS query 4 kept live by a ``joinstate.Pipeline``, vs DuckDB.

Query 4 is the TPC-DS query that looks most like a streaming workload's worst case: three
fact tables, each joined to customer and date_dim, grouped per customer and year, the
union self-joined six ways on ``customer_id``.  A change anywhere (a sale, a customer's
name, one date's year) has to travel through joins, an aggregate and a six-way join.  This
suite measures what that costs per change batch, and checks every answer against DuckDB.

* **data**: customer, date_dim, store_sales, catalog_sales, web_sales at ``--sf``, only
  the columns q4 reads (plus each sale's item and ticket/order number, so that sampled
  "new" sales are distinct rows), from ``bench/tpcds.py`` (cached Parquet);
* **pipeline** (:func:`build_q4`): the official DuckDB text, hand-translated (see
  :func:`build_q4` for the one deliberate numeric difference), with two outputs:
  ``year_total`` (the CTE) and ``q4`` (the final answer without ORDER BY / LIMIT);
* **population** (:func:`populate_pipeline`): every source pushed in chunks, dimensions
  first, then a check against DuckDB;
* **qualifying sales** (``--qualify``, default 0.1% of the customers): q4's answer is
  empty below SF1 (and 6 rows at SF1), so a few customers get sales that put them in it
  (:meth:`Workload.qualifying_sales`): the six-way join and the final WHERE then have
  rows to keep up to date, and the checks something to compare;
* **live**: for each batch size (a share of all sales rows) and ``--repeat`` times, the
  batch kinds in order: new sales in the three channels, deleted sales in the three
  channels, customer updates (-old +new: first name, preferred flag, e-mail), a date_dim
  correction (one date's ``d_year`` moved between 2001 and 2002).  Each push is timed;
  after each kind (``--check each``) both outputs, integrated from every delta so far,
  must equal DuckDB's answer on the current tables, as multisets;
* DuckDB recomputing ``year_total`` and the answer from scratch on the changed tables
  (median of ``--recompute-runs``);
* the whole pass twice, ``share_indexes=True`` and ``False`` (``--no-unshared`` skips the
  second): column families, bytes on disk, population time, customer-update time.

Writes ``q4.json`` and ``q4.md`` under ``--out`` (default ``bench-results/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import joinstate
import population
from bench import tpcds
from bench.q4ref import Reference, reference_sql
from joinstate.testing import compare, consolidate, expand

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence


__all__ = [
    "CHANNELS", "KINDS", "TABLES", "Channel", "Integrated", "Reference", "Workload",
    "apply_delta", "build_q4", "define_q4", "load", "populate_pipeline", "reference_sql",
    "run_q4", "to_markdown",
]

WEIGHT = "_weight"

# ---- the data ------------------------------------------------------------------------


@dataclass(frozen=True)
class Channel:
    """One sales channel of q4: its table, its column prefix and the q4 ``sale_type``."""

    sale_type: str
    table: str
    prefix: str
    customer_col: str
    date_col: str
    number_col: str
    """The ticket / order number: fresh values make sampled "new" sales distinct rows."""

    def col(self, name: str) -> str:
        """``ext_list_price`` -> ``ss_ext_list_price``."""
        return f"{self.prefix}_{name}"


CHANNELS = (
    Channel("s", "store_sales", "ss", "ss_customer_sk", "ss_sold_date_sk", "ss_ticket_number"),
    Channel("c", "catalog_sales", "cs", "cs_bill_customer_sk", "cs_sold_date_sk",
            "cs_order_number"),
    Channel("w", "web_sales", "ws", "ws_bill_customer_sk", "ws_sold_date_sk", "ws_order_number"),
)
CUSTOMER_COLUMNS = ["c_customer_sk", "c_customer_id", "c_first_name", "c_last_name",
                    "c_preferred_cust_flag", "c_birth_country", "c_login", "c_email_address"]
PRICE_COLUMNS = ("ext_discount_amt", "ext_sales_price", "ext_wholesale_cost", "ext_list_price")
TABLES: dict[str, list[str]] = {
    "customer": CUSTOMER_COLUMNS,
    "date_dim": ["d_date_sk", "d_year"],
    **{ch.table: [ch.date_col, ch.customer_col, ch.col("item_sk"), ch.number_col,
                  *(ch.col(c) for c in PRICE_COLUMNS)] for ch in CHANNELS},
}
"""The columns q4 reads, per table (the sales also keep item and ticket/order number)."""


def _type(column: str) -> pa.DataType:
    """The Arrow type dsdgen gives a q4 column (as DuckDB writes it to Parquet)."""
    if any(column.endswith(p) for p in PRICE_COLUMNS):
        return pa.decimal128(7, 2)
    if column.endswith(("_sk", "_number", "d_year")):
        return pa.int64()
    return pa.string()


SCHEMAS = {n: pa.schema([(c, _type(c)) for c in cols]) for n, cols in TABLES.items()}
"""The sources' schemas, fixed here so a pipeline can be built before any data is read;
:func:`load` checks the Parquet files against them."""
UNIQUE_KEYS = {"customer": ["c_customer_sk"], "date_dim": ["d_date_sk"]}
ALSO_UNIQUE = {"customer": [("c_customer_id",)]}
"""Further unique keys, verified by the pipeline: TPC-DS makes ``c_customer_id`` unique in
``customer`` (the business key of its surrogate ``c_customer_sk``), which lets a
distributed plan keep every ``customer_id`` group where its customer's rows lie."""
POPULATION_ORDER = ("date_dim", "customer", "store_sales", "catalog_sales", "web_sales")
"""Dimensions first: each sale then joins as it arrives instead of waiting in state."""
LOCATOR = {"customer": "c_customer_sk", "date_dim": "d_date_sk",
           **{ch.table: ch.number_col for ch in CHANNELS}}
"""A selective column per table: :func:`apply_delta` finds rows to delete through it."""

GROUP_COLUMNS = ["c_customer_id", "c_first_name", "c_last_name", "c_preferred_cust_flag",
                 "c_birth_country", "c_login", "c_email_address", "d_year"]
YEAR_TOTAL_COLUMNS = {  # the CTE's column names (DuckDB text), from the group columns
    "customer_id": "c_customer_id", "customer_first_name": "c_first_name",
    "customer_last_name": "c_last_name",
    "customer_preferred_cust_flag": "c_preferred_cust_flag",
    "customer_birth_country": "c_birth_country", "customer_login": "c_login",
    "customer_email_address": "c_email_address", "dyear": "d_year",
}
LEGS = {  # leg name -> (sale_type, dyear, year_total > 0 required)
    "t_s_firstyear": ("s", 2001, True), "t_s_secyear": ("s", 2002, False),
    "t_c_firstyear": ("c", 2001, True), "t_c_secyear": ("c", 2002, False),
    "t_w_firstyear": ("w", 2001, True), "t_w_secyear": ("w", 2002, False),
}
ANSWER_COLUMNS = ["customer_id", "customer_first_name", "customer_last_name",
                  "customer_preferred_cust_flag"]
"""The DuckDB text's final select list (all from ``t_s_secyear``) and its ORDER BY."""


def load(sf: float, cache_dir: Path | None = None) -> dict[str, pa.Table]:
    """The five tables at ``sf`` with :data:`TABLES`' columns (generated once, cached)."""
    paths = tpcds.tables(sf, TABLES, TABLES, cache_dir=cache_dir)
    out = {n: pq.read_table(p) for n, p in paths.items()}
    for n, t in out.items():
        if not t.schema.equals(SCHEMAS[n]):
            raise RuntimeError(f"{paths[n]}: schema {t.schema} is not the expected "
                               f"{SCHEMAS[n]} (another dsdgen version?)")
    return out


# ---- the pipeline --------------------------------------------------------------------


def _f(name: str) -> pc.Expression:
    return pc.field(name)


def _channel_year_total(ch: Channel, sales: joinstate.Stream, customer: joinstate.Stream,
                        date_dim: joinstate.Stream) -> joinstate.Stream:
    """One branch of the CTE's UNION ALL: sales ⋈ customer ⋈ date_dim, per customer-year.

    ``sum(((list - wholesale - discount) + sales_price) / 2)`` is DOUBLE in DuckDB (a
    DECIMAL divided by an INTEGER is DOUBLE there), so its sum is a floating-point sum
    whose last bits depend on the order of the rows.  Kept that way under deletes, a
    float sum would drift: removing a sale would not give back the value computed
    without it.  So the numerator is summed as DECIMAL (the pipeline's sum over
    decimal128 is exact, decimal128(38, 2)) and converted to float64 and halved in a
    projection after the aggregate: the result is a function of the group's current rows
    only, whatever happened before, and equals DuckDB's to ~1e-15 relative.
    """
    # date_dim first: the intermediate join (sales with their year) is then indexed by
    # customer, so a customer update probes it and writes no intermediate state, and
    # each indexed row carries one year instead of the customer's seven columns.
    joined = (sales.join(date_dim, on=(ch.date_col, "d_date_sk"))
              .join(customer, on=(ch.customer_col, "c_customer_sk")))
    numerator = ((_f(ch.col("ext_list_price")) - _f(ch.col("ext_wholesale_cost"))
                  - _f(ch.col("ext_discount_amt"))) + _f(ch.col("ext_sales_price")))
    grouped = joined.group_by(GROUP_COLUMNS).aggregate(numerator=("sum", numerator))
    return grouped.select({
        **YEAR_TOTAL_COLUMNS,
        "year_total": pc.divide(_f("numerator").cast(pa.float64()), 2.0),
        "sale_type": pc.scalar(ch.sale_type),
    })


def _ratio(first: str, second: str) -> pc.Expression:
    """``CASE WHEN first.year_total > 0 THEN second.year_total / first.year_total END``."""
    fy, sy = _f(f"{first}_year_total"), _f(f"{second}_year_total")
    return pc.if_else(fy > 0, pc.divide(sy, fy), pc.scalar(pa.scalar(None, pa.float64())))


def build_q4(store: joinstate.StateStore, name: str = "q4",
             share_indexes: bool = True) -> joinstate.Pipeline:
    """TPC-DS q4 (DuckDB's text) as a pipeline with outputs ``year_total`` and ``q4``.

    ``year_total`` is the CTE: the three channels' per customer-year totals, with
    DuckDB's column names and order.  ``q4`` is the final answer without ORDER BY and
    LIMIT (a multiset; its first 100 rows in DuckDB's order are DuckDB's answer).  The
    six legs keep only the columns the final WHERE and select use; as filters and
    column picks of ``year_total`` they read one shared index of it on ``customer_id``.
    """
    return joinstate.Pipeline(store, name, define_q4(), share_indexes=share_indexes)


def define_q4(retractions: str = "checked", *, verified_keys: bool = True) -> joinstate.Graph:
    """q4's graph: its sources, operators and outputs (see :func:`build_q4`).

    Spark ships this graph to its tasks; ``joinstate apply --pipeline bench.q4:define_q4``
    attaches it to a store.  ``retractions`` applies to every source (``"unchecked"``:
    no row records, what ``bench source-check`` compares with).  ``verified_keys``:
    declare :data:`ALSO_UNIQUE` (verified; on Spark, q4 then runs as one stage).
    """
    customer = joinstate.source("customer", schema=SCHEMAS["customer"],
                                unique_key=UNIQUE_KEYS["customer"], retractions=retractions,
                                also_unique=ALSO_UNIQUE["customer"] if verified_keys else ())
    date_dim = joinstate.source("date_dim", schema=SCHEMAS["date_dim"],
                                unique_key=UNIQUE_KEYS["date_dim"], retractions=retractions)
    branches = [_channel_year_total(ch, joinstate.source(ch.table, schema=SCHEMAS[ch.table],
                                                         retractions=retractions),
                                    customer, date_dim) for ch in CHANNELS]
    year_total = branches[0].union_all(*branches[1:])
    graph = joinstate.Graph().output("year_total", year_total)

    legs: dict[str, joinstate.Stream] = {}
    for leg, (sale_type, dyear, positive) in LEGS.items():
        cond = (_f("sale_type") == sale_type) & (_f("dyear") == dyear)
        if positive:
            cond = cond & (_f("year_total") > 0)
        keep = ANSWER_COLUMNS if leg == "t_s_secyear" else ["customer_id"]
        legs[leg] = year_total.filter(cond).select([*keep, "year_total"])
    joined = joinstate.join_all(legs, on="customer_id")
    c_ratio = _ratio("t_c_firstyear", "t_c_secyear")
    where = ((c_ratio > _ratio("t_s_firstyear", "t_s_secyear"))
             & (c_ratio > _ratio("t_w_firstyear", "t_w_secyear")))
    return graph.output("q4", joined.filter(where).select(
        {c: f"t_s_secyear_{c}" for c in ANSWER_COLUMNS}))


# ---- Z-sets --------------------------------------------------------------------------


def weighted(table: pa.Table, w: int) -> pa.Table:
    """``table`` with a ``_weight`` column of ``w``."""
    return table.append_column(WEIGHT, pa.array(np.full(table.num_rows, w, np.int64)))


def _tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    return list(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))


def apply_delta(table: pa.Table, delta: pa.Table, locate_by: str) -> pa.Table:
    """``table`` (a multiset of rows) after the Z-set ``delta``.

    Rows with a negative weight are removed (one copy per unit of weight); a row that is
    not there raises ``ValueError``, so a generator that deletes absent rows is caught
    here, before the pipeline is blamed.  ``locate_by`` is a selective column of the
    table: only rows whose value is among the deleted rows' are compared whole (Python
    tuples; decimals compare exactly).  Positive rows are appended.
    """
    delta = consolidate(delta)
    rows = delta.drop_columns([WEIGHT]).select(table.column_names).cast(table.schema)
    w = delta[WEIGHT].to_numpy()
    if (w < 0).any():
        neg = rows.filter(pa.array(w < 0))
        wanted = Counter(dict(zip(_tuples(neg), (-w[w < 0]).tolist(), strict=True)))
        mask = pc.is_in(table[locate_by], value_set=pa.array(neg[locate_by].to_pylist(),
                                                            table.schema.field(locate_by).type))
        cand = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        remove = []
        for i, t in zip(cand.tolist(), _tuples(table.take(pa.array(cand))), strict=True):
            if wanted.get(t, 0) > 0:
                wanted[t] -= 1
                remove.append(i)
        absent = +wanted
        if absent:
            first = next(iter(absent))
            raise ValueError(f"delta deletes {sum(absent.values())} rows absent from the "
                             f"table, e.g. {dict(zip(table.column_names, first, strict=True))}")
        keep = np.ones(table.num_rows, bool)
        keep[remove] = False
        table = table.filter(pa.array(keep))
    if (w > 0).any():
        plus = rows.filter(pa.array(w > 0))
        plus = plus.take(pa.array(np.repeat(np.arange(plus.num_rows), w[w > 0])))
        table = pa.concat_tables([table, plus])
    return table


class Integrated:
    """Each output's state, integrated from every delta the pipeline returned.

    Deltas are kept as they come and consolidated only when the state is read, so the
    timed pushes pay nothing for the bookkeeping.
    """

    def __init__(self, limit_rows: int | None = None) -> None:
        self.pending: dict[str, list[pa.Table]] = {}
        self.deltas = 0
        self.limit_rows = limit_rows
        self.seconds = 0.0
        """Seconds :meth:`add` spent consolidating (a caller timing pushes subtracts them)."""

    def add(self, outs: Mapping[str, pa.Table]) -> None:
        """Record one push's output deltas.

        With ``limit_rows``, an output whose kept deltas exceed that many rows is
        consolidated on the spot (an aggregate's every push retracts and re-emits the
        groups it touched: at SF10 a population returns ~75M rows of ``year_total``
        changes, which kept whole would not fit in memory beside the tables).
        """
        for name, d in outs.items():
            if d.num_rows:
                parts = self.pending.setdefault(name, [])
                parts.append(d)
                self.deltas += 1
                if self.limit_rows is not None and \
                        sum(t.num_rows for t in parts) > self.limit_rows:
                    t0 = time.perf_counter()
                    self.pending[name] = [consolidate(pa.concat_tables(
                        parts, promote_options="permissive").combine_chunks())]
                    self.seconds += time.perf_counter() - t0

    def state(self, name: str) -> pa.Table:
        """Output ``name`` as a multiset of rows (raises if a weight went negative)."""
        parts = self.pending.get(name, [])
        if not parts:
            raise KeyError(f"no delta seen for output {name!r}")
        cur = consolidate(pa.concat_tables(parts, promote_options="permissive").combine_chunks())
        self.pending[name] = [cur]
        return expand(cur)


def _top100(answer: pa.Table) -> pa.Table:
    """The answer in DuckDB's ORDER BY (the four columns, NULLS FIRST), first 100 rows."""
    if answer.num_rows == 0:
        return answer
    idx = pc.sort_indices(answer, sort_keys=[(c, "ascending", "at_start")
                                             for c in ANSWER_COLUMNS])
    return answer.take(idx).slice(0, 100)


def check(integrated: Integrated, ref: Reference, tables: Mapping[str, pa.Table],
          label: str) -> dict[str, Any]:
    """Both outputs against DuckDB on ``tables``; the top 100 against the shipped query."""
    want_yt, ms_yt = ref.year_total(tables)
    want_q4, ms_q4 = ref.answer(tables)
    got_q4 = integrated.state("q4") if "q4" in integrated.pending else want_q4.slice(0, 0)
    yt = compare(integrated.state("year_total"), want_yt)
    q4 = compare(got_q4, want_q4)
    lim, _ = ref.limited(tables)
    top = _top100(got_q4)
    top_ok = (top.num_rows == lim.num_rows
              and all(top[c].to_pylist() == lim[c].to_pylist()
                      for c in ANSWER_COLUMNS))
    return {"after": label, "ok": bool(yt["ok"] and q4["ok"] and top_ok),
            "year_total": yt, "q4": q4, "top100_ok": top_ok, "top100_rows": lim.num_rows,
            "duckdb_year_total_ms": ms_yt, "duckdb_answer_ms": ms_q4}


# ---- the workload --------------------------------------------------------------------

KINDS = ("insert", "delete", "customer", "date")
KIND_TEXT = {"insert": "new sales (+1, three channels)",
             "delete": "deleted sales (-1, three channels)",
             "customer": "customer update (-old +new)",
             "date": "date_dim correction (-old +new d_year)"}


class Workload:
    """The change batches, generated from the tables as they currently stand.

    ``tables`` is the current data: :meth:`apply` moves it forward with each delta (via
    :func:`apply_delta`, which refuses to delete absent rows), and the generators sample
    from it, so a delete batch only deletes present rows, an update retracts exactly the
    row the pipeline holds, and the DuckDB reference reads the same tables.  One seed
    gives the same batches in every pass.
    """

    def __init__(self, tables: Mapping[str, pa.Table], seed: int) -> None:
        self.tables = dict(tables)
        self.rng = np.random.default_rng(seed)
        self.next_number = {ch.table: int(pc.max(tables[ch.table][ch.number_col]).as_py() or 0) + 1
                            for ch in CHANNELS}
        self.version = 0

    def apply(self, source: str, delta: pa.Table) -> None:
        """Move ``source`` forward by ``delta``."""
        self.tables[source] = apply_delta(self.tables[source], delta, LOCATOR[source])

    def sales_counts(self, share: float) -> dict[str, int]:
        """Rows per channel for ``share`` of all sales rows (each channel in proportion)."""
        sizes = {ch.table: self.tables[ch.table].num_rows for ch in CHANNELS}
        total = sum(sizes.values())
        n = max(1, round(share * total))
        return {t: max(1, round(n * s / total)) for t, s in sizes.items()}

    def customers(self, share: float) -> int:
        """Customers to update for ``share``: the same share of the customers."""
        return max(1, round(share * self.tables["customer"].num_rows))

    def _pick(self, table: str, n: int) -> pa.Table:
        t = self.tables[table]
        idx = self.rng.choice(t.num_rows, min(n, t.num_rows), replace=False)
        return t.take(pa.array(np.sort(idx)))

    def new_sales(self, ch: Channel, n: int) -> pa.Table:
        """``n`` rows sampled from the channel's sales, weight +1.

        Each gets a fresh ticket/order number, so it is a new row; its customer and date
        keys stay valid (or NULL, as the sampled row's).
        """
        rows = self._pick(ch.table, n)
        start = self.next_number[ch.table]
        self.next_number[ch.table] += rows.num_rows
        i = rows.schema.get_field_index(ch.number_col)
        rows = rows.set_column(i, rows.schema.field(i), pa.array(
            np.arange(start, start + rows.num_rows), rows.schema.field(i).type))
        return weighted(rows, 1)

    def deleted_sales(self, ch: Channel, n: int) -> pa.Table:
        """``n`` distinct present rows of the channel's sales, weight -1."""
        return weighted(self._pick(ch.table, n), -1)

    def customer_update(self, n: int, customer_sks: Sequence[int] | None = None) -> pa.Table:
        """-current row, +changed row for ``n`` distinct customers (2n rows).

        The change: a new first name, the preferred flag flipped (NULL -> 'Y'), a new
        e-mail; all three are q4 group columns, two are in its answer.  ``customer_sks``
        names the customers instead (a test aims at the ones in q4's answer).
        """
        if customer_sks is None:
            old = self._pick("customer", n)
        else:
            t = self.tables["customer"]
            old = t.filter(pc.is_in(t["c_customer_sk"], pa.array(customer_sks, pa.int64())))
        self.version += 1
        v = self.version
        flip = {"Y": "N", "N": "Y", None: "Y"}
        new = old
        for col, fn in (("c_first_name", lambda s: f"{s or ''}~{v}"),
                        ("c_preferred_cust_flag", lambda s: flip.get(s, "Y")),
                        ("c_email_address", lambda s: f"v{v}.{s or ''}")):
            i = new.schema.get_field_index(col)
            new = new.set_column(i, new.schema.field(i),
                                 pa.array([fn(s) for s in old[col].to_pylist()], pa.string()))
        return pa.concat_tables([weighted(old, -1), weighted(new, 1)])

    def date_correction(self) -> pa.Table:
        """One date of 2001 or 2002 moved to the other year (-old +new row).

        Every sale of that day changes customer-year group, on the two years q4 compares.
        """
        t = self.tables["date_dim"]
        years = t["d_year"].to_numpy(zero_copy_only=False)
        cand = np.flatnonzero((years == 2001) | (years == 2002))
        i = int(self.rng.choice(cand))
        old = t.slice(i, 1)
        y = old["d_year"][0].as_py()
        new = old.set_column(old.schema.get_field_index("d_year"), old.schema.field("d_year"),
                             pa.array([4003 - y], old.schema.field("d_year").type))
        return pa.concat_tables([weighted(old, -1), weighted(new, 1)])

    def qualifying_sales(self, n: int) -> list[tuple[str, pa.Table]]:
        """Sales that put ``n`` random customers into q4's answer (almost surely).

        At small scale factors q4's answer is empty (SF0.1: three customers buy in all
        three channels in both 2001 and 2002, none passes the ratio test; SF1: six rows),
        so its six-way join and final WHERE would be checked on nothing.  Each customer
        gets, on one 2001 and one 2002 date, a sale per channel with a year_total of
        50,000 (list and sales price 50,000, no cost or discount), and two more catalog
        sales of 99,999.99 in 2002: the catalog ratio (~6) beats store's and web's (~1)
        unless the customer's own sales are of the same order, which TPC-DS's are not.
        Rows are templated on one existing sale per channel (its item), with fresh
        ticket/order numbers.
        """
        sks = self._pick("customer", n)["c_customer_sk"].to_numpy()
        years = self.tables["date_dim"]["d_year"].to_numpy(zero_copy_only=False)
        date_sks = self.tables["date_dim"]["d_date_sk"].to_numpy()
        d1 = int(self.rng.choice(date_sks[years == 2001]))
        d2 = int(self.rng.choice(date_sks[years == 2002]))
        big, top = Decimal("50000.00"), Decimal("99999.99")
        out = []
        for ch in CHANNELS:
            plan = [(d1, big), (d2, big)] + ([(d2, top), (d2, top)] if ch.sale_type == "c"
                                             else [])
            template = self._pick(ch.table, 1).to_pylist()[0]
            rows = []
            for sk in sks.tolist():
                for date_sk, price in plan:
                    rows.append({**template, ch.customer_col: sk, ch.date_col: date_sk,
                                 ch.number_col: self.next_number[ch.table],
                                 ch.col("ext_list_price"): price,
                                 ch.col("ext_sales_price"): price,
                                 ch.col("ext_wholesale_cost"): Decimal(0),
                                 ch.col("ext_discount_amt"): Decimal(0)})
                    self.next_number[ch.table] += 1
            out.append((ch.table, weighted(pa.Table.from_pylist(rows, SCHEMAS[ch.table]), 1)))
        return out

    def batch(self, kind: str, share: float) -> list[tuple[str, pa.Table]]:
        """The pushes ``(source, delta)`` of one batch kind at ``share``, in order.

        Every delta of the kind is built here, before any push is timed; the caller
        applies each to :attr:`tables` after its push (the three channels are different
        tables, so no delta of a kind depends on another).
        """
        if kind == "insert":
            return [(ch.table, self.new_sales(ch, n))
                    for ch, n in zip(CHANNELS, self.sales_counts(share).values(), strict=True)]
        if kind == "delete":
            return [(ch.table, self.deleted_sales(ch, n))
                    for ch, n in zip(CHANNELS, self.sales_counts(share).values(), strict=True)]
        if kind == "customer":
            return [("customer", self.customer_update(self.customers(share)))]
        if kind == "date":
            return [("date_dim", self.date_correction())]
        raise ValueError(f"unknown batch kind {kind!r} (one of {KINDS})")


# ---- running -------------------------------------------------------------------------


def populate_pipeline(p: joinstate.Pipeline, tables: Mapping[str, pa.Table], *,
                      chunk_rows: int = 200_000, strategy: str = "auto",
                      on_output: Callable[[Mapping[str, pa.Table]], None] | None = None,
                      ) -> dict[str, Any]:
    """Fill the pipeline with ``tables`` through ``population.populate``.

    The driver loads the sources smallest first (date_dim and customer before any
    sales), ``chunk_rows`` per push, with ``strategy``'s compaction control per index.
    ``on_output`` receives every push's output deltas (the check integrates them).
    """
    if not isinstance(p, joinstate.Pipeline):  # a stand-in with push() only (tests)
        t0 = time.perf_counter()
        per: dict[str, Any] = {}
        for name in POPULATION_ORDER:
            t = tables[name]
            for batch in t.to_batches(max_chunksize=chunk_rows):
                outs = p.push(name, pa.Table.from_batches([batch], t.schema))
                if on_output is not None:
                    on_output(outs)
            per[name] = {"rows": t.num_rows, "pushes": 1, "s": 0.0}
        return {"s": time.perf_counter() - t0, "chunk_rows": chunk_rows, "strategy": "-",
                "rows_per_s": 0.0, "sources": per, "operators": {}, "actions": 0,
                "peak_rss_bytes": 0}
    report = population.populate(p, sources=dict(tables), strategy=strategy,
                                 batch_rows=chunk_rows, progress=False,
                                 sink=on_output)
    per = {s.name: {"rows": s.rows, "pushes": s.batches, "s": s.seconds}
           for s in report.sources}
    return {"s": report.seconds, "chunk_rows": chunk_rows, "strategy": report.strategy,
            "rows_per_s": report.rows_per_second, "sources": per,
            "operators": report.operators, "actions": len(report.actions),
            "peak_rss_bytes": report.peak_rss_bytes,
            "plan": report.plan, "explain": report.explain,
            # for bench/report.py's population timelines
            "samples": report.samples, "compaction_actions": report.actions}


def population_strategies(tables: Mapping[str, pa.Table], strategies: Sequence[str],
                          workdir: Path, *, chunk_rows: int = 200_000) -> list[dict[str, Any]]:
    """Population of the whole q4 pipeline per strategy (fresh store each), rows/s.

    Each result keeps the plan the population ran (``plan``, ``explain``): for ``auto``,
    what the planner picked and why (:func:`auto_vs_fixed` compares it with the rest).
    """
    out = []
    for strategy in strategies:
        path = workdir / f"pop-{strategy}"
        shutil.rmtree(path, ignore_errors=True)
        with joinstate.StateStore(path) as store:
            p = build_q4(store)
            res = populate_pipeline(p, tables, chunk_rows=chunk_rows, strategy=strategy)
        res["state_bytes"] = dir_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        out.append(res)
    return out


SHARED_INPUTS = ("customer", "date_dim", "union")
"""The streams q4 reads more than once on one key: customer and date_dim (three joins
each) and year_total (a union; six legs)."""


def index_bytes(store: joinstate.StateStore, p: joinstate.Pipeline) -> dict[str, int]:
    """Bytes of every index (SST files after a flush), and the sum over the shared inputs.

    Index families are ``ix.<pipeline>~<stream>[~<reader>][key]``: the stream says what
    an index holds, whichever operator reads it.
    """
    out: dict[str, int] = {"shared inputs": 0}
    if not isinstance(p, joinstate.Pipeline):  # a stand-in (tests)
        return out
    store.flush()
    for cf in p.column_families():
        out[cf] = store.property_int(cf, "rocksdb.total-sst-files-size") or 0
    prefix = f"ix.{p.name}~"
    shared = 0
    for cf, n in out.items():
        if cf.startswith(prefix):
            parts = re.split(r"[~\[]", cf[len(prefix):], maxsplit=2)
            stream, reader = parts[0], (parts[1] if cf.count("~") > 1 else "")
            # Unshared, the six legs each index their own filtered projection of the
            # union (``project<i>~joinall<j>-<leg>``): what the shared union index replaces.
            if stream.startswith(SHARED_INPUTS) or reader.startswith("joinall"):
                shared += n
    out["shared inputs"] = shared
    return out


def dir_bytes(path: Path) -> int:
    """Sum of the sizes of the files under ``path`` (the store's bytes on disk)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _ms_summary(ms: Sequence[float]) -> dict[str, Any]:
    return {"ms": [round(x, 3) for x in ms], "first_ms": ms[0],
            "median_ms": statistics.median(ms), "max_ms": max(ms)}


def run_pass(name: str, share_indexes: bool, tables: Mapping[str, pa.Table],
             sizes: Sequence[float], repeat: int, seed: int, workdir: Path, *,
             chunk_rows: int = 200_000, check_every: str = "each", qualify: int = 0,
             ref: Reference | None = None,
             build: Callable[..., Any] = build_q4,
             on_step: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    """Populate, check, then every size's batches (timed, checked); figures of the pass.

    ``qualify`` customers are first given sales that put them in q4's answer
    (:meth:`Workload.qualifying_sales`), so that the batches have an answer to change.
    ``build(store, share_indexes=...)`` makes the pipeline (tests pass a stand-in).
    ``on_step(what, ms)`` hears of each step as it ends (population, qualifying sales,
    each batch kind), so a caller can show progress through a pass that takes minutes.
    """
    def step(what: str, ms: float) -> None:
        if on_step is not None:
            on_step(what, ms)

    path = workdir / name
    shutil.rmtree(path, ignore_errors=True)
    own_ref = ref is None
    ref = ref or Reference()
    integrated = Integrated()
    checks: list[dict[str, Any]] = []
    res: dict[str, Any] = {"name": name, "share_indexes": share_indexes}
    try:
        with joinstate.StateStore(path) as store:
            t0 = time.perf_counter()
            p = build(store, share_indexes=share_indexes)
            res["build_ms"] = (time.perf_counter() - t0) * 1e3
            res["population"] = populate_pipeline(p, tables, chunk_rows=chunk_rows,
                                                  on_output=integrated.add)
            res["state_bytes_after_population"] = dir_bytes(path)
            res["index_bytes"] = index_bytes(store, p)
            checks.append(check(integrated, ref, tables, "population"))
            step("population", res["population"]["s"] * 1e3)
            # A source decides retractions from an in-memory multiset of its row hashes,
            # built by one scan when it is first needed: built here, timed apart, so the
            # first delete batch measures a delete and not that one-time scan.
            warm = p.warm()
            res["warm"] = {"s": sum(warm.values()), "sources": warm}
            step("warm-up (row multisets of the sources)", sum(warm.values()) * 1e3)
            work = Workload(tables, seed)
            if qualify:
                q_ms = []
                for source, delta in work.qualifying_sales(qualify):
                    t0 = time.perf_counter()
                    integrated.add(p.push(source, delta))
                    q_ms.append((time.perf_counter() - t0) * 1e3)
                    work.apply(source, delta)
                checks.append(check(integrated, ref, work.tables, "qualifying sales"))
                res["qualify"] = {"customers": qualify, "ms": sum(q_ms),
                                  "q4_rows": checks[-1]["q4"]["want_rows"]}
                step("qualifying sales", sum(q_ms))
            res["sizes"] = []
            for share in sizes:
                kinds: dict[str, dict[str, Any]] = {k: {"ms": [], "pushes": [], "out_rows": []}
                                                    for k in KINDS}
                rows: dict[str, int] = {}
                for r in range(repeat):
                    for kind in KINDS:
                        deltas = work.batch(kind, share)
                        total, outs_rows = 0.0, {"year_total": 0, "q4": 0}
                        push_ms = []
                        for source, delta in deltas:
                            t0 = time.perf_counter()
                            outs = p.push(source, delta)
                            ms = (time.perf_counter() - t0) * 1e3
                            total += ms
                            push_ms.append({"source": source, "rows": delta.num_rows,
                                            "ms": round(ms, 3)})
                            integrated.add(outs)
                            for o in outs_rows:
                                outs_rows[o] += outs[o].num_rows if o in outs else 0
                            work.apply(source, delta)
                        kinds[kind]["ms"].append(total)
                        kinds[kind]["pushes"].append(push_ms)
                        kinds[kind]["out_rows"].append(outs_rows)
                        rows[kind] = sum(d.num_rows for _, d in deltas)
                        if check_every == "each":
                            checks.append(check(integrated, ref, work.tables,
                                                f"{share:g} #{r + 1} {kind}"))
                        step(f"{share:g} #{r + 1} {kind}", total)
                if check_every == "size":
                    checks.append(check(integrated, ref, work.tables, f"{share:g}"))
                batch_ms = [sum(kinds[k]["ms"][i] for k in KINDS) for i in range(repeat)]
                res["sizes"].append({
                    "share": share, "sales_rows": work.sales_counts(share),
                    "customers": work.customers(share),
                    "kinds": {k: {**v, **_ms_summary(v["ms"]), "rows": rows[k]}
                              for k, v in kinds.items()},
                    "batch": _ms_summary(batch_ms),
                })
            if check_every == "end":
                checks.append(check(integrated, ref, work.tables, "end"))
            res["column_families"] = sorted(store.column_families())
            res["final_tables"] = work.tables
        res["state_bytes_closed"] = dir_bytes(path)
    finally:
        if own_ref:
            ref.close()
    res["output_deltas"] = integrated.deltas
    res["checks"] = checks
    res["ok"] = all(c["ok"] for c in checks)
    return res


def duckdb_recompute(tables: Mapping[str, pa.Table], runs: int) -> dict[str, Any]:
    """DuckDB computing year_total and the whole answer from scratch (Arrow tables)."""
    ref = Reference()
    try:
        yt, ans = [], []
        rows = {}
        for _ in range(runs):
            t, ms = ref.year_total(tables)
            yt.append(ms)
            rows["year_total"] = t.num_rows
            t, ms = ref.answer(tables)
            ans.append(ms)
            rows["q4"] = t.num_rows
        threads = ref.con.execute("SELECT current_setting('threads')").fetchone()
    finally:
        ref.close()
    return {"year_total": _ms_summary(yt), "answer": _ms_summary(ans), "rows": rows,
            "threads": int(threads[0]) if threads else None}


def run_q4(sf: float = 0.1, sizes: Sequence[float] = (0.0001, 0.001, 0.01), repeat: int = 3,
           out: Path | None = None, *, unshared: bool = True, seed: int = 0,
           workdir: Path | None = None, cache_dir: Path | None = None,
           chunk_rows: int = 200_000, check_every: str = "each", qualify: int | None = None,
           recompute_runs: int = 3, strategies: Sequence[str] = (),
           spark_sql: bool = False) -> dict[str, Any]:
    """Run the suite; write ``q4.json``/``q4.md`` under ``out`` if given.

    ``results["ok"]`` is whether every check of every pass passed (and, with
    ``spark_sql``, whether Spark SQL's from-scratch answer equals DuckDB's).
    """
    from bench.live import _git

    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1")
    if check_every not in ("each", "size", "end"):
        raise ValueError(f"check_every={check_every!r}: each, size or end")
    tables = load(sf, cache_dir)
    if qualify is None:
        qualify = max(3, round(0.001 * tables["customer"].num_rows))
    res: dict[str, Any] = {
        "suite": "q4", "sf": sf, "sizes": list(sizes), "repeat": repeat, "seed": seed,
        "check_every": check_every, "chunk_rows": chunk_rows, "qualify": qualify,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git": _git(),
        "load_average_start": list(os.getloadavg()),
        "rows": {n: t.num_rows for n, t in tables.items()},
        "query": {"answer_columns": ANSWER_COLUMNS, "legs": {k: list(v) for k, v in LEGS.items()},
                  "order_by": ANSWER_COLUMNS, "limit": 100},
    }
    tmp = Path(workdir or tempfile.mkdtemp(prefix="joinstate-q4-"))
    passes = [("shared", True)] + ([("unshared", False)] if unshared else [])
    final: Mapping[str, pa.Table] = tables
    try:
        res["population_strategies"] = population_strategies(tables, strategies, tmp,
                                                             chunk_rows=chunk_rows)
        res["passes"] = []
        for n, share in passes:
            pr = run_pass(n, share, tables, sizes, repeat, seed, tmp, chunk_rows=chunk_rows,
                          check_every=check_every, qualify=qualify)
            final = pr.pop("final_tables")
            res["passes"].append(pr)
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["final_rows"] = {n: t.num_rows for n, t in final.items()}
    res["duckdb_recompute"] = duckdb_recompute(final, recompute_runs)
    res["spark_sql_recompute"] = None
    if spark_sql:
        from bench import spark_sql as sparksql

        res["spark_sql_recompute"] = sparksql.recompute(final, recompute_runs)
    res["load_average_end"] = list(os.getloadavg())
    res["ok"] = all(p["ok"] for p in res["passes"]) and (
        not spark_sql or bool(res["spark_sql_recompute"]["matches_duckdb"]))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "q4.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "q4.md").write_text(to_markdown(res) + "\n")
    return res


# ---- report --------------------------------------------------------------------------


def _pct(share: float) -> str:
    return f"{share * 100:g}%"


def _times(x: float) -> str:
    return f"{x:,.0f}x" if x >= 10 else f"{x:.2f}x"


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _failed(checks: Iterable[dict[str, Any]]) -> list[str]:
    md = []
    for c in checks:
        if c["ok"]:
            continue
        md.append(f"- after {c['after']}: top100 ok {c['top100_ok']}")
        for out in ("year_total", "q4"):
            r = c[out]
            if not r["ok"]:
                md.append(f"  - {out}: {r.get('mismatches')} mismatches, {r['got_rows']} vs "
                          f"{r['want_rows']} rows; {r.get('reason', '')} first at "
                          f"{r.get('first_position')}: got {r.get('got_at_first')}, want "
                          f"{r.get('want_at_first')}; only in pipeline {r.get('only_got')}, "
                          f"only in DuckDB {r.get('only_want')}")
    return md


def to_markdown(res: dict[str, Any]) -> str:
    """The report: per pass population and per-kind push times, shared vs unshared, checks."""
    from bench.live import _short

    g = res["git"]
    rc = res["duckdb_recompute"]
    rows = res["rows"]
    md = [f"# TPC-DS query 4, live: SF{res['sf']:g}", "",
          ", ".join(f"{n} {r:,}" for n, r in rows.items()) + f" rows; {res['repeat']} batches "
          f"per size, seed {res['seed']}, checks after {res['check_every']}; {res['started']}; "
          f"commit `{_short(g['head'])}`"
          + (f" (uncommitted changes in {', '.join(g['dirty'])})" if g["dirty"] else ""), "",
          f"DuckDB from scratch on the final tables (Arrow, {rc['threads']} threads): "
          f"year_total ({rc['rows']['year_total']:,} rows) median "
          f"{rc['year_total']['median_ms']:,.0f} ms, answer ({rc['rows']['q4']:,} rows) median "
          f"{rc['answer']['median_ms']:,.0f} ms; load average (1 min) "
          f"{res['load_average_start'][0]:.1f} at the start, {res['load_average_end'][0]:.1f} "
          f"at the end ({os.cpu_count()} CPUs)", ""]
    sq = res.get("spark_sql_recompute")
    if sq:
        md += [f"Spark SQL from scratch on the same tables (Parquet, local, "
               f"{sq['parallelism']} partitions per stage): year_total median "
               f"{sq['year_total']['median_ms']:,.0f} ms, answer median "
               f"{sq['answer']['median_ms']:,.0f} ms (first run "
               f"{sq['answer']['first_ms']:,.0f} ms); its answer "
               f"{'equals' if sq['matches_duckdb'] else 'DIFFERS FROM'} DuckDB's", ""]
    recompute = rc["answer"]["median_ms"]
    for p in res["passes"]:
        pop = p["population"]
        md += [f"## pass `{p['name']}` (share_indexes={p['share_indexes']})", "",
               f"population {pop['s']:.1f} s (" + ", ".join(
                   f"{n} {v['s']:.1f} s" for n, v in pop["sources"].items())
               + f"); {len(p['column_families'])} column families; "
               f"{_mb(p['state_bytes_closed'])} on disk after close", ""]
        if pop.get("explain"):
            md += ["<details><summary>the population's plan (strategy "
                   f"{pop['strategy']})</summary>", "", "```text", pop["explain"], "```", "",
                   "</details>", ""]
        if "qualify" in p:
            qf = p["qualify"]
            md += [f"qualifying sales for {qf['customers']} customers: {qf['ms']:.1f} ms; the "
                   f"answer then has {qf['q4_rows']} rows", ""]
        md += [
               "| size | kind | rows | first ms | median ms | max ms | year_total rows out "
               "(median) | q4 rows out (max) |", "|---|---|---|---|---|---|---|---|"]
        for s in p["sizes"]:
            for k in KINDS:
                r = s["kinds"][k]
                yt = statistics.median(o["year_total"] for o in r["out_rows"])
                q4 = max(o["q4"] for o in r["out_rows"])
                md.append(f"| {_pct(s['share'])} | {KIND_TEXT[k]} | {r['rows']:,} | "
                          f"{r['first_ms']:.1f} | {r['median_ms']:.1f} | {r['max_ms']:.1f} | "
                          f"{yt:,.0f} | {q4:,.0f} |")
            b = s["batch"]
            md.append(f"| {_pct(s['share'])} | **whole batch** | "
                      f"{sum(s['kinds'][k]['rows'] for k in KINDS):,} | {b['first_ms']:.1f} | "
                      f"{b['median_ms']:.1f} | {b['max_ms']:.1f} | DuckDB answer from "
                      f"scratch / median batch: {_times(recompute / b['median_ms'])}"
                      + (f"; Spark SQL: {_times(sq['answer']['median_ms'] / b['median_ms'])}"
                         if sq else "") + " | |")
        n_ok = sum(c["ok"] for c in p["checks"])
        md += ["", f"checks against DuckDB: {n_ok}/{len(p['checks'])} passed "
               f"({p['output_deltas']:,} output deltas integrated) -> "
               f"**{'OK' if p['ok'] else 'FAILED'}**"]
        md += _failed(p["checks"])
        md.append("")
    if res.get("population_strategies"):
        pops = res["population_strategies"]
        md += auto_vs_fixed(pops)
        best = max(x["rows_per_s"] for x in pops if not x["strategy"].startswith("auto"))\
            if any(not x["strategy"].startswith("auto") for x in pops) else None
        md += ["## population of the whole pipeline per strategy", "",
               "| strategy | seconds | rows/s | vs best fixed | compaction actions | "
               "peak RSS | state on disk |", "|---|---|---|---|---|---|---|"]
        for x in pops:
            rel = f"{x['rows_per_s'] / best:.2f}x" if best else "-"
            md.append(f"| {x['strategy']} | {x['s']:.1f} | {x['rows_per_s']:,.0f} | {rel} | "
                      f"{x['actions']} | {_mb(x['peak_rss_bytes'])} | {_mb(x['state_bytes'])} |")
        md.append("")
    if len(res["passes"]) > 1:
        md += ["## shared vs unshared indexes", "",
               "| pass | column families | index bytes of the shared inputs (customer, "
               "date_dim, year_total) | bytes after population | bytes after close | "
               "population s | customer update ms (median, per size) |",
               "|---|---|---|---|---|---|---|"]
        for p in res["passes"]:
            cu = ", ".join(f"{_pct(s['share'])}: {s['kinds']['customer']['median_ms']:.1f}"
                           for s in p["sizes"])
            md.append(f"| {p['name']} | {len(p['column_families'])} | "
                      f"{_mb(p['index_bytes']['shared inputs'])} | "
                      f"{_mb(p['state_bytes_after_population'])} | "
                      f"{_mb(p['state_bytes_closed'])} | {p['population']['s']:.1f} | {cu} |")
        md.append("")
    return "\n".join(md)


def auto_vs_fixed(pops: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown: ``auto`` (the planner) against the fixed population strategies.

    ``auto`` passes when its rows/s are within 10% of the best fixed strategy's and not
    below the worst's; "pick / best fixed" compares the picked strategy's own fixed run
    with the best (the decision, apart from run-to-run noise).  Ends with the plan of
    the ``auto`` run.
    """
    fixed = {x["strategy"]: x["rows_per_s"] for x in pops
             if not str(x["strategy"]).startswith("auto")}
    autos = [x for x in pops if str(x["strategy"]).startswith("auto")]
    if not fixed or not autos:
        return []
    best, worst = max(fixed.values()), min(fixed.values())
    md = ["## population: `auto` against the fixed strategies", "",
          "| " + " | ".join(f"{n} rows/s" for n in fixed) + " | auto rows/s | auto picked "
          "| auto / best fixed | auto / worst fixed | ok | pick / best fixed "
          "| why (the planner's reason) |",
          "|" + "---|" * (len(fixed) + 7)]
    for a in autos:
        why = next((d["reason"] for d in a.get("plan", {}).get("decisions", [])
                    if d["topic"] == "strategy" and d["subject"] == a["plan"]["name"]), "")
        rate = a["rows_per_s"]
        ok = rate >= 0.9 * best and rate >= worst
        picked = str(a["strategy"]).removeprefix("auto->")
        pick = f"{fixed[picked] / best:.2f}x" if picked in fixed else "-"
        md.append("| " + " | ".join(f"{v:,.0f}" for v in fixed.values())
                  + f" | {rate:,.0f} | {picked} | {rate / best:.2f}x | {rate / worst:.2f}x | "
                  f"{'yes' if ok else 'NO'} | {pick} | {why} |")
    md.append("")
    if autos[0].get("explain"):
        md += ["plan of the `auto` population:", "", "```text", autos[0]["explain"], "```",
               ""]
    return md
