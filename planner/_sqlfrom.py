"""FROM clauses: where each WHERE and ON conjunct goes, and how the items are joined.

The items between outer joins form an *inner group*.  Every conjunct is placed where it
first can be: on one item (a filter before the joins), as an equi-join key between two
items, or after the joins that bring its items together; a WHERE conjunct is never
pushed below an outer join that null-extends one of its items.  The group is then joined
left-deep in the order the :class:`~planner.rules.join_order.JoinOrder` rule chooses,
or, when at least three items are joined on one common key (every predicate equates one
column of each, transitively), by one ``joinstate.join_all``: a delta join whose legs
share their stream's index (TPC-DS q4's six ``year_total`` legs).  Outer, semi and anti
joins take the group built so far as their left input.  Groups of items no equality
connects are cross-joined on a constant key (:mod:`planner._sqlcross`); a non-equi
condition between two groups that may both hold several rows is refused.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

import joinstate
from joinstate.errors import SchemaMismatchError
from planner._sqlcross import cross_groups
from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqlexpr import ExprCompiler, cast_to
from planner._sqlscope import (
    Bound,
    BoundScope,
    JoinStep,
    Rel,
    SourceSpec,
    aliases_of,
    columns_of,
    conjuncts,
    key_family,
    unique_name,
)
from planner._sqltypes import Typed, TypeRuleError, common_type
from planner._sqlwindow import top_n
from planner.rule import Decision
from planner.rules.join_order import JoinEdge, JoinInput, JoinOrderContext
from planner.stats import duj1

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from joinstate import Stream

__all__ = ["FromPlanner", "QueryContext", "join_bounds"]


class QueryContext(Protocol):
    """What planning a FROM clause needs of the query compiler that owns it.

    The compiler (``planner._sqlrel.QueryCompiler``) plans each SELECT's FROM clause here
    and this planner calls back for nested queries, binding and decisions: a Protocol
    keeps that a one-way import.
    """

    sources: Mapping[str, SourceSpec]
    outer_scopes: list[frozenset[str]]

    def query(self, node: exp.Expr, names: Sequence[str] | None = None) -> Rel: ...

    def bind(self, node: exp.Expr) -> Bound: ...

    def outer_aliases(self) -> frozenset[str]: ...

    def record(self, decision: Decision) -> None: ...

    def join_order(self, context: JoinOrderContext) -> list[str]: ...

    def decorrelates(self, node: exp.Expr) -> bool: ...

    def correlated_aliases(self, node: exp.Expr) -> frozenset[str]: ...

    def subquery_filter(self, bound: Bound, node: exp.Expr) -> Bound: ...

_VALID_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


@dataclass
class _Conj:
    """A conjunct, the aliases it reads, and whether it has been placed."""

    node: exp.Expr
    aliases: frozenset[str]
    used: bool = False


def join_bounds(left: Bound, right: Bound, pairs: Sequence[tuple[str, str]], how: str
                ) -> tuple[Bound, dict[str, str], dict[str, str]]:
    """``left`` joined with ``right`` on stream column ``pairs``.

    Also returns how each side's stream columns are named in the output (the right
    side's map is empty for semi and anti joins).
    """
    left, right, pairs = _align_keys(left, right, pairs)
    left, right, pairs = _distinct_keys(left, right, pairs)
    taken = set(left.stream.columns)
    suffix = "_" + (right.aliases[0] if len(right.aliases) == 1 else "right")
    k = 1
    while any(c + suffix in taken or (c + suffix in right.stream.columns)
              for c in right.stream.columns if c in taken):
        suffix = f"_{right.aliases[0]}{k}"
        k += 1
    try:
        out = left.stream.join(right.stream, on=list(pairs), how=how,
                               suffixes=("", suffix))
    except SchemaMismatchError as exc:
        raise SQLError(f"join of {left.label} and {right.label} on {list(pairs)}: {exc}"
                       ) from exc
    names = out.columns
    nl = len(left.stream.columns)
    lmap = dict(zip(left.stream.columns, names[:nl], strict=True))
    refs = {k2: lmap[v] for k2, v in left.refs.items()}
    aliases = left.aliases
    rmap: dict[str, str] = {}
    if how not in ("left_semi", "left_anti"):
        rmap = dict(zip(right.stream.columns, names[nl:], strict=True))
        refs.update({k2: rmap[v] for k2, v in right.refs.items()})
        aliases = left.aliases + right.aliases
    label = f"({left.label} {how} {right.label})"
    return Bound(out, refs, aliases, label), lmap, rmap


def _align_keys(left: Bound, right: Bound, pairs: Sequence[tuple[str, str]]
                ) -> tuple[Bound, Bound, list[tuple[str, str]]]:
    """Key pairs of different types, cast to their common type (as DuckDB compares)."""
    lcast: dict[str, Any] = {}
    rcast: dict[str, Any] = {}
    out = []
    for lc, rc in pairs:
        lt, rt = left.stream.schema.field(lc).type, right.stream.schema.field(rc).type
        if key_family(lt) == key_family(rt):
            out.append((lc, rc))
            continue
        try:
            t = common_type(Typed(None, lt), Typed(None, rt))
        except TypeRuleError as exc:
            raise SQLError(f"join key {left.label}.{lc} = {right.label}.{rc}: {exc}"
                           ) from exc
        ln = unique_name(f"__k_{lc}", set(left.stream.columns) | set(lcast))
        rn = unique_name(f"__k_{rc}", set(right.stream.columns) | set(rcast))
        lcast[ln] = cast_to(Typed(pc.field(lc), lt), t)
        rcast[rn] = cast_to(Typed(pc.field(rc), rt), t)
        out.append((ln, rn))
    if lcast:
        left = Bound(left.stream.with_columns(lcast), left.refs, left.aliases, left.label,
                     left.source, left.unique, left.filtered)
    if rcast:
        right = Bound(right.stream.with_columns(rcast), right.refs, right.aliases,
                      right.label, right.source, right.unique, right.filtered)
    return left, right, out


def _distinct_keys(left: Bound, right: Bound, pairs: Sequence[tuple[str, str]]
                   ) -> tuple[Bound, Bound, list[tuple[str, str]]]:
    """A key names each column once: a column used twice is copied under a new name."""
    out = list(pairs)
    for side in (0, 1):
        bound = left if side == 0 else right
        copies: dict[str, Any] = {}
        seen: set[str] = set()
        for n, pair in enumerate(out):
            col = pair[side]
            if col in seen:
                new = unique_name(f"__k_{col}", set(bound.stream.columns) | set(copies))
                copies[new] = pc.field(col)
                out[n] = (new, pair[1]) if side == 0 else (pair[0], new)
            seen.add(col)
        if copies:
            bound = Bound(bound.stream.with_columns(copies), bound.refs, bound.aliases,
                          bound.label, bound.source, bound.unique, bound.filtered)
            if side == 0:
                left = bound
            else:
                right = bound
    return left, right, out


_OUTER = {"LEFT": "left", "RIGHT": "right", "FULL": "full"}


class FromPlanner:
    """Plans one SELECT's FROM clause and WHERE conjuncts (see the module docstring)."""

    def __init__(self, qc: QueryContext, node: exp.Select) -> None:
        self.qc = qc
        self.node = node
        self.column_uses: Counter[tuple[str, str]] = Counter()

    def plan(self) -> Bound:
        """The FROM clause joined and filtered by WHERE."""
        node = self.node
        entries: list[tuple[exp.Expr, exp.Join | None]] = [(node.args["from_"].this, None)]
        entries += [(j.this, j) for j in node.args.get("joins") or []]
        local = [e.alias_or_name for e, _ in entries]
        self.qc.outer_scopes.append(frozenset(local))
        try:
            return self._plan(entries)
        finally:
            self.qc.outer_scopes.pop()

    def _plan(self, entries: list[tuple[exp.Expr, exp.Join | None]]) -> Bound:
        node = self.node
        for c in columns_of(node):
            self.column_uses[(c.table, c.name)] += 1
        kinds = [self._kind(j) for _, j in entries]
        # A WHERE conjunct may be applied inside the group before position k only if no
        # later outer join null-extends that group (RIGHT and FULL joins do).
        later_nulls = [any(k in ("right", "full") for k in kinds[i:]) for i in range(
            len(kinds) + 1)]
        nulled_later: set[str] = set()
        for (item, _), kind in zip(entries, kinds, strict=True):
            if kind in ("left", "full"):
                nulled_later.add(item.alias_or_name)
        where = [_Conj(c, frozenset(aliases_of(c)) | self.qc.correlated_aliases(c))
                 for c in conjuncts(node.args.get("where"))]
        members: list[Bound] = []
        on_conjs: list[_Conj] = []
        for i, ((item, join), kind) in enumerate(zip(entries, kinds, strict=True)):
            bound = self.qc.bind(item)
            if kind in ("inner", "cross"):
                members.append(bound)
                if join is not None:
                    on_conjs += [_Conj(c, frozenset(aliases_of(c))
                                       | self.qc.correlated_aliases(c))
                                 for c in conjuncts(join.args.get("on"))]
                continue
            pool = on_conjs + ([w for w in where if not (w.aliases & nulled_later)]
                               if not later_nulls[i] else [])
            left = self._group(members, pool)
            assert join is not None
            members = [self._outer_join(left, bound, kind, join)]
            on_conjs = []
        pool = on_conjs + [w for w in where if not w.used]
        result = self._group(members, pool)
        rest = [w for w in where if not w.used]
        return self._filter_after(result, rest)

    @staticmethod
    def _kind(join: exp.Join | None) -> str:
        if join is None:
            return "inner"
        for arg in ("using", "method"):
            if join.args.get(arg):
                raise UnsupportedSQLError(f"{str(join.args[arg]).upper()} JOIN {snippet(join)}",
                                          "only inner, outer, semi and anti equi-joins are "
                                          "compiled")
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if side in _OUTER:
            return _OUTER[side]
        if kind in ("SEMI", "ANTI"):
            return f"left_{kind.lower()}"
        if kind == "CROSS":
            return "cross"
        if kind in ("", "INNER", "OUTER"):
            return "inner"
        raise UnsupportedSQLError(f"{kind} JOIN {snippet(join)}", "not compiled")

    # ---- filters ----------------------------------------------------------------------

    def _compile_pred(self, bound: Bound, conj: exp.Expr) -> Any:
        return ExprCompiler(BoundScope(bound, self.qc.outer_aliases())).predicate(conj).expr

    def _filter(self, bound: Bound, conjs: Sequence[_Conj]) -> Bound:
        """``bound`` filtered by ``conjs`` (IN-subquery conjuncts become semi joins)."""
        bound = top_n(bound, [c.node for c in conjs], self.qc.record)
        preds = []
        later = []  # subqueries the compiler decorrelates: joined after the plain filters
        for c in conjs:
            c.used = True
            if self.qc.decorrelates(c.node):
                later.append(c)
                continue
            if isinstance(c.node, exp.In) and self._is_in_subquery(c.node):
                bound = self._semi(bound, c.node)
                continue
            preds.append(self._compile_pred(bound, c.node))
        if preds:
            expr = preds[0]
            for p in preds[1:]:
                expr = pc.and_kleene(expr, p)
            bound = Bound(bound.stream.filter(expr), bound.refs, bound.aliases, bound.label,
                          bound.source, bound.unique, True, _kept(bound.sample, expr),
                          bound.unfiltered)
        for c in later:
            bound = self.qc.subquery_filter(bound, c.node)
        return bound

    def _filter_after(self, bound: Bound, conjs: Sequence[_Conj]) -> Bound:
        for c in conjs:
            unknown = c.aliases - set(bound.aliases)
            if unknown:
                # Columns of an enclosing query: the subquery is correlated.
                raise UnsupportedSQLError(
                    f"correlated subquery (it reads {sorted(unknown)} of an enclosing query "
                    f"in {snippet(c.node)})",
                    "a subquery that depends on the row of another query is not compiled; "
                    "rewrite it as a join")
        return self._filter(bound, conjs)

    @staticmethod
    def _is_in_subquery(node: exp.Expr) -> bool:
        return isinstance(node, exp.In) and node.args.get("query") is not None and not \
            node.args.get("negate")

    def _semi(self, bound: Bound, node: exp.In) -> Bound:
        """``x IN (SELECT y ...)`` as a WHERE conjunct: a left semi join on ``x = y``."""
        query = node.args["query"]
        sub = self.qc.query(query.this if isinstance(query, exp.Subquery) else query)
        if len(sub.columns) != 1:
            raise SQLError(f"{snippet(node)}: the subquery returns {len(sub.columns)} "
                           "columns, IN needs one")
        v = ExprCompiler(BoundScope(bound, self.qc.outer_aliases())).compile(node.this)
        stream = bound.stream
        col = next((c for c in stream.columns if v.expr.equals(pc.field(c))), None)
        if col is None:
            col = unique_name("__in", set(stream.columns))
            stream = stream.with_columns({col: v.expr})
        left = Bound(stream, bound.refs, bound.aliases, bound.label, bound.source,
                     bound.unique, True)
        right = Bound(sub.stream, {}, ("__in",), "IN subquery")
        out, _, _ = join_bounds(left, right, [(col, sub.columns[0][1])], "left_semi")
        return Bound(out.stream, out.refs, bound.aliases, bound.label, bound.source,
                     bound.unique, True)

    # ---- inner groups -----------------------------------------------------------------

    def _group(self, members: list[Bound], pool: list[_Conj]) -> Bound:
        """Join ``members`` (inner) with the conjuncts of ``pool`` that belong to them."""
        covered = {a for m in members for a in m.aliases}
        mine = [c for c in pool if not c.used and c.aliases <= covered]
        owner = {a: i for i, m in enumerate(members) for a in m.aliases}
        singles: dict[int, list[_Conj]] = {}
        edges: list[tuple[int, str, exp.Expr, int, str, exp.Expr, _Conj]] = []
        multi: list[_Conj] = []
        consts: list[_Conj] = []
        for c in mine:
            owners = {owner[a] for a in c.aliases}
            if not owners:
                consts.append(c)
            elif len(owners) == 1:
                singles.setdefault(owners.pop(), []).append(c)
            elif (edge := self._edge(c, owner)) is not None:
                edges.append(edge)
            else:
                multi.append(c)
        members = [self._filter(m, singles.get(i, [])) for i, m in enumerate(members)]
        for c in consts:
            c.used = True
        if len(members) == 1:
            return self._filter(members[0], multi + consts)
        # key columns: each side of an edge as a stream column of its member
        keyed: list[tuple[int, str, int, str]] = []
        for li, lname, lexpr, ri, rname, rexpr, conj in edges:
            conj.used = True
            members[li], lcol = self._key_column(members[li], lexpr, lname)
            members[ri], rcol = self._key_column(members[ri], rexpr, rname)
            keyed.append((li, lcol, ri, rcol))
        members, keyed = cross_groups(self.qc, members, keyed, multi, self.node)
        self._connected(members, keyed, multi)
        joined = self._join_all(members, keyed)
        if joined is None:
            joined = self._left_deep(members, keyed, multi)
        return self._filter(joined, [c for c in multi if not c.used] + consts)

    def _edge(self, c: _Conj, owner: dict[str, int]
              ) -> tuple[int, str, exp.Expr, int, str, exp.Expr, _Conj] | None:
        if not isinstance(c.node, exp.EQ):
            return None
        la, ra = aliases_of(c.node.left), aliases_of(c.node.right)
        lo, ro = {owner[a] for a in la}, {owner[a] for a in ra}
        if len(lo) != 1 or len(ro) != 1 or lo == ro:
            return None
        li, ri = lo.pop(), ro.pop()
        return li, self._expr_name(c.node.left), c.node.left, ri, \
            self._expr_name(c.node.right), c.node.right, c

    @staticmethod
    def _expr_name(node: exp.Expr) -> str:
        while isinstance(node, exp.Paren):
            node = node.this
        return node.name if isinstance(node, exp.Column) else ""

    def _key_column(self, bound: Bound, expr: exp.Expr, name: str) -> tuple[Bound, str]:
        v = ExprCompiler(BoundScope(bound, self.qc.outer_aliases())).compile(expr)
        col = next((c for c in bound.stream.columns if v.expr.equals(pc.field(c))), None)
        if col is not None:
            return bound, col
        col = unique_name(f"__k_{name or 'expr'}", set(bound.stream.columns))
        stream = bound.stream.with_columns({col: v.expr})
        return Bound(stream, bound.refs, bound.aliases, bound.label, bound.source,
                     bound.unique, bound.filtered), col

    def _connected(self, members: list[Bound], keyed: list[tuple[int, str, int, str]],
                   multi: list[_Conj]) -> None:
        reach = {0}
        changed = True
        while changed:
            changed = False
            for li, _, ri, _ in keyed:
                if (li in reach) != (ri in reach):
                    reach |= {li, ri}
                    changed = True
        if len(reach) == len(members):
            return
        apart = [members[i].label for i in range(len(members)) if i not in reach]
        joined = [members[i].label for i in sorted(reach)]
        inside = {a for i in reach for a in members[i].aliases}
        across = [c for c in multi if c.aliases & inside and c.aliases - inside]
        if across:
            raise UnsupportedSQLError(
                f"non-equi join {snippet(across[0].node)}",
                f"{', '.join(joined)} and {', '.join(apart)} are joined by no equality: a "
                "non-equi join changes in proportion to a whole input for one row's change, "
                "so it is not maintained incrementally; add an equi-join predicate")
        raise UnsupportedSQLError(
            f"cross join of {', '.join(joined)} with {', '.join(apart)} in "
            f"{snippet(self.node)}",
            "no predicate connects them: a cross product changes in proportion to a whole "
            "input for one row's change, so it is not maintained incrementally; add an "
            "equi-join predicate")

    def _join_all(self, members: list[Bound], keyed: list[tuple[int, str, int, str]]
                  ) -> Bound | None:
        """One ``join_all`` when >= 3 members are joined on one common key."""
        if len(members) < 3:
            return None
        key: dict[int, str] = {}
        for li, lc, ri, rc in keyed:
            for i, c in ((li, lc), (ri, rc)):
                if key.setdefault(i, c) != c:
                    return None
        if len(key) != len(members):
            return None
        legs: dict[str, Stream] = {}
        names: dict[int, str] = {}
        taken: set[str] = set()
        for i, m in enumerate(members):
            base = m.aliases[0] if len(m.aliases) == 1 and _VALID_NAME.match(
                m.aliases[0]) else f"leg{i}"
            names[i] = unique_name(base, taken)
            legs[names[i]] = m.stream
        out_cols = [f"{names[i]}_{c}" for i, m in enumerate(members) for c in m.stream.columns]
        if len(set(out_cols)) != len(out_cols):
            return None  # leg_column names would collide: binary joins instead
        stream = joinstate.join_all(legs, on={names[i]: key[i] for i in names})
        refs: dict[tuple[str, str], str] = {}
        for i, m in enumerate(members):
            refs.update({k: f"{names[i]}_{v}" for k, v in m.refs.items()})
        aliases = tuple(a for m in members for a in m.aliases)
        on = ", ".join(f"{m.label}.{key[i]}" for i, m in enumerate(members))
        self.qc.record(Decision(
            topic="join_all", subject=f"FROM {', '.join(m.label for m in members)}",
            choice={names[i]: key[i] for i in names},
            reason=(f"{len(members)} inputs joined on one key ({on}): one N-way delta join, "
                    "no intermediate join state; legs that filter one stream share its "
                    "index"),
            figures={"legs": len(members)}, rule="sql"))
        return Bound(stream, refs, aliases, f"join_all({', '.join(names.values())})")

    def _left_deep(self, members: list[Bound], keyed: list[tuple[int, str, int, str]],
                   multi: list[_Conj]) -> Bound:
        labels = {}
        taken: set[str] = set()
        for i, m in enumerate(members):
            labels[i] = unique_name(m.label, taken)
        inputs = []
        for i, m in enumerate(members):
            keys = {c for li, lc, ri, rc in keyed for j, c in ((li, lc), (ri, rc)) if j == i}
            width = sum(1 for (a, c), n in self.column_uses.items()
                        if a in m.aliases and m.refs.get((a, c)) not in keys)
            inputs.append(JoinInput(
                name=labels[i], source=m.source,
                rows=self.qc.sources[m.source.lower()].rows if m.source else None,
                unique_keys=m.unique, filtered=m.filtered, width=width,
                selectivity=self._selectivity(i, members, keyed)))
        edges = tuple(JoinEdge(labels[li], labels[ri], (lc,), (rc,))
                      for li, lc, ri, rc in keyed)
        ties = tuple(sorted({tuple(sorted(labels[i] for i, m in enumerate(members)
                                          if m.aliases and set(m.aliases) & c.aliases))
                             for c in multi}))
        fans = self._fanouts(members, keyed)
        fanouts = tuple((labels[i], labels[j], f) for (i, j), f in fans.items())
        ctx = JoinOrderContext(tuple(inputs), edges, f"FROM {', '.join(labels.values())}",
                               tuple(t for t in ties if len(t) > 1), fanouts)
        order = self.qc.join_order(ctx)
        by_label = {labels[i]: i for i in labels}
        seq = [by_label[n] for n in order]
        parent: dict[tuple[int, str], tuple[int, str]] = {}

        def find(x: tuple[int, str]) -> tuple[int, str]:
            while parent.get(x, x) != x:
                x = parent[x]
            return x

        cur = members[seq[0]]
        colmap: dict[int, dict[str, str]] = {seq[0]: {c: c for c in cur.stream.columns}}
        steps: list[JoinStep] = []
        root_rows = self._member_rows(cur)
        rows = None if root_rows is None else root_rows * inputs[seq[0]].kept
        for i in seq[1:]:
            pairs: list[tuple[str, str]] = []
            extra: list[tuple[str, str]] = []  # more columns equal to a key column used
            seen: set[tuple[tuple[int, str], str]] = set()
            for li, lc, ri, rc in keyed:
                if li in colmap and ri == i:
                    mine, other = (li, lc), rc
                elif ri in colmap and li == i:
                    mine, other = (ri, rc), lc
                else:
                    continue
                sig = (find(mine), other)
                if sig in seen:  # already equal to a column this key is joined on
                    continue
                seen.add(sig)
                if any(o == other for _, o in pairs):
                    extra.append((colmap[mine[0]][mine[1]], other))
                else:
                    pairs.append((colmap[mine[0]][mine[1]], other))
                parent[find((i, other))] = find(mine)
            before = cur
            cur, lmap, rmap = join_bounds(cur, members[i], pairs, "inner")
            colmap = {j: {c: lmap.get(v, v) for c, v in m.items()} for j, m in colmap.items()}
            colmap[i] = dict(rmap)
            if extra:  # a key column joined twice: the second equality filters the join
                cur = self._equal_after(cur, [(a, rmap[b]) for a, b in extra])
            ready = [c for c in multi if not c.used and c.aliases <= set(cur.aliases)]
            if ready:
                cur = self._filter(cur, ready)
            steps.append(JoinStep(before, members[i], tuple(pairs), cur.stream,
                                  not extra and not ready, self._member_rows(members[i]),
                                  rows))
            if rows is not None:
                fan = [f for (a, b), f in fans.items() if a == i and b in colmap]
                rows *= inputs[i].kept * (min(fan) if fan else 1.0)
        return dataclasses.replace(cur, steps=tuple(steps))

    def _fanouts(self, members: list[Bound], keyed: list[tuple[int, str, int, str]]
                 ) -> dict[tuple[int, int], float]:
        """The rows of ``i`` each row of ``j`` finds, per pair of members joined.

        For each ordered pair ``(i, j)`` of members joined by equalities, where ``i`` is
        not joined on a unique key of its own.

        The textbook estimate from distinct keys: two inputs joined on key ``k`` give
        ``|i| |j| / max(D_i(k), D_j(k))`` rows (every value of the side with fewer
        distinct values is assumed to occur in the other), so one row of ``j`` finds
        ``|i| / max(D_i, D_j)`` rows of ``i``; rows with a NULL in ``k`` find none.
        ``D`` is estimated on each member's unfiltered sample (Duj1, scaled to the rows
        the sample was drawn from), so it needs samples of both.  Two fact tables joined
        on one's near-unique key (TPC-DS ``store_returns`` on ``store_sales``' ticket and
        item) come out near ``|returns| / |sales|``.
        """
        on: dict[tuple[int, int], dict[tuple[str, str], None]] = {}
        for li, lc, ri, rc in keyed:
            if li != ri:
                on.setdefault((li, ri), {})[(lc, rc)] = None
                on.setdefault((ri, li), {})[(rc, lc)] = None
        keys: dict[tuple[int, tuple[str, ...]], tuple[int, float] | None] = {}

        def distinct(m: int, cols: tuple[str, ...]) -> tuple[int, float] | None:
            """Estimated distinct non-NULL keys of member ``m`` and its non-NULL share."""
            if (m, cols) not in keys:
                keys[(m, cols)] = _distinct_keys_of(members[m], cols, self._rows_of(
                    members[m]))
            return keys[(m, cols)]

        out: dict[tuple[int, int], float] = {}
        for (i, j), pairs in on.items():
            mine = tuple(a for a, _ in pairs)
            if any(set(k) <= set(mine) for k in members[i].unique):
                continue
            rows_i = self._rows_of(members[i])
            di, dj = distinct(i, mine), distinct(j, tuple(b for _, b in pairs))
            if rows_i is None or di is None or dj is None:
                continue
            out[(i, j)] = rows_i * di[1] * dj[1] / max(di[0], dj[0], 1)
        return out

    def _member_rows(self, m: Bound) -> int | None:
        """The rows ``m`` reads, when it is a source or a projection or filter of one.

        A derived table such as ``(SELECT substr(w_name, 1, 20) AS w_substr, * FROM
        warehouse)`` reads its source's rows; anything else: None.
        """
        node: Any = m.stream.node
        while node.kind in ("project", "filter") and len(node.inputs) == 1:
            node = node.inputs[0]
        if node.kind != "source":
            return None
        spec = self.qc.sources.get(str(node.name).lower())
        return None if spec is None else spec.rows or spec.sampled_from

    def _rows_of(self, m: Bound) -> int | None:
        """The rows a member's sample stands for (None: no sample of it)."""
        return None if m.unfiltered is None else self._member_rows(m)

    @staticmethod
    def _selectivity(i: int, members: list[Bound],
                     keyed: list[tuple[int, str, int, str]]) -> float | None:
        """The share of the rows joined to member ``i`` that its filters keep (estimated).

        On samples: of the rows of its partner (the largest sampled member it is joined
        with) whose key matches a sampled row of ``i``, the share whose key matches a
        row its filters keep.  A share of ``i``'s own rows would mislead: TPC-DS's
        ``d_year = 2000`` keeps 0.5% of ``date_dim`` but a fifth of the sales, which
        cover five of its 200 years.  Without a partner sample, the share of its own
        rows; without a sample, None.
        """
        m = members[i]
        if not m.filtered or m.sample is None or m.unfiltered is None:
            return None
        own = m.sample.num_rows / max(m.unfiltered.num_rows, 1)
        best: tuple[int, float] | None = None
        for li, lc, ri, rc in keyed:
            if i not in (li, ri):
                continue
            mine, (j, theirs) = (lc, (ri, rc)) if li == i else (rc, (li, lc))
            other = members[j].sample
            if other is None or j == i:
                continue
            try:
                values = other.column(theirs)
                hit = pc.sum(pc.is_in(values, value_set=m.unfiltered.column(mine).cast(
                    values.type), skip_nulls=True)).as_py()
                kept = pc.sum(pc.is_in(values, value_set=m.sample.column(mine).cast(
                    values.type), skip_nulls=True)).as_py()
            except (KeyError, pa.ArrowException):
                continue
            if hit and (best is None or other.num_rows > best[0]):
                best = (other.num_rows, (kept or 0) / hit)
        return best[1] if best is not None else own

    @staticmethod
    def _equal_after(bound: Bound, pairs: list[tuple[str, str]]) -> Bound:
        """``bound`` filtered by ``a = b`` for stream column pairs (in their common type)."""
        expr: Any = None
        schema = bound.stream.schema
        for a, b in pairs:
            ta = Typed(pc.field(a), schema.field(a).type)
            tb = Typed(pc.field(b), schema.field(b).type)
            t = common_type(ta, tb)
            eq = pc.equal(cast_to(ta, t), cast_to(tb, t))
            expr = eq if expr is None else pc.and_kleene(expr, eq)
        return Bound(bound.stream.filter(expr), bound.refs, bound.aliases, bound.label,
                     bound.source, bound.unique, True)

    # ---- outer joins ------------------------------------------------------------------

    def _outer_join(self, left: Bound, right: Bound, kind: str, join: exp.Join) -> Bound:
        """``left kind JOIN right ON ...``.

        Equalities become keys; a conjunct on the side that is not preserved filters that
        side first; anything else is refused.
        """
        conds = [_Conj(c, frozenset(aliases_of(c)))
                 for c in conjuncts(join.args.get("on"))]
        what = f"{kind.upper().replace('LEFT_', '')} JOIN {snippet(join)}"
        la, ra = set(left.aliases), set(right.aliases)
        pairs_e: list[tuple[exp.Expr, exp.Expr]] = []
        lf: list[_Conj] = []
        rf: list[_Conj] = []
        for c in conds:
            outside = c.aliases - la - ra
            if outside:
                raise UnsupportedSQLError(
                    f"{what}", f"the ON condition reads {sorted(outside)}, which is not "
                    "one of the two sides (a correlated or misplaced condition)")
            if isinstance(c.node, exp.EQ):
                l_, r_ = aliases_of(c.node.left), aliases_of(c.node.right)
                if l_ and r_ and l_ <= la and r_ <= ra:
                    pairs_e.append((c.node.left, c.node.right))
                    continue
                if l_ and r_ and l_ <= ra and r_ <= la:
                    pairs_e.append((c.node.right, c.node.left))
                    continue
            if c.aliases and c.aliases <= ra and kind in ("left", "left_semi", "left_anti"):
                rf.append(c)
            elif c.aliases and c.aliases <= la and kind == "right":
                lf.append(c)
            else:
                raise UnsupportedSQLError(
                    f"ON condition {snippet(c.node)} of {what}",
                    "an outer join's ON condition must be equalities between the two sides, "
                    "plus conditions on the side that is not preserved; this one is a "
                    "non-equi condition or tests the preserved side")
        if not pairs_e:
            raise UnsupportedSQLError(what, "an outer, semi or anti join needs at least one "
                                      "equality between its two sides (a non-equi join is not "
                                      "maintained incrementally)")
        if rf:
            right = self._filter(right, rf)
        if lf:
            left = self._filter(left, lf)
        pairs = []
        for le, re_ in pairs_e:
            left, lc = self._key_column(left, le, self._expr_name(le))
            right, rc = self._key_column(right, re_, self._expr_name(re_))
            pairs.append((lc, rc))
        return join_bounds(left, right, pairs, kind)[0]


