"""Apply one change batch to a join or a pipeline, incrementally or by recompute.

    import population
    out = population.apply(join, "right", delta)                  # the planner decides
    rep = population.apply_batch(join, "right", delta, strategy="recompute")
    print(rep.explain())       # what ran, in how many ms, and why

``strategy="auto"`` asks the planner (:func:`planner.batch.decide_batch`), which
compares the estimated cost of both paths from the batch's rows, the rows stored, and
the costs measured on earlier batches; ``"incremental"`` is the target's push
(:meth:`joinstate.maintained.Maintained.push_change`), ``"recompute"`` the snapshot
path (:func:`population.recompute.recompute_change`).  Both give the same output and
state.  After every apply that did work the measured wall time is recorded for the
planner (:func:`planner.batch.record_batch`: one small metadata write), so later
decisions use measured costs; a replayed ``commit_id`` and a failed apply record
nothing.

A pipeline is decided per operator (:func:`planner.batch.decide_operators`): each join,
``join_all`` and window the push reaches reads its input state by key (``incremental``)
or by one scan of each index it reads (``recompute``), whichever the planner estimates
cheaper for the rows reaching it; ``"incremental"`` and ``"recompute"`` put every such
operator on that path.  The push is one transaction either way (same output, state,
commit record and errors), and each operator's measured time is recorded for later
decisions (:func:`planner.batch.record_operators`).  The report lists the operators'
decisions (``operators``) and :meth:`ApplyReport.explain` shows each with its reason.

A batch that changes several sources of a pipeline at once (a fact table and its
dimensions, as a change-data-capture micro-batch does) is applied by
:func:`apply_changes` as one push (:meth:`joinstate.Pipeline.push_many`): every
operator runs once for all of them, one transaction.  Each operator's path is decided
from the sources that reach it: their incremental estimates add up, while a recompute
scans its indexes once for all of them.

A target without a recompute path (:func:`population.recompute.unavailable`) is decided
``incremental`` by ``"auto"`` (the decision says why) and refuses ``"recompute"`` with
:class:`PopulationError`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, cast, get_args

from joinstate.ops import Strategies
from planner.batch import (
    batch_context,
    decide_operators,
    record_batch,
    record_operators,
    scanned_rows,
)
from planner.rule import Decision
from planner.rules.recompute import RecomputeRule
from population.driver import face_of
from population.errors import PopulationError
from population.recompute import recompute_change, unavailable

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa

    import joinstate
    from joinstate.maintained import Maintained
    from joinstate.ops.base import OperatorRun

__all__ = ["ApplyReport", "ApplyStrategy", "apply", "apply_batch", "apply_changes"]

ApplyStrategy = Literal["auto", "incremental", "recompute"]
_STRATEGIES: tuple[str, ...] = get_args(ApplyStrategy)


@dataclass(frozen=True)
class ApplyReport:
    """What :func:`apply_batch` did: the output, the path taken, its time, the decision.

    ``output``: the join's output change set (a table), or a pipeline's outputs (a dict
    by output name).  ``strategy``: the path that ran.  ``decision``: the planner's
    decision for the batch (for a strategy fixed by the caller, the planner's figures
    with the caller's choice).  ``ms``: wall time of the apply.  ``replayed``: the
    ``commit_id`` was already committed, so the recorded output was returned and
    nothing was applied.  ``phases``: for a recompute, the ms of its scans, hash joins
    and write (``scan_ms``, ``compute_ms``, ``write_ms``); empty otherwise.
    """

    output: pa.Table | dict[str, pa.Table]
    strategy: str
    decision: Decision
    ms: float
    replayed: bool = False
    phases: Mapping[str, float] = field(default_factory=dict)
    operators: tuple[Decision, ...] = ()
    operator_ms: Mapping[str, float] = field(default_factory=dict)
    operator_runs: Mapping[str, OperatorRun] = field(default_factory=dict)
    """A pipeline's every operator that ran: its path, rows in, ms, rows scanned."""

    def explain(self) -> str:
        """For a person: path, time, the reason with its figures; per operator for a pipeline."""
        done = "replayed a committed batch" if self.replayed else f"{self.strategy}"
        head = f"{self.decision.subject}: {done} in {self.ms:,.1f} ms. {self.decision.reason}"
        lines = [head]
        for d in self.operators:
            label = str(d.figures.get("operator", d.subject))
            ran = self.operator_ms.get(label)
            took = f" (ran in {ran:,.1f} ms)" if ran is not None else ""
            lines.append(f"  operator {label}: {d.choice}{took}. {d.reason}")
        return "\n".join(lines)


def apply(
    target: Maintained, side_or_source: str, delta: pa.Table | pa.RecordBatch, *,
    strategy: ApplyStrategy = "auto", commit_id: str | None = None,
) -> pa.Table | dict[str, pa.Table]:
    """Apply ``delta`` to a join side or pipeline source; return the output change set.

    See :func:`apply_batch` (which also returns the decision and the time).
    """
    return apply_batch(target, side_or_source, delta, strategy=strategy,
                       commit_id=commit_id).output


def apply_batch(
    target: Maintained, side_or_source: str, delta: pa.Table | pa.RecordBatch, *,
    strategy: ApplyStrategy = "auto", commit_id: str | None = None,
) -> ApplyReport:
    """Apply ``delta`` to ``side_or_source`` of ``target`` the way ``strategy`` says.

    ``target``: a :class:`joinstate.Join` (``side_or_source``: ``"left"``/``"right"``) or
    a :class:`joinstate.Pipeline` (a source name).  ``strategy``: ``"auto"`` (the
    planner's choice), ``"incremental"`` or ``"recompute"``.  ``commit_id`` makes the
    apply exactly-once whatever the path: an id already committed (by either path, or
    by ``push``) returns the recorded output and applies nothing.  Atomic: an error
    (over-retraction, unique key, weight overflow) applies nothing and is the error
    ``push`` raises.
    """
    if strategy not in _STRATEGIES:
        raise PopulationError(f"strategy={strategy!r} must be one of {_STRATEGIES}")
    face = face_of(target)
    if target.kind == "pipeline":
        return _apply_pipeline(cast("joinstate.Pipeline", target), side_or_source, delta,
                               strategy, commit_id)
    context = batch_context(target, side_or_source, delta,
                            recompute_unavailable=unavailable(target))
    planned = RecomputeRule().apply(context)[0]
    if strategy == "auto":
        decision, chosen = planned, str(planned.choice)
    else:
        if strategy == "recompute" and not context.recompute_available:
            raise PopulationError(
                f"strategy='recompute' for {context.subject}: {context.unavailable}; use "
                "strategy='incremental' or 'auto'"
            )
        decision = Decision(planned.topic, planned.subject, strategy,
                            f"{strategy}: fixed by the caller (the planner would choose "
                            f"{planned.reason})", planned.figures, planned.rule)
        chosen = strategy
    replayed = commit_id is not None and target.committed(commit_id)
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    scanned = scanned_rows(target, side_or_source) if chosen == "recompute" else 0
    outs = (recompute_change(target, side_or_source, delta, commit_id=commit_id,
                             timings=phases) if chosen == "recompute"
            else target.push_change(side_or_source, delta, commit_id=commit_id))
    ms = (time.perf_counter() - t0) * 1e3
    if not replayed and context.batch_rows:
        record_batch(target, side_or_source, chosen, context.batch_rows, scanned, ms,
                     phases.get("scan_ms", 0.0))
    return ApplyReport(face.value(target, outs), chosen, decision, ms, replayed, phases)


def _apply_pipeline(pipeline: joinstate.Pipeline, source: str, delta: pa.Table | pa.RecordBatch,
                    strategy: str, commit_id: str | None) -> ApplyReport:
    """A pipeline push with a path chosen per operator (see the module docstring)."""
    decisions, overall, decision = _decided(
        decide_operators(pipeline, source, delta), strategy,
        f"pipeline {pipeline.name!r}, source {source!r}", delta.num_rows)
    replayed = commit_id is not None and pipeline.committed(commit_id)
    chosen = Strategies({str(d.figures["operator"]): str(d.choice) for d in decisions})
    t0 = time.perf_counter()
    outs = pipeline.push(source, delta, commit_id=commit_id, strategies=chosen)
    ms = (time.perf_counter() - t0) * 1e3
    if not replayed and delta.num_rows:
        record_operators(pipeline, source, delta.num_rows, chosen.runs)
        if overall in ("incremental", "recompute"):  # the whole push, as for a join
            record_batch(pipeline, source, overall, delta.num_rows,
                         sum(r.scanned_rows for r in chosen.runs.values()), ms,
                         sum(r.scan_ms for r in chosen.runs.values()))
    return _report(pipeline, outs, decisions, overall, decision, ms, replayed, chosen)


def _decided(planned: list[Decision], strategy: str, subject: str, rows: int
             ) -> tuple[list[Decision], str, Decision]:
    """The operators' decisions as ``strategy`` fixes them, the overall path, its decision."""
    if strategy == "auto":
        decisions = planned
    else:
        decisions = [Decision(d.topic, d.subject, strategy,
                              f"{strategy}: fixed by the caller (the planner would choose "
                              f"{d.reason})", d.figures, d.rule) for d in planned]
    choices = {str(d.figures["operator"]): str(d.choice) for d in decisions}
    on = sorted(label for label, c in choices.items() if c == "recompute")
    overall = ("recompute" if on and len(on) == len(choices) else
               f"recompute for {', '.join(on)}, incremental for the rest" if on else
               "incremental")
    reason = (f"{len(choices)} operator(s) with a choice; "
              + (f"recompute: {', '.join(on)}" if on else "all incremental")
              if choices else "no operator the push reaches reads its input state by key")
    decision = Decision(planned[0].topic if planned else "batch_strategy", subject, overall,
                        f"{reason} (per operator below)",
                        {"batch_rows": rows, "operators": choices}, "recompute")
    return decisions, overall, decision


def _report(pipeline: joinstate.Pipeline, outs: dict[str, pa.Table], decisions: list[Decision],
            overall: str, decision: Decision, ms: float, replayed: bool, chosen: Strategies
            ) -> ApplyReport:
    """A pipeline apply's report: outputs, path, decisions, and every operator's run."""
    runs = {label: run.ms for label, run in chosen.runs.items() if label in chosen.choices}
    scan_ms = sum(run.scan_ms for run in chosen.runs.values())
    phases = {"scan_ms": scan_ms} if scan_ms else {}
    return ApplyReport(face_of(pipeline).value(pipeline, outs), overall, decision, ms,
                       replayed, phases, tuple(decisions), runs, dict(chosen.runs))


def apply_changes(
    pipeline: joinstate.Pipeline, changes: Mapping[str, pa.Table | pa.RecordBatch], *,
    strategy: ApplyStrategy = "auto", commit_id: str | None = None,
) -> ApplyReport:
    """Apply change sets to several sources of ``pipeline`` as one push.

    ``changes``: change sets by source name.  The output is the sum of what
    :func:`apply_batch` per source would return, in one transaction (all or nothing)
    that runs every operator once (:meth:`joinstate.Pipeline.push_many`).
    ``strategy``: as :func:`apply_batch`; ``"auto"`` decides each operator from every
    source that reaches it (:func:`combined_decisions`).  ``commit_id``: exactly-once for
    the whole set of changes.  A push to several sources records no measured runs for
    the planner: its operators' times mix the sources' fan-outs, which later per-source
    decisions could not tell apart.
    """
    if strategy not in _STRATEGIES:
        raise PopulationError(f"strategy={strategy!r} must be one of {_STRATEGIES}")
    if getattr(pipeline, "kind", None) != "pipeline":
        raise PopulationError(
            "apply_changes applies changes to several sources of a pipeline in one push; "
            f"{pipeline!r} is not a pipeline (a join's sides are applied one at a time "
            "with apply_batch)")
    if not changes:
        raise PopulationError(
            f"apply_changes on pipeline {pipeline.name!r} was given no change set; give "
            f"one per changed source (its sources: {list(pipeline.sources)})")
    if len(changes) == 1:
        ((source, delta),) = changes.items()
        return _apply_pipeline(pipeline, source, delta, strategy, commit_id)
    names = ", ".join(repr(s) for s in changes)
    decisions, overall, decision = _decided(
        combined_decisions(pipeline, changes), strategy,
        f"pipeline {pipeline.name!r}, sources {names}",
        sum(d.num_rows for d in changes.values()))
    replayed = commit_id is not None and pipeline.committed(commit_id)
    chosen = Strategies({str(d.figures["operator"]): str(d.choice) for d in decisions})
    t0 = time.perf_counter()
    outs = pipeline.push_many(changes, commit_id=commit_id, strategies=chosen)
    ms = (time.perf_counter() - t0) * 1e3
    return _report(pipeline, outs, decisions, overall, decision, ms, replayed, chosen)


def combined_decisions(pipeline: joinstate.Pipeline,
                       changes: Mapping[str, pa.Table | pa.RecordBatch]) -> list[Decision]:
    """Each operator's path for one push of several sources' changes.

    Every source is decided on its own (:func:`planner.batch.decide_operators`); an
    operator several of them reach is recomputed only if that is cheaper by the rule's
    margin, comparing the summed incremental estimates with one recompute: the largest
    of the sources' scans (a recompute scans each index once, whatever number of
    sources changed) plus each source's per-row and fixed costs.  One whose every
    index is held in memory for all of them stays incremental, as for one source.
    """
    by_label: dict[str, list[tuple[str, Decision]]] = {}
    for source, delta in changes.items():
        for d in decide_operators(pipeline, source, delta):
            by_label.setdefault(str(d.figures["operator"]), []).append((source, d))
    out: list[Decision] = []
    for label, found in by_label.items():
        if len(found) == 1:
            out.append(found[0][1])
            continue
        names = ", ".join(repr(s) for s, _ in found)
        subject = f"pipeline {pipeline.name!r}, operator {label} (push to {names})"
        inc = sum(float(d.figures.get("incremental_ms", 0.0)) for _, d in found)
        scans = [float(d.figures.get("recompute_us_per_scanned_row", 0.0))
                 * float(d.figures.get("scanned_rows", 0)) / 1e3 for _, d in found]
        rec = max(scans) + sum(float(d.figures.get("recompute_ms", 0.0)) - scan
                               for (_, d), scan in zip(found, scans, strict=True))
        margin = max(float(d.figures.get("margin", 0.0)) for _, d in found)
        figures = {"operator": label,
                   "batch_rows": sum(float(d.figures.get("batch_rows", 0)) for _, d in found),
                   "scanned_rows": max(float(d.figures.get("scanned_rows", 0))
                                       for _, d in found),
                   "incremental_ms": round(inc, 3), "recompute_ms": round(rec, 3),
                   "margin": margin, "sources": [s for s, _ in found]}
        if all(d.figures.get("held_in_memory") for _, d in found):
            choice = "incremental"
            reason = f"incremental: reached by {names}; {found[0][1].reason}"
        else:
            choice = "recompute" if rec < inc * (1.0 - margin) else "incremental"
            reason = (f"{choice}: reached by {names}; incremental ~{inc:,.1f} ms (the "
                      f"sources' estimates added) against recompute ~{rec:,.1f} ms (one "
                      "scan of its indexes for all of them, plus each source's rows)"
                      + ("" if choice == "recompute" or rec >= inc else
                         f"; recompute is not {margin:.0%} cheaper"))
        out.append(Decision(found[0][1].topic, subject, choice, reason, figures,
                            found[0][1].rule))
    return out
