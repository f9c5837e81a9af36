"""Where every operator runs on N shards, and how each of its inputs gets there.

:func:`derive` walks a graph in topological order, given each source's partitioning
(:mod:`planner.partitioning` has the vocabulary), and records a :class:`Placement` per
operator and an :class:`Arrival` per input.

**What operators need.**  A filter or a projection runs where its input lies (a
projection keeps a hash only while every key position keeps a column: renames map it,
a dropped or computed key column loses it).  A join needs rows with equal keys on one
shard: both inputs hashed at the same key positions with the join's key plan, or one
input replicated where the join is inner-like for the other (an inner join either side;
a left, semi or anti join its right side).  A copy on a *preserved* side is refused: an
outer join emits unmatched rows of that side once per copy.  An aggregate needs each
group on one shard: its input hashed by columns its group key contains or determines
(functional dependencies from declared unique keys, below), with NULL keys together; a
global aggregate needs :class:`Single`.  A window needs each of its partitions on one
shard, as an aggregate its groups (its PARTITION BY in place of the group key; it keeps
every input column, so its output lies as its input); a window without PARTITION BY sees
every row and runs on :class:`Single`.  A check and a repeat (``INTERSECT`` /
``EXCEPT``'s copies of a row) need nothing: stateless and row by row, they run where
their input lies (a repeat's count column, dropped, stops locating rows).  A
``join_all`` needs every leg hashed by its key with one plan.  A union needs nothing, and
keeps a partitioning all its inputs share.

**Arrivals.**  When an input does not lie as its consumer needs, it *arrives* otherwise:
a stream computed from sources by filters, projections and unions only (a *chain*) is
re-delivered: its sources are routed by the traced key columns straight into the
consumer's stage (so a self-join on two keys delivers one source twice); any other
stream is *exchanged* (a stage boundary).  :func:`derive` makes these choices for every
operator, in topological order, choosing exchange keys with look-ahead
(:func:`desires`: what the consumers downstream would like, so that one exchange serves
an aggregate, the filters after it and a delta join on one of its group columns).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from joinstate.keys import single_plan
from joinstate.nodes import (
    AggNode,
    CheckNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    ProjectNode,
    RepeatNode,
    SourceNode,
    UnionNode,
    UniqueNode,
    WindowNode,
)
from planner.errors import PlannerError
from planner.partitioning import (
    PRESERVED,
    Anywhere,
    Duplicated,
    Hash,
    Located,
    Partitioning,
    Replicated,
    Single,
    check_desire,
    closure,
    desires,
    equal_keys,
    join_plan,
    map_target,
    out_names,
    picks,
)
from planner.rules._text import rows as fmt_rows

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from joinstate.keys import KeyColumn
    from joinstate.nodes import Node
    from planner.partitioning import FD, Desire, GraphFacts

__all__ = [
    "Arrival",
    "Derivation",
    "Placement",
    "aligned",
    "chain_partitioning",
    "derive",
    "merge",
    "satisfies",
    "through_project",
    "through_repeat",
    "trace",
]


# ---- partitionings through operators ---------------------------------------------------------


def through_project(p: Partitioning, node: ProjectNode) -> Partitioning:
    """``p`` after projection ``node``: renamed, or lost with a key column."""
    if isinstance(p, Located):
        cols = tuple(o for c in p.columns for o in picks(node).get(c, []))
        return dataclasses.replace(p, columns=cols) if cols else Anywhere()
    if not isinstance(p, Hash):
        return p
    names = picks(node)
    slots = []
    for slot in p.slots:
        alts = tuple(o for c in slot for o in names.get(c, []))
        if not alts:
            return Anywhere()
        slots.append(alts)
    return Hash(tuple(slots), p.plan, p.nulls)


def through_repeat(p: Partitioning, node: RepeatNode) -> Partitioning:
    """``p`` after repeat ``node``: its count column no longer locates rows."""
    if isinstance(p, Located):
        cols = tuple(c for c in p.columns if c != node.count)
        return dataclasses.replace(p, columns=cols) if cols else Anywhere()
    if not isinstance(p, Hash):
        return p
    slots = tuple(tuple(c for c in slot if c != node.count) for slot in p.slots)
    if not all(slots):
        return Anywhere()
    return Hash(slots, p.plan, p.nulls)


def merge(parts: Sequence[Partitioning]) -> Partitioning | None:
    """The partitioning every input of a union shares (equal columns by name), or None."""
    first = parts[0]
    if all(isinstance(p, Replicated) for p in parts):
        return first
    if all(isinstance(p, Single) for p in parts):
        return first
    if all(isinstance(p, Located) for p in parts):
        ls = [p for p in parts if isinstance(p, Located)]
        shared = tuple(c for c in ls[0].columns if all(c in x.columns for x in ls))
        if shared and all(x.plan == ls[0].plan and x.via == ls[0].via for x in ls):
            return dataclasses.replace(ls[0], columns=shared)
        return None
    if not all(isinstance(p, Hash) for p in parts):
        return None
    hs = [p for p in parts if isinstance(p, Hash)]
    h0 = hs[0]
    if any(len(h.slots) != len(h0.slots) or h.plan != h0.plan for h in hs):
        return None
    slots = []
    for i, slot in enumerate(h0.slots):
        common = [c for c in slot if all(c in h.slots[i] for h in hs)]
        if not common:
            return None
        slots.append(tuple(common))
    return Hash(tuple(slots), h0.plan, all(h.nulls for h in hs))


def satisfies(p: Partitioning, target: Hash | Single) -> bool:
    """Whether rows lying as ``p`` already lie as ``target`` asks."""
    if isinstance(target, Single):
        return isinstance(p, Single)
    if not isinstance(p, Hash) or len(p.slots) != len(target.slots) or p.plan != target.plan:
        return False
    if target.nulls and not p.nulls:
        return False
    return all(c in slot for c, slot in zip(target.columns, p.slots, strict=True))


def aligned(p: Partitioning, key: Sequence[str], plan: Sequence[KeyColumn]
            ) -> tuple[int, ...] | None:
    """Key positions ``p`` hashes ``key`` at (with ``plan``), or None."""
    if not isinstance(p, Hash):
        return None
    idx: list[int] = []
    for slot, kc in zip(p.slots, p.plan, strict=True):
        j = next((j for j, k in enumerate(key) if k in slot and j not in idx
                  and plan[j] == kc), None)
        if j is None:
            return None
        idx.append(j)
    return tuple(idx)


# ---- the derivation ---------------------------------------------------------------------------

Mode = Literal["local", "delivery", "exchange"]


@dataclass(frozen=True)
class Arrival:
    """How input ``pos`` of ``consumer`` (a node id, or -1 for output ``output``) arrives.

    ``local``: where it lies (its producer runs in the consumer's stage or an earlier one
    on the same shard; a chain is computed in the consumer's stage from its sources as
    they are routed by default, listed in ``deliveries``); ``delivery``: the chain
    ``producer`` is computed in the consumer's stage from its sources routed otherwise,
    as ``deliveries`` say; ``exchange``: the
    producer's output is sent to the consumer's stage, routed by ``partitioning``.
    ``rows``: rows this costs (sent, or delivered beyond each source's first delivery).
    """

    consumer: int
    pos: int
    producer: int
    mode: Mode
    partitioning: Partitioning
    deliveries: tuple[tuple[str, Partitioning], ...] = ()
    reason: str = ""
    rows: float = 0.0
    output: str | None = None


@dataclass(frozen=True)
class Placement:
    """A node that is not a chain: the partitioning of its output, and why it runs there."""

    node: int
    partitioning: Partitioning
    reason: str
    figures: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Derivation:
    """Every placement and arrival of a graph under given source partitionings."""

    facts: GraphFacts
    shards: int
    defaults: Mapping[str, Partitioning]
    placements: dict[int, Placement] = field(default_factory=dict)
    arrivals: list[Arrival] = field(default_factory=list)
    delivered: dict[str, list[Partitioning]] = field(default_factory=dict)
    cost: float = 0.0

    def arrivals_of(self, consumer: int) -> list[Arrival]:
        """The arrivals of ``consumer``'s inputs, by position."""
        return sorted((a for a in self.arrivals if a.consumer == consumer and a.output is None),
                      key=lambda a: a.pos)

    def refused_copies(self) -> list[Arrival]:
        """Arrivals of replicated streams that a consumer could not take as copies."""
        out = []
        for a in self.arrivals:
            if a.mode != "local" and isinstance(self.natural(a.producer), Replicated):
                out.append(a)
        return out

    def natural(self, nid: int) -> Partitioning:
        """Where ``nid``'s rows lie without moving anything."""
        if nid in self.facts.chain:
            return chain_partitioning(self.facts, nid, self.defaults)
        return self.placements[nid].partitioning


def chain_partitioning(facts: GraphFacts, nid: int, parts: Mapping[str, Partitioning]
                       ) -> Partitioning:
    """The partitioning of chain node ``nid`` when its sources lie as ``parts`` say."""
    n = facts.nodes[nid]
    if isinstance(n, SourceNode):
        return parts[n.name]
    if isinstance(n, FilterNode):
        return chain_partitioning(facts, n.inputs[0].id, parts)
    if isinstance(n, ProjectNode):
        return through_project(chain_partitioning(facts, n.inputs[0].id, parts), n)
    ins = [chain_partitioning(facts, i.id, parts) for i in n.inputs]
    merged = merge(ins)
    if merged is not None:
        return merged
    return Duplicated() if any(isinstance(p, Replicated | Duplicated) for p in ins) else Anywhere()


def trace(facts: GraphFacts, nid: int, target: Hash | Single) -> dict[str, Partitioning] | None:
    """Source partitionings under which chain ``nid`` lies as ``target``.

    None when a key column is computed, or one source would need two routings.
    """
    n = facts.nodes[nid]
    if isinstance(n, SourceNode):
        return {n.name: target}
    if isinstance(n, FilterNode):
        return trace(facts, n.inputs[0].id, target)
    if isinstance(n, ProjectNode):
        back = {o: i for i, outs in picks(n).items() for o in outs}
        mapped = map_target(target, back)
        return None if mapped is None else trace(facts, n.inputs[0].id, mapped)
    out: dict[str, Partitioning] = {}
    for i in n.inputs:
        got = trace(facts, i.id, target)
        if got is None:
            return None
        for s, p in got.items():
            if out.setdefault(s, p) != p:
                return None
    return out


def derive(facts: GraphFacts, defaults: Mapping[str, Partitioning], shards: int,
           want: Mapping[int, list[Desire]] | None = None) -> Derivation:
    """Place every operator and choose how each input arrives (see the module docstring).

    ``defaults``: each source's partitioning (where its rows go unless a consumer needs
    them otherwise); ``want``: :func:`desires` (look-ahead for exchange keys).
    """
    missing = [s for s in facts.graph.sources if s not in defaults]
    if missing:
        raise PlannerError(f"internal: no partitioning for source(s) {missing}")
    d = Derivation(facts, shards, dict(defaults))
    want = want if want is not None else desires(facts)
    for nid in facts.order:
        if nid in facts.chain:
            continue
        _place(d, facts.nodes[nid], want.get(nid, []))
    for name, nid in facts.outputs.items():
        p = d.natural(nid)
        if isinstance(p, Replicated | Duplicated):
            a = _arrive(d, -1, 0, nid, Single(), f"output {name} is {p.describe()} on every "
                        "shard; it is read once, from shard 0", output=name)
        else:
            a = _local(d, -1, 0, nid, f"output {name} is read from every shard", output=name)
        d.arrivals.append(a)
    return d


def _local(d: Derivation, consumer: int, pos: int, producer: int, reason: str,
           output: str | None = None) -> Arrival:
    facts = d.facts
    if producer in facts.chain:
        dl = tuple((s, d.defaults[s]) for s in facts.sources_of(producer))
        for s, p in dl:
            got = d.delivered.setdefault(s, [])
            if p not in got:
                got.append(p)
        return Arrival(consumer, pos, producer, "local", d.natural(producer), dl, reason,
                       0.0, output)
    return Arrival(consumer, pos, producer, "local", d.natural(producer), (), reason, 0.0,
                   output)


def _arrive_cost(d: Derivation, producer: int, target: Hash | Single) -> float:
    """Rows it costs to have ``producer`` lie as ``target`` (0 if it does)."""
    facts = d.facts
    if satisfies(d.natural(producer), target):
        return 0.0
    if producer in facts.chain:
        traced = trace(facts, producer, target)
        if traced is not None:
            return sum(facts.source_rows(s) for s, p in traced.items()
                       if p != d.defaults[s] and p not in d.delivered.get(s, []))
    return facts.rows[producer]


def _arrive(d: Derivation, consumer: int, pos: int, producer: int, target: Hash | Single,
            reason: str, output: str | None = None) -> Arrival:
    """The cheapest way for ``producer`` to reach ``consumer`` lying as ``target``."""
    facts = d.facts
    if satisfies(d.natural(producer), target):
        return _local(d, consumer, pos, producer, reason, output)
    if producer in facts.chain:
        traced = trace(facts, producer, target)
        if traced is not None:
            cost = 0.0
            for s, p in traced.items():
                got = d.delivered.setdefault(s, [])
                if p != d.defaults[s] and p not in got:
                    cost += facts.source_rows(s)
                if p not in got:
                    got.append(p)
            d.cost += cost
            dl = tuple((s, traced[s]) for s in facts.sources_of(producer))
            return Arrival(consumer, pos, producer, "delivery", target, dl, reason, cost,
                           output)
        dl = tuple((s, d.defaults[s]) for s in facts.sources_of(producer))
        if isinstance(d.natural(producer), Duplicated):
            # Sent from where its copies are read once: copies delivered to shard 0 only.
            dl = tuple((s, Single() if isinstance(p, Replicated) else p) for s, p in dl)
        for s, p in dl:  # the chain is computed where they lie
            got = d.delivered.setdefault(s, [])
            if p not in got:
                got.append(p)
        rows = facts.rows[producer]
        d.cost += rows
        return Arrival(consumer, pos, producer, "exchange", target, dl, reason, rows, output)
    rows = facts.rows[producer]
    d.cost += rows
    return Arrival(consumer, pos, producer, "exchange", target, (), reason, rows, output)


def _place(d: Derivation, n: Node, want: list[Desire]) -> None:
    if isinstance(n, FilterNode | ProjectNode | CheckNode | RepeatNode):
        a = _local(d, n.id, 0, n.inputs[0].id, "")
        p = (through_project(a.partitioning, n) if isinstance(n, ProjectNode)
             else through_repeat(a.partitioning, n) if isinstance(n, RepeatNode)
             else a.partitioning)
        d.arrivals.append(a)
        why = ("runs where its input lies" if not isinstance(p, Anywhere)
               or isinstance(a.partitioning, Anywhere) else
               f"runs where its input lies, which is no longer {a.partitioning.describe()}: "
               "a key column is dropped or computed")
        d.placements[n.id] = Placement(n.id, p, why)
    elif isinstance(n, UnionNode):
        _place_union(d, n, want)
    elif isinstance(n, JoinNode):
        _place_join(d, n, want)
    elif isinstance(n, AggNode):
        _place_agg(d, n, want)
    elif isinstance(n, JoinAllNode):
        _place_joinall(d, n)
    elif isinstance(n, WindowNode):
        _place_window(d, n, want)
    elif isinstance(n, UniqueNode):
        _place_unique(d, n)
    else:
        raise PlannerError(f"internal: the distributed planner has no rule for {n.kind} "
                           f"nodes ({n.label})")


def _place_union(d: Derivation, n: UnionNode, want: list[Desire]) -> None:
    nats = [d.natural(i.id) for i in n.inputs]
    merged = merge(nats)
    if merged is not None:
        for pos, i in enumerate(n.inputs):
            d.arrivals.append(_local(d, n.id, pos, i.id, ""))
        d.placements[n.id] = Placement(n.id, merged, "its inputs lie alike: "
                                       f"{merged.describe()}")
        return
    target: Hash | Single | None = None
    why = ""
    for w in want:
        if any(satisfies(p, w.target) for p in nats):
            target, why = w.target, w.why
            break
    if target is None and any(isinstance(p, Replicated | Duplicated) for p in nats):
        other = next((p for p in nats if isinstance(p, Hash | Single)), Single())
        assert isinstance(other, Hash | Single)
        target, why = other, "a copy of an input would be counted once per shard"
    if target is None:
        for pos, i in enumerate(n.inputs):
            d.arrivals.append(_local(d, n.id, pos, i.id, ""))
        d.placements[n.id] = Placement(
            n.id, Anywhere(), "its inputs lie differently (" + "; ".join(
                p.describe() for p in nats) + ") and nothing downstream needs them together")
        return
    for pos, i in enumerate(n.inputs):
        d.arrivals.append(_arrive(d, n.id, pos, i.id, target,
                                  f"to lie as its sibling inputs: {why}"))
    d.placements[n.id] = Placement(n.id, target, f"its inputs are brought to "
                                   f"{target.describe()} ({why})")


def _join_out(n: JoinNode, pl: Partitioning, pr: Partitioning) -> Partitioning:
    """The partitioning of a join's output when its inputs lie as ``pl`` and ``pr``."""
    lo, ro = out_names(n, 0), out_names(n, 1)
    how = n.how
    if isinstance(pl, Replicated) and isinstance(pr, Replicated):
        return Replicated()
    if isinstance(pl, Single) or isinstance(pr, Single):
        return Single()
    equal: dict[str, set[str]] = {}
    for a, b, _ in equal_keys(n):
        equal.setdefault(a, set()).add(b)
        equal.setdefault(b, set()).add(a)

    def mapped(p: Partitioning, names: Mapping[str, str]) -> Partitioning:
        if isinstance(p, Located):
            alts = [names[c] for c in p.columns if c in names]
            for a in list(alts):
                alts += sorted(equal.get(a, set()) - set(alts))
            return dataclasses.replace(p, columns=tuple(alts)) if alts else Anywhere()
        if not isinstance(p, Hash):
            return p
        slots = []
        for slot in p.slots:
            alts = [names[c] for c in slot if c in names]
            for a in list(alts):
                alts += sorted(equal.get(a, set()) - set(alts))
            if not alts:
                return Anywhere()
            slots.append(tuple(alts))
        return Hash(tuple(slots), p.plan, p.nulls)

    if isinstance(pr, Replicated):
        return mapped(pl, lo)
    if isinstance(pl, Replicated):
        return mapped(pr, ro)
    left = mapped(pl, lo)
    if how in ("left", "left_semi", "left_anti", "inner"):
        return left
    right = mapped(pr, ro)
    if how == "right":
        return right
    if isinstance(left, Hash) and isinstance(right, Hash):  # full: either side, non-NULL
        slots = tuple(tuple(dict.fromkeys(a + b)) for a, b in zip(left.slots, right.slots,
                                                                    strict=True))
        return Hash(slots, left.plan, False)
    return Anywhere()


def _place_join(d: Derivation, n: JoinNode, want: list[Desire]) -> None:
    left, right = n.inputs
    pl, pr = d.natural(left.id), d.natural(right.id)
    plan = join_plan(n)
    keys = (n.left_key, n.right_key)
    copyable = [pos not in PRESERVED[n.how] for pos in (0, 1)]
    figures: dict[str, Any] = {}
    reason = ""
    if isinstance(pl, Duplicated) or isinstance(pr, Duplicated):
        pass
    elif isinstance(pl, Single) and isinstance(pr, Single):
        reason = "both inputs are on shard 0"
    elif isinstance(pl, Replicated) and isinstance(pr, Replicated):
        reason = "both inputs are copied to every shard: so is its output"
    elif isinstance(pr, Replicated) and copyable[1]:
        reason = (f"its right input is copied to every shard and {_a(n.how)} join emits no "
                  "unmatched right row")
    elif isinstance(pl, Replicated) and copyable[0]:
        reason = (f"its left input is copied to every shard and {_a(n.how)} join emits no "
                  "unmatched left row")
    if reason:
        d.arrivals += [_local(d, n.id, 0, left.id, ""), _local(d, n.id, 1, right.id, "")]
        d.placements[n.id] = Placement(n.id, _join_out(n, pl, pr), reason)
        return
    al, ar = aligned(pl, keys[0], plan), aligned(pr, keys[1], plan)
    if al is not None and al == ar:
        d.arrivals += [_local(d, n.id, 0, left.id, ""), _local(d, n.id, 1, right.id, "")]
        cols = ", ".join(f"{keys[0][j]} = {keys[1][j]}" for j in al)
        d.placements[n.id] = Placement(
            n.id, _join_out(n, pl, pr),
            f"co-partitioned: both inputs are hashed by {cols} with one key plan "
            f"({', '.join(str(plan[j].common) for j in al)}), so equal keys meet")
        return
    # Candidates: the positions an input already lies at, look-ahead, the whole key.
    cands: list[tuple[tuple[int, ...], str]] = []
    for idx, side in ((al, "left"), (ar, "right")):
        if idx is not None:
            cands.append((idx, f"the {side} input already lies so"))
    for w in want:
        if isinstance(w.target, Hash):
            idx2 = aligned(w.target, [out_names(n, 0).get(c, c) for c in keys[0]], plan)
            if idx2 is None:
                idx2 = aligned(w.target, [out_names(n, 1).get(c, c) for c in keys[1]], plan)
            if idx2 is not None:
                cands.append((idx2, f"look-ahead: {w.why}"))
    cands.append((tuple(range(len(plan))), "the whole key"))
    best: tuple[float, tuple[int, ...], str] | None = None
    for idx, why in cands:
        cost = sum(_arrive_cost(d, inp.id, _key_target(keys[pos], plan, idx))
                   for pos, inp in enumerate(n.inputs))
        if best is None or cost < best[0]:
            best = (cost, idx, why)
    assert best is not None
    _, idx, why = best
    figures["moved_rows"] = round(best[0])
    for pos, inp in enumerate(n.inputs):
        t = _key_target(keys[pos], plan, idx)
        d.arrivals.append(_arrive(d, n.id, pos, inp.id, t,
                                  f"{n.label} joins on {', '.join(keys[pos])}"))
    got = [a.partitioning for a in d.arrivals_of(n.id)]
    refused = ""
    for pos, p in enumerate((pl, pr)):
        if isinstance(p, Replicated):
            side = "left" if pos == 0 else "right"
            refused = (f"; its {side} input is copied but {_a(n.how)} join emits unmatched "
                       f"{side} rows, once per copy")
    cols = ", ".join(f"{keys[0][j]} = {keys[1][j]}" for j in idx)
    d.placements[n.id] = Placement(
        n.id, _join_out(n, got[0], got[1]),
        f"its inputs are brought to one hash by {cols} ({why}){refused}", figures)


def _a(how: str) -> str:
    """``an inner``, ``a left`` ...: the join type with its article."""
    return f"{'an' if how[0] in 'aeiou' else 'a'} {how}"


def _key_target(key: Sequence[str], plan: Sequence[KeyColumn], idx: Sequence[int]) -> Hash:
    return Hash(tuple((key[j],) for j in idx), tuple(plan[j] for j in idx))


def _group_local(p: Partitioning, n: AggNode, fds: Sequence[FD]) -> tuple[Partitioning, str] | None:
    """Whether groups of aggregate ``n`` lie together under ``p``: (output, reason)."""
    return _within(p, n.keys, fds, "group key", "each group lies on one shard")


def _within(p: Partitioning, key: Sequence[str], fds: Sequence[FD], what: str, so: str
            ) -> tuple[Partitioning, str] | None:
    """Whether rows equal on ``key`` lie on one shard under ``p``.

    ``key``: an aggregate's group key or a window's PARTITION BY, called ``what`` in the
    reason.  Returns (the partitioning of what an aggregate by ``key`` outputs, reason),
    or None.
    """
    if isinstance(p, Single):
        return Single(), "its input is on shard 0"
    keys = set(key)
    if isinstance(p, Located):
        inside = tuple(c for c in p.columns if c in keys)
        if inside:
            return dataclasses.replace(p, columns=inside), (
                f"its input is {p.describe()}, and {inside[0]} is in its {what}: {so}")
        have, used = closure(keys, fds)
        if any(c in have for c in p.columns):
            c = next(c for c in p.columns if c in have)
            because = "; ".join(dict.fromkeys(fd.why for fd in _path(keys, [c], used)))
            return Anywhere(), (f"its input is {p.describe()}, and its {what} determines "
                                f"{c} ({because}): {so}")
        return None
    if not isinstance(p, Hash) or not p.nulls:
        return None
    direct = [next((c for c in slot if c in keys), None) for slot in p.slots]
    if all(c is not None for c in direct):
        out = Hash(tuple(tuple(c for c in slot if c in keys) for slot in p.slots), p.plan)
        return out, (f"its input is hashed by {', '.join(c for c in direct if c)}, within its "
                     f"{what}: {so}")
    have, used = closure(keys, fds)
    if all(any(c in have for c in slot) for slot in p.slots):
        hashed = [next(c for c in slot if c in have) for slot in p.slots]
        because = "; ".join(dict.fromkeys(fd.why for fd in _path(keys, hashed, used)))
        return _located(p, key, fds) or Anywhere(), (
            f"its input is hashed by {', '.join(hashed)}, which its {what} determines "
            f"({because}): rows equal on the {what} are equal on "
            f"{', '.join(hashed)}, hence on one shard")
    return None


def _located(p: Hash, key: Sequence[str], fds: Sequence[FD]) -> Located | None:
    """``p`` as seen by one column of ``key`` that determines every hashed slot, if any.

    The first column ``c`` of ``key`` that is the whole left side of a source's verified
    unique key dependency (never NULL, so it holds for every row) whose right side holds
    a column of every slot: the hashed values are then one function of ``c`` in every
    stream that dependency reaches (the source's columns, named by ``origin``), which
    :class:`Located` records to compare with.
    """
    for c in key:
        for fd in fds:
            if fd.lhs != {c} or not fd.origin:
                continue
            src = dict(fd.origin)
            hashed = [next((x for x in slot if x in src), None) for slot in p.slots]
            if any(x is None for x in hashed):
                continue
            cols = [x for x in hashed if x is not None]
            via = (fd.why, "hashing its column(s) " + ", ".join(src[x] for x in cols))
            return Located((c,), p.plan, via, tuple(cols))
    return None


def _path(start: set[str], targets: Sequence[str], used: Sequence[FD]) -> list[FD]:
    """The dependencies among ``used`` (in closure order) that derive ``targets``."""
    need = [c for c in targets if c not in start]
    out: list[FD] = []
    while need:
        c = need.pop()
        fd = next(f for f in used if c in f.rhs)
        if fd not in out:
            out.insert(0, fd)
            need += [x for x in fd.lhs if x not in start]
    return out


def _place_agg(d: Derivation, n: AggNode, want: list[Desire]) -> None:
    inp = n.inputs[0]
    p = d.natural(inp.id)
    if not n.keys:
        a = _arrive(d, n.id, 0, inp.id, Single(), f"{n.label} aggregates all rows")
        d.arrivals.append(a)
        d.placements[n.id] = Placement(n.id, Single(), "a global aggregate runs on shard 0"
                                       + ("" if a.mode != "exchange" else
                                          f"; its input ({fmt_rows(round(a.rows))} rows) is "
                                          "sent there"))
        return
    local = _group_local(p, n, d.facts.fds[inp.id])
    if local is not None:
        d.arrivals.append(_local(d, n.id, 0, inp.id, ""))
        d.placements[n.id] = Placement(n.id, local[0], local[1])
        return
    target: Hash | None = None
    why = ""
    for w in want:
        if isinstance(w.target, Hash) and set(w.target.columns) <= set(n.keys):
            target, why = w.target, f"look-ahead: {w.why}"
            break
    if target is None:
        target = Hash(tuple((k,) for k in n.keys), tuple(single_plan(inp.schema, n.keys)))
        why = "its whole group key"
    a = _arrive(d, n.id, 0, inp.id, target, f"{n.label} needs each group on one shard")
    d.arrivals.append(a)
    d.placements[n.id] = Placement(
        n.id, Hash(target.slots, target.plan),
        f"its input is brought to {target.describe()} ({why})", {"moved_rows": round(a.rows)})


def _place_unique(d: Derivation, n: UniqueNode) -> None:
    """A unique-key check: its input hashed by the key, so that equal values meet."""
    want = check_desire(n)
    a = _arrive(d, n.id, 0, n.inputs[0].id, want.target,
                f"{n.label} needs rows equal on {', '.join(n.key)} on one shard")
    d.arrivals.append(a)
    how = ("its input lies so" if a.mode == "local" else
           f"source {n.source} is delivered to it a second time, routed by "
           f"{', '.join(n.key)}" if a.mode == "delivery" else "its input is sent there")
    d.placements[n.id] = Placement(
        n.id, want.target, f"verifies {', '.join(n.key)} unique in source {n.source} where "
        f"rows are hashed by it ({how}); nothing reads it", {"moved_rows": round(a.rows)})


def _located_legs(n: JoinAllNode, nats: Sequence[Partitioning]) -> Located | None:
    """The one location every non-copied leg shares on its key, if they all do."""
    legs = [p for p in nats if not isinstance(p, Replicated)]
    if not legs or not all(isinstance(p, Located) and n.keys[pos] in p.columns
                           for pos, p in enumerate(nats) if not isinstance(p, Replicated)):
        return None
    first = legs[0]
    assert isinstance(first, Located)
    if not all(isinstance(p, Located) and p.plan == first.plan and p.via == first.via
               for p in legs):
        return None
    return first


def _place_joinall(d: Derivation, n: JoinAllNode) -> None:
    plan = join_plan(n)[:1]
    nats = [d.natural(i.id) for i in n.inputs]
    loc = _located_legs(n, nats)
    if loc is not None:
        for pos, i in enumerate(n.inputs):
            d.arrivals.append(_local(d, n.id, pos, i.id, ""))
        cols = [n.out_name(leg, k) for leg, k in zip(n.legs, n.keys, strict=True)]
        d.placements[n.id] = Placement(
            n.id, dataclasses.replace(loc, columns=tuple(dict.fromkeys(cols))),
            f"every leg is {loc.describe()} on its key: equal keys lie on one shard, so a "
            "delta join runs where its legs lie")
        return
    ok = [isinstance(p, Replicated) or (isinstance(p, Hash) and p.plan == plan
                                        and len(p.slots) == 1 and n.keys[pos] in p.slots[0])
          for pos, p in enumerate(nats)]
    if all(isinstance(p, Replicated) for p in nats):
        for pos, i in enumerate(n.inputs):
            d.arrivals.append(_local(d, n.id, pos, i.id, ""))
        d.placements[n.id] = Placement(n.id, Replicated(), "every leg is copied to every "
                                       "shard: so is its output")
        return
    if all(isinstance(p, Single) for p in nats):
        for pos, i in enumerate(n.inputs):
            d.arrivals.append(_local(d, n.id, pos, i.id, ""))
        d.placements[n.id] = Placement(n.id, Single(), "every leg is on shard 0")
        return
    moved = []
    for pos, i in enumerate(n.inputs):
        if ok[pos]:
            d.arrivals.append(_local(d, n.id, pos, i.id, ""))
        else:
            t = Hash(((n.keys[pos],),), plan)
            d.arrivals.append(_arrive(d, n.id, pos, i.id, t,
                                      f"{n.label} joins on {n.legs[pos]}.{n.keys[pos]}"))
            moved.append(n.legs[pos])
    alts: list[str] = []
    for pos, (leg, k) in enumerate(zip(n.legs, n.keys, strict=True)):
        alts.append(n.out_name(leg, k))
        p = d.arrivals_of(n.id)[pos].partitioning
        if isinstance(p, Hash):
            alts += [n.out_name(leg, c) for c in p.slots[0]]
    out = Hash((tuple(dict.fromkeys(alts)),), plan)
    why = ("every leg is hashed by its key with one key plan: a delta join runs where its "
           "legs lie" if not moved else
           f"legs {', '.join(moved)} are brought to a hash of their key")
    d.placements[n.id] = Placement(n.id, out, why)



def _place_window(d: Derivation, n: WindowNode, want: list[Desire]) -> None:
    """A window: each of its partitions on one shard (no PARTITION BY: shard 0).

    It outputs every input row with its columns, so where it runs locally its output
    lies as its input does; brought to a hash of its PARTITION BY, it lies so.
    """
    inp = n.inputs[0]
    p = d.natural(inp.id)
    if not n.partition_by:
        a = _arrive(d, n.id, 0, inp.id, Single(), f"{n.label} orders all rows together")
        d.arrivals.append(a)
        d.placements[n.id] = Placement(
            n.id, Single(), "a window without PARTITION BY sees every row: it runs on shard 0"
            + ("" if a.mode != "exchange" else
               f"; its input ({fmt_rows(round(a.rows))} rows) is sent there"))
        return
    if isinstance(p, Replicated):
        d.arrivals.append(_local(d, n.id, 0, inp.id, ""))
        d.placements[n.id] = Placement(n.id, Replicated(), "its input is copied to every "
                                       "shard: each computes the same windows, a copy")
        return
    local = _within(p, n.partition_by, d.facts.fds[inp.id], "PARTITION BY",
                    "each window partition lies on one shard")
    if local is not None:
        d.arrivals.append(_local(d, n.id, 0, inp.id, ""))
        d.placements[n.id] = Placement(n.id, p, local[1])
        return
    target: Hash | None = None
    why = ""
    for w in want:
        if isinstance(w.target, Hash) and set(w.target.columns) <= set(n.partition_by):
            target, why = w.target, f"look-ahead: {w.why}"
            break
    if target is None:
        target = Hash(tuple((k,) for k in n.partition_by),
                      tuple(single_plan(inp.schema, n.partition_by)))
        why = "its whole PARTITION BY"
    a = _arrive(d, n.id, 0, inp.id, target,
                f"{n.label} needs each window partition on one shard")
    d.arrivals.append(a)
    d.placements[n.id] = Placement(
        n.id, a.partitioning, f"its input is brought to {target.describe()} ({why})",
        {"moved_rows": round(a.rows)})
