"""Filters that read one stream together: evaluated in one pass per push, same answers.

Several filters of one stream (q4's six ``year_total`` legs) are evaluated together the
first time one of them runs in a push, and the legs of a delta join that read one shared
index evaluate their filters on the probed rows together.  These tests pin that the
shortcut changes nothing a user can see: the integrated outputs equal a plain oracle on
random change streams (rows passing no filter, every filter, some), and a filter that
fails on the pushed rows is still the one named, with nothing applied.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate

if TYPE_CHECKING:
    from pathlib import Path

SCHEMA = pa.schema([("k", pa.int64()), ("t", pa.string()), ("v", pa.int64())])
TYPES = ["a", "b", "c"]


def _pipeline(store: joinstate.StateStore, share: bool) -> joinstate.Pipeline:
    s = joinstate.source("s", SCHEMA)
    legs = {t: s.filter((pc.field("t") == t) & (pc.field("v") >= 0)).select(["k", "v"])
            for t in TYPES}
    graph = joinstate.Graph()
    for t, leg in legs.items():
        graph = graph.output(f"only_{t}", leg)
    graph = graph.output("all", joinstate.join_all(legs, on="k"))
    return joinstate.Pipeline(store, "f", graph, share_indexes=share)


def _oracle(rows: Counter[tuple[Any, ...]]) -> dict[str, Counter[tuple[Any, ...]]]:
    per: dict[str, Counter[tuple[Any, ...]]] = {
        t: Counter() for t in TYPES}
    for (k, t, v), n in rows.items():
        if t in per and v is not None and v >= 0:
            per[t][(k, v)] += n
    out = {f"only_{t}": c for t, c in per.items()}
    joined: Counter[tuple[Any, ...]] = Counter()
    for (ka, va), na in per["a"].items():
        for (kb, vb), nb in per["b"].items():
            for (kc, vc), nc in per["c"].items():
                if ka is not None and ka == kb == kc:
                    joined[(ka, va, kb, vb, kc, vc)] += na * nb * nc
    out["all"] = joined
    return {name: +c for name, c in out.items()}


def _integrate(acc: Counter[tuple[Any, ...]], delta: pa.Table) -> None:
    cols = [c for c in delta.column_names if c != joinstate.WEIGHT]
    for row, w in zip(zip(*(delta.column(c).to_pylist() for c in cols), strict=True),
                      delta.column(joinstate.WEIGHT).to_pylist(), strict=True):
        acc[row] += w
    for row in [r for r, n in acc.items() if n == 0]:
        del acc[row]


def _row(rng: random.Random, mode: str) -> tuple[Any, ...]:
    k = rng.choice([1, 2, 3, None])
    if mode == "one":  # passes exactly one filter
        return (k, rng.choice(TYPES), rng.choice([0, 5, 7]))
    if mode == "none":  # passes no filter
        return (k, rng.choice(["z", None]), rng.choice([-1, 5, None]))
    return (k, rng.choice([*TYPES, "z", None]), rng.choice([-1, 0, 5, 7, None]))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_sibling_filters_and_filtered_legs_match_the_oracle(
        tmp_path: Path, share: bool, seed: int) -> None:
    rng = random.Random(seed)
    held: Counter[tuple[Any, ...]] = Counter()
    got: dict[str, Counter[tuple[Any, ...]]] = {}
    schema = SCHEMA.append(pa.field(joinstate.WEIGHT, pa.int64()))
    with joinstate.StateStore(tmp_path / "s") as store:
        p = _pipeline(store, share)
        for _ in range(30):
            mode = rng.choice(["mixed", "mixed", "one", "none"])
            batch = []
            for _ in range(rng.choice([1, 1, 2, 5, 12])):
                if held and rng.random() < 0.3:
                    row = rng.choice(sorted(held, key=repr))
                    batch.append((*row, -1))
                    held[row] -= 1
                    held += Counter()
                else:
                    row = _row(rng, mode)
                    batch.append((*row, 1))
                    held[row] += 1
            ks, ts, vs, ws = (list(c) for c in zip(*batch, strict=True))
            outs = p.push("s", pa.table({"k": ks, "t": ts, "v": vs, joinstate.WEIGHT: ws},
                                        schema=schema))
            for name, delta in outs.items():
                _integrate(got.setdefault(name, Counter()), delta)
        want = _oracle(held)
    for name in ["only_a", "only_b", "only_c", "all"]:
        assert +got.get(name, Counter()) == want[name], name


def test_a_failing_filter_among_siblings_is_named_and_applies_nothing(
        tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        s = joinstate.source("s", SCHEMA)
        ok = s.filter(pc.field("v") > 0)
        bad = s.filter(pc.greater(pc.divide(pc.field("k"), pc.field("v")), 1))
        p = joinstate.Pipeline(store, "f", joinstate.Graph({"ok": ok, "bad": bad}))
        w = pa.field(joinstate.WEIGHT, pa.int64())
        p.push("s", pa.table({"k": [4], "t": ["a"], "v": [2], joinstate.WEIGHT: [1]},
                             schema=SCHEMA.append(w)))
        bad_label = p.graph.outputs["bad"].label
        with pytest.raises(joinstate.ExpressionError, match=rf"{bad_label}\b.*divide"):
            p.push("s", pa.table({"k": [1, 3], "t": ["a", "b"], "v": [5, 0],
                                  joinstate.WEIGHT: [1, 1]}, schema=SCHEMA.append(w)))
        # Nothing of the failed push landed: a retraction of its rows is refused...
        outs = p.push("s", pa.table({"k": [4], "t": ["a"], "v": [2], joinstate.WEIGHT: [-1]},
                                    schema=SCHEMA.append(w)))
        assert outs["ok"].column(joinstate.WEIGHT).to_pylist() == [-1]
        assert outs["bad"].column(joinstate.WEIGHT).to_pylist() == [-1]
