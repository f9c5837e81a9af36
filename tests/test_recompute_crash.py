"""A recompute survives kill -9 anywhere: the store holds the old state or the new one.

Each case populates a join (300 customers x 3,000 sales, NULL keys on both sides), copies
it, and runs one ``population.apply(strategy="recompute", commit_id="c1")`` in a child
process (``tests/recompute_crash_child.py``) that SIGKILLs itself at a seeded arrival at
one point: around the scans, after the output is computed, around the transaction's
commit, right after RocksDB wrote the batch (before the process updated its counters and
derived structures), and around the executor's cost record.  The parent reopens the
store and checks: both sides equal the state before the batch or the state a
``push`` of the batch produces (never anything else); the commit id is recorded exactly
when the new state is there; ``verify()`` passes.  Then it retries the same apply with
the same commit id: the returned output equals push's output for the batch, the state
is the new one, and a batch committed before the kill is replayed, not applied twice.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from oracle import zset_from_table

import joinstate
from planner.batch import recorded
from population.apply import apply_batch

if TYPE_CHECKING:
    from collections import Counter

CHILD = Path(__file__).with_name("recompute_crash_child.py")
sys.path.insert(0, str(CHILD.parent))
from recompute_crash_child import JOIN, batch, initial, sides  # noqa: E402

ALL_POINTS = ["scan-before", "scan", "output", "commit-before", "write", "commit",
              "record-before", "meta-put"]
COMBOS: dict[tuple[str, str], list[str]] = {
    ("inner", "right"): ALL_POINTS,
    ("full", "left"): ["scan", "output", "write", "meta-put"],
    ("left_anti", "right"): ["scan-before", "commit", "record-before"],
    ("left", "left"): ["write"],
}
CASES = [(how, side, point) for (how, side), points in COMBOS.items() for point in points]


def run_child(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=120)


def states(join: joinstate.Join) -> dict[str, Counter[Any]]:
    out = {}
    for s in ("left", "right"):
        t = join.state(s)  # type: ignore[arg-type]
        out[s] = zset_from_table(t, t.schema.names[:-1])
    return out


class Reference:
    """A populated base store, the state and output of pushing the batch, the menu."""

    def __init__(self, tmp: Path, how: str, side: str) -> None:
        self.base = tmp / "base"
        customers, sales = initial()
        with joinstate.StateStore(self.base) as store:
            ls, rs = sides()
            join = store.join(JOIN, left=ls, right=rs, how=how)
            join.push("left", customers)
            join.push("right", sales)
            self.old = states(join)
        shutil.copytree(self.base, tmp / "pushed")
        with joinstate.StateStore(tmp / "pushed") as store:
            join = store.join(JOIN)
            out = join.push(side, batch(side))  # type: ignore[arg-type]
            self.columns = out.schema.names[:-1]
            self.output = zset_from_table(out, self.columns)
            self.new = states(join)
        assert self.new != self.old
        shutil.copytree(self.base, tmp / "menu")
        proc = run_child({"path": str(tmp / "menu"), "how": how, "side": side,
                          "kill": ["none", 0], "out": str(tmp / "menu.arrow")})
        assert proc.returncode == 0, proc.stderr
        self.counts: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
        with pa.memory_map(str(tmp / "menu.arrow")) as m:
            uninterrupted = pa.ipc.open_file(m).read_all()
        assert zset_from_table(uninterrupted, self.columns) == self.output


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[tuple[str, str], Reference] = {}

    def get(how: str, side: str) -> Reference:
        if (how, side) not in cache:
            cache[(how, side)] = Reference(tmp_path_factory.mktemp(f"ref-{how}-{side}"), how,
                                           side)
        return cache[(how, side)]

    return get


@pytest.mark.cover
@pytest.mark.parametrize(("how", "side", "point"), CASES, ids=["-".join(c) for c in CASES])
def test_kill_anywhere_leaves_old_or_new(tmp_path: Path, references: Any, how: str, side: str,
                                         point: str) -> None:
    ref = references(how, side)
    reached = ref.counts.get(point, 0)
    assert reached, f"the uninterrupted run never reaches {point!r}: {ref.counts}"
    n = random.Random(f"{how}-{side}-{point}").randint(1, reached)
    path = tmp_path / "state"
    shutil.copytree(ref.base, path)
    proc = run_child({"path": str(path), "how": how, "side": side, "kill": [point, n],
                      "out": str(tmp_path / "out.arrow")})
    assert proc.returncode == -9, (
        f"the child was to be killed at arrival {n} at {point!r}; rc {proc.returncode}\n"
        f"{proc.stdout}\n{proc.stderr}")
    assert not (tmp_path / "out.arrow").exists()
    with joinstate.StateStore(path) as store:
        join = store.join(JOIN)
        found = states(join)
        assert found in (ref.old, ref.new), "neither the old state nor the new one"
        committed = join.committed("c1")
        assert committed == (found == ref.new)
        if point in ("write", "commit", "record-before", "meta-put"):
            assert committed  # the WriteBatch was written: the batch is durable
        if point in ("scan-before", "scan", "output", "commit-before"):
            assert not committed
        join.verify()
        for s in ("left", "right"):
            assert join.rows(s) == sum(found[s].values())  # type: ignore[arg-type]
        recorded(join, side, "recompute")  # the cost record reads (or is absent)
        rep = apply_batch(join, side, batch(side), strategy="recompute", commit_id="c1")
        assert rep.replayed == committed
        assert isinstance(rep.output, pa.Table)
        assert zset_from_table(rep.output, ref.columns) == ref.output
        assert states(join) == ref.new
        join.verify()
    with joinstate.StateStore(path) as store:  # and after a clean reopen
        join = store.join(JOIN)
        assert states(join) == ref.new
        join.verify()
