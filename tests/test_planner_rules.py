"""Golden tests of the physical planner's rules: statistics in, decision out.

Each expected choice is derived by hand from the rule's documented thresholds (bulk from
100,000 big-side rows, asymmetric from a 4x ratio, scan when point probes cost twice a
scan at 5 µs per get and 0.6 µs per scanned row, ...), never by running the rule.  The
rules' own doctests run here too.  Plus the plan's API (get, explain, to_dict) and the
shapes the planner reads from real joins and pipelines.
"""

from __future__ import annotations

import doctest
import importlib
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate
from planner.context import (
    IndexShape,
    PlanContext,
    PlannerSettings,
    ReaderShape,
    ShareGroup,
    StreamShape,
)
from planner.errors import PlannerError
from planner.history import History, StrategyFigures
from planner.plan import Plan, plan_join, plan_population, run
from planner.rule import Rule
from planner.rules import RULES
from planner.rules.compaction import CompactionChoice
from planner.rules.order import PopulationOrder
from planner.rules.sharing import IndexSharing
from planner.rules.small_side import smaller
from planner.stats import KeyStats, SourceStats, from_table, given

if TYPE_CHECKING:
    from pathlib import Path

MODULES = ["small_side", "order", "strategy", "layout", "memtable", "compaction", "probe",
           "sharing", "spark"]


@pytest.mark.parametrize("module", [*(f"planner.rules.{m}" for m in MODULES),
                                    "planner.plan", "planner.stats", "planner.shape"])
