"""``joinstate bench tpcds --queries ...``: every TPC-DS query kept live, checked by DuckDB.

Per query (official text from DuckDB's ``tpcds`` extension): compile it
(:func:`planner.sql.compile`, a refusal is listed with its reason), create its view in a
fresh store, populate it (:func:`population.populate`), then apply three change batches
(:func:`population.apply_batch`, one call per source the batch touches; the second batch
as one push of every source's change, :func:`population.apply_changes`) and check the
view after population and after every batch against DuckDB computing the query from
scratch on the changed tables: the integrated output against the answer without ORDER
BY/LIMIT, ``read()`` against the ordered, limited answer (rows tied at the limit may be
either).  Recorded per query: population seconds, per-batch seconds, DuckDB's recompute
seconds, answer rows, whether the answer changed, the planner's per-source choice.

**Change batches that matter.**  Random rows would mostly miss a query's filters, so its
answer would not move and the check would prove little.  Each SELECT scope of the
query is rewritten into ``SELECT DISTINCT alias.__rid FROM <its FROM> WHERE <its
WHERE>`` per base table it reads (CTEs kept; aggregation, HAVING, ORDER BY and LIMIT
dropped; in a correlated subquery, the conjuncts naming the outer row) and run by
DuckDB on the tables with a stable row id: the rows that survive the scope's joins and
filters (its *candidates*).  Where the scale factor leaves a query without an answer,
a seed (:mod:`bench.tpcds_seeds`) adds rows before population that give it one; the
seeded rows are *hot*: half of each later pick comes from them.  A batch that leaves
the answer as it was, or empties it, is drawn again (up to RETRIES times).
Every batch mixes four kinds:

* **new rows**: clones of candidate fact rows, some with columns taken from other
  candidates (new combinations of customers, items, dates that pass the same
  per-column filters);
* **deletes**: candidate fact rows (and a few random ones);
* **dimension updates**: candidate rows of up to two dimensions, one column the query
  reads rewritten with another row's value, as a delete and an insert under the same
  key;
* **re-inserts**: the rows the previous batch deleted (the first batch: candidate rows
  held out of the population, i.e. deleted before it).

Row ids (``__rid``) stay with a row for the whole run and never reach joinstate or the
checked DuckDB tables.  A query whose answer is empty (or one row of zeros and NULLs)
after population, or that no batch changes, matched DuckDB without proving anything:
its status is ``vacuous``, which fails the run like a wrong answer (its seed is
missing or its batches miss what it reads).  An answer emptied by a batch is listed.

:func:`run` returns the results; :func:`write_report` writes ``report.json``,
``report.md`` and ``tpcds-all.png`` (per query: mean batch time vs DuckDB's recompute).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import tpcds
from bench.q4 import Integrated, weighted
from bench.tpcds_seeds import SEEDS
from joinstate.errors import JoinStateError
from joinstate.testing import ATOL, RTOL

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    import duckdb
    import sqlglot.expressions as exp

__all__ = [
    "BATCHES", "DEFAULT_SHARE", "FACTS", "TABLES", "Batch", "Changes", "Oracle",
    "QueryArgumentError", "QueryResult", "candidate_queries", "check_view", "compile_query",
    "environment", "query_sources",
    "is_trivial", "load_tables", "parse_queries", "plain", "prepare_changes", "run",
    "run_query", "same_answer", "unordered", "valid_batch", "write_report",
]

FACTS = frozenset({"store_sales", "store_returns", "catalog_sales", "catalog_returns",
                   "web_sales", "web_returns", "inventory"})
"""Fact tables: no declared unique key; they take new rows, deletes and re-inserts."""
TABLES = tuple(sorted({*FACTS, "call_center", "catalog_page", "customer", "customer_address",
                       "customer_demographics", "date_dim", "household_demographics",
                       "income_band", "item", "promotion", "reason", "ship_mode", "store",
                       "time_dim", "warehouse", "web_page", "web_site"}))
"""TPC-DS's 24 tables; a dimension is unique on its first column (its surrogate key)."""
BATCHES = 3
ONE_PUSH_BATCH = 1
"""The batch (0-based) applied as one push of every source's change; the others go one
source at a time, so every query checks both."""
DEFAULT_SHARE = 0.001
"""Fact rows per kind and batch, as a share of the fact table (at least MIN_ROWS)."""
MIN_ROWS = 8
DIM_ROWS = (2, 40)
"""Dimension rows updated per dimension and batch: at least, at most."""
RID = "__rid"
RETRIES = 5
CANDIDATE_DONORS = 0.8
"""Share of dimension updates taking the new value from a candidate row (the rest: any)."""
MIX = 0.3
"""Chance that a cloned fact row takes a column's value from another candidate row."""
RANDOM_SHARE = 0.2
"""Share of the deleted rows drawn from the whole table rather than the candidates."""
HOLD_SHARE = 5
DELETE_SHARE = 4
"""At most 1/HOLD_SHARE of a table's candidates are held out of the population, at most
1/DELETE_SHARE of those alive deleted per batch, and of a dimension's candidates at most
1/DELETE_SHARE (or DIM_ROWS[0]) updated: the answer must not empty."""


class QueryArgumentError(JoinStateError, ValueError):
    """``--queries`` names no TPC-DS query (1-99); the message says what to give."""


def parse_queries(text: str) -> list[int]:
    """``all``, or query numbers and ranges separated by commas: ``3,7,40-42``."""
    text = text.strip()
    if text.lower() == "all":
        return list(range(1, 100))
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a = int(lo.strip().lstrip("qQ"))
            b = int(hi.strip().lstrip("qQ")) if hi else a
        except ValueError:
            raise QueryArgumentError(f"--queries {text!r}: {part!r} is not a query number; "
                                     "give all, or numbers and ranges like 3,7,40-42") from None
        if not 1 <= a <= b <= 99:
            raise QueryArgumentError(f"--queries {text!r}: {part!r} is outside 1-99 (TPC-DS "
                                     "has queries 1 to 99)")
        out.extend(n for n in range(a, b + 1) if n not in out)
    if not out:
        raise QueryArgumentError(f"--queries {text!r}: no query given; give all, or numbers "
                                 "like 3,7,42")
    return out