def _distinct_keys_of(m: Bound, cols: tuple[str, ...], rows: int | None
                      ) -> tuple[int, float] | None:
    """Distinct non-NULL values of ``cols`` in ``m``'s source, and their non-NULL share.

    Duj1 on its unfiltered sample, scaled to ``rows``; the share is of rows where none
    of ``cols`` is NULL.
    """
    sample = m.unfiltered
    if sample is None or rows is None or not sample.num_rows:
        return None
    try:
        keyed = sample.select(list(cols)).drop_null()
        counts = keyed.group_by(list(cols)).aggregate([([], "count_all")])
    except (KeyError, pa.ArrowException):
        return None
    share = keyed.num_rows / sample.num_rows
    if not keyed.num_rows:
        return 0, 0.0
    freqs = counts.column("count_all").to_numpy()
    return duj1(freqs, max(round(rows * share), keyed.num_rows)), share


def _kept(sample: pa.Table | None, predicate: pc.Expression) -> pa.Table | None:
    """The rows of ``sample`` that ``predicate`` keeps (None: no sample, or not evaluable).

    Only an estimate for the join order: a predicate the sample cannot evaluate (a
    column it lacks, a function Arrow refuses) leaves the share unknown.
    """
    if sample is None:
        return None
    try:
        return sample.filter(predicate)
    except (pa.ArrowException, KeyError, TypeError, ValueError):
        return None