def test_doctests(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0, f"{module} has no doctest example"
    assert result.failed == 0


def test_rules_run_in_one_tuple_behind_one_protocol() -> None:
    assert [r.name for r in RULES] == MODULES
    assert all(isinstance(r, Rule) for r in RULES)
    for m in MODULES:  # each module's rule class says what it decides, with an example
        mod = importlib.import_module(f"planner.rules.{m}")
        assert mod.__doc__ and ">>>" in "".join(
            (c.__doc__ or "") for c in vars(mod).values() if isinstance(c, type))


def join(left: int | None, right: int | None, **kw: Any) -> Plan:
    """A join plan from row counts (snapshots unless said otherwise)."""
    snap = kw.pop("snapshot", True)
    lk = kw.pop("left_at_least", 0)
    rk = kw.pop("right_at_least", 0)
    return plan_join(given("left", left, rows_at_least=lk, snapshot=snap and left is not None),
                     given("right", right, rows_at_least=rk,
                           snapshot=snap and right is not None), **kw)


# ---- small side ----------------------------------------------------------------------------


@pytest.mark.parametrize(("left", "right", "extra", "want"), [
    # moved from tests/test_population.py (the former population.small_side)
    (3, 4, {}, "left"), (4, 4, {}, "left"), (5, 4, {}, "right"),
    (100, 3000, {}, "left"),
    (3000, 100, {}, "right"),
    (500, 500, {}, "left"),                 # a tie goes left
    (0, 10, {}, "left"),                    # an empty side is the small one
    (10, 0, {}, "right"),
    (0, 0, {}, "left"),
    (None, None, {}, None),                 # unknown: the driver counts
    (3000, None, {"right_at_least": 5000}, "left"),
    (3000, None, {"right_at_least": 3000}, "left"),  # at least as many: left or a tie
    (3000, None, {"right_at_least": 100}, None),
    (None, 3000, {"left_at_least": 3000}, None),      # a tie would go left: undecided
    (None, 3000, {"left_at_least": 3001}, "right"),
])
def test_small_side(left: int | None, right: int | None, extra: dict[str, int],
                    want: str | None) -> None:
    assert join(left, right, **extra).get("small_side") == want
    assert smaller(left, right, left_at_least=extra.get("left_at_least", 0),
                   right_at_least=extra.get("right_at_least", 0)) == want


def test_small_side_given_is_recorded_as_given() -> None:
    d = join(100, 3000, small_side="right").decision("small_side")
    assert d is not None and d.choice == "right" and "given" in d.reason


# ---- order ---------------------------------------------------------------------------------


def test_join_order_is_small_first_unless_given() -> None:
    assert join(10, 99).get("order") == "small-first"
    assert join(10, 99, order="interleaved").get("order") == "interleaved"


def pipeline_ctx(rows: dict[str, int | None], **kw: Any) -> PlanContext:
    return PlanContext("pipeline", "p", {n: given(n, r) for n, r in rows.items()}, **kw)


def test_pipeline_order_smallest_first_unknown_last_ties_by_definition() -> None:
    ctx = pipeline_ctx({"sales": 4000, "stream": None, "customer": 200, "date_dim": 30,
                        "promo": 200})
    (d,) = PopulationOrder().apply(ctx)
    assert d.choice == ["date_dim", "customer", "promo", "sales", "stream"]
    assert "unknown size last" in d.reason


def test_pipeline_order_dimensions_first() -> None:
    # q4's sizes at SF0.1: web_sales is smaller than date_dim, but date_dim is what the
    # sales probe
    stats = {"customer": given("customer", 10_000, unique_key="ck"),
             "date_dim": given("date_dim", 73_049, unique_key="dk"),
             "store_sales": given("store_sales", 288_464),
             "web_sales": given("web_sales", 71_632),
             "clicks": given("clicks", None, unique_key="id")}
    (d,) = PopulationOrder().apply(PlanContext("pipeline", "p", stats))
    assert d.choice == ["customer", "date_dim", "clicks", "web_sales", "store_sales"]
    assert d.reason.startswith("dimensions (a declared unique key) first")


# ---- strategy ------------------------------------------------------------------------------


@pytest.mark.parametrize(("left", "right", "kw", "want"), [
    # moved from tests/test_population.py (the former population.choose)
    (10, 20, {}, "symmetric"), (10, None, {}, "symmetric"),
    (1000, 2_000_000, {}, "bulk"),
    (None, None, {}, "symmetric"),                        # nothing known
    (10_000, 200_000, {}, "bulk"),                        # big snapshot >= 100k rows
    (10_000, 99_999, {}, "asymmetric"),                   # just below the bulk threshold
    (10_000, 100_000, {}, "bulk"),                        # at it
    (300_000, 300_000, {}, "bulk"),                       # equal sizes: bulk still pays
    (10_000, 200_000, {"snapshot": False}, "bulk"),       # a stream of known size too
    (10_000, 20_000, {}, "symmetric"),                    # 2x: no asymmetry, below bulk
    (10_000, 40_000, {}, "asymmetric"),                   # 4x exactly
    (10_000, 39_999, {}, "symmetric"),
    (10_000, 200_000, {"order": "interleaved"}, "bulk"),        # 20x: the big side's run
    (10_000, 39_999, {"order": "interleaved"}, "symmetric"),    # below 4x: both probed
    (150_000, 200_000, {"order": "interleaved"}, "symmetric"),
    (1_000, 50_000, {"order": "interleaved"}, "symmetric"),     # never asymmetric
    (10_000, 200_000, {"order": "as-given"}, "bulk"),           # the small side is left
    (200_000, 10_000, {"order": "as-given"}, "symmetric"),      # the big side loads first
    (200_000, 10_000, {}, "bulk"),                        # the big side on the left
    (10_000, 200_000, {"how": "left"}, "asymmetric"),     # right keeps degrees: no bulk
    (200_000, 10_000, {"how": "left"}, "bulk"),           # the left side has no degrees
])
def test_join_strategy(left: int | None, right: int | None, kw: dict[str, Any],
                       want: str) -> None:
    assert join(left, right, **kw).get("strategy") == want


def test_counted_lower_bounds_decide() -> None:
    p = join(1_000, None, right_at_least=8_000)
    assert (p.get("small_side"), p.get("strategy")) == ("left", "asymmetric")
    # counted past the bulk threshold: bulk, though the total is unknown
    p = join(1_000, None, right_at_least=150_000)
    assert (p.get("small_side"), p.get("strategy")) == ("left", "bulk")


def hist(rows: int, **rates: float) -> History:
    """Recorded runs of ``rows`` input rows at the given rows/s per strategy."""
    return History("join", {n: StrategyFigures(n, rows, rows / r) for n, r in rates.items()})


def test_recorded_history_overrides_the_static_estimate() -> None:
    static = join(10_000, 200_000)
    assert static.get("strategy") == "bulk"
    measured = join(10_000, 200_000, history=hist(210_000, bulk=300_000, symmetric=450_000))
    d = measured.decision("strategy")
    assert d is not None and d.choice == "symmetric"
    assert "earlier runs measured" in d.reason and "bulk" in d.reason
    assert d.figures["measured_rows_per_second"] == {"bulk": 300_000, "symmetric": 450_000}


def test_history_agreeing_with_the_estimate_keeps_it() -> None:
    d = join(10_000, 200_000, history=hist(210_000, bulk=500_000, symmetric=450_000)
             ).decision("strategy")
    assert d is not None and d.choice == "bulk" and "earlier runs agree" in d.reason


@pytest.mark.parametrize("h", [
    hist(2_100_000, bulk=300_000, symmetric=450_000),    # measured at 10x the size
    hist(210_000, symmetric=450_000),                    # the static choice not measured
    hist(210_000, bulk=300_000),                         # nothing to compare it with
    hist(210_000, bulk=300_000, interleaved=900_000),    # not a candidate
])
def test_history_that_cannot_compare_is_ignored(h: History) -> None:
    assert join(10_000, 200_000, history=h).get("strategy") == "bulk"


def test_history_never_picks_an_infeasible_strategy() -> None:
    p = join(10_000, 200_000, how="left", history=hist(210_000, asymmetric=100,
                                                       bulk=900_000, symmetric=200))
    assert p.get("strategy") == "symmetric"


def test_pipeline_strategy_ratio_and_history() -> None:
    ctx = pipeline_ctx({"a": 100, "b": 399, "c": 0})
    assert run(ctx).get("strategy") == "symmetric"  # 3.99x; the empty source does not count
    ctx = pipeline_ctx({"a": 100, "b": 400})
    assert run(ctx).get("strategy") == "asymmetric"
    h = History("p", {"symmetric": StrategyFigures("symmetric", 500, 1.0),
                      "asymmetric": StrategyFigures("asymmetric", 500, 2.0)})
    assert run(pipeline_ctx({"a": 100, "b": 400}, history=h)).get("strategy") == "symmetric"
    assert run(pipeline_ctx({"a": None})).get("strategy") == "symmetric"


@pytest.mark.parametrize(("big_bytes", "want"), [
    (None, "asymmetric"),            # bytes unknown: the rows decide
    ((64 << 20) - 1, "symmetric"),   # fits one memtable: nothing is compacted anyway
    (64 << 20, "asymmetric"),
])
def test_pipeline_asymmetry_needs_more_than_a_memtable(big_bytes: int | None,
                                                       want: str) -> None:
    ctx = PlanContext("pipeline", "p", {"dim": given("dim", 100, bytes=1000),
                                        "fact": given("fact", 10_000, bytes=big_bytes)})
    d = run(ctx).decision("strategy")
    assert d is not None and d.choice == want
    if want == "symmetric":
        assert "(fact, 64.0 MiB) fits one memtable (64 MiB)" in d.reason


# ---- layout --------------------------------------------------------------------------------


def layout_of(left: SourceStats, **kw: Any) -> Any:
    p = plan_join(left, given("right", 10), left_key=["k"], right_key=["k"], **kw)
    return p.decision("layout", p.side_index("left"))


@pytest.mark.parametrize(("unique_key", "want"), [
    (["k"], "key"), (["k", "x"], "key"), (["id"], "unique"), (None, "bag")])
def test_layout_follows_the_declaration(unique_key: list[str] | None, want: str) -> None:
    # (k, x) within the join key (k, x) for the second case
    key = ["k", "x"] if unique_key == ["k", "x"] else ["k"]
    p = plan_join(given("left", 10, unique_key=unique_key), given("right", 10),
                  left_key=key, right_key=key)
    assert p.get("layout", p.side_index("left")) == want


def test_layout_advises_declaring_a_key_the_sample_shows_unique() -> None:
    t = pa.table({"k": list(range(50)), "v": ["x"] * 50})
    d = layout_of(from_table(t, "left", keys=["k"]))
    assert d.choice == "bag" and "declaring unique_key=['k']" in d.reason
    dup = pa.table({"k": [1, 1, 2], "v": ["a", "b", "c"]})
    d = layout_of(from_table(dup, "left", keys=["k"]))
    assert d.choice == "bag" and "declaring" not in d.reason
    assert d.figures["rows_per_key"] == 1.5


# ---- memtable / compaction -----------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "small", "big"), [
    ("symmetric", None, None), ("asymmetric", "hash_skip_list", "skiplist"),
    ("bulk", "hash_skip_list", "skiplist")])