# ---- what a query reads -----------------------------------------------------------------


def _parse(sql: str) -> exp.Expr:
    import sqlglot

    return sqlglot.parse_one(sql, read="duckdb")


def unordered(sql: str) -> str:
    """``sql`` without its outermost ORDER BY and LIMIT: the whole answer, as a multiset."""
    tree = _parse(sql)
    tree.set("order", None)
    tree.set("limit", None)
    return tree.sql(dialect="duckdb")


def candidate_queries(sql: str, tables: Iterable[str]) -> list[tuple[str, str]]:
    """``(table, query)`` per base table of each SELECT scope: its candidate row ids.

    The query keeps the scope's FROM, joins and WHERE (and the statement's CTEs) and
    selects ``DISTINCT alias.__rid``: the rows of ``table`` that pass what the scope
    filters on.  A correlated subquery's conjuncts naming an outer table are dropped
    (the rows pass for *some* outer row).
    """
    import sqlglot.expressions as exp
    from sqlglot.optimizer.scope import traverse_scope

    names = set(tables)
    tree = _parse(sql)
    with_ = tree.args.get("with")
    out: list[tuple[str, str]] = []
    for scope in traverse_scope(tree):
        sel = scope.expression
        if not isinstance(sel, exp.Select):
            continue
        inner = set(scope.sources)
        for alias, source in scope.sources.items():
            if not isinstance(source, exp.Table) or source.name not in names:
                continue
            q = sel.copy()
            q.set("expressions", [exp.column(RID, table=alias)])
            for arg in ("group", "having", "order", "limit", "offset", "qualify", "windows"):
                q.set(arg, None)
            q.set("distinct", exp.Distinct())
            where = q.args.get("where")
            if scope.is_correlated_subquery and where is not None:
                kept = [c for c in where.this.flatten() if all(
                    not col.table or col.table in inner for col in c.find_all(exp.Column))]
                q.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
            if with_ is not None and q.args.get("with") is None:
                q.set("with", with_.copy())
            out.append((source.name, q.sql(dialect="duckdb")))
    return out


