"""An interrupted pipeline population: resuming it, and dropping the pipeline instead.

* The progress markers record the run's parameters: ``populate(resume=True)`` without
  ``batch_rows=`` continues with the interrupted run's, and a contradicting argument is
  refused naming it (never blamed on the input).
* The interrupted-population error says what a resume accepts (sources with batches
  loaded must give those same batches first; a source with nothing loaded, or the
  batches after the loaded ones, may be new: a corrected file) and names the other
  remedy, ``store.drop_pipeline(name)``.
* ``drop_pipeline`` removes every family and record of the pipeline (and nothing of
  another), so the name can be created again with another definition.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_population_pipeline import CS, SS, build, data, integrate, reference

import joinstate
import population
from joinstate.names import pipeline_column_families
from population import PopulationError, PopulationInterruptedError

if TYPE_CHECKING:
    from collections.abc import Callable


class Boom(Exception):
    pass


def fail_at(source: str, index: int) -> Callable[[dict[str, pa.Table], population.OutputBatch],
                                                  None]:
    def sink(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
        if batch.side == source and batch.index == index:
            raise Boom

    return sink


# ---- resuming with the run's own parameters ------------------------------------------------


def test_resume_uses_the_interrupted_runs_batch_rows(tmp_path: Path) -> None:
    d = data(seed=3)
    delivered: dict[tuple[str, int], pa.Table] = {}  # the last delivery of each batch

    def sink(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
        delivered[(batch.side, batch.index)] = outs["per_year"]

    def failing(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
        sink(outs, batch)
        if batch.side == "sales" and batch.index == 5:
            raise Boom

    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        with pytest.raises(Boom):
            population.populate(p, sources=d, progress=False, batch_rows=250,
                                strategy="symmetric", sink=failing)
        # Neither batch_rows nor strategy repeated: the markers know them.
        report = population.populate(p, sources=d, progress=False, resume=True, sink=sink)
        assert report.strategy == "symmetric"
        skipped = {s.name: s.skipped_batches for s in report.sources}
        assert skipped["sales"] == 5, skipped
        assert report.redelivered == {"sales": 5}
        assert p.phase == "live"
        assert all(p.progress(s) is None for s in p.sources)
    assert integrate(list(delivered.values())) == reference(d)


def test_resume_with_other_parameters_names_them(tmp_path: Path) -> None:
    d = data(seed=3)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        with pytest.raises(Boom):
            population.populate(p, sources=d, progress=False, batch_rows=250,
                                strategy="symmetric", sink=fail_at("sales", 3))
        with pytest.raises(PopulationError, match=r"batch_rows=400.*250") as info:
            population.populate(p, sources=d, progress=False, resume=True, batch_rows=400)
        assert "input" not in str(info.value).split("batch_rows")[0]
        with pytest.raises(PopulationError, match=r"strategy='asymmetric'.*'symmetric'"):
            population.populate(p, sources=d, progress=False, resume=True,
                                strategy="asymmetric")
        # Refusals change nothing: the same resume then completes.
        report = population.populate(p, sources=d, progress=False, resume=True,
                                     batch_rows=250, strategy="symmetric")
        assert report.redelivered == {"sales": 3}
        assert p.phase == "live"


# ---- what the interrupted-population error allows --------------------------------------------


def bad_sales(d: dict[str, pa.Table]) -> pa.Table:
    """The sales file with a wrong column type (amounts as text)."""
    s = d["sales"]
    return s.set_column(2, "amt", pc.cast(s.column("amt"), pa.string()))


def test_a_corrected_file_for_the_source_that_failed_resumes(tmp_path: Path) -> None:
    d = data(seed=6)
    outs: list[pa.Table] = []
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        with pytest.raises(joinstate.SchemaMismatchError, match="amt"):
            population.populate(p, sources=dict(d, sales=bad_sales(d)), progress=False,
                                batch_rows=500, strategy="symmetric",
                                sink=lambda o: outs.append(o["per_year"]))
        with pytest.raises(PopulationInterruptedError) as info:
            population.populate(p, sources=d, progress=False, batch_rows=500)
        msg = str(info.value)
        # It says what a resume accepts and how to start over, in the user's terms.
        assert "resume=True" in msg and "store.drop_pipeline('mini')" in msg, msg
        assert "customer" in msg and "date_dim" in msg and "sales" in msg, msg
        assert "corrected" in msg, msg
        assert "with the same inputs" not in msg, msg
        population.populate(p, sources=d, progress=False, resume=True,
                            sink=lambda o: outs.append(o["per_year"]))
        assert p.phase == "live"
    assert integrate(outs) == reference(d)


def test_a_changed_loaded_source_is_refused_with_both_remedies(tmp_path: Path) -> None:
    d = data(seed=6)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        with pytest.raises(Boom):
            population.populate(p, sources=d, progress=False, batch_rows=500,
                                sink=fail_at("sales", 2))
        other = dict(d, sales=data(seed=7)["sales"])
        with pytest.raises(PopulationInterruptedError, match="differs") as info:
            population.populate(p, sources=other, progress=False, resume=True)
        msg = str(info.value)
        assert "sales" in msg and "2 batches" in msg and "drop_pipeline('mini')" in msg, msg
        # A shorter input (fewer batches than were loaded) is a changed input too.
        short = dict(d, sales=d["sales"].slice(0, 600))
        with pytest.raises(PopulationInterruptedError, match="differs") as info:
            population.populate(p, sources=short, progress=False, resume=True)
        assert "drop_pipeline('mini')" in str(info.value)
        store.drop_pipeline("mini")
        q = build(store)
        outs: list[pa.Table] = []
        population.populate(q, sources=other, progress=False,
                            sink=lambda o: outs.append(o["per_year"]))
    assert integrate(outs) == reference(other)


# ---- drop_pipeline -------------------------------------------------------------------------


def meta_mentions(store: joinstate.StateStore, name: str) -> list[bytes]:
    """Every ``__meta__`` key that names pipeline ``name`` or one of its families."""
    needles = (f"pipeline~{name}".encode(), f"~{name}".encode(), name.encode() + b"~",
               b"\x00" + name.encode())
    return [k for k in store.meta_keys(b"") if any(n in k for n in needles)
            and b"mini2" not in k]


def test_drop_then_create_with_another_definition(tmp_path: Path) -> None:
    d = data(seed=8)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        population.populate(p, sources=d, progress=False, batch_rows=700)
        p.push("sales", d["sales"].slice(0, 10), commit_id="c1")
        ks = joinstate.source("sales", SS)  # another pipeline, untouched
        keep = joinstate.Pipeline(store, "mini2", joinstate.Graph().output(
            "n", ks.group_by(["dsk"]).aggregate(n=("count", None)), materialize=True))
        keep.push("sales", d["sales"].slice(0, 100))
        kept = keep.read("n")
        families = set(store.column_families())
        mine = set(pipeline_column_families(sorted(families), "mini"))
        assert mine and not any("mini2" in cf for cf in mine)
        store.drop_pipeline("mini")
        assert not set(pipeline_column_families(store.column_families(), "mini"))
        assert set(store.column_families()) == families - mine
        assert meta_mentions(store, "mini") == []
        assert "mini" not in joinstate.inspect.stored_names(store)
        assert not [f for f in (store.path / "derived").glob("*")
                    if "mini_" in f.name and "mini2" not in f.name]
        with pytest.raises(joinstate.StateClosedError):
            p.push("sales", d["sales"].slice(0, 1))
        # The name takes another definition; it starts empty, in the population phase.
        c = joinstate.source("customer", CS, unique_key="ck")
        graph = joinstate.Graph().output(
            "names", c.group_by(["name"]).aggregate(n=("count", None)), materialize=True)
        q = joinstate.Pipeline(store, "mini", graph)
        assert q.phase == "population"
        assert q.read("names").num_rows == 0
        q.push("customer", d["customer"])
        assert sum(q.read("names").column("n").to_pylist()) == d["customer"].num_rows
        assert keep.read("n").equals(kept)
        store.verify()
    with joinstate.StateStore(tmp_path / "s") as store:  # and after a reopen
        assert sorted(joinstate.inspect.stored_names(store)) == ["mini", "mini2"]


def test_drop_an_interrupted_population_then_populate_again(tmp_path: Path) -> None:
    d = data(seed=9)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        with pytest.raises(Boom):
            population.populate(p, sources=d, progress=False, batch_rows=500,
                                sink=fail_at("sales", 3))
        store.drop_pipeline("mini")
        q = build(store)
        outs: list[pa.Table] = []
        population.populate(q, sources=d, progress=False, batch_rows=500,
                            sink=lambda o: outs.append(o["per_year"]))
    assert integrate(outs) == reference(d)


def test_drop_of_an_unknown_pipeline_or_on_a_read_only_store_is_refused(tmp_path: Path
                                                                        ) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        build(store).push("customer", data()["customer"])
        with pytest.raises(joinstate.JoinSpecMismatchError, match=r"'nope'.*'mini'"):
            store.drop_pipeline("nope")
        with pytest.raises(joinstate.SchemaMismatchError, match="pipeline name"):
            store.drop_pipeline("a~b")
    with joinstate.StateStore(tmp_path / "s", read_only=True) as ro, \
            pytest.raises(joinstate.StateReadOnlyError, match="drop pipeline 'mini'"):
        ro.drop_pipeline("mini")
    with joinstate.StateStore(tmp_path / "s") as store:
        assert joinstate.inspect.stored_names(store) == ["mini"]


DROP_CHILD = """
import os, signal, sys
import joinstate
from joinstate.db import Database
path, kind, name, when = sys.argv[1:5]
inner = Database.drop_column_families

