"""Run one case's stream on one path and hold every step to the oracle.

After every step: each returned change set has the description's columns (and types,
where the path keeps Arrow types) plus an int64 ``_weight``, is consolidated (each row
once, no zero weight), and the running sum of every output equals the oracle's output
over the integrated inputs; a join's two sides' state equals their integrated inputs. A
reject step must raise a :class:`joinstate.JoinStateError` and change nothing (the next
check sees the state and the outputs of before).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pipeline_oracle as po
import pyarrow as pa
import pytest

import joinstate

if TYPE_CHECKING:
    from pathlib import Path

    from contract_cases import Case, Row, Step
    from contract_paths import ExecPath, Outs, Runner

WEIGHT = "_weight"


class Check:
    """The integrated inputs and outputs of one run, and the checks against the oracle."""

    def __init__(self, case: Case, path: ExecPath) -> None:
        self.case = case
        self.path = path
        self.inputs: dict[str, Counter[Row]] = {s: Counter() for s in case.sources}
        self.outputs: dict[str, Counter[Row]] = {o: Counter() for o in case.outputs}
        self.done: list[str] = []
        self.context = ""
        """What the runner says of itself (a distributed plan's choices)."""

    def where(self, what: str) -> str:
        """Where a check failed: path, case, the steps so far, the description."""
        steps = "\n".join(f"  {s}" for s in self.done)
        return (f"[path {self.path.name}{self.context}] {what}\nsteps so far:\n{steps}\n"
                f"{self.case.describe()}")

    def take(self, step: Step, outs: list[Outs]) -> None:
        """Integrate one step's inputs and output change sets (their shape checked)."""
        self.done.append(f"{step.kind} {dict(step.changes)!r}")
        for s, entries in step.changes.items():
            self.inputs[s] = po.zadd(self.inputs[s], po.consolidate(entries))
            assert all(w > 0 for w in self.inputs[s].values()), "the stream is illegal"
        for out in outs:
            assert set(out) == set(self.case.outputs), self.where(
                f"outputs {sorted(out)}, the description has {sorted(self.case.outputs)}")
            for name, table in out.items():
                self.outputs[name] = po.zadd(self.outputs[name], self.delta(name, table))

    def delta(self, name: str, table: pa.Table) -> Counter[Row]:
        """One output change set as a Z-set, after checking its shape."""
        node = self.case.outputs[name]
        names = [n for n in table.schema.names if n != WEIGHT]
        assert names == node.schema.names, self.where(
            f"output {name!r}: columns {names}, the description says {node.schema.names}")
        assert table.schema.field(WEIGHT).type == pa.int64(), self.where(f"{name}: _weight")
        if self.path.exact_types:
            got = [table.schema.field(n).type for n in names]
            want = [f.type for f in node.schema]
            assert got == want, self.where(f"output {name!r}: types {got}, want {want}")
        z = po.zset_of(table, names)
        assert len(z) == table.num_rows, self.where(
            f"output {name!r} is not consolidated (a repeated row or a zero weight): "
            f"{table.to_pylist()}")
        return z

    def check(self, runner: Runner, what: str) -> None:
        """The running output sums against the oracle; a join's state against its inputs."""
        want = self.case.oracle(self.inputs)
        for name, got in self.outputs.items():
            if got != want[name]:
                pytest.fail(self.where(f"{what}: output {name!r} differs from the oracle:\n"
                                       f"{po.diff_text(got, want[name])}"))
        state = runner.state()
        if state is None:
            return
        for side, table in state.items():
            names = list(self.case.sources[side].schema.names)
            got = po.zset_of(table, names)
            if got != self.inputs[side]:
                pytest.fail(self.where(f"{what}: {side} state differs from its inputs:\n"
                                       f"{po.diff_text(got, self.inputs[side])}"))


def run_case(case: Case, path: ExecPath, root: Path, runner: Runner | None = None) -> Check:
    """Run ``case`` on ``path`` (or on ``runner``, already started), checking every step."""
    check = Check(case, path)
    runner = runner if runner is not None else path.start(case, root)
    describe = getattr(runner, "describe", None)
    if describe is not None:
        check.context = f": {describe()}"
    try:
        for i, step in enumerate(case.steps):
            what = f"after step {i} ({step.kind})"
            if step.kind == "reopen":
                if path.reopens:
                    runner.reopen()
                    check.check(runner, what)
                continue
            if step.kind == "reject":
                if path.atomic:
                    _refused(runner, step, check)
                    check.check(runner, what)
                continue
            outs = runner.load(step) if step.kind == "load" else runner.apply(step)
            check.take(step, outs)
            check.check(runner, what)
    finally:
        runner.close()
    return check


def _refused(runner: Runner, step: Step, check: Check) -> None:
    """A bad step raises a JoinStateError (nothing applied: the next check sees that)."""
    try:
        runner.apply(step)
    except joinstate.JoinStateError:
        check.done.append(f"refused {dict(step.changes)!r}")
        return
    pytest.fail(check.where(f"the bad step {dict(step.changes)!r} was accepted"))