def referenced_columns(sql: str, schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` the query names (TPC-DS column names are table-unique)."""
    import sqlglot.expressions as exp

    named = {c.name for c in _parse(sql).find_all(exp.Column)}
    return [c for c in schema.names if c in named]


# ---- the tables, with row ids ----------------------------------------------------------


def load_tables(sf: float, cache_dir: Path | None = None) -> dict[str, pa.Table]:
    """Every TPC-DS table at ``sf``, each with a ``__rid`` column 0..n-1 appended."""
    paths = tpcds.tables(sf, TABLES, cache_dir=cache_dir)
    out = {}
    for n, path in paths.items():
        t = pq.read_table(path)
        out[n] = t.append_column(RID, pa.array(np.arange(t.num_rows, dtype=np.int64)))
    return out


def plain(t: pa.Table) -> pa.Table:
    """``t`` without its row ids: what joinstate and the checked tables see."""
    return t.drop_columns([RID])


class Tables:
    """The current tables of one query's run: Arrow, each row with its ``__rid``."""

    def __init__(self, tables: Mapping[str, pa.Table]) -> None:
        self.t = dict(tables)
        self.next_rid = {n: int(pc.max(t[RID]).as_py() or 0) + 1 if t.num_rows else 0
                         for n, t in self.t.items()}

    def take(self, name: str, rids: np.ndarray) -> pa.Table:
        t = self.t[name]
        return t.filter(pc.is_in(t[RID], pa.array(rids, pa.int64())))

    def remove(self, name: str, rids: np.ndarray) -> None:
        t = self.t[name]
        self.t[name] = t.filter(pc.invert(pc.is_in(t[RID], pa.array(rids, pa.int64()))))

    def add(self, name: str, rows: pa.Table) -> None:
        self.t[name] = pa.concat_tables([self.t[name], rows.select(self.t[name].column_names)])

    def fresh(self, name: str, rows: pa.Table) -> pa.Table:
        """``rows`` under new row ids."""
        n = self.next_rid[name]
        self.next_rid[name] = n + rows.num_rows
        i = rows.schema.get_field_index(RID)
        return rows.set_column(i, RID, pa.array(np.arange(n, n + rows.num_rows, dtype=np.int64)))


class Oracle:
    """DuckDB on the current tables: real tables (statistics: complex plans stay fast)."""

    def __init__(self) -> None:
        import duckdb

        self.con: duckdb.DuckDBPyConnection = duckdb.connect()
        self.con.execute("SET enable_progress_bar = false")

    def close(self) -> None:
        """Close the connection."""
        self.con.close()

    def load(self, tables: Mapping[str, pa.Table], names: Iterable[str], *,
             rids: bool = False) -> None:
        """(Re)load the tables ``names`` (with their row ids if ``rids``)."""
        for n in names:
            self.con.register("arrow_in", tables[n] if rids else plain(tables[n]))
            self.con.execute(f'CREATE OR REPLACE TABLE "{n}" AS SELECT * FROM arrow_in')
            self.con.unregister("arrow_in")

    def answer(self, sql: str) -> tuple[pa.Table, float]:
        """``sql``'s answer on the loaded tables, and DuckDB's seconds for it."""
        t0 = time.perf_counter()
        out = self.con.execute(sql).to_arrow_table()
        return out, time.perf_counter() - t0


def candidates(sql: str, tables: Mapping[str, pa.Table], names: Sequence[str]
               ) -> tuple[dict[str, np.ndarray], list[str]]:
    """Candidate row ids per table (see the module docstring), and scopes DuckDB refused."""
    import duckdb

    oracle = Oracle()
    found: dict[str, set[int]] = {}
    skipped: list[str] = []
    try:
        oracle.load(tables, names, rids=True)
        for table, q in candidate_queries(sql, names):
            try:
                got = oracle.con.execute(q).fetchnumpy()[RID]
            except duckdb.Error as e:
                skipped.append(f"{table}: {str(e).splitlines()[0][:120]}")
                continue
            found.setdefault(table, set()).update(int(x) for x in np.asarray(got))
    finally:
        oracle.close()
    return {t: np.array(sorted(s), np.int64) for t, s in found.items()}, skipped


# ---- change batches --------------------------------------------------------------------


@dataclass
class Batch:
    """One change batch: per source its Z-set delta, rows per kind, what it removed."""

    deltas: dict[str, pa.Table] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, pa.Table] = field(default_factory=dict)

    def add(self, source: str, kind: str, rows: pa.Table, w: int) -> None:
        """Add ``rows`` of ``kind`` to ``source``'s delta with weight ``w``."""
        if not rows.num_rows:
            return
        d = weighted(plain(rows), w)
        self.deltas[source] = (pa.concat_tables([self.deltas[source], d])
                               if source in self.deltas else d)
        self.rows[kind] = self.rows.get(kind, 0) + rows.num_rows


class Changes:
    """The change batches of one query: candidates, held-out rows, the previous deletes."""

    def __init__(self, sql: str, tables: Tables, sources: Sequence[str],
                 cands: Mapping[str, np.ndarray], share: float,
                 rng: np.random.Generator) -> None:
        self.sql, self.tables, self.rng, self.share = sql, tables, rng, share
        self.cands = {s: np.asarray(cands.get(s, np.empty(0, np.int64))) for s in sources}
        self.facts = [s for s in sources if s in FACTS]
        self.dims = [s for s in sources if s not in FACTS and tables.t[s].num_rows > 1]
        self.previous: dict[str, pa.Table] = {}
        self.hot: dict[str, np.ndarray] = {}
        """Rows a seed added or named: half of each pick comes from them."""

    def snapshot(self) -> tuple[Any, ...]:
        """What :meth:`batch` changes, to :meth:`restore` a batch DuckDB cannot run."""
        return (dict(self.tables.t), dict(self.tables.next_rid), dict(self.cands),
                dict(self.previous), dict(self.hot))

    def restore(self, snap: tuple[Any, ...]) -> None:
        """Forget the batches since ``snap`` (the rng moves on: the next one differs)."""
        t, rid, cands, previous, hot = snap
        self.tables.t, self.tables.next_rid = dict(t), dict(rid)
        self.cands, self.previous, self.hot = dict(cands), dict(previous), dict(hot)

    def seed(self, steps: Sequence[tuple[str, pa.Table]]) -> dict[str, int]:
        """Add a seed's rows (before population); picks prefer them.  Rows per table."""
        added: dict[str, int] = {}
        for s, rows in steps:
            if s not in self.cands or not rows.num_rows:
                continue
            r = self.tables.fresh(s, rows.append_column(RID, pa.nulls(rows.num_rows,
                                                                       pa.int64())))
            self.tables.add(s, r)
            rids = r[RID].to_numpy()
            self.hot[s] = np.concatenate([self.hot.get(s, np.empty(0, np.int64)), rids])
            self.cands[s] = np.concatenate([self.cands[s], rids])
            added[s] = added.get(s, 0) + rows.num_rows
        return added

    def rows_per_kind(self, name: str) -> int:
        """Fact rows of ``name`` per kind in a batch: ``share`` of the table, at least MIN_ROWS."""
        return max(MIN_ROWS, round(self.share * self.tables.t[name].num_rows))

    def _alive(self, name: str, rids: np.ndarray, exclude: np.ndarray | None = None
               ) -> np.ndarray:
        """Those of ``rids`` that are rows of ``name`` now (and not in ``exclude``)."""
        if not rids.size:
            return rids
        keep = np.isin(rids, self.tables.t[name][RID].to_numpy())
        if exclude is not None and exclude.size:
            keep &= ~np.isin(rids, exclude)
        return rids[keep]

    def _pick(self, name: str, k: int, *, replace: bool = False,
              exclude: np.ndarray | None = None) -> np.ndarray:
        """``k`` row ids, from the live candidates where there are any.

        Candidates and hot rows stay so when deleted: re-inserted, they are picked again
        (were they dropped for good, each batch would spend a few of a seed's rows and
        the answer would run dry).
        """
        pool = self._alive(name, self.cands[name], exclude)
        if not pool.size:
            pool = self._alive(name, self.tables.t[name][RID].to_numpy(), exclude)
        if not pool.size:
            return np.empty(0, np.int64)
        hot = self._alive(name, self.hot.get(name, np.empty(0, np.int64)), exclude)
        if hot.size and k > 1:
            k_hot = min(k // 2, hot.size // 2 if not replace else k // 2)
            rest = self._pick_from(pool, k - k_hot, replace)
            return np.concatenate([self._pick_from(hot, k_hot, replace), rest])
        return self._pick_from(pool, k, replace)

    def _pick_from(self, pool: np.ndarray, k: int, replace: bool) -> np.ndarray:
        if not pool.size or k <= 0:
            return np.empty(0, np.int64)
        if not replace:
            k = min(k, pool.size)
        return np.asarray(self.rng.choice(pool, k, replace=replace), np.int64)

    def hold_out(self) -> None:
        """Remove some candidate fact rows before population: the first re-inserts."""
        for s in self.facts:
            # never most of the candidates: the answer after population must not empty
            hot = self.hot.get(s, np.empty(0, np.int64))
            pool = np.setdiff1d(self.cands[s], hot)
            k = min(self.rows_per_kind(s), pool.size // HOLD_SHARE)
            if not k:  # too few candidates to spare: other rows, so that one comes back
                pool = np.setdiff1d(self.tables.t[s][RID].to_numpy(),
                                    np.concatenate([self.cands[s], hot]))
                k = min(self.rows_per_kind(s), pool.size // HOLD_SHARE)
            rids = np.unique(self._pick_from(pool, k, False))
            if not rids.size or rids.size * 4 > self.tables.t[s].num_rows:
                continue
            self.previous[s] = self.tables.take(s, rids)
            self.tables.remove(s, rids)

    def batch(self) -> Batch:
        """The next batch, applied to the tables (re-inserts, deletes, new rows, updates).

        Per fact table: the previous batch's deletes re-inserted, candidates (and a few
        random rows) deleted, clones added; then rows of up to two dimensions updated.
        """
        b = Batch()
        t = self.tables
        for s in self.facts:
            k = self.rows_per_kind(s)
            # re-inserts: what the previous batch deleted (or the population held out)
            back = self.previous.pop(s, None)
            back_rids = back[RID].to_numpy() if back is not None else None
            if back is not None and back.num_rows:
                t.add(s, back)
                b.add(s, "reinsert", back, 1)
            # deletes: candidates and some random rows (all distinct), not those just
            # re-inserted (that would cancel)
            alive = self._alive(s, self.cands[s], back_rids)
            n_rand = int(k * RANDOM_SHARE)
            n_cand = min(k - n_rand, alive.size // DELETE_SHARE) if alive.size else k - n_rand
            rids = np.unique(np.concatenate([
                self._pick(s, n_cand, exclude=back_rids),
                self.rng.choice(t.t[s][RID].to_numpy(), min(n_rand, t.t[s].num_rows),
                                replace=False) if t.t[s].num_rows else np.empty(0, np.int64)]))
            if back_rids is not None:
                rids = np.setdiff1d(rids, back_rids)
            gone = t.take(s, rids)
            if gone.num_rows:
                t.remove(s, rids)
                b.add(s, "delete", gone, -1)
                b.deleted[s] = gone
                self.previous[s] = gone
            # new rows: clones of candidates, some columns from other candidates
            new = self._clones(s, k)
            if new.num_rows:
                t.add(s, new)
                b.add(s, "new", new, 1)
                self.cands[s] = np.concatenate([self.cands[s], new[RID].to_numpy()])
        for s in self._dims_this_batch():
            self._update(s, b)
        return b

    def _clones(self, s: str, k: int) -> pa.Table:
        base_ids = self._pick(s, k, replace=True)
        if not base_ids.size:
            return self.tables.t[s].slice(0, 0)
        pool = self.tables.take(s, np.unique(base_ids))
        if not pool.num_rows:
            return pool
        base = pool.take(pa.array(self.rng.integers(0, pool.num_rows, k)))
        cols = []
        for name in base.column_names:
            col = base[name]
            if name != RID:
                donor = pool[name].take(pa.array(self.rng.integers(0, pool.num_rows, k)))
                mask = pa.array(self.rng.random(k) < MIX)
                col = pc.if_else(mask, donor, col)
            cols.append(col)
        return self.tables.fresh(s, pa.table(cols, names=base.column_names))

    def _dims_this_batch(self) -> list[str]:
        if not self.dims:
            return []
        k = min(2, len(self.dims))
        return [self.dims[i] for i in sorted(self.rng.choice(len(self.dims), k, replace=False))]

    def _update(self, s: str, b: Batch) -> None:
        """Rows of dimension ``s`` rewritten: one column the query reads, another row's value."""
        t = self.tables
        table = t.t[s]
        lo, hi = DIM_ROWS
        k = int(min(hi, max(lo, round(self.share * 10 * table.num_rows))))
        if self.cands[s].size:  # not every row the query reads (a query reading three
            # dates had them all rewritten at once, its answer emptied)
            k = min(k, max(lo, self.cands[s].size // DELETE_SHARE))
        rids = np.unique(self._pick(s, k))
        old = t.take(s, rids)
        if not old.num_rows:
            return
        key = table.schema.names[0]
        readable = [c for c in referenced_columns(self.sql, table.schema)
                    if c not in (key, RID)] or [c for c in table.schema.names
                                                 if c not in (key, RID)]
        which = self.rng.integers(0, len(readable), old.num_rows)
        # donors: mostly other candidate rows (per-column filters stay true)
        cand = self.cands[s]
        donor_ids = np.where(self.rng.random(old.num_rows) < CANDIDATE_DONORS,
                             self.rng.choice(cand, old.num_rows) if cand.size else
                             self.rng.choice(table[RID].to_numpy(), old.num_rows),
                             self.rng.choice(table[RID].to_numpy(), old.num_rows))
        donors = table.take(pc.index_in(pa.array(donor_ids, pa.int64()), table[RID]))
        new = old
        for j, c in enumerate(readable):
            mask = pa.array(which == j)
            i = new.schema.get_field_index(c)
            new = new.set_column(i, new.schema.field(i),
                                 pc.if_else(mask, donors[c], new[c]))
        t.remove(s, rids)
        t.add(s, new)
        b.add(s, "update", old, -1)
        b.add(s, "update", new, 1)


# ---- one query -------------------------------------------------------------------------


@dataclass
class QueryResult:
    """What one query's run measured and found (a row of the report)."""

    query: int
    status: str = "pending"
    """``ok``, ``failed`` (a check differed), ``vacuous`` (every check matched, but the
    answer was empty after population or no batch changed it), ``refused`` (compile),
    ``error``."""
    reason: str = ""
    sources: list[str] = field(default_factory=list)
    population_s: float | None = None
    batch_s: list[float] = field(default_factory=list)
    duckdb_s: list[float] = field(default_factory=list)
    """DuckDB's time for the query from scratch: after population, after each batch."""
    rows: list[int] = field(default_factory=list)
    """The answer's rows (DuckDB's, without LIMIT) after population and each batch."""
    changed: list[bool] = field(default_factory=list)
    nonempty: bool = False
    """The answer after population has a row that is not all zeros and NULLs."""
    trivial: list[bool] = field(default_factory=list)
    """Per step (population, each batch): the answer was empty or one row of zeros/NULLs."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    batch_rows: list[dict[str, int]] = field(default_factory=list)
    choices: list[dict[str, str]] = field(default_factory=list)
    skipped_scopes: list[str] = field(default_factory=list)
    traceback: str = ""
    redrawn: list[str] = field(default_factory=list)
    """Batches drawn again: DuckDB could not answer the query after them, or they left
    its answer as it was or emptied it."""
    seeded: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Matched DuckDB at every step, on an answer that makes the checks count.

        A refusal is a listed outcome, not a failure; a vacuous match is a failure.
        """
        return self.status in ("ok", "refused")

    def vacuity(self) -> str:
        """Why checks that all matched prove nothing, or "" if they prove something."""
        if not self.nonempty:
            return ("the answer after population is empty (or one row of zeros and NULLs): "
                    "no check can fail; seed the query (bench/tpcds_seeds.py)")
        if self.changed and not any(self.changed):
            return ("no change batch changed the answer: the batches miss the rows it reads "
                    "(rows after population and each batch: "
                    f"{'/'.join(map(str, self.rows))})")
        return ""


def is_trivial(answer: pa.Table) -> bool:
    """No row, or one row of zeros and NULLs (an aggregate over nothing)."""
    if answer.num_rows == 0:
        return True
    return answer.num_rows == 1 and all(v in (None, 0) for v in answer.to_pylist()[0].values())


def _norm(x: Any) -> Any:
    return round(x, 6) if isinstance(x, float) else x


def _tied_at_the_limit(lim: pa.Table, want: pa.Table, order: Sequence[str]) -> bool:
    """Rows past the limit that tie with the last kept row make the kept set arbitrary."""
    if lim.num_rows == want.num_rows or not order or not lim.num_rows:
        return False
    last = tuple(_norm(lim[c][lim.num_rows - 1].as_py()) for c in order)
    keys = list(zip(*(map(_norm, want[c].to_pylist()) for c in order), strict=True))
    return sum(k == last for k in keys) > 1


def check_view(p: Any, name: str, integrated: Integrated, want: pa.Table, lim: pa.Table,
               order: Sequence[str]) -> dict[str, Any]:
    """The view's integrated output vs ``want`` and ``read()`` vs ``lim`` (DuckDB's)."""
    from joinstate.testing import compare

    got = integrated.state(name) if name in integrated.pending else want.slice(0, 0)
    if got.num_columns != want.num_columns:
        return {"ok": False, "what": "columns", "detail": f"{got.column_names} vs "
                f"{want.column_names}"}
    res = compare(got.rename_columns(want.column_names), want)
    if not res["ok"]:
        return {"ok": False, "what": "output", "detail": _short(res)}
    read = p.read(name)
    keys = [lim.column_names[read.column_names.index(c)] for c in order
            if c in read.column_names]
    read = read.rename_columns(lim.column_names)
    if read.num_rows != lim.num_rows:
        return {"ok": False, "what": "read", "detail": f"read() {read.num_rows} rows, DuckDB "
                f"{lim.num_rows}"}
    if not compare(read, lim)["ok"] and not _tied_at_the_limit(lim, want, keys):
        return {"ok": False, "what": "read", "detail": _short(compare(read, lim))}
    for c in keys:
        a, b = read[c].to_pylist(), lim[c].to_pylist()
        bad = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if not _close(x, y)]
        if bad and not _order_within_ties(p, name, lim):
            i = bad[0]
            return {"ok": False, "what": "order", "detail": f"order of {c} at row {i}: "
                    f"{a[i:i + 5]} vs {b[i:i + 5]}"}
    return {"ok": True}


def _order_within_ties(p: Any, name: str, lim: pa.Table) -> bool:
    """Whether DuckDB's rows ``lim`` are in an order the view's sort keys allow.

    Two engines round doubles apart, so rows whose sort keys are equal to ``compare``'s
    tolerance may come in either order, also where a sort key is an ORDER BY expression
    the answer does not show (TPC-DS q89 orders by ``sum_sales - avg_monthly_sales``).
    The view's rows with every sort key (:meth:`joinstate.Pipeline.held`) are sorted
    and cut where two neighbours' first differing key differs beyond the tolerance (a
    difference within it is a rounding, so either order is right whatever the later
    keys say); DuckDB's rows at each run's positions must be the view's rows of that
    run (a run the LIMIT cuts: some of them).
    """
    from joinstate.ordering import sort_indices
    from joinstate.testing import compare

    m = p.graph.materialized_output(name)
    rows = p.held(name)
    rows = rows.take(sort_indices(rows, m.order_by)) if rows.num_rows else rows
    shown = rows.drop_columns(list(m.hidden)).rename_columns(lim.column_names)
    keys = [rows[o[0]].to_pylist() for o in m.order_by]

    def apart(i: int) -> bool:  # row i - 1 must come before row i
        first = next((k for k in keys if not (k[i - 1] == k[i] or (
            k[i - 1] is None and k[i] is None))), None)
        return first is not None and not _close(first[i - 1], first[i])

    starts = [0] + [i for i in range(1, rows.num_rows) if apart(i)] + [rows.num_rows]
    for a, b in itertools.pairwise(starts):
        if a >= lim.num_rows:
            break
        mine, theirs = shown.slice(a, b - a), lim.slice(a, min(b, lim.num_rows) - a)
        if b <= lim.num_rows:
            if not compare(mine, theirs)["ok"]:
                return False
        elif not all(any(compare(theirs.slice(i, 1), mine.slice(j, 1))["ok"]
                         for j in range(mine.num_rows)) for i in range(theirs.num_rows)):
            return False
    return True


def _close(x: Any, y: Any) -> bool:
    """Equal, or doubles equal to the tolerance ``compare`` uses (two engines round apart)."""
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL) or (x != x and y != y)
    return bool(x == y) or (x is None and y is None)


def _short(res: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in res.items() if k != "ok"}, default=str)[:600]


def same_answer(a: pa.Table, b: pa.Table) -> bool:
    """The same multiset of rows (doubles to ``compare``'s tolerance)."""
    from joinstate.testing import compare

    return a.num_rows == b.num_rows and bool(compare(a, b)["ok"])


def query_sources(base: Mapping[str, pa.Table]) -> dict[str, Any]:
    """Every TPC-DS table as a compiler source.

    A dimension's first column, its surrogate key, is declared unique; fact tables have
    no declared key.
    """
    from planner.sql import Source

    return {t: Source(plain(base[t]).schema, None if t in FACTS else base[t].schema.names[0])
            for t in TABLES}


def compile_query(n: int, base: Mapping[str, pa.Table], store: Any
                  ) -> tuple[Any, list[str]] | str:
    """TPC-DS query ``n`` compiled into ``store``: (pipeline, ORDER BY columns).

    Every table is a source (:func:`query_sources`), its data given as a sample on
    which the join order weighs what each filter keeps; a refusal is returned as its
    first line instead.  The row counts are not given: they only break ties between
    the inputs that could root a join group, and the samples' estimates are what
    order the rest.
    """
    from planner.sql import SQLError, UnsupportedSQLError, compile, plan
    from planner.stats import given

    sql, name = tpcds.query(n), f"q{n}"
    srcs = query_sources(base)
    try:
        p = compile(sql, srcs, store=store, name=name,
                    stats={t: given(t, None).replace(sample=plain(base[t])) for t in srcs})
        return p, [o.column for o in plan(sql, srcs, name=name).order_by]
    except (UnsupportedSQLError, SQLError) as e:
        return str(e).splitlines()[0]


def run_query(n: int, base: Mapping[str, pa.Table], workdir: Path, *, seed: int = 0,
              share: float = DEFAULT_SHARE,
              step: Callable[[str], None] | None = None) -> QueryResult:
    """Compile, populate, change and check TPC-DS query ``n`` (see the module docstring)."""
    import joinstate
    import population

    res = QueryResult(n)
    t_start = time.perf_counter()
    say = step or (lambda _: None)
    sql = tpcds.query(n)
    name = f"q{n}"
    store_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    try:
        say("compile")
        with joinstate.StateStore(store_dir / "state") as store:
            compiled = compile_query(n, base, store)
            if isinstance(compiled, str):
                res.status, res.reason = "refused", compiled
                return res
            p, order = compiled
            sources = sorted(p.sources)
            res.sources = sources
            say("candidates")
            changes = prepare_changes(n, sql, base, sources, res, seed=seed, share=share)
            tables = changes.tables
            integrated = Integrated()
            oracle = Oracle()
            try:
                say("populate")
                t0 = time.perf_counter()
                population.populate(p, sources={s: plain(tables.t[s]) for s in sources},
                                     progress=False, sink=integrated.add)
                res.population_s = time.perf_counter() - t0
                oracle.load(tables.t, sources)
                prev = _check(res, p, name, sql, order, integrated, oracle, "population", None)
                res.nonempty = not is_trivial(prev)
                for i in range(BATCHES):
                    say(f"batch {i + 1}")
                    b = valid_batch(changes, oracle, sql, res, prev)
                    res.batch_rows.append(dict(b.rows))
                    choices = {}
                    t0 = time.perf_counter()
                    if i == ONE_PUSH_BATCH and b.deltas:  # every source's change at once
                        rep = population.apply_changes(p, b.deltas)
                        integrated.add(rep.output)
                        choices["one push"] = rep.strategy
                    else:  # dimensions first: as an upstream system would commit them
                        for s in sorted(b.deltas, key=lambda s: (s in FACTS, s)):
                            rep = population.apply_batch(p, s, b.deltas[s])
                            integrated.add(rep.output)
                            choices[s] = rep.strategy
                    res.batch_s.append(time.perf_counter() - t0)
                    res.choices.append(choices)
                    oracle.load(tables.t, b.deltas)
                    prev = _check(res, p, name, sql, order, integrated, oracle,
                                  f"batch {i + 1}", prev)
            finally:
                oracle.close()
        res.status = "ok" if all(c["ok"] for c in res.checks) else "failed"
        if res.status == "ok" and res.vacuity():
            res.status, res.reason = "vacuous", res.vacuity()
        if res.status == "failed":
            bad = next(c for c in res.checks if not c["ok"])
            res.reason = f"after {bad['step']}: {bad['what']}: {bad['detail']}"
    except Exception as e:  # one query's fault is its row, named; the run goes on
        import traceback

        res.status = "error"
        res.reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        res.traceback = traceback.format_exc(limit=-6)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
        res.seconds = time.perf_counter() - t_start
    return res


def prepare_changes(n: int, sql: str, base: Mapping[str, pa.Table], sources: Sequence[str],
                    res: QueryResult, *, seed: int = 0, share: float = DEFAULT_SHARE
                    ) -> Changes:
    """Query ``n``'s tables, seeded, with candidates and rows held out: ready to populate."""
    tables = Tables({s: base[s] for s in sources})
    cands, res.skipped_scopes = candidates(sql, tables.t, sources)
    rng = np.random.default_rng([seed, n])
    changes = Changes(sql, tables, sources, cands, share, rng)
    if n in SEEDS:
        current = {t: plain(base[t]) for t in TABLES}
        current.update({t: plain(tables.t[t]) for t in sources})
        res.seeded = changes.seed(SEEDS[n](current, rng))
    changes.hold_out()
    return changes


def valid_batch(changes: Changes, oracle: Oracle, sql: str, res: QueryResult,
                 prev: pa.Table | None = None) -> Batch:
    """A batch after which DuckDB can answer the query (loaded into ``oracle``).

    A dimension update can make the data one the query has no answer on (a scalar
    subquery returning two rows: SQL raises, and so does joinstate, naming it); such a
    batch is drawn again, up to RETRIES times, and the last error raised.  So is a batch
    that leaves the answer ``prev`` as it was, or empties it: a check after it would
    prove little.  The last of RETRIES such draws is kept (the report shows the answer
    unchanged or emptied, and an answer no batch changes fails as vacuous).
    """
    import duckdb

    for attempt in range(RETRIES):
        snap = changes.snapshot()
        b = changes.batch()
        oracle.load(changes.tables.t, b.deltas)
        try:
            oracle.answer(sql)
            got = oracle.answer(unordered(sql))[0] if prev is not None else None
        except duckdb.Error as e:
            res.redrawn.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            changes.restore(snap)
            oracle.load(changes.tables.t, b.deltas)
            if attempt == RETRIES - 1:
                raise
            continue
        if got is not None and prev is not None and attempt < RETRIES - 1:
            why = ("left the answer as it was" if same_answer(got, prev) else
                   "emptied the answer" if is_trivial(got) and not is_trivial(prev) else "")
            if why:
                res.redrawn.append(f"batch {len(res.batch_s) + 1} {why}")
                changes.restore(snap)
                oracle.load(changes.tables.t, b.deltas)
                continue
        return b
    raise AssertionError("unreachable")


def _check(res: QueryResult, p: Any, name: str, sql: str, order: Sequence[str],
           integrated: Integrated, oracle: Oracle, step: str, prev: pa.Table | None
           ) -> pa.Table:
    lim, secs = oracle.answer(sql)
    want, _ = oracle.answer(unordered(sql))
    res.duckdb_s.append(secs)
    res.rows.append(want.num_rows)
    res.trivial.append(is_trivial(want))
    if prev is not None:
        res.changed.append(not same_answer(want, prev))
    res.checks.append({"step": step, **check_view(p, name, integrated, want, lim, order)})
    return want


# ---- the run ---------------------------------------------------------------------------


def run(queries: Sequence[int], sf: float, *, seed: int = 0, share: float = DEFAULT_SHARE,
        workdir: Path | None = None, cache_dir: Path | None = None, jobs: int = 1,
        say: Callable[[str], None] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every query in ``queries`` at ``sf``; the results as a JSON-able dict.

    ``jobs`` > 1 runs that many queries at once, one process each (the queries share
    nothing; their times are then measured side by side, as the report says).
    """
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
    t0 = time.perf_counter()
    tell = say or (lambda _: None)
    tell(f"loading TPC-DS SF{sf:g}")
    tpcds.tables(sf, TABLES, cache_dir=cache_dir)  # generated once, before any worker
    work = workdir or Path(tempfile.mkdtemp(prefix="joinstate-tpcds-all-"))
    work.mkdir(parents=True, exist_ok=True)
    done: dict[int, QueryResult] = {}
    try:
        with _progress(progress, len(queries), tell) as (update, advance, tell):
            if jobs <= 1:
                base = load_tables(sf, cache_dir)
                for n in queries:
                    def step(what: str, n: int = n) -> None:
                        update(f"q{n}: {what}")

                    done[n] = run_query(n, base, work, seed=seed, share=share, step=step)
                    advance()
                    tell(_line(done[n]))
            else:
                from concurrent.futures import ProcessPoolExecutor, as_completed
                from multiprocessing import get_context

                update(f"{jobs} processes")
                with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"),
                                         initializer=_worker_init,
                                         initargs=(sf, cache_dir)) as pool:
                    futures = {pool.submit(_worker_run, n, work, seed, share): n
                               for n in queries}
                    for f in as_completed(futures):
                        r = f.result()
                        done[r.query] = r
                        advance()
                        tell(_line(r))
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    results = [done[n] for n in queries]
    rows = [asdict(r) | {"ok": r.ok} for r in results]
    return {"sf": sf, "seed": seed, "share": share, "queries": list(queries), "jobs": jobs,
            "seconds": time.perf_counter() - t0, "ok": all(r.ok for r in results),
            "environment": environment(), "summary": summarize(rows), "results": rows}


_BASE: dict[str, pa.Table] = {}
"""A worker process's tables (loaded once per process by :func:`_worker_init`)."""


def _worker_init(sf: float, cache_dir: Path | None) -> None:
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
    _BASE.update(load_tables(sf, cache_dir))


def _worker_run(n: int, work: Path, seed: int, share: float) -> QueryResult:
    return run_query(n, _BASE, work, seed=seed, share=share)


class _progress:
    """A rich progress bar over the queries (on stderr), or nothing.

    Entering gives ``(update, advance, say)``: ``say`` prints a line above the bar (a
    line printed past the bar's console would tear it on a terminal).
    """

    def __init__(self, enabled: bool, total: int, say: Callable[[str], None]) -> None:
        self.enabled, self.total, self.say = enabled, total, say
        self.bar: Any = None

    def __enter__(self) -> tuple[Callable[[str], None], Callable[[], None],
                                 Callable[[str], None]]:
        if not self.enabled:
            return (lambda _: None), (lambda: None), self.say
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("{task.description:<24}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True, highlight=False), transient=True)
        self.bar.__enter__()
        task = self.bar.add_task("TPC-DS", total=self.total)
        return (lambda d: self.bar.update(task, description=d),
                lambda: self.bar.advance(task),
                lambda line: self.bar.console.print(line, soft_wrap=True, markup=False))

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def _line(r: QueryResult) -> str:
    if r.status == "refused":
        return f"q{r.query}: refused: {r.reason}"
    if r.status == "error":
        return f"q{r.query}: ERROR: {r.reason}"
    batches = ", ".join(f"{s:.2f}" for s in r.batch_s)
    ddb = f"{np.median(r.duckdb_s):.3f}" if r.duckdb_s else "-"
    return (f"q{r.query}: {r.status}; population {r.population_s or 0:.1f} s, batches "
            f"[{batches}] s, DuckDB {ddb} s; rows {r.rows}; changed {r.changed}"
            + (f"; {r.reason}" if r.status in ("failed", "vacuous") else ""))


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The counts the report leads with."""
    ran = [r for r in rows if r["status"] in ("ok", "failed", "vacuous")]

    def matched(r: Mapping[str, Any], step: str) -> bool:
        return any(c["step"] == step and c["ok"] for c in r["checks"])

    return {
        "queries": len(rows),
        "compiled": sum(r["status"] != "refused" for r in rows),
        "refused": sorted(r["query"] for r in rows if r["status"] == "refused"),
        "errors": sorted(r["query"] for r in rows if r["status"] == "error"),
        "matched_population": sum(matched(r, "population") for r in ran),
        "matched_all": sum(r["status"] in ("ok", "vacuous") for r in rows),
        "failed": sorted(r["query"] for r in rows if r["status"] == "failed"),
        "vacuous": sorted(r["query"] for r in rows if r["status"] == "vacuous"),
        "emptied": sorted(r["query"] for r in ran if r["nonempty"] and any(r["trivial"][1:])),
        "nonempty": sum(bool(r["nonempty"]) for r in ran),
        "empty": sorted(r["query"] for r in ran if not r["nonempty"]),
        "changed_every_batch": sum(bool(r["changed"]) and all(r["changed"]) for r in ran),
        "changed_some_batch": sum(any(r["changed"]) for r in ran),
        "nonempty_and_changed": sum(bool(r["nonempty"]) and any(r["changed"]) for r in ran),
    }


def environment() -> dict[str, Any]:
    """Date, commit, machine and Python version, for a report's head."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        commit = ""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "machine": f"{cpu}, {os.cpu_count()} cores", "python": platform.python_version()}


# ---- the report ------------------------------------------------------------------------


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _path(choice: str) -> str:
    """One letter per apply: i incremental, r recompute, m some operators recomputed."""
    return {"incremental": "i", "recompute": "r"}.get(choice, "m")


def to_markdown(results: Mapping[str, Any], chart: str | None = None) -> str:
    """The report: counts, then one table row per query."""
    s = results["summary"]
    env = results["environment"]
    lines = [
        f"# TPC-DS, {len(results['queries'])} queries kept live at SF{results['sf']:g}",
        "",
        f"{env['date']}, commit {env['commit'] or '?'}, {env['machine']}; seed "
        f"{results['seed']}, batch share {results['share']:g}; {results['seconds']:.0f} s"
        + (f" with {results['jobs']} queries at a time." if results.get("jobs", 1) > 1
           else "."),
        "",
        f"- compiled: {s['compiled']} of {s['queries']}"
        + (f" (refused: {', '.join(f'q{q}' for q in s['refused'])})" if s["refused"] else ""),
        f"- matched DuckDB after population: {s['matched_population']}; after population "
        f"and all {BATCHES} batches: {s['matched_all']}"
        + (f" (failed: {', '.join(f'q{q}' for q in s['failed'])})" if s["failed"] else "")
        + (f" (errors: {', '.join(f'q{q}' for q in s['errors'])})" if s["errors"] else ""),
        f"- non-empty answers: {s['nonempty']}"
        + (f" (empty or one row of zeros/NULLs: {', '.join(f'q{q}' for q in s['empty'])})"
           if s["empty"] else ""),
        f"- answer changed in every batch: {s['changed_every_batch']}; in at least one: "
        f"{s['changed_some_batch']}; non-empty and changed: {s['nonempty_and_changed']}",
        f"- **vacuous** (matched, but empty after population or changed by no batch: a "
        f"failure): {_queries(s['vacuous']) if s['vacuous'] else 'none'}",
        f"- emptied by a batch (checked on an empty answer at that step): "
        f"{_queries(s['emptied']) if s['emptied'] else 'none'}",
        "",
        "Times in seconds: population (joinstate), each change batch (joinstate, every "
        "source's apply), DuckDB computing the query from scratch (median of the four "
        "checks). Rows: DuckDB's answer without LIMIT after population / each batch. "
        "Changed: per batch, whether the answer differs from the step before. Paths: "
        "the planner's apply path per batch, one letter per source (i incremental, r "
        "recompute, m some operators recomputed, the rest incremental).",
        "",
    ]
    if chart:
        lines += [f"![batch time vs DuckDB recompute]({chart})", ""]
    lines += ["| query | status | sources | population s | batch s (1/2/3) | DuckDB s | "
              "batch / DuckDB | rows | changed | paths |",
              "|---|---|---:|---:|---|---:|---:|---|---|---|"]
    for r in results["results"]:
        if r["status"] == "refused":
            lines.append(f"| q{r['query']} | refused | | | | | | | | {r['reason'][:80]} |")
            continue
        ddb = float(np.median(r["duckdb_s"])) if r["duckdb_s"] else None
        mean_b = float(np.mean(r["batch_s"])) if r["batch_s"] else None
        ratio = _f(mean_b / ddb, 1) if mean_b is not None and ddb else "-"
        changed = "".join("y" if c else "n" for c in r["changed"]) or "-"
        paths = " ".join("".join(_path(v) for v in c.values()) for c in r["choices"]) or "-"
        status = r["status"] if r["status"] == "ok" else f"**{r['status']}**"
        lines.append(
            f"| q{r['query']} | {status} | {len(r['sources'])} | {_f(r['population_s'])} | "
            f"{' / '.join(_f(x) for x in r['batch_s']) or '-'} | {_f(ddb, 3)} | {ratio} | "
            f"{'/'.join(map(str, r['rows'])) or '-'} | {changed} | {paths} |")
    bad = [r for r in results["results"] if r["status"] in ("failed", "vacuous", "error")]
    if bad:
        lines += ["", "## Failures", ""]
        lines += [f"- q{r['query']} ({r['status']}): {r['reason']}" for r in bad]
    return "\n".join(lines) + "\n"


def _queries(numbers: Iterable[int]) -> str:
    return ", ".join(f"q{q}" for q in numbers)


def chart(results: Mapping[str, Any], path: Path) -> Path | None:
    """Per query: the mean change-batch time beside DuckDB's recompute (log seconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in results["results"] if r["batch_s"] and r["duckdb_s"]]
    if not ran:
        return None
    x = np.arange(len(ran))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.22 * len(ran) + 2), 4.5))
    ax.bar(x - 0.2, [np.mean(r["batch_s"]) for r in ran], 0.4, label="joinstate: change "
           "batch (mean of 3)", color="tab:blue")
    ax.bar(x + 0.2, [np.median(r["duckdb_s"]) for r in ran], 0.4,
           label="DuckDB: query from scratch (median)", color="tab:orange")
    for i, r in enumerate(ran):
        if r["status"] != "ok":
            ax.annotate("x", (i, 0), xycoords=("data", "axes fraction"), color="red",
                        ha="center")
    ax.set_xticks(x, [f"q{r['query']}" for r in ran], rotation=90, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title(f"TPC-DS SF{results['sf']:g}: change batch vs recompute, per query")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(results: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """``report.json``, ``report.md`` and ``tpcds-all.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "report.json", "markdown": out_dir / "report.md"}
    files["json"].write_text(json.dumps(results, indent=1, default=str))
    png = chart(results, out_dir / "tpcds-all.png")
    if png is not None:
        files["chart"] = png
    files["markdown"].write_text(to_markdown(results, png.name if png else None))
    return files
