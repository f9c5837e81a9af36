"""Population of pipelines: every strategy gives the same state and outputs, resumes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate
import population
from joinstate.testing import integrate
from population import PipelineReport, PopulationError, PopulationInterruptedError

if TYPE_CHECKING:
    from pathlib import Path

CS = pa.schema([("ck", pa.int64()), ("name", pa.string())])
DS = pa.schema([("dk", pa.int32()), ("yr", pa.int32())])
SS = pa.schema([("sk", pa.int64()), ("dsk", pa.int32()), ("amt", pa.decimal128(7, 2))])


def data(seed: int = 0, n: int = 4000) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed)
    cust = pa.table({"ck": np.arange(200), "name": [f"n{i % 37}" for i in range(200)]},
                    schema=CS)
    dates = pa.table({"dk": np.arange(30, dtype=np.int32),
                      "yr": (2000 + np.arange(30) // 10).astype(np.int32)}, schema=DS)
    sk = rng.integers(0, 230, n).astype(object)
    sk[rng.random(n) < 0.05] = None
    sales = pa.table({"sk": pa.array(sk, pa.int64()),
                      "dsk": rng.integers(0, 32, n).astype(np.int32),
                      "amt": pa.array([f"{v / 100:.2f}" for v in rng.integers(0, 99999, n)],
                                      pa.string()).cast(pa.decimal128(7, 2))}, schema=SS)
    return {"customer": cust, "date_dim": dates, "sales": sales}


def build(store: joinstate.StateStore, share: bool = True) -> joinstate.Pipeline:
    c = joinstate.source("customer", CS, unique_key="ck")
    d = joinstate.source("date_dim", DS, unique_key="dk")
    s = joinstate.source("sales", SS)
    per_year = (s.join(c, on=("sk", "ck")).join(d, on=("dsk", "dk"))
                .group_by(["name", "yr"]).aggregate(total=("sum", "amt"), n=("count", None)))
    graph = joinstate.Graph().output("per_year", per_year)
    graph = graph.output("growth", joinstate.join_all(
        {"a": per_year.filter(pc.field("yr") == 2000),
         "b": per_year.filter(pc.field("yr") == 2001)}, on="name"))
    return joinstate.Pipeline(store, "mini", graph, share_indexes=share)


def reference(d: dict[str, pa.Table]) -> dict[tuple[Any, ...], int]:
    """per_year from scratch, with plain Python."""
    names = dict(zip(d["customer"]["ck"].to_pylist(), d["customer"]["name"].to_pylist(),
                     strict=True))
    years = dict(zip(d["date_dim"]["dk"].to_pylist(), d["date_dim"]["yr"].to_pylist(),
                     strict=True))
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for sk, dsk, amt in zip(*(d["sales"][c].to_pylist() for c in ("sk", "dsk", "amt")),
                            strict=True):
        if sk in names and dsk in years:
            g = groups.setdefault((names[sk], years[dsk]), [0, 0])
            g[0] += amt
            g[1] += 1
    return {(k[0], k[1], v[0], v[1]): 1 for k, v in groups.items()}


@pytest.mark.parametrize("strategy", ["symmetric", "asymmetric", "auto"])
def test_every_strategy_gives_the_same_outputs(tmp_path: Path, strategy: str) -> None:
    d = data()
    outs: dict[str, list[pa.Table]] = {}
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        report = population.populate(
            p, sources=d, strategy=strategy, progress=False, batch_rows=700,
            sink=lambda o: [outs.setdefault(k, []).append(v) for k, v in o.items()],
        )
        assert isinstance(report, PipelineReport)
        # small sources first, whatever the dict order
        assert report.order == ["date_dim", "customer", "sales"]
        assert report.rows == sum(t.num_rows for t in d.values())
        assert p.phase == "live"
        assert report.operators  # per operator
        if strategy == "asymmetric":
            disabled = {a["cf"] for a in report.actions if a["action"] == "disable"}
            enabled = {a["cf"] for a in report.actions if a["action"] == "enable"}
            assert disabled and disabled <= enabled  # the guard turned every one back on
            assert any(a["action"] == "compact" for a in report.actions)
        if strategy == "auto":
            # a few KiB of input fit one memtable: nothing would be compacted anyway
            assert report.strategy == "auto->symmetric" and not report.actions
            assert "fits one memtable" in report.explain
        # the executed schedule is the plan's, index by index
        planned = {d["subject"]: d["choice"] for d in report.plan["decisions"]
                   if d["topic"] == "compaction"}
        assert set(planned) == {ix.column_family for ix in p.indexes()}
        compacted = {a["cf"] for a in report.actions if a["action"] == "compact"}
        assert compacted == {cf for ix in p.indexes() for cf in ix.data_column_families
                             if planned[ix.column_family]["compact_after"]}
    assert integrate(outs["per_year"]) == reference(d)


def test_a_live_pipeline_is_not_populated_twice(tmp_path: Path) -> None:
    d = data(n=500)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        population.populate(p, sources=d, progress=False)
        with pytest.raises(PopulationError, match="already live"):
            population.populate(p, sources=d, progress=False)


def test_bad_arguments_name_what_is_wrong(tmp_path: Path) -> None:
    d = data(n=100)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        with pytest.raises(PopulationError, match="no source"):
            population.populate(p, sources={"nope": d["sales"]}, progress=False)
        with pytest.raises(PopulationError, match="bulk"):
            population.populate(p, sources=d, strategy="bulk", progress=False)
        with pytest.raises(PopulationError, match="sources="):
            population.populate(p, d["customer"], d["sales"], progress=False)  # type: ignore[call-overload]


class Boom(RuntimeError):
    pass


def test_an_interrupted_population_resumes_to_the_same_result(tmp_path: Path) -> None:
    d = data(seed=3)
    seen: list[tuple[str, int, dict[str, pa.Table]]] = []
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        calls = {"n": 0}

        def failing(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
            calls["n"] += 1
            seen.append((batch.side, batch.index, outs))
            if batch.side == "sales" and batch.index == 2:
                raise Boom

        with pytest.raises(Boom):
            population.populate(p, sources=d, progress=False, batch_rows=600, sink=failing)
        with pytest.raises(PopulationInterruptedError, match="resume=True"):
            population.populate(p, sources=d, progress=False, batch_rows=600)
        resumed: list[tuple[str, int, dict[str, pa.Table]]] = []
        report = population.populate(
            p, sources=d, progress=False, batch_rows=600, resume=True,
            sink=lambda o, b: resumed.append((b.side, b.index, o)),
        )
        assert report.redelivered == {"sales": 2}
        skipped = {s.name: s.skipped_batches for s in report.sources}
        assert skipped["sales"] == 2 and skipped["customer"] == 1
    # Drop the interrupted run's delivery of the re-delivered batch, keep the rest.
    kept = [o for side, i, o in seen if not (side == "sales" and i >= 2)]
    kept += [o for _, _, o in resumed]
    assert integrate([o["per_year"] for o in kept]) == reference(d)


def test_a_changed_input_is_refused_on_resume(tmp_path: Path) -> None:
    d = data(seed=4)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)

        def failing(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
            if batch.side == "sales" and batch.index == 1:
                raise Boom

        with pytest.raises(Boom):
            population.populate(p, sources=d, progress=False, batch_rows=500, sink=failing)
        other = dict(d, sales=data(seed=5)["sales"])
        with pytest.raises(PopulationInterruptedError, match="differs"):
            population.populate(p, sources=other, progress=False, batch_rows=500, resume=True)


def live_batches(d: dict[str, pa.Table]) -> list[tuple[str, pa.Table]]:
    """Live changes after population: sales deleted and re-added, a customer renamed."""
    sales = d["sales"]
    w = pa.array([-1] * 50, pa.int64())
    out = [("sales", sales.slice(0, 50).append_column("_weight", w))]
    out.append(("customer", pa.table({"ck": [5, 5], "name": ["n5", "renamed"],
                                      "_weight": [-1, 1]}, schema=CS.append(
        pa.field("_weight", pa.int64())))))
    out.append(("sales", sales.slice(0, 50)))
    return out


def apply_live(d: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The inputs after every live batch."""
    sales = d["sales"].slice(50).append_column(
        "_weight", pa.array([1] * (d["sales"].num_rows - 50), pa.int64()))
    sales = pa.concat_tables([sales.drop_columns(["_weight"]), d["sales"].slice(0, 50)])
    names = d["customer"]["name"].to_pylist()
    names[5] = "renamed"
    cust = pa.table({"ck": d["customer"]["ck"], "name": names}, schema=CS)
    return dict(d, sales=sales, customer=cust)
