"""A plan: every physical decision, with the figures that drove it, and how to read it.

::

    plan = planner.plan_join(planner.stats.from_table(customers, keys=["c_customer_sk"]),
                             planner.stats.from_parquet("sales/", keys=["ss_customer_sk"]))
    plan.get("strategy")          # 'bulk'
    print(plan.explain())         # the decisions as a tree, each with its reason

Entry points: :func:`plan_join` (statistics only) and :func:`plan_population` (anything
maintained: a :class:`joinstate.Join` or a :class:`joinstate.Pipeline`, with its inputs'
statistics); each builds a :class:`~planner.context.PlanContext` and runs
:data:`planner.rules.RULES` over it in order (:func:`run`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.errors import PlannerError
from planner.rule import latest_decision
from planner.rules import RULES
from planner.shape import context_of, join_context

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from joinstate.maintained import Maintained
    from planner.context import PlanContext, PlannerSettings
    from planner.history import History
    from planner.rule import Decision, Rule
    from planner.stats import SourceStats

__all__ = ["Plan", "join_context", "plan_join", "plan_population", "run"]

_MISSING = object()


def run(context: PlanContext, rules: Iterable[Rule] = RULES) -> Plan:
    """Apply ``rules`` in order; each sees the decisions of the ones before it."""
    names = []
    for rule in rules:
        context = context.with_decisions(rule.apply(context))
        names.append(rule.name)
    return Plan(context.kind, context.name, context.decisions, tuple(names), context)


@dataclass(frozen=True)
class Plan:
    """The decisions of one planning run, in the order the rules took them."""

    kind: str
    name: str
    decisions: tuple[Decision, ...]
    rules: tuple[str, ...] = ()
    context: PlanContext | None = field(default=None, compare=False, repr=False)

    def decision(self, topic: str, subject: str | None = None) -> Decision | None:
        """The decision on ``topic`` about ``subject`` (default: the plan's root)."""
        return latest_decision(self.decisions, topic, self.name if subject is None else subject)

    def get(self, topic: str, subject: str | None = None, default: Any = _MISSING) -> Any:
        """The choice on ``topic`` about ``subject`` (default: the plan's root).

        Raises :class:`~planner.errors.PlannerError` naming what exists if there is no
        such decision and no ``default``.
        """
        d = self.decision(topic, subject)
        if d is not None:
            return d.choice
        if default is not _MISSING:
            return default
        have = sorted({d.subject for d in self.decisions if d.topic == topic})
        raise PlannerError(f"plan of {self.kind} {self.name!r} has no {topic!r} decision about "
                           f"{subject or self.name!r} (it has one about {have})")

    def where(self, topic: str) -> list[Decision]:
        """Every decision on ``topic``."""
        return [d for d in self.decisions if d.topic == topic]

    def side_index(self, side: str) -> str:
        """A join plan's index (column family) of ``side`` (``"left"``/``"right"``)."""
        if self.context is None or not self.context.joins:
            raise PlannerError(f"plan of {self.kind} {self.name!r} has no join sides")
        return self.context.joins[0].index(side)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: the decisions and the statistics they came from."""
        ctx = self.context
        return {
            "kind": self.kind, "name": self.name, "rules": list(self.rules),
            "decisions": [d.to_dict() for d in self.decisions],
            "sources": {} if ctx is None else {k: v.to_dict() for k, v in ctx.sources.items()},
        }

    # ---- the readable tree --------------------------------------------------------------

    def _groups(self) -> list[tuple[str, list[Decision]]]:
        ctx = self.context
        titles: dict[str, str] = {}
        if ctx is not None:
            for j in ctx.joins:
                titles[j.name] = f"join {j.name} ({j.left} x {j.right}, {j.how})"
            for ix in ctx.indexes:
                titles[ix.name] = f"index {ix.name}" + (f" ({ix.label})" if ix.label else "")
            for g in ctx.share_groups:
                titles[f"{g.stream}[{','.join(g.key)}]"] = (
                    f"input {g.stream} by {list(g.key)} ({len(g.readers)} readers)")
            for s in ctx.sources:
                titles.setdefault(s, f"source {s}")
        titles[self.name] = f"{self.kind} {self.name}"
        order = [self.name, *(k for k in titles if k != self.name)]
        by: dict[str, list[Decision]] = {}
        for d in self.decisions:
            by.setdefault(d.subject, []).append(d)
        out = [(titles[s], by.pop(s)) for s in order if s in by]
        out += [(s, ds) for s, ds in by.items()]
        return out

    def explain(self) -> str:
        """Every decision as a tree: what it is about, the choice, why, and its figures."""
        lines = [f"plan of {self.kind} {self.name!r}: {len(self.decisions)} decisions by "
                 f"{len(self.rules)} rules"]
        groups = self._groups()
        for gi, (title, ds) in enumerate(groups):
            last_group = gi == len(groups) - 1
            lines.append(("└─ " if last_group else "├─ ") + title)
            pad = "   " if last_group else "│  "
            for di, d in enumerate(ds):
                branch = "└─ " if di == len(ds) - 1 else "├─ "
                lines.append(f"{pad}{branch}{d.topic}: {_show(d.choice)} — {d.reason}")
                figs = _figures(d.figures)
                if figs:
                    cont = "   " if di == len(ds) - 1 else "│  "
                    lines.append(f"{pad}{cont}   [{figs}]")
        return "\n".join(lines)


def _show(choice: Any) -> str:
    if choice is None:
        return "default"
    if isinstance(choice, dict):
        parts = [str(choice.get("policy", ""))]
        if choice.get("disable_before"):
            parts.append("off from " + ", ".join(choice["disable_before"]))
        if choice.get("compact_after"):
            parts.append("compacted after " + ", ".join(choice["compact_after"]))
        return "; ".join(p for p in parts if p)
    if isinstance(choice, list):
        return " -> ".join(str(c) for c in choice)
    return str(choice)


def _figures(figures: Mapping[str, Any], limit: int = 160) -> str:
    parts = []
    for k, v in figures.items():
        if v is None or v == [] or v == {}:
            continue
        text = json.dumps(v, separators=(",", ":"), default=str) if isinstance(
            v, dict | list) else (f"{v:,}" if isinstance(v, int) and not isinstance(v, bool)
                                  else str(v))
        parts.append(f"{k}={text}")
    out = ", ".join(parts)
    return out if len(out) <= limit else out[:limit - 1] + "…"


# ---- entry points ------------------------------------------------------------------------


def plan_join(left: SourceStats, right: SourceStats, *, name: str = "join",
              how: str = "inner", left_key: Sequence[str] | None = None,
              right_key: Sequence[str] | None = None,
              bulk_loadable: Mapping[str, bool] | None = None,
              history: History | None = None, settings: PlannerSettings | None = None,
              **given: Any) -> Plan:
    """Plan a join from its inputs' statistics alone (see :func:`planner.shape.join_context`).

    ``given`` fixes choices instead of deciding them (``strategy=``, ``small_side=``,
    ``order=``, ``compaction=``, ``memtables=``, ``probe=``, ``shards=``; ``None`` leaves
    a choice to the rules).

    >>> from planner.stats import given
    >>> p = plan_join(given("left", 100_000), given("right", 3_000_000, snapshot=True))
    >>> p.get("small_side", "join"), p.get("strategy", "join"), p.get("compaction")
    ('left', 'bulk', 'bulk-load')
    """
    return run(join_context(left, right, name=name, how=how, left_key=left_key,
                            right_key=right_key, bulk_loadable=bulk_loadable, history=history,
                            settings=settings, **given))


def plan_population(target: Maintained, stats: Mapping[str, SourceStats], *,
                    history: History | None = None, settings: PlannerSettings | None = None,
                    **given: Any) -> Plan:
    """Plan the population of ``target`` whose inputs ``stats`` describe.

    ``stats`` maps input names to their statistics: a join's ``"left"`` and ``"right"``
    (both needed), a pipeline's sources that load (those left out stay empty).  Index
    names, layouts and bulk-loadability come from the target, the probe settings from
    its store (:func:`planner.shape.context_of`).  ``history`` defaults to nothing
    recorded; population passes what the store recorded for the target's owner
    (:func:`planner.history.read_history`).  ``given`` fixes choices (see
    :func:`plan_join`).
    """
    return run(context_of(target, stats, history=history, settings=settings, **given))
