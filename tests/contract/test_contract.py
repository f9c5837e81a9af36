"""The contract suite: one set of cases, every execution path, the same answer.

Every differential join case (each join type; ``contract_cases.join_cases``) and random
pipeline (``contract_cases.pipeline_cases``) runs its one change stream on every path of
``contract_paths.PATHS`` that takes its kind: ``Join.push``, a one-join ``Pipeline``,
the pipeline runtime, ``population.populate`` then pushes, ``population.apply`` with
``strategy="recompute"`` (where ``population.recompute.unavailable`` allows it), and
the distributed plan run without Spark.  After every step the integrated outputs equal
the oracle's (``tests/oracle.py`` for joins, DuckDB for pipelines) and bad steps are
refused whole (``contract_harness``).  Hypothesis draws (and shrinks) more join streams,
key widths mixed, on every join path.  The real Spark path is ``test_contract_spark.py``.

Default run (about a minute of CPU): one stream per join case and type, ``PIPELINE_SEEDS``
pipelines, a few drawn streams per path; ``-m slow`` adds more seeds of both and more
drawn streams.  Reproduce one test with its id, e.g.
``pytest tests/contract -k "recompute and left_pk-full-0"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from contract_cases import CaseRef, drawn_join_case, join_cases, pipeline_cases
from contract_harness import run_case
from contract_paths import PATHS, ExecPath, PipelineRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import JOIN_TYPES
from test_differential import INT_TYPES, OPS

import joinstate
import population

if TYPE_CHECKING:
    from pathlib import Path

    from contract_cases import Step
    from contract_paths import Outs

JOIN_SEEDS = (0,)
SLOW_JOIN_SEEDS = (1, 2, 3)
PIPELINE_SEEDS = tuple(range(8))
SLOW_PIPELINE_SEEDS = tuple(range(1000, 1060))


KNOWN_BUGS: dict[str, str] = {}
"""Test ids (path-case) that meet a known, reported bug: strict xfail, so a fix shows."""


def params(cases: list[CaseRef]) -> list[Any]:
    """(path, case) pairs for every path taking the case's kind."""
    out = []
    for case in cases:
        for path in PATHS:
            if case.kind in path.kinds:
                tid = f"{path.name}-{case.id}"
                marks = ([pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[tid])]
                         if tid in KNOWN_BUGS else [])
                out.append(pytest.param(path, case, id=tid, marks=marks))
    return out


@pytest.mark.parametrize(("path", "case"), params(join_cases(JOIN_SEEDS))
                         + params(pipeline_cases(PIPELINE_SEEDS)))
def test_path_matches_oracle(tmp_path: Path, path: ExecPath, case: CaseRef) -> None:
    run_case(case.make(), path, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("path", "case"), params(join_cases(SLOW_JOIN_SEEDS))
                         + params(pipeline_cases(SLOW_PIPELINE_SEEDS)))
def test_path_matches_oracle_many(tmp_path: Path, path: ExecPath, case: CaseRef) -> None:
    run_case(case.make(), path, tmp_path)


JOIN_PATHS = [p for p in PATHS if "join" in p.kinds]


def drawn(tmp_path_factory: pytest.TempPathFactory, path: ExecPath, how: str,
          left_type: pa.DataType, right_type: pa.DataType, ops: list[Any]) -> None:
    case = drawn_join_case(how, left_type, right_type, ops)
    run_case(case, path, tmp_path_factory.mktemp(path.name))


DRAWN = dict(how=st.sampled_from(JOIN_TYPES), left_type=INT_TYPES, right_type=INT_TYPES,
             ops=OPS)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@pytest.mark.parametrize("path", JOIN_PATHS, ids=lambda p: p.name)
