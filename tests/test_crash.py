"""Population survives kill -9 anywhere and resumes to exactly an uninterrupted run.

Each case runs ``population.populate`` in a child process (``tests/crash_child.py``)
over generated customers x sales (3k x 30k rows, 1,000-row batches, 4,000-row SST
runs for ``bulk``) and SIGKILLs it at a seeded point: in the output sink, around a
transaction commit, around an SST ingestion and between the steps of a durable
ingestion, before going live, after going live.  The parent reopens the store and
checks: auto-compaction is on, a plain ``populate`` refuses with
``PopulationInterruptedError``, ``populate(resume=True)`` finishes, and then both
sides' state equals an uninterrupted run's (the child run without a kill), each
side's row counter equals its state's weight, ``store.verify()`` passes, and the
outputs delivered before the crash (minus the re-delivered range the report names)
plus the resumed run's add up to exactly the uninterrupted run's output.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import joinstate
import population
from joinstate.activity import auto_compaction_flags
from joinstate.testing import integrate, zset
from population import synthetic as syn
from population.bulk import STAGING

if TYPE_CHECKING:
    from collections.abc import Iterator

CHILD = Path(__file__).with_name("crash_child.py")
JOIN = "cs"
BASE = {"customers": 3000, "sales": 30000, "deletes": 0, "batch_rows": 1000,
        "bulk_run_rows": 4000}

# (strategy, order, how) -> kill points; the n-th arrival is drawn with a seed from how
# often the uninterrupted run reaches the point.
COMBOS: dict[tuple[str, str, str], list[str]] = {
    ("symmetric", "small-first", "inner"): ["sink", "commit-before", "commit", "go-live"],
    ("symmetric", "interleaved", "full"): ["sink", "commit", "sink-before", "go-live"],
    ("asymmetric", "small-first", "inner"): ["sink", "commit", "commit-before", "sink-before"],
    ("asymmetric", "interleaved", "left"): ["sink", "commit", "commit-before", "go-live"],
    ("bulk", "small-first", "inner"): ["ingest", "ingest-after", "durable", "intent",
                                       "cf-ingest", "sink"],
    ("bulk", "interleaved", "inner"): ["ingest", "durable", "intent", "cf-ingest", "commit"],
}
CASES = [(*combo, point) for combo, points in COMBOS.items() for point in points]


def run_child(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=120)


def sides() -> tuple[joinstate.Side, joinstate.Side]:
    return (joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                           unique_key=["c_customer_sk"]),
            joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"]))


def inputs(spec: dict[str, Any]) -> tuple[pa.Table, pa.Table]:
    sys.path.insert(0, str(CHILD.parent))
    try:
        from crash_child import data
    finally:
        sys.path.remove(str(CHILD.parent))
    return data(spec["customers"], spec["sales"], spec["deletes"])


def delivered(out: Path) -> Iterator[tuple[str, int, pa.Table]]:
    """The outputs a child delivered: ``(side, batch index, table)``."""
    for f in sorted(out.glob("*.arrow")):
        side, index = f.stem.split("-")
        with pa.memory_map(str(f)) as m:
            yield side, int(index), pa.ipc.open_file(m).read_all()


class Reference:
    """An uninterrupted child run: final state, summed output, and how often each kill
    point was reached."""

    def __init__(self, tmp: Path, spec: dict[str, Any]) -> None:
        proc = run_child({**spec, "path": str(tmp / "state"), "out": str(tmp / "out"),
                          "kill": ["none", 0]})
        assert proc.returncode == 0, proc.stderr
        self.counts: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
        with joinstate.StateStore(tmp / "state", read_only=True) as store:
            join = store.join(JOIN)
            self.columns = [n for n in join.output_schema.names if n != "_weight"]
            self.state = {s: zset(join.state(s), join.state(s).schema.names[:-1])
                          for s in ("left", "right")}
        self.output = integrate([t for _, _, t in delivered(tmp / "out")], self.columns)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, Reference] = {}

    def get(spec: dict[str, Any]) -> Reference:
        key = json.dumps(spec, sort_keys=True)
        if key not in cache:
            cache[key] = Reference(tmp_path_factory.mktemp("reference"), spec)
        return cache[key]

    return get


def crash(tmp: Path, spec: dict[str, Any], point: str, n: int) -> None:
    proc = run_child({**spec, "path": str(tmp / "state"), "out": str(tmp / "out"),
                      "kill": [point, n]})
    assert proc.returncode == -9, (
        f"the child was to be killed at arrival {n} at {point!r}; rc {proc.returncode}\n"
        f"{proc.stdout}\n{proc.stderr}")


def check_store(join: joinstate.Join, store: joinstate.StateStore, ref: Reference) -> None:
    for side in ("left", "right"):
        state = join.state(side)
        assert zset(state, state.schema.names[:-1]) == ref.state[side], side
        assert join.rows(side) == sum(state.column("_weight").to_pylist()), side
    store.verify()
    assert join.phase == "live"
    assert population.interrupted(join) == {}
    assert join.progress("left") is None and join.progress("right") is None
    assert not (store.path / STAGING / JOIN).exists()


def resume_and_check(tmp: Path, spec: dict[str, Any], ref: Reference) -> population.Report | None:
    """Reopen after the crash, resume, and compare everything with the reference."""
    left, right = inputs(spec)
    path = tmp / "state"
    with joinstate.StateStore(path) as store:
        assert not any(auto_compaction_flags(path).values()), auto_compaction_flags(path)
        ls, rs = sides()
        join = store.join(JOIN, left=ls, right=rs, how=spec["how"])
        crashed = list(delivered(tmp / "out"))
        if join.phase == "live":  # killed after going live: finished, stale markers or not
            assert population.interrupted(join) == {}
            with pytest.raises(population.PopulationError, match="already live"):
                population.populate(join, left, right, resume=True)
            join.clear_progress()
            check_store(join, store, ref)
            assert integrate([t for _, _, t in crashed], ref.columns) == ref.output
            return None
        with pytest.raises(population.PopulationInterruptedError,
                           match=r"interrupted population .*resume=True.*drop_join"):
            population.populate(join, left, right, batch_rows=spec["batch_rows"])
        resumed: list[tuple[str, int, pa.Table]] = []
        rep = population.populate(
            join, left, right, resume=True, progress=False,
            sink=lambda t, b: resumed.append((b.side, b.index, t)),
        )
        assert set(rep.redelivered) == {"left", "right"}
        kept = [t for side, i, t in crashed if i < rep.redelivered[side]]
        again = {(side, i) for side, i, _ in resumed}
        assert all((side, i) not in again for side, i, _ in crashed
                   if i < rep.redelivered[side]), "an output kept from the crash came again"
        assert integrate(kept + [t for _, _, t in resumed], ref.columns) == ref.output
        check_store(join, store, ref)
        assert not any(auto_compaction_flags(path).values())
        return rep


@pytest.mark.cover
@pytest.mark.parametrize(("strategy", "order", "how", "point"), CASES,
                         ids=["-".join(c) for c in CASES])
def test_kill_anywhere_then_resume(tmp_path: Path, references: Any, strategy: str, order: str,
                                   how: str, point: str) -> None:
    spec = {**BASE, "strategy": strategy, "order": order, "how": how}
    ref = references(spec)
    reached = ref.counts.get(point, 0)
    assert reached, f"the uninterrupted run never reaches {point!r}: {ref.counts}"
    rng = random.Random(f"{strategy}-{order}-{how}-{point}")
    n = rng.randint(max(1, reached // 4), reached)
    crash(tmp_path, spec, point, n)
    resume_and_check(tmp_path, spec, ref)


@pytest.mark.parametrize("point", ["sink-before:left:3", "sink:left:3"])
def test_kill_around_a_retracting_batch(tmp_path: Path, references: Any, point: str) -> None:
    """A batch retracting unique-key rows reads state, so it cannot go to a bulk sink: it
    is written by a WriteBatch, its output delivered just before (``before_commit``).  A
    crash before or after that delivery (the batch not yet durable) re-delivers it, once."""
    spec = {**BASE, "deletes": 1000, "strategy": "bulk", "order": "interleaved",
            "how": "inner"}
    ref = references(spec)
    assert ref.counts.get(point), f"{point!r} is never reached: {ref.counts}"
    crash(tmp_path, spec, point, 1)
    rep = resume_and_check(tmp_path, spec, ref)
    assert rep is not None
    assert rep.redelivered["left"] == 3


def test_changed_input_or_arguments_refuse_to_resume(tmp_path: Path, references: Any) -> None:
    spec = {**BASE, "strategy": "bulk", "order": "small-first", "how": "inner"}
    ref = references(spec)
    crash(tmp_path, spec, "ingest-after", 3)
    left, right = inputs(spec)
    with joinstate.StateStore(tmp_path / "state") as store:
        ls, rs = sides()
        join = store.join(JOIN, left=ls, right=rs)
        found = population.interrupted(join)
        assert found["left"].done and found["right"].batches > 0
        changed = right.set_column(5, "ss_net_paid", pa.array(
            [v + 1 for v in right.column("ss_net_paid").to_pylist()]))
        with pytest.raises(population.PopulationInterruptedError,
                           match="input of the right side changed"):
            population.populate(join, left, changed, resume=True)
        with pytest.raises(population.PopulationError, match="order='interleaved'"):
            population.populate(join, left, right, order="interleaved", resume=True)
        with pytest.raises(population.PopulationError, match="strategy='symmetric'"):
            population.populate(join, left, right, strategy="symmetric", resume=True)
        with pytest.raises(population.PopulationError, match="batch_rows=999"):
            population.populate(join, left, right, batch_rows=999, resume=True)
        assert population.interrupted(join) == found  # refusals change nothing
    resume_and_check(tmp_path, spec, ref)


def test_drop_join_then_populate_from_scratch(tmp_path: Path, references: Any) -> None:
    spec = {**BASE, "strategy": "bulk", "order": "interleaved", "how": "inner"}
    ref = references(spec)
    crash(tmp_path, spec, "durable", 2)  # SST files staged, nothing of them durable
    assert any((tmp_path / "state" / STAGING / JOIN).iterdir())
    left, right = inputs(spec)
    with joinstate.StateStore(tmp_path / "state") as store:
        store.drop_join(JOIN)
        assert store.joins() == []
        ls, rs = sides()
        join = store.join(JOIN, left=ls, right=rs)
        outs: list[pa.Table] = []
        rep = population.populate(
            join, left, right, strategy=population.Strategy.bulk_load().replace(
                bulk_run_rows=spec["bulk_run_rows"]),
            order="interleaved", sink=outs.append, progress=False,
            batch_rows=spec["batch_rows"])
        assert rep.resumed == {} and rep.redelivered == {}
        assert integrate(outs, ref.columns) == ref.output
        check_store(join, store, ref)
