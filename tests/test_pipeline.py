"""Differential tests of ``joinstate.Pipeline``, operator by operator, against a DuckDB oracle.

Every test describes a pipeline with ``tests/pipeline_oracle.py``'s node classes, builds it
through the public API, pushes seeded-random Z-set change streams (inserts, deletes of
present rows, duplicates, updates, NULL keys and values) into several sources, and after
every push compares each output's integrated deltas with DuckDB's from-scratch evaluation
of the same description on the integrated inputs.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pipeline_oracle import (
    JOIN_TYPES,
    ChangeGen,
    JoinAll,
    Node,
    PipelineHarness,
    Source,
    col,
    consolidate,
    diff_text,
    make_delta,
    zadd,
    zset_of,
)

import joinstate

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

pytestmark = pytest.mark.skipif(
    not hasattr(joinstate, "Pipeline"), reason="joinstate.Pipeline is not there yet")


def one_of(*choices: Any) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(choices)


D = Decimal

L = Source("L", pa.schema([("k", pa.int64()), ("a", pa.string()), ("v", pa.int64())]))
R = Source("R", pa.schema([("k", pa.int64()), ("b", pa.int32()), ("s", pa.string()),
                           ("v", pa.int64())]))
T = Source("T", pa.schema([("tk", pa.int64()), ("c", pa.string()),
                           ("w", pa.decimal128(7, 2))]), unique_key=["tk"])

GENS: dict[str, ChangeGen] = {
    "L": ChangeGen(L, {"k": one_of(None, 0, 1, 2, 3), "a": one_of("x", "y", None),
                       "v": one_of(-1, 0, 1, 2, 5, None)}),
    "R": ChangeGen(R, {"k": one_of(None, 0, 1, 2, 4), "b": one_of(-1, 0, 1, 2, None),
                       "s": one_of("x", "y", None), "v": one_of(0, 1, 2, None)}),
    "T": ChangeGen(T, {"c": one_of("p", "q", None),
                       "w": one_of(D("1.50"), D("-2.25"), D("0.00"), D("99999.99"), None)},
                   key_domain=[0, 1, 2, 3, 4, 5]),
}


def store_at(path: Path) -> joinstate.StateStore:
    return joinstate.StateStore(str(path))


def run_stream(h: PipelineHarness, seed: int, pushes: int = 12,
               sources: tuple[str, ...] | None = None, size: int = 6) -> None:
    """Push a seeded random stream, round-robin-ish over the sources, checking each push."""
    rng = random.Random(seed)
    names = sources or tuple(h.sources)
    for i in range(pushes):
        if i < len(names):  # an initial load of each source, then changes of every kind
            h.push(names[i], GENS[names[i]].delta(rng, h.inputs[names[i]], 8, inserts_only=True))
        else:
            src = rng.choice(names)
            h.push(src, GENS[src].delta(rng, h.inputs[src], size))


def harness(tmp_path: Path, outputs: Mapping[str, Node], name: str = "p",
            **kw: Any) -> tuple[joinstate.StateStore, PipelineHarness]:
    store = store_at(tmp_path / "db")
    return store, PipelineHarness(store, name, outputs, **kw)


def check_stream(tmp_path: Path, outputs: Mapping[str, Node], seed: int = 0,
                 pushes: int = 12, **kw: Any) -> PipelineHarness:
    store, h = harness(tmp_path, outputs, **kw)
    with store:
        run_stream(h, seed, pushes)
    # guard against vacuous tests: every output must have moved, several rows at a time
    for o in outputs:
        assert h.changed[o] >= 3 and h.multi[o] >= 1, (
            f"output {o!r} changed in only {h.changed[o]} pushes ({h.multi[o]} with several "
            f"rows): the stream tests too little; pick another seed")
    return h


# --------------------------------------------------------------------------- joins

ON_VARIANTS = {
    "same_name": "k",
    "pair_int64_int32": ("v", "b"),
    "two_pairs": [("k", "k"), ("a", "s")],
}


@pytest.mark.parametrize("on", list(ON_VARIANTS), ids=list(ON_VARIANTS))
@pytest.mark.parametrize("how", JOIN_TYPES)
def test_join_of_two_sources(tmp_path: Path, how: str, on: str) -> None:
    check_stream(tmp_path, {"j": L.join(R, on=ON_VARIANTS[on], how=how)},
                 seed=zlib.crc32(f"{how}/{on}".encode()), pushes=14)


@pytest.mark.parametrize("how", JOIN_TYPES)
def test_join_of_derived_streams(tmp_path: Path, how: str) -> None:
    left = L.filter((col("v") > 0) | col("a").is_null()).select(
        {"k": "k", "a2": col("a"), "v10": col("v") * 10})
    right = R.with_columns({"bb": col("b") + 1}).filter(col("s").ne("y")).select(["bb", "k"])
    check_stream(tmp_path, {"j": left.join(right, on="k", how=how)}, seed=7, pushes=14)


@pytest.mark.parametrize(("how1", "how2"),
                         list(zip(JOIN_TYPES, JOIN_TYPES[2:] + JOIN_TYPES[:2], strict=True)))
def test_join_of_a_join_with_a_third_source(tmp_path: Path, how1: str, how2: str) -> None:
    inner = L.join(R, on="k", how=how1)
    outer = inner.join(T, on=("k", "tk"), how=how2)
    check_stream(tmp_path, {"inner": inner, "outer": outer}, seed=11, pushes=16)


@pytest.mark.parametrize("how", ["inner", "full", "left_anti"])
def test_self_join_of_one_source(tmp_path: Path, how: str) -> None:
    """Both inputs change in the same push: ΔL⋈L + L⋈ΔL + ΔL⋈ΔL must all be there."""
    right = L.select({"k": "k", "a2": "a"})
    check_stream(tmp_path, {"self": L.join(L, on="k", how=how), "proj": L.join(right, on="k",
                                                                               how=how)},
                 seed=3, pushes=10)


# --------------------------------------------------------------------------- filter/select

PREDICATES = {
    "gt": col("v") > 1,
    "and_eq": (col("v") > 0) & col("a").eq("x"),
    "or_is_null": (col("v") < 1) | col("a").is_null(),
    "not": ~(col("v") >= 2),
    "valid_ne": col("k").is_valid() & col("v").ne(0),
    "string_gt": col("a") > "x",
    "arith": (col("v") * 2 + col("k")) <= 4,
}


@pytest.mark.parametrize("pred", list(PREDICATES), ids=list(PREDICATES))
def test_filter(tmp_path: Path, pred: str) -> None:
    check_stream(tmp_path, {"f": L.filter(PREDICATES[pred])}, seed=5, pushes=12)


def test_filter_chain_and_decimal_predicate(tmp_path: Path) -> None:
    outs = {
        "dec": T.filter(col("w") > D("0.00")),
        "chain": L.filter(col("v") > -1).filter(col("a").ne("y") | col("a").is_null())
                  .filter(col("k") < 3),
    }
    check_stream(tmp_path, outs, seed=8, pushes=16)


def test_select_forms(tmp_path: Path) -> None:
    outs = {
        "names": L.select(["v", "k"]),  # reorder + drop: multiplicities of equal rows add up
        "one": L.select(["a"]),
        "rename_expr": L.select({"key": "k", "twice": col("v") * 2, "a": col("a")}),
        "dec": T.select({"c": "c", "w2": col("w") + col("w")}),
    }
    check_stream(tmp_path, outs, seed=9, pushes=12)


def test_with_columns(tmp_path: Path) -> None:
    outs = {
        "add": L.with_columns({"v1": col("v") + 1}),
        "replace": L.with_columns({"v": col("v") * 3}),
        "both": R.with_columns({"b": col("b") - 1, "kv": col("k") + col("v")}),
    }
    check_stream(tmp_path, outs, seed=10, pushes=12)


# --------------------------------------------------------------------------- union_all


def test_union_all(tmp_path: Path) -> None:
    lk = L.select(["k", "v"])
    rk = R.select({"k": "k", "v": "v"})
    outs = {
        "two": lk.union_all(rk),
        "three": lk.union_all(rk, L.filter(col("v") > 1).select(["k", "v"])),
        "self": lk.union_all(lk),
        "agg_of_union": lk.union_all(rk).group_by(["k"], n=("count", None), s=("sum", "v")),
    }
    check_stream(tmp_path, outs, seed=12, pushes=14)


def test_union_all_mismatch_is_rejected() -> None:
    ls = joinstate.source("L", schema=L.schema)
    rs = joinstate.source("R", schema=R.schema)
    with pytest.raises(joinstate.SchemaMismatchError):  # names differ
        ls.select(["k", "a"]).union_all(rs.select(["k", "s", "v"]))
    with pytest.raises(joinstate.SchemaMismatchError):  # int64 vs int32
        ls.select(["v"]).union_all(rs.select({"v": "b"}))


# --------------------------------------------------------------------------- group_by


def test_group_by_int_aggregates(tmp_path: Path) -> None:
    outs = {
        "by_k": L.group_by(["k"], n=("count", None), nv=("count", "v"), s=("sum", "v"),
                           lo=("min", "v"), hi=("max", "v"), amin=("min", "a"),
                           amax=("max", "a"), s2=("sum", col("v") * 2)),
        "by_a_k": L.group_by(["a", "k"], s=("sum", "v"), n=("count", None)),
        "r_by_s": R.group_by(["s"], sb=("sum", "b"), lo=("min", "b"), hi=("max", "b")),
    }
    check_stream(tmp_path, outs, seed=13, pushes=16)


def test_group_by_decimal(tmp_path: Path) -> None:
    outs = {"by_c": T.group_by(["c"], s=("sum", "w"), lo=("min", "w"), hi=("max", "w"),
                               n=("count", "w"))}
    h = check_stream(tmp_path, outs, seed=14, pushes=14)
    assert h.pipeline.output_schema("by_c").field("s").type == pa.decimal128(38, 2)


def test_min_max_after_deleting_the_extreme(tmp_path: Path) -> None:
    g = L.group_by(["k"], lo=("min", "v"), hi=("max", "v"), s=("sum", "v"), n=("count", None),
                   nv=("count", "v"))
    gd = T.group_by(["c"], lo=("min", "w"), hi=("max", "w"), s=("sum", "w"))
    store, h = harness(tmp_path, {"g": g, "gd": gd})
    with store:
        steps: list[tuple[str, list[tuple[tuple[Any, ...], int]]]] = [
            ("L", [((1, "x", 5), 1), ((1, "x", 3), 1), ((1, "y", 9), 2), ((2, None, 1), 1)]),
            ("L", [((1, "y", 9), -1)]),            # one copy of the max left: max stays 9
            ("L", [((1, "y", 9), -1)]),            # max goes back to 5
            ("L", [((1, "x", 3), -1)]),            # min goes up to 5
            ("L", [((1, None, None), 1)]),         # a NULL value: skipped by min/max/sum
            ("L", [((1, "x", 5), -1)]),            # only the NULL left: min/max/sum NULL, n=1
            ("L", [((1, None, None), -1)]),        # the group disappears
            ("L", [((1, "x", 4), 1), ((1, "x", 4), -1)]),  # a no-op push
            ("T", [((0, "p", D("1.50")), 1), ((1, "p", D("-2.25")), 1),
                   ((2, "p", D("99999.99")), 1)]),
            ("T", [((2, "p", D("99999.99")), -1)]),
            ("T", [((1, "p", D("-2.25")), -1), ((1, "p", D("3.00")), 1)]),  # update the min
            ("T", [((0, "p", D("1.50")), -1), ((1, "p", D("3.00")), -1)]),
        ]
        for src, entries in steps:
            h.push(src, entries)
        assert h.integrated["g"] == Counter({(2, 1, 1, 1, 1, 1): 1})


def test_group_by_of_an_outer_join_and_join_of_an_aggregate(tmp_path: Path) -> None:
    j = L.join(R, on="k", how="full")
    agg = j.group_by(["k_right", "a"], n=("count", None), s=("sum", "v_right"))
    per_k = L.group_by(["k"], total=("sum", "v"), n=("count", None))
    back = per_k.join(R, on="k", how="left")
    check_stream(tmp_path, {"agg": agg, "back": back}, seed=15, pushes=14)


# --------------------------------------------------------------------------- join_all


def test_join_all_three_sources(tmp_path: Path) -> None:
    j = JoinAll({"l": L, "r": R, "t": T}, on={"l": "k", "r": "k", "t": "tk"})
    same = JoinAll({"x": L, "y": R.select(["k", "b"]), "z": L.filter(col("v") > 0)}, on="k")
    check_stream(tmp_path, {"j": j, "same": same.filter(col("x_v") <= col("z_v"))},
                 seed=16, pushes=16)


def q4_like() -> tuple[Source, Node, Node]:
    """One aggregate filtered six ways and N-way joined on its key (TPC-DS q4's shape)."""
    sales = Source("sales", pa.schema([("cid", pa.int64()), ("year", pa.int32()),
                                       ("kind", pa.string()), ("amt", pa.int64())]))
    agg = sales.group_by(["cid", "year", "kind"], total=("sum", "amt"))
    legs: dict[str, Node] = {}
    for kind in ("s", "c", "w"):
        for year in (2001, 2002):
            pred = col("year").eq(year) & col("kind").eq(kind)
            legs[f"{kind}{year % 10}"] = agg.filter(pred & (col("total") > 0) if year == 2001
                                                    else pred)
    j = JoinAll(legs, on="cid")
    ratios = j.filter((col("c2_total") * col("s1_total") >= col("c1_total") * col("s2_total"))
                      | (col("c2_total") * col("w1_total") > col("c1_total") * col("w2_total")))
    return sales, j, ratios.select({"cid": "s1_cid", "s2": "s2_total", "c2": "c2_total"})


def test_join_all_q4_pattern(tmp_path: Path) -> None:
    sales, six, q4 = q4_like()
    gen = ChangeGen(sales, {"cid": one_of(None, 1, 2, 3), "year": one_of(2001, 2002),
                            "kind": one_of("s", "c", "w"), "amt": one_of(1, 2, 5, 10, -3, None)})
    raw = JoinAll({"a": sales.filter(col("kind").eq("s")),
                   "b": sales.filter(col("kind").eq("c"))}, on="cid")
    store, h = harness(tmp_path, {"q4": q4, "six": six, "raw": raw})
    rng = random.Random(17)
    seen = 0
    with store:
        # every (cid, year, kind) once, so that the six legs meet from the start
        # (never deleted: the stream only deletes what it inserted itself)
        base = [((cid, year, kind, rng.choice((1, 2, 5, 10))), 1)
                for cid in (1, 2) for year in (2001, 2002) for kind in "scw"]
        h.push("sales", base)
        extra: Counter[tuple[Any, ...]] = Counter()
        for _ in range(24):
            entries = gen.delta(rng, extra, 6)
            extra = zadd(extra, consolidate(entries))
            h.push("sales", entries)
            seen += bool(h.integrated["q4"])
        assert seen >= 5, f"q4 was non-empty after only {seen} pushes; pick another seed"


# --------------------------------------------------------------------------- pipeline-level


def mixed_outputs() -> dict[str, Node]:
    j = L.join(R, on="k", how="left")
    return {
        "join": j,
        "agg": j.group_by(["k"], n=("count", None), s=("sum", "v_right"), hi=("max", "b")),
        "all": JoinAll({"l": L, "t": T, "g": L.group_by(["k"], n=("count", None))},
                       on={"l": "k", "t": "tk", "g": "k"}),
        "full": L.join(T, on=("k", "tk"), how="full").filter(col("v") >= 0),
    }


def semi_anti_outputs() -> dict[str, Node]:
    return {
        "anti": L.join(T, on=("k", "tk"), how="left_anti").filter(col("v") >= 0),
        "semi": L.join(R, on="k", how="left_semi"),
        "semi_of_join": L.join(R, on="k").join(T, on=("k", "tk"), how="left_semi"),
    }


@pytest.mark.parametrize("which", ["mixed", "semi_anti"])
def test_share_indexes_true_and_false_agree(tmp_path: Path, which: str) -> None:
    outs = mixed_outputs() if which == "mixed" else semi_anti_outputs()
    with store_at(tmp_path / "db") as store:
        a = PipelineHarness(store, "shared", outs, share_indexes=True)
        b = PipelineHarness(store, "private", outs, share_indexes=False)
        rng = random.Random(18)
        for i in range(16):
            src = ("L", "R", "T")[i % 3]
            entries = GENS[src].delta(rng, a.inputs[src])
            da = a.push(src, entries)
            db = b.push(src, entries)
            assert da == db, f"push {i} to {src}: share_indexes changes the output"


def test_delta_without_weight_column_counts_plus_one(tmp_path: Path) -> None:
    store, h = harness(tmp_path, mixed_outputs())
    with store:
        h.push("L", [((1, "x", 1), 1), ((1, "x", 1), 1), ((None, "y", 2), 1)], with_weight=False)
        h.push("R", [((1, 1, "x", 1), 1)], with_weight=False)
        run_stream(h, 19, pushes=6)


def test_repeated_commit_id_replays_without_reapplying(tmp_path: Path) -> None:
    store, h = harness(tmp_path, mixed_outputs())
    with store:
        run_stream(h, 20, pushes=5)
        rng = random.Random(21)
        entries = GENS["L"].delta(rng, h.inputs["L"])
        first = h.push("L", entries, commit_id="c-1")
        delta = make_delta(L.schema, entries)
        again = h.pipeline.push("L", delta, commit_id="c-1")
        assert set(again) == set(h.outputs)
        for o, table in again.items():
            got = zset_of(table, h.outputs[o].schema.names)
            assert got == first[o], f"replay of {o!r} differs:\n{diff_text(got, first[o])}"
        h.check()  # state unchanged by the replay
        h.push("R", GENS["R"].delta(rng, h.inputs["R"]), commit_id="c-2")
        run_stream(h, 22, pushes=5)


def test_over_retraction_applies_nothing(tmp_path: Path) -> None:
    store, h = harness(tmp_path, mixed_outputs())
    with store:
        run_stream(h, 23, pushes=6)
        present = next(iter(h.inputs["L"]))
        bad_batches = [
            [((3, "nope", 42), -1)],                                     # absent row
            [((0, "zz", 1), 1), (present, -(h.inputs["L"][present] + 1))],  # one too many
        ]
        for bad in bad_batches:
            with pytest.raises(joinstate.OverRetractionError):
                h.pipeline.push("L", make_delta(L.schema, bad))
            h.check()
        # a unique-key source too
        t_row = next(iter(h.inputs["T"]), None) or (5, "p", D("1.50"))
        with pytest.raises(joinstate.OverRetractionError):
            h.pipeline.push("T", make_delta(T.schema, [((t_row[0], "zz", None), -1)]))
        # the next valid pushes behave as if the failed ones never happened
        rng = random.Random(24)
        for src in ("L", "T", "R", "L"):
            h.push(src, GENS[src].delta(rng, h.inputs[src]))


def test_unique_key_violation_applies_nothing(tmp_path: Path) -> None:
    store, h = harness(tmp_path, mixed_outputs())
    with store:
        h.push("T", [((1, "p", D("1.50")), 1), ((2, "q", None), 1)])
        run_stream(h, 28, pushes=3, sources=("L", "R"))
        for bad in ([((1, "q", D("0.00")), 1)],                      # key 1 is taken
                    [((3, "p", None), 1), ((3, "q", None), 1)],      # twice in one batch
                    [((4, "p", None), 2)]):                          # two copies
            with pytest.raises(joinstate.UniqueKeyViolationError):
                h.pipeline.push("T", make_delta(T.schema, bad))
        h.push("T", [((1, "p", D("1.50")), -1), ((1, "q", D("0.00")), 1)])  # an update is fine
        run_stream(h, 29, pushes=4)


def test_reopen_continues(tmp_path: Path) -> None:
    outs = mixed_outputs()
    store = store_at(tmp_path / "db")
    h = PipelineHarness(store, "p", outs)
    try:
        run_stream(h, 25, pushes=8)
        rng = random.Random(27)
        entries = GENS["R"].delta(rng, h.inputs["R"])
        first = h.push("R", entries, commit_id="before-close")
        store.close()
        store = store_at(tmp_path / "db")
        h.rebuild(store)
        h.check()
        again = h.pipeline.push("R", make_delta(R.schema, entries), commit_id="before-close")
        for o, table in again.items():  # the commit record survives the reopen
            assert zset_of(table, h.outputs[o].schema.names) == first[o], o
        run_stream(h, 26, pushes=8)
    finally:
        store.close()


# --------------------------------------------------------------------------- bad names


def _bad() -> list[tuple[str, Callable[[], Any]]]:
    ls = joinstate.source("L", schema=L.schema)
    rs = joinstate.source("R", schema=R.schema)
    return [
        ("nope_on", lambda: ls.join(rs, on="nope_on")),
        ("nope_left", lambda: ls.join(rs, on=("nope_left", "k"))),
        ("nope_right", lambda: ls.join(rs, on=[("k", "k"), ("a", "nope_right")])),
        ("nope_filter", lambda: ls.filter(pc.field("nope_filter") > 1)),
        ("nope_select", lambda: ls.select(["k", "nope_select"])),
        ("nope_expr", lambda: ls.select({"x": pc.field("nope_expr") * 2})),
        ("nope_rename", lambda: ls.select({"x": "nope_rename"})),
        ("nope_with", lambda: ls.with_columns({"x": pc.field("nope_with") + 1})),
        ("nope_key", lambda: ls.group_by(["nope_key"]).aggregate(n=("count", None))),
        ("nope_agg", lambda: ls.group_by(["k"]).aggregate(s=("sum", "nope_agg"))),
        ("nope_leg", lambda: joinstate.join_all({"x": ls, "y": rs},
                                                on={"x": "k", "y": "nope_leg"})),
    ]


@pytest.mark.parametrize("which", range(11))
def test_bad_column_name_is_named(which: int) -> None:
    name, make = _bad()[which]
    with pytest.raises(joinstate.SchemaMismatchError, match=name):
        joinstate.Graph().output("o", make())