def test_memtables_follow_the_strategy(strategy: str, small: str | None,
                                       big: str | None) -> None:
    p = join(3000, 100, strategy=strategy)  # the right side is the small one
    assert p.get("memtable", p.side_index("right")) == small
    assert p.get("memtable", p.side_index("left")) == big


def test_memtables_given_by_a_custom_strategy() -> None:
    p = join(100, 3000, strategy="mine", memtables={"small": "vector", "big": None})
    assert p.get("memtable", p.side_index("left")) == "vector"
    assert p.get("memtable", p.side_index("right")) is None


@pytest.mark.parametrize(("strategy", "policy", "small", "big"), [
    ("symmetric", "rocksdb", "auto", "auto"),
    ("asymmetric", "epsio", "compact-when-loaded", "off-after-small-loaded"),
    ("bulk", "bulk-load", "compact-when-loaded", "off-while-loading")])
def test_join_compaction_policy(strategy: str, policy: str, small: str, big: str) -> None:
    p = join(100, 3000, strategy=strategy)
    assert p.get("compaction") == policy
    assert p.get("compaction", p.side_index("left")) == small
    assert p.get("compaction", p.side_index("right")) == big


def test_pipeline_compaction_schedule() -> None:
    ixs = (
        IndexShape("dim", "dim", ("k",), written_by=("dim",), read_by=("fact",)),
        IndexShape("fact", "fact", ("k",), written_by=("fact",), read_by=("dim",)),
        IndexShape("mid", "x", ("k",), written_by=("dim", "other"), read_by=("fact",)),
        IndexShape("both", "y", ("k",), written_by=("fact",), read_by=("fact",)),
        # written and probed by every source (q4's year_total): never complete, left alone
        IndexShape("union", "u", ("k",), written_by=("dim", "fact", "other"),
                   read_by=("dim", "fact", "other")),
    )
    ctx = pipeline_ctx({"dim": 10, "fact": 1000, "other": 5000}, indexes=ixs)
    ctx = ctx.with_decisions(PopulationOrder().apply(ctx))  # dim, fact, other
    from planner.rules.strategy import PopulationStrategy

    ctx = ctx.with_decisions(PopulationStrategy().apply(ctx))
    got = {d.subject: d.choice for d in CompactionChoice().apply(ctx)}
    assert got["dim"] == {"policy": "compact-when-loaded", "disable_before": [],
                          "compact_after": ["dim"]}
    assert got["fact"] == {"policy": "off-while-loading", "disable_before": ["fact"],
                           "compact_after": []}
    assert got["mid"] == {"policy": "compact-then-off", "disable_before": ["other"],
                          "compact_after": ["dim"]}
    assert got["both"]["policy"] == "auto"  # read while it is written
    assert got["union"]["policy"] == "auto"
    sym = ctx.with_decisions(PopulationStrategy().apply(
        pipeline_ctx({"dim": 10, "fact": 20, "other": 30})))
    assert all(d.choice["policy"] == "auto" for d in CompactionChoice().apply(sym))