@settings(max_examples=4, deadline=None, suppress_health_check=FIXTURE_OK)
@given(**DRAWN)
def test_drawn_streams(tmp_path_factory: pytest.TempPathFactory, path: ExecPath, how: str,
                       left_type: pa.DataType, right_type: pa.DataType, ops: list[Any]
                       ) -> None:
    """Hypothesis-drawn (and shrunk) streams over mixed key widths, on every join path."""
    drawn(tmp_path_factory, path, how, left_type, right_type, ops)


@pytest.mark.slow
@pytest.mark.parametrize("path", JOIN_PATHS, ids=lambda p: p.name)
@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE_OK)
@given(**DRAWN)
def test_drawn_streams_many(tmp_path_factory: pytest.TempPathFactory, path: ExecPath,
                            how: str, left_type: pa.DataType, right_type: pa.DataType,
                            ops: list[Any]) -> None:
    drawn(tmp_path_factory, path, how, left_type, right_type, ops)


def test_cases_cover_the_contract() -> None:
    """The default cases have deletes, duplicates, NULL keys, outer joins, reopens and
    refused steps, and every path kind runs each case kind it names."""
    cases = [ref.make() for ref in join_cases(JOIN_SEEDS) + pipeline_cases(PIPELINE_SEEDS)]
    seen: set[str] = set()
    for case in cases:
        for step in case.steps:
            seen.add(f"step:{step.kind}")
            for entries in step.changes.values():
                if step.kind == "change" and any(w < 0 for _, w in entries):
                    seen.add("delete")
                if any(w > 1 for _, w in entries) or len({r for r, _ in entries}) < len(entries):
                    seen.add("duplicate")
                if any(None in r for r, _ in entries):
                    seen.add("null")
        for node in case.outputs.values():
            how = getattr(node, "how", None)
            if how is not None:
                seen.add(f"how:{how}")
    want = {"step:load", "step:change", "step:reject", "step:reopen", "delete", "duplicate",
            "null", "how:left", "how:right", "how:full", "how:left_anti", "how:left_semi"}
    assert want <= seen, f"the default cases never have {sorted(want - seen)}"
    assert {p.name for p in PATHS} == {"push", "pipeline", "populate", "recompute",
                                       "distributed"}


class DropsARow(PipelineRunner):
    """A wrong path: every change's first output row is lost."""

    def apply(self, step: Step) -> list[Outs]:
        outs = super().apply(step)
        return [{o: t.slice(1) if t.num_rows else t for o, t in out.items()} for out in outs]


class OverCounts(PipelineRunner):
    """A wrong path: the load's outputs are delivered twice."""

    def load(self, step: Step) -> list[Outs]:
        outs = super().load(step)
        return outs + outs


def test_one_source_pipeline_populates_asymmetric(tmp_path: Path) -> None:
    """A one-source pipeline populates asymmetrically.

    Every source but the small one is big (here none): no 'other side' is looked up.
    """
    s = joinstate.source("s", schema=pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    graph = joinstate.Graph().output("out", s.filter(pc.field("v") > 0))
    store = joinstate.StateStore(str(tmp_path / "store"))
    try:
        p = joinstate.Pipeline(store, "p", graph)
        got: list[dict[str, pa.Table]] = []
        population.populate(p, sources={"s": pa.table({"k": [1, 2], "v": [1, -1]})},
                            strategy="asymmetric", progress=False, sink=got.append)
        assert [t.to_pylist() for out in got for t in out.values()] == [
            [{"k": 1, "v": 1, "_weight": 1}]]
    finally:
        store.close()


@pytest.mark.parametrize("wrong", [DropsARow, OverCounts])
def test_a_wrong_path_fails(tmp_path: Path, wrong: type[PipelineRunner]) -> None:
    """The harness can fail: a path that loses or repeats output rows is caught."""
    path = next(p for p in PATHS if p.name == "pipeline")
    case = join_cases(JOIN_SEEDS)[0].make()
    with pytest.raises(pytest.fail.Exception, match="differs from the oracle"):
        run_case(case, path, tmp_path, runner=wrong(case, tmp_path))
