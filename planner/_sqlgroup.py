"""GROUP BY beyond one plain set of keys: grouping sets, DISTINCT aggregates, moments.

Everything here is built from the one group-by operator the engine maintains
(``Stream.group_by(...).aggregate(...)``: sums, counts, min, max with retraction), so
it inherits its state, its checks and its exactness; this module only decides the shape.

* **``ROLLUP`` / ``CUBE`` / ``GROUPING SETS``** (:func:`expand_grouping`): one group-by per
  grouping set, their outputs in one bag union with the keys a set does not group on
  NULL and each ``GROUPING(...)`` a constant of the set (a hidden column).  A set is
  computed from the output of the smallest set already built that groups on more keys
  (sum of sums, sum of counts, min of mins), which reads one row per changed group of
  the finer set instead of every changed input row: the sets share the input's work.
  Float sums and DISTINCT aggregates are not rolled up this way (a float sum of sums
  rounds differently; distinct values do not add up): their sets read the input.
  The empty set ``()`` is an aggregate without group keys, so its row exists over an
  empty input, as in DuckDB.
* **``COUNT(DISTINCT x)``, ``SUM(DISTINCT x)``, ``AVG(DISTINCT x)``**: two levels: group by
  the keys and ``x`` (NULL ``x`` is a group, skipped by the counts and sums above it),
  then group by the keys counting or summing ``x``; the other aggregates of the SELECT
  are computed at the first level and rolled up at the second.  Several distinct
  arguments each get their two levels, and their outputs are combined by a union and a
  group-by on the keys (NULL keys group, where a join on them would not match).
* **``STDDEV_SAMP`` / ``STDDEV`` / ``STDDEV_POP`` / ``VAR_SAMP`` / ``VARIANCE`` / ``VAR_POP``**:
  running moments (count, sum, sum of squares), retracted like any sum, and the
  variance computed after the group-by.  For integers of up to 32 bits and decimals of
  up to 18 digits the sums are exact decimals and ``n * sum(x^2) - sum(x)^2`` is
  computed exactly (256-bit decimals) before the one division: deletes leave no trace
  and the result is the correctly rounded double.  Other types sum doubles (compensated
  sums) and use ``(sum(x^2) - sum(x)^2 / n)``, which loses digits when the mean is large
  against the deviation.  ``*_SAMP`` is NULL below two values, ``*_POP`` below one.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqlexpr import cast_to, null_of
from planner._sqlscope import AggScope, unique_name
from planner._sqltypes import INT_DIGITS, Typed, describe, is_decimal, is_float, is_integer
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from joinstate import Stream
    from planner._sqlexpr import ExprCompiler

__all__ = ["MAX_CUBE", "AggregatePlan", "expand_grouping", "key_column"]

MAX_CUBE = 12
"""Columns a CUBE may list (2^12 grouping sets, each a group-by)."""

_MOMENTS: dict[type, tuple[str, bool]] = {
    exp.StddevSamp: ("samp", True), exp.Stddev: ("samp", True),
    exp.StddevPop: ("pop", True), exp.Variance: ("samp", False),
    exp.VariancePop: ("pop", False),
}
"""Moment aggregates: (sample or population, square root taken)."""

_ROLL = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}
"""How an aggregate of a finer group-by's aggregates gives a coarser group's value."""

_EXACT_DIGITS = 18
"""Decimals (and integers) of up to 18 digits square into at most 37 digits."""

Specs = dict[str, tuple[str, Any]]


# ---- grouping sets ---------------------------------------------------------------------


def expand_grouping(items: Sequence[exp.Expr]
                    ) -> tuple[list[exp.Expr], list[tuple[int, ...]] | None]:
    """GROUP BY items as distinct key expressions and the grouping sets over them.

    Returns the key expressions (each once, in order of appearance) and, when the GROUP
    BY has ``ROLLUP``/``CUBE``/``GROUPING SETS``, every grouping set as positions in
    them (SQL's product of the items' sets, duplicates kept as SQL keeps them); ``None``
    for a plain GROUP BY.
    """
    if not any(isinstance(e, exp.Rollup | exp.Cube | exp.GroupingSets) for e in items):
        return list(items), None
    flat: list[exp.Expr] = []
    seen: dict[str, int] = {}

    def pos(e: exp.Expr) -> int:
        while isinstance(e, exp.Paren):
            e = e.this
        key = e.sql(dialect="duckdb")
        if key not in seen:
            seen[key] = len(flat)
            flat.append(e)
        return seen[key]

    def unit(e: exp.Expr) -> list[int]:
        """A ROLLUP/CUBE element: a column, or a parenthesised list of them."""
        return [pos(x) for x in e.expressions] if isinstance(e, exp.Tuple) else [pos(e)]

    def options(e: exp.Expr) -> list[list[int]]:
        if isinstance(e, exp.Rollup):
            units = [unit(x) for x in e.expressions]
            return [[p for u in units[:k] for p in u] for k in range(len(units), -1, -1)]
        if isinstance(e, exp.Cube):
            units = [unit(x) for x in e.expressions]
            if len(units) > MAX_CUBE:
                raise UnsupportedSQLError(f"CUBE {snippet(e)}", f"a CUBE of {len(units)} "
                                          f"columns is 2^{len(units)} group-bys; at most "
                                          f"{MAX_CUBE} columns are compiled")
            out = []
            for mask in range(2 ** len(units) - 1, -1, -1):
                out.append([p for j, u in enumerate(units)
                            if mask >> (len(units) - 1 - j) & 1 for p in u])
            return out
        if isinstance(e, exp.GroupingSets):
            out = []
            for s in e.expressions:
                if isinstance(s, exp.Tuple):
                    out.append([pos(x) for x in s.expressions])
                elif isinstance(s, exp.Rollup | exp.Cube | exp.GroupingSets):
                    out += options(s)
                else:
                    out.append([pos(s)])
            return out
        return [[pos(e)]]

    per_item = [options(e) for e in items]
    sets = []
    for combo in itertools.product(*per_item):
        members: list[int] = []
        for part in combo:
            members += [p for p in part if p not in members]
        sets.append(tuple(sorted(members)))
    return flat, sets


def key_column(pre: ExprCompiler, stream: Stream, e: exp.Expr, i: int, taken: set[str],
               computed: dict[str, Any]) -> str:
    """The column holding the ``i``-th GROUP BY expression ``e`` over ``stream``.

    One of ``stream``'s columns when ``e`` is one; else a new ``__g<i>`` column, whose
    expression is added to ``computed`` (the caller adds those columns to the stream).
    """
    v = pre.compile(e)
    col = next((c for c in stream.columns if v.expr.equals(pc.field(c))), None)
    if col is None:
        col = unique_name(f"__g{i}", taken)
        computed[col] = v.expr
    return col


# ---- the aggregate phase ---------------------------------------------------------------


class AggregatePlan:
    """The aggregates of one SELECT, and the group-bys that compute them.

    ``value`` registers an aggregate call (a plain one through ``fallback``, the
    compiler's own translation of SUM/COUNT/MIN/MAX/AVG) and returns its value after the
    group-by: a column name or an expression over the output.  :meth:`build` makes the
    group-bys when there are grouping sets, DISTINCT aggregates or GROUPING() calls.
    """

    def __init__(self, pre: ExprCompiler, specs: Specs, names: set[str],
                 exprs: Sequence[exp.Expr],
                 fallback: Callable[[exp.Expr, ExprCompiler, Specs, set[str]], Typed | str],
                 record: Callable[[Decision], None]) -> None:
        self.pre = pre
        self.specs = specs
        self.names = names
        self.exprs = list(exprs)
        self.fallback = fallback
        self.record = record
        self.dargs: list[Typed] = []
        """The distinct arguments, each once."""
        self.distinct: dict[str, tuple[str, int]] = {}
        """Output name -> (count or sum, distinct argument)."""
        self.groupings: dict[str, list[int]] = {}
        """Hidden column -> the key expressions GROUPING() reads (positions in exprs)."""

    @property
    def special(self) -> bool:
        """Whether :meth:`build` must make the group-bys (not one plain group-by)."""
        return bool(self.distinct or self.groupings)

    # ---- aggregate calls ----------------------------------------------------------------

    def value(self, node: exp.Expr) -> Typed | str:
        """Register the aggregate ``node`` needs; its value after the group-by."""
        inner = node.this if isinstance(node, exp.Filter) else node
        if isinstance(inner, exp.Grouping):
            if isinstance(node, exp.Filter):
                raise SQLError(f"{snippet(node)}: GROUPING() takes no FILTER")
            return self._grouping(inner)
        special = type(inner) in _MOMENTS or isinstance(inner.this, exp.Distinct)
        if special and isinstance(node, exp.Filter):
            node = _unfilter(node)
        if type(node) in _MOMENTS:
            return self._moment(node)
        if isinstance(node.this, exp.Distinct):
            return self._distinct(node)
        return self.fallback(node, self.pre, self.specs, self.names)

    def _spec(self, func: str, expr: Any) -> str:
        for n, (f, e) in self.specs.items():
            if f == func and ((e is None and expr is None) or (
                    e is not None and expr is not None and e.equals(expr))):
                return n
        n = unique_name(f"__a{len(self.specs)}", self.names)
        self.specs[n] = (func, expr)
        return n

    def _grouping(self, node: exp.Grouping) -> Typed:
        args = list(node.expressions)
        if not args:
            raise SQLError(f"{snippet(node)}: GROUPING() needs at least one argument")
        where = []
        for a in args:
            hit = next((i for i, e in enumerate(self.exprs) if e == a), None)
            if hit is None:
                raise SQLError(f"{snippet(node)}: the argument {snippet(a)} of GROUPING() "
                               "must be a GROUP BY expression")
            where.append(hit)
        name = unique_name(f"__grouping{len(self.groupings)}", self.names)
        self.groupings[name] = where
        return Typed(pc.field(name), pa.int64())

    def _moment(self, node: exp.Expr) -> Typed:
        kind, root = _MOMENTS[type(node)]
        v = self.pre.compile(node.this)
        if not (is_integer(v.type) or is_decimal(v.type) or is_float(v.type)):
            raise SQLError(f"{snippet(node)}: cannot take the deviation of "
                           f"{describe(v.type)}")
        n = self._spec("count", v.expr)
        exact = _exact_type(v.type)
        if exact is not None:
            x = cast_to(v, exact)
            s1 = self._spec("sum", x)
            s2 = self._spec("sum", pc.multiply(x, x))
            # n*sum(x^2) - sum(x)^2 >= 0 exactly: 256-bit decimals hold it (a sum of 38
            # digits would not fit squared; 37 do, and the cast checks it).
            nd = pc.field(n).cast(pa.decimal256(19, 0))
            d1 = pc.field(s1).cast(pa.decimal256(37, exact.scale))
            d2 = pc.field(s2).cast(pa.decimal256(38, 2 * exact.scale))
            num = pc.subtract(pc.multiply(nd, d2), pc.multiply(d1, d1)).cast(pa.float64())
        else:
            x = cast_to(v, pa.float64())
            s1 = self._spec("sum", x)
            s2 = self._spec("sum", pc.multiply(x, x))
            f1 = pc.field(s1)
            nf0 = pc.field(n).cast(pa.float64())
            num = pc.multiply(nf0, pc.subtract(pc.field(s2), pc.divide(pc.multiply(f1, f1),
                                                                        nf0)))
        nf = pc.field(n).cast(pa.float64())
        one = pc.scalar(1.0)
        if kind == "samp":
            den, enough = pc.multiply(nf, pc.subtract(nf, one)), pc.greater(nf, one)
        else:
            den, enough = pc.multiply(nf, nf), pc.greater(nf, pc.scalar(0.0))
        var = pc.max_element_wise(pc.divide(num, den), pc.scalar(0.0))
        out = pc.sqrt(var) if root else var
        return Typed(pc.if_else(enough, out, pc.scalar(pa.scalar(None, pa.float64()))),
                     pa.float64())

    def _distinct(self, node: exp.Expr) -> Typed | str:
        args = node.this.expressions
        if len(args) != 1:
            raise UnsupportedSQLError(f"DISTINCT aggregate {snippet(node)}", "an aggregate "
                                      "of distinct tuples is not compiled (one argument)")
        if isinstance(node, exp.Min | exp.Max):  # the extreme of distinct values is the same
            plain = node.copy()
            plain.set("this", args[0].copy())
            return self.fallback(plain, self.pre, self.specs, self.names)
        if not isinstance(node, exp.Count | exp.Sum | exp.Avg):
            raise UnsupportedSQLError(f"DISTINCT aggregate {snippet(node)}", "only COUNT, "
                                      "SUM, AVG, MIN and MAX of DISTINCT values are compiled")
        v = self.pre.compile(args[0])
        if not isinstance(node, exp.Count) and not (
                is_integer(v.type) or is_decimal(v.type) or is_float(v.type)):
            raise SQLError(f"{snippet(node)}: cannot sum {describe(v.type)}")
        if pa.types.is_null(v.type):
            v = null_of(pa.int32())
        arg = next((i for i, d in enumerate(self.dargs) if d.expr.equals(v.expr)), None)
        if arg is None:
            arg = len(self.dargs)
            self.dargs.append(v)

        def spec(func: str) -> str:
            for n, f in self.distinct.items():
                if f == (func, arg):
                    return n
            n = unique_name(f"__d{len(self.distinct)}", self.names)
            self.distinct[n] = (func, arg)
            return n

        if isinstance(node, exp.Count):
            return spec("count")
        s = spec("sum")
        if isinstance(node, exp.Sum):
            return s
        return Typed(pc.divide(pc.field(s).cast(pa.float64()),
                               pc.field(spec("count")).cast(pa.float64())), pa.float64())

    # ---- the group-bys --------------------------------------------------------------------

    def build(self, stream: Stream, keys: list[tuple[exp.Expr, str]],
              sets: list[tuple[int, ...]] | None, post: dict[str, Typed | str],
              grouped: bool) -> tuple[Stream, AggScope]:
        """The aggregate's output stream and the scope the SELECT list is compiled in.

        ``keys`` pairs each key expression of ``self.exprs`` with its stream column;
        ``sets`` are the grouping sets (positions in ``keys``; None: one set of all).
        """
        if self.groupings and not grouped:
            msg = "GROUPING() needs a GROUP BY (it says which group keys a row rolls up)"
            raise SQLError(msg)
        cols = [c for _, c in keys]
        key_sets = [tuple(dict.fromkeys(cols[p] for p in s)) for s in
                    (sets if sets is not None else [tuple(range(len(cols)))])]
        all_keys = list(dict.fromkeys(cols))
        key_types = {k: stream.schema.field(k).type for k in all_keys}
        if not self.specs and not self.distinct:
            self.specs[unique_name("__rows", self.names)] = ("count", None)
        built: dict[frozenset[str], tuple[Stream, bool]] = {}
        rolled_from: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        for ks in sorted(dict.fromkeys(key_sets), key=len, reverse=True):
            parent = self._parent(built, ks)
            if parent is not None:
                out = self._rolled(built[parent][0], ks)
            else:
                out = self._direct(stream, list(ks))
            built[frozenset(ks)] = (out, parent is not None)
            rolled_from[ks] = tuple(c for c in all_keys if c in parent) if parent else None
        target: pa.Schema | None = None
        branches = []
        for ks in key_sets:
            out, rolled = built[frozenset(ks)]
            branch = self._branch(out, ks, key_types, rolled, keys)
            if target is None:
                target = branch.schema
            elif not branch.schema.equals(target):
                branch = branch.select({f.name: pc.field(f.name).cast(f.type)
                                        for f in target})
            branches.append(branch)
        result = branches[0].union_all(*branches[1:]) if len(branches) > 1 else branches[0]
        self._explain(key_sets, rolled_from, all_keys)
        resolved = {k: v if isinstance(v, Typed) else Typed(
            pc.field(v), result.schema.field(v).type) for k, v in post.items()}
        return result, AggScope(result, keys, resolved)

    def _parent(self, built: dict[frozenset[str], tuple[Stream, bool]],
                ks: tuple[str, ...]) -> frozenset[str] | None:
        """The smallest set built so far that groups on more keys, if it can roll up."""
        if self.distinct:
            return None
        found = [s for s in built if s > set(ks)]
        if not found:
            return None
        best = min(found, key=len)
        schema = built[best][0].schema
        if any(f == "sum" and is_float(schema.field(n).type)
               for n, (f, _) in self.specs.items()):
            return None
        return best

    def _rolled(self, finer: Stream, ks: tuple[str, ...]) -> Stream:
        """The group-by of ``ks`` over the output of a group-by on more keys."""
        aggs = {n: (_ROLL[f], pc.field(n)) for n, (f, _) in self.specs.items()}
        return finer.group_by(list(ks)).aggregate(**aggs)

    def _direct(self, stream: Stream, ks: list[str]) -> Stream:
        """The group-by of ``ks`` over the input (two levels with DISTINCT aggregates)."""
        if not self.distinct:
            return stream.group_by(ks).aggregate(**self.specs)
        chains = []
        for arg, v in enumerate(self.dargs):
            own = {n: f for n, (f, a) in self.distinct.items() if a == arg}
            taken = set(stream.columns) | set(self.names)
            dcol = unique_name(f"__dv{arg}", taken)
            first = self.specs if arg == 0 else {}
            lvl1 = dict(first) or {unique_name("__n", taken): ("count", None)}
            inner = stream.with_columns({dcol: v.expr}).group_by([*ks, dcol]).aggregate(
                **lvl1)
            lvl2 = {n: (_ROLL[f], pc.field(n)) for n, (f, _) in first.items()}
            lvl2.update({n: (f, pc.field(dcol)) for n, f in own.items()})
            chains.append(inner.group_by(ks).aggregate(**lvl2))
        if len(chains) == 1:
            return chains[0]
        # Every chain has a row for the same groups (they read the same rows): a union
        # of the chains, each value in its own column and NULL in the others, grouped on
        # the keys, puts each group's values in one row, NULL keys included.
        fields = [f for c in chains for f in c.schema if f.name not in ks]
        parts = []
        for c in chains:
            own_cols = set(c.columns)
            cols: dict[str, Any] = {k: pc.field(k) for k in ks}
            for f in fields:
                cols[f.name] = (pc.field(f.name) if f.name in own_cols
                                else pc.scalar(pa.scalar(None, f.type)))
            parts.append(c.select(cols))
        merged = parts[0].union_all(*parts[1:])
        combine = {f.name: ("sum" if pa.types.is_integer(f.type) or is_decimal(f.type)
                            or is_float(f.type) else "max", pc.field(f.name))
                   for f in fields}
        return merged.group_by(ks).aggregate(**combine)

    def _branch(self, out: Stream, ks: tuple[str, ...], key_types: dict[str, pa.DataType],
                rolled: bool, keys: list[tuple[exp.Expr, str]]) -> Stream:
        """One set's rows in the union's columns.

        The keys (NULL where the set does not group on them), the aggregates, and the
        GROUPING() values of the set.
        """
        cols: dict[str, Any] = {}
        for k, t in key_types.items():
            cols[k] = pc.field(k) if k in ks else pc.scalar(pa.scalar(None, t))
        counts = {n for n, (f, _) in self.specs.items() if f == "count"}
        for name in list(self.specs) + list(self.distinct):
            e = pc.field(name)
            if not ks and (rolled or self.distinct) and name in counts:
                # a sum of counts over no row is NULL; a count is 0
                e = pc.coalesce(e, pc.scalar(pa.scalar(0, pa.int64())))
            cols[name] = e
        col_of = [c for _, c in keys]
        for g, where in self.groupings.items():
            bits = 0
            for p in where:
                bits = bits * 2 + (0 if col_of[p] in ks else 1)
            cols[g] = pc.scalar(pa.scalar(bits, pa.int64()))
        return out.select(cols)

    def _explain(self, key_sets: list[tuple[str, ...]],
                 rolled_from: dict[tuple[str, ...], tuple[str, ...] | None],
                 all_keys: list[str]) -> None:
        if len(key_sets) > 1 or self.groupings:
            rolled = sum(1 for p in rolled_from.values() if p is not None)
            self.record(Decision(
                topic="grouping_sets", subject=f"GROUP BY over {', '.join(all_keys)}",
                choice=[list(ks) for ks in key_sets],
                reason=(f"{len(key_sets)} grouping sets: one group-by each, in one union "
                        "with the keys a set does not group on NULL and GROUPING() a "
                        f"constant per set; {rolled} of them computed from the output of a "
                        "finer set (" + "; ".join(
                            f"({', '.join(k)}) from ({', '.join(p)})"
                            for k, p in rolled_from.items() if p is not None)
                        + ") instead of the input"),
                figures={"sets": len(key_sets), "rolled_up": rolled}, rule="sql"))
        if self.distinct:
            self.record(Decision(
                topic="distinct_aggregate", subject=", ".join(
                    f"{f}(DISTINCT {d.expr})" for f, a in self.distinct.values()
                    for d in [self.dargs[a]]),
                choice=len(self.dargs),
                reason=("two group-bys per distinct argument: by the keys and the value "
                        "(its rows counted), then by the keys counting or summing the "
                        "values present; the other aggregates are rolled up from the first"
                        + (", and the arguments' results combined by a union grouped on "
                           "the keys" if len(self.dargs) > 1 else "")),
                figures={"arguments": len(self.dargs)}, rule="sql"))


def _exact_type(t: pa.DataType) -> pa.DataType | None:
    """The decimal an argument's moments are summed in exactly, or None (doubles)."""
    if is_integer(t) and t in INT_DIGITS and INT_DIGITS[t] <= _EXACT_DIGITS:
        return pa.decimal128(INT_DIGITS[t], 0)
    if is_decimal(t) and t.precision <= _EXACT_DIGITS:
        return t
    return None


def _unfilter(node: exp.Filter) -> exp.Expr:
    """``agg(x) FILTER (WHERE c)`` as ``agg(CASE WHEN c THEN x END)`` (DISTINCT kept)."""
    agg = node.this
    cond = node.expression.this if isinstance(node.expression, exp.Where) else \
        node.expression
    out = agg.copy()
    arg = agg.this
    if isinstance(arg, exp.Distinct):
        inner = [exp.Case(ifs=[exp.If(this=cond.copy(), true=a.copy())])
                 for a in arg.expressions]
        out.set("this", exp.Distinct(expressions=inner))
    else:
        out.set("this", exp.Case(ifs=[exp.If(this=cond.copy(), true=arg.copy())]))
    return out