# ---- probe ---------------------------------------------------------------------------------


def test_probe_paths() -> None:
    # small-first: left (10,000) is probed by 3,000,000 right rows: 15 s of gets against
    # 6 ms of scan -> scan; the right side is empty while the left loads -> auto.
    p = join(10_000, 3_000_000)
    assert p.get("probe", p.side_index("left")) == "scan"
    assert p.get("probe", p.side_index("right")) == "auto"
    assert p.get("probe") == "auto"  # the right index is beyond the 2M-row cache
    # as-given with a 3M-row left side probed by 10,000 rows: 50 ms of gets against
    # 1.8 s of scan, and too big to cache -> point.
    p = join(3_000_000, 10_000, order="as-given")
    assert p.get("probe", p.side_index("left")) == "point"
    # as-given, 1,000 left rows probed by 100 right rows: 0.5 ms of gets against 0.6 ms
    # of scan -> auto; the right side loads after the left: never probed -> auto
    p = join(1_000, 100, order="as-given", strategy="symmetric")
    d = p.decision("probe", p.side_index("left"))
    assert d is not None and d.choice == "auto" and d.figures["probing_rows"] == 100
    d = p.decision("probe", p.side_index("right"))
    assert d is not None and d.choice == "auto" and d.figures["probing_rows"] == 0