def dying(self, names):
    if when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    inner(self, names)
    os.kill(os.getpid(), signal.SIGKILL)

store = joinstate.StateStore(path)  # finishes an earlier drop, then this one dies
Database.drop_column_families = dying
(store.drop_pipeline if kind == "pipeline" else store.drop_join)(name)
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_kill_9_during_a_drop_finishes_it_on_reopen(tmp_path: Path, when: str) -> None:
    """Killed after the records went and before (or after) the families did."""
    d = data(seed=10)
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        population.populate(build(store), sources=d, progress=False, batch_rows=700)
        j = store.join("j", left=joinstate.Side(CS, key=["ck"]),
                       right=joinstate.Side(CS, key=["ck"]))
        j.push("left", d["customer"])
        before = set(store.column_families())
        dropped = set(pipeline_column_families(sorted(before), "mini"))
        dropped |= set(j.column_families())
    for kind, name in (("pipeline", "mini"), ("join", "j")):
        child = subprocess.run([sys.executable, "-c", DROP_CHILD, str(path), kind, name, when],
                               capture_output=True, text=True, check=False, timeout=120,
                               cwd=Path(__file__).resolve().parents[1])
        assert child.returncode == -9, child.stderr
    with joinstate.StateStore(path) as store:
        assert set(store.column_families()) == before - dropped
        assert store.joins() == []
        assert joinstate.inspect.stored_names(store) == []
        assert meta_mentions(store, "mini") == []
        assert not [k for k in store.meta_keys(b"") if b"drop\x00" in k or b"j." in k]
        outs: list[pa.Table] = []
        population.populate(build(store), sources=d, progress=False, batch_rows=700,
                            sink=lambda o: outs.append(o["per_year"]))
        store.verify()
    assert integrate(outs) == reference(d)