def test_probe_interleaved_and_unknown() -> None:
    p = join(10_000, 200_000, order="interleaved")
    # right (200,000) probed by 10,000 left rows: 50 ms of gets vs 120 ms of scan -> auto
    assert p.get("probe", p.side_index("right")) == "auto"
    # left (10,000) probed by 200,000 rows: 1 s vs 6 ms -> scan
    assert p.get("probe", p.side_index("left")) == "scan"
    # every index fits the cache and one pays for a scan: scan for the whole store
    assert p.get("probe") == "scan"
    p = join(None, None)
    assert {p.get("probe", p.side_index(s)) for s in ("left", "right")} == {"auto"}


def test_probe_mode_given_by_the_store(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64())])
    opts = joinstate.StoreOptions(probe="point")
    with joinstate.StateStore(tmp_path / "s", opts) as store:
        j = store.join("j", left=joinstate.Side(schema, ["k"]),
                       right=joinstate.Side(schema, ["k"]))
        p = plan_population(j, {"left": given("left", 10), "right": given("right", 10_000)})
        assert p.get("probe") == "point"
        assert p.get("probe", j.index("left").column_family) == "point"


# ---- sharing -------------------------------------------------------------------------------


STREAMS = {
    "u": StreamShape("u", "union", (), ("id", "y", "v", "name"),
                     ("int64", "int32", "double", "string")),
    "f1": StreamShape("f1", "filter", ("u",), ("id", "y", "v", "name")),
    "f2": StreamShape("f2", "filter", ("u",), ("id", "y", "v", "name")),
}


def sharing(group: ShareGroup, rows: dict[str, int | None]) -> Any:
    ctx = PlanContext("pipeline", "p", {}, share_groups=(group,), streams=STREAMS,
                      stream_rows=rows)
    return IndexSharing().apply(ctx)


def test_unfiltered_readers_share() -> None:
    g = ShareGroup("u", ("id",), (ReaderShape("j1[1]", "u", ("id", "name")),
                                  ReaderShape("j2[1]", "u", ("id", "name")),
                                  ReaderShape("j3[1]", "u", ("id", "name"))))
    d, switch = sharing(g, {"u": 1000})
    # shared: 1,000 x (40 + 8) + 1,000 x 16; per reader: 3 x 1,000 x (40 + 8 + 16)
    assert (d.choice, d.figures["shared_bytes"], d.figures["per_reader_bytes"]) == (
        "shared", 64_000, 192_000)
    assert switch.choice is True


def test_selective_filters_with_stored_filter_columns_split() -> None:
    f = ("y",)
    g = ShareGroup("u", ("id",), (ReaderShape("a[0]", "f1", ("id", "v"), True, f),
                                  ReaderShape("b[1]", "f2", ("id", "v"), True, f)))
    d, switch = sharing(g, {"u": 6000, "f1": 100, "f2": 100})
    # shared stores 200 rows x (40 + id 8 + y 4) + v on 200 rows: 10,400 + 1,600;
    # per reader: 2 x 100 x (40 + 8 + 8)
    assert (d.choice, d.figures["shared_bytes"], d.figures["per_reader_bytes"]) == (
        "per-reader", 12_000, 11_200)
    assert d.figures["read_amplification"] == {"a[0]": 2.0, "b[1]": 2.0}
    assert switch.choice == {"u": False}


def test_unknown_reader_rows_keep_sharing_and_history_decides() -> None:
    g = ShareGroup("u", ("id",), (ReaderShape("a[0]", "f1", ("id", "v"), True, ("y",)),
                                  ReaderShape("b[1]", "f2", ("id", "v"), True, ("y",))))
    d, _ = sharing(g, {"u": 6000, "f1": None, "f2": 100})
    assert d.choice == "shared" and "a[0]" in d.reason and "unknown" in d.reason
    # overlapping readers (recorded rows 5,000 each of 6,000): one index wins
    d, _ = sharing(g, {"u": 6000, "f1": 5000, "f2": 5000})
    assert d.choice == "shared" and d.figures["stored_rows"] == 6000


def test_no_sharing_decision_for_single_readers() -> None:
    g = ShareGroup("u", ("id",), (ReaderShape("a[0]", "u", ("id",)),))
    assert sharing(g, {"u": 10}) == []


# ---- spark ---------------------------------------------------------------------------------


def spark(left: SourceStats, right: SourceStats, cores: int = 4, **kw: Any) -> Plan:
    return plan_join(left, right, settings=PlannerSettings(cores=cores), **kw)


def test_shards() -> None:
    assert spark(given("left", 10, bytes=1000), given("right", 10, bytes=1000)
                 ).get("shards") == 4
    # 5 GiB in shards of at most 1 GiB on 4 cores: two full waves
    big = spark(given("left", 10, bytes=1 << 20), given("right", 10, bytes=5 << 30))
    assert big.get("shards") == 8
    assert spark(given("left", 10), given("right", 10), shards=3).get("shards") == 3


@pytest.mark.parametrize(("how", "left", "right"), [
    ("inner", "replicate", "shuffle"),
    ("left", "shuffle", "shuffle"),       # the left side's unmatched rows are emitted
    ("right", "replicate", "shuffle"),
    ("full", "shuffle", "shuffle"),
])
def test_replicate_small_dimensions(how: str, left: str, right: str) -> None:
    p = spark(given("left", 1000, bytes=64_000), given("right", 3_000_000, bytes=1 << 28),
              how=how)
    assert (p.get("replicate", "left"), p.get("replicate", "right")) == (left, right)


def test_replicate_needs_a_small_copy_that_saves_a_shuffle() -> None:
    # 11 MiB: over Spark's broadcast threshold
    p = spark(given("left", 1000, bytes=11 << 20), given("right", 3_000_000, bytes=1 << 28))
    assert p.get("replicate", "left") == "shuffle"
    # 1,000 rows copied to 4 shards (3,000 extra) to save shuffling 2,000 rows: no
    p = spark(given("left", 1000, bytes=1000), given("right", 2000, bytes=2000))
    assert (p.get("replicate", "left"), p.get("replicate", "right")) == ("shuffle",) * 2
    p = spark(given("left", 1000, bytes=1000), given("right", 9000, bytes=9000), cores=1)
    assert p.get("replicate", "left") == "shuffle"  # one shard


# ---- the plan ------------------------------------------------------------------------------


def test_plan_api_get_explain_to_dict() -> None:
    p = join(100_000, 3_000_000)
    with pytest.raises(PlannerError, match="no 'nope' decision"):
        p.get("nope")
    assert p.get("nope", default=7) == 7
    doc = json.loads(json.dumps(p.to_dict()))
    assert doc["kind"] == "join" and len(doc["decisions"]) == len(p.decisions)
    assert doc["sources"]["right"]["rows"] == 3_000_000
    text = p.explain()
    for d in p.decisions:  # every decision is in the tree, with its reason
        assert d.reason in text
    lines = text.splitlines()
    assert lines[1].startswith("├─ join join")
    idx = lines.index(f"├─ index {p.side_index('left')} (left side by [])")
    assert lines[idx + 1].startswith("│  ├─ layout: bag")
    assert "[rows=100,000" in text  # the figures that drove the decisions


def test_plan_rejects_unknown_fixed_choices() -> None:
    with pytest.raises(PlannerError, match="speed"):
        plan_join(given("left", 1), given("right", 1), speed="fast")


# ---- shapes from real joins and pipelines ----------------------------------------------------


def test_plan_for_a_real_join(tmp_path: Path) -> None:
    cust = pa.schema([("ck", pa.int64()), ("name", pa.string())])
    sales = pa.schema([("sk", pa.int64()), ("v", pa.int64())])
    with joinstate.StateStore(tmp_path / "s") as store:
        j = store.join("cs", left=joinstate.Side(cust, ["ck"], unique_key=["ck"]),
                       right=joinstate.Side(sales, ["sk"]), how="left")
        p = plan_population(j, {"left": given("left", 100),
                                "right": given("right", 200_000, snapshot=True)})
        left, right = j.index("left").column_family, j.index("right").column_family
        assert p.side_index("left") == left
        assert p.get("layout", left) == "key" and p.get("layout", right) == "bag"
        # the right side of a left join keeps degrees: not bulk-loadable
        assert p.get("strategy", "cs") == "asymmetric"


def test_plan_pipeline_reads_the_operator_graph(tmp_path: Path) -> None:
    cs = pa.schema([("ck", pa.int64()), ("name", pa.string())])
    ss = pa.schema([("sk", pa.int64()), ("yr", pa.int32()), ("amt", pa.float64())])
    shares: list[bool | dict[str, bool]] = [True, False, {"agg3": False}]
    for i, share in enumerate(shares):
        with joinstate.StateStore(tmp_path / f"s{i}") as store:
            c = joinstate.source("customer", cs, unique_key="ck")
            s = joinstate.source("sales", ss)
            per = (s.join(c, on=("sk", "ck")).group_by(["name", "yr"])
                   .aggregate(total=("sum", "amt")))
            graph = joinstate.Graph().output("per_year", per)
            graph = graph.output("growth", joinstate.join_all({
                "a": per.filter(pc.field("yr") == 2000).select(["name", "total"]),
                "b": per.filter(pc.field("yr") == 2001)}, on="name"))
            p = joinstate.Pipeline(store, "mini", graph, share_indexes=share)
            plan = plan_population(p, {"customer": given("customer", 200),
                                       "sales": given("sales", 4000)})
            ctx = plan.context
            assert ctx is not None
            assert [j.name for j in ctx.joins] == ["join2"]
            assert (ctx.joins[0].left, ctx.joins[0].right) == ("sales", "customer")
            assert plan.get("small_side", "join2") == "right"
            (g,) = [g for g in ctx.share_groups if len(g.readers) > 1]
            assert (g.stream, g.key) == ("agg3", ("name",))
            a, b = g.readers
            assert (a.name, a.stream, a.columns, a.filtered, a.filter_columns) == (
                "joinall7[0]", "project5", ("name", "total"), True, ("yr",))
            assert (b.name, b.stream, b.filtered) == ("joinall7[1]", "filter6", True)
            if share is True:  # the pipeline's own account of who reads the shared index
                assert f"read by {a.name}, {b.name}" in p.explain()
            # the derived indexes are the pipeline's own
            assert {ix.name for ix in ctx.indexes} == {
                ix.column_family for ix in p.indexes()}
            assert all(ix.stream for ix in ctx.indexes)
            assert len(g.indexes) == (1 if share is True else 2)
            assert plan.get("sharing", "agg3[name]") == "shared"  # reader rows unknown
            assert plan.get("order") == ["customer", "sales"]


def test_key_stats_reach_the_rules() -> None:
    s = SourceStats("left", 1000, keys=(KeyStats(("k",), 10, False, "sample"),))
    d = layout_of(s)
    assert d.figures["distinct_keys"] == 10 and d.figures["rows_per_key"] == 100.0
