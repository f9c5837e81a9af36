"""Compaction policies and guard rails, checked against RocksDB's own OPTIONS file.

The central promise: no column family is left with auto-compaction disabled after
population, including when population fails midway.  ``auto_compaction_flags`` reads
the switch from the OPTIONS file RocksDB rewrites on every SetOptions, so these tests
check RocksDB's state, not our bookkeeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import compaction
import joinstate
import population
from population import synthetic as syn

if TYPE_CHECKING:
    import pyarrow as pa


def make_join(store: joinstate.StateStore, how: str = "inner") -> joinstate.Join:
    return store.join(
        "j",
        left=joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                            unique_key=["c_customer_sk"]),
        right=joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"]), how=how,
    )


def cfs(join: joinstate.Join, side: joinstate.SideName) -> tuple[str, str]:
    """The side's rows family and its NULL-key rows family (the data column families)."""
    info = join.index(side)
    assert info.column_family == info.data_column_families[0]
    assert len(info.data_column_families) == 2
    return info.data_column_families[0], info.data_column_families[1]


def failing(batches: list[pa.RecordBatch], after: int) -> Any:
    for i, b in enumerate(batches):
        if i == after:
            raise RuntimeError("injected failure mid-population")
        yield b


@pytest.mark.parametrize("strategy", ["asymmetric", "bulk"])
@pytest.mark.parametrize("order", ["small-first", "interleaved"])
def test_compaction_reenabled_after_failure_mid_population(
    tmp_path: Any, strategy: str, order: str
) -> None:
    cust = syn.customers(2000)
    sales = syn.sales(20_000, 2000).to_batches(max_chunksize=1000)
    seen_disabled: list[set[str]] = []
    with joinstate.StateStore(tmp_path / "s") as store:
        j = make_join(store)

        def spy(_out: pa.Table) -> None:
            flags = compaction.auto_compaction_flags(store.path)
            seen_disabled.append({cf for cf, off in flags.items() if off})

        with pytest.raises(RuntimeError, match="injected failure"):
            population.populate(j, cust, failing(sales, after=12), strategy=strategy,
                                order=order, sink=spy, progress=False,
                                sizes={"left": 2000, "right": 20_000}, batch_rows=500)
        # compaction really was off for the big side while loading ...
        assert any(cfs(j, "right")[0] in s for s in seen_disabled)
        # ... and is on again for every column family after the failure
        flags = compaction.auto_compaction_flags(store.path)
        assert flags and not any(flags.values()), flags
        assert j.phase == "population"
        assert not (tmp_path / "s" / "population-sst").exists()


def test_compaction_reenabled_after_failing_output_sink(tmp_path: Any) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        j = make_join(store)
        calls = []

        def sink(out: pa.Table) -> None:
            calls.append(out.num_rows)
            if len(calls) == 3:
                raise KeyboardInterrupt  # even a BaseException must not leave it disabled

        with pytest.raises(KeyboardInterrupt):
            population.populate(j, syn.customers(1000), syn.sales(10_000, 1000),
                                strategy="asymmetric", sink=sink, progress=False,
                                batch_rows=1000)
        assert not any(compaction.auto_compaction_flags(store.path).values())


def test_asymmetric_policy_compacts_small_side_and_disables_big_side(tmp_path: Any) -> None:
    """Small side one sorted run when the big side streams in; big side uncompacted."""
    opts = joinstate.StoreOptions(write_buffer_size=1 << 20)
    snapshots: list[dict[str, Any]] = []
    with joinstate.StateStore(tmp_path / "s", opts) as store:
        j = make_join(store)
        left, right = cfs(j, "left")[0], cfs(j, "right")[0]

        def spy(_out: pa.Table) -> None:
            snapshots.append(compaction.rocksdb_activity(store, [left, right]))

        rep = population.populate(j, syn.customers(20_000), syn.sales(200_000, 20_000),
                                  strategy="asymmetric", sink=spy, progress=False,
                                  batch_rows=10_000)
        during = snapshots[-1]["cf"]
        assert during[left]["num-files-at-level0"] == 0
        assert during[left]["auto_compaction_disabled"] is False
        assert during[right]["auto_compaction_disabled"] is True
        assert rep.l0_max[right] >= 3  # ~12 MiB of sales through a 1 MiB memtable
        kinds = [(a["action"], a["cf"]) for a in rep.actions]
        assert kinds.index(("compact", left)) < kinds.index(("disable", right))
        assert ("enable", right) in kinds
        assert rep.rocksdb["compaction_write_bytes"] > 0  # the small side's compaction
        after = compaction.rocksdb_activity(store)
        assert after["cf"][right]["auto_compaction_disabled"] is False
        assert after["db"]["flush_write_bytes"] > 0


def test_symmetric_leaves_rocksdb_alone(tmp_path: Any) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        j = make_join(store)
        rep = population.populate(j, syn.customers(1000), syn.sales(5000, 1000),
                                  strategy="symmetric", progress=False)
        assert rep.actions == []
        assert rep.sides["left"].memtable == rep.sides["right"].memtable == "skiplist"


def test_guard_reenables_when_l0_passes_limit(tmp_path: Any) -> None:
    opts = joinstate.StoreOptions(write_buffer_size=1 << 20)
    strategy = population.Strategy.asymmetric().replace(l0_limit=2)
    with joinstate.StateStore(tmp_path / "s", opts) as store:
        j = make_join(store)
        right = cfs(j, "right")[0]
        rep = population.populate(j, syn.customers(20_000), syn.sales(200_000, 20_000),
                                  strategy=strategy, progress=False, batch_rows=10_000,
                                  sample_interval=0.0)
        guard = [a for a in rep.actions if a["reason"].startswith("guard: l0_files")]
        assert guard and guard[0]["cf"] == right and guard[0]["action"] == "enable"
        # once tripped, the family stays enabled for the rest of population
        later = [a for a in rep.actions if a["t"] > guard[0]["t"] and a["cf"] == right]
        assert all(a["action"] != "disable" for a in later)


@pytest.mark.parametrize("policy", [compaction.AsymmetricPolicy, compaction.BulkLoadPolicy])
def test_guard_reenables_on_big_side_deletes(tmp_path: Any, policy: Any) -> None:
    """The one rule "deletes re-enable compaction" lives in the guard, not in the policies."""
    with joinstate.StateStore(tmp_path / "s") as store:
        j = make_join(store)
        control = compaction.CompactionControl(
            store, {s: j.index(s) for s in ("left", "right")})
        control.small = "left"
        right, right_nulls = cfs(j, "right")
        guard = compaction.Guard()
        main = policy()
        main.observe(compaction.PopulationStarted("left"), control)
        main.observe(compaction.SideFinished("left", small=True), control)
        assert control.disabled == {right, right_nulls}
        deletes = compaction.BatchWritten("right", rows=10, deletes=3)
        main.observe(deletes, control)  # the main policy leaves deletes to the guard
        assert control.disabled == {right, right_nulls}
        guard.observe(compaction.BatchWritten("right", rows=10, deletes=0), control)
        assert control.disabled
        guard.observe(deletes, control)
        assert not control.disabled and control.pinned == {right, right_nulls}
        control.disable(right, "a policy trying again")  # pinned: refused
        assert not compaction.auto_compaction_flags(store.path)[right]


def test_guarded_restores_and_propagates(tmp_path: Any) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        j = make_join(store)
        control = compaction.CompactionControl(
            store, {s: j.index(s) for s in ("left", "right")})
        left = cfs(j, "left")[0]
        with pytest.raises(ValueError, match="boom"), compaction.guarded(control):
            control.disable(left, "test")
            assert compaction.auto_compaction_flags(store.path)[left]
            raise ValueError("boom")
        assert not compaction.auto_compaction_flags(store.path)[left]
        with pytest.raises(joinstate.JoinStateError, match="'middle'"):
            control.cfs("middle")


def test_policies_satisfy_the_protocol() -> None:
    for p in (compaction.RocksDBDefaults(), compaction.AsymmetricPolicy(),
              compaction.BulkLoadPolicy(), compaction.Guard()):
        assert isinstance(p, compaction.CompactionPolicy)
    with pytest.raises(ValueError, match="l0_limit"):
        compaction.Guard(l0_limit=0)


def test_statistics_parsing() -> None:
    text = (
        "rocksdb.compact.read.bytes COUNT : 10\n"
        "rocksdb.compact.write.bytes COUNT : 7\n"
        "rocksdb.compaction.times.micros P50 : 1.0 P95 : 2.0 P99 : 3.0 P100 : 4.0 "
        "COUNT : 2 SUM : 900\n"
    )
    c = compaction.statistics_counters(text)
    assert c["rocksdb.compact.read.bytes"] == 10
    assert c["rocksdb.compaction.times.micros.sum"] == 900
    assert c["rocksdb.compaction.times.micros.count"] == 2
    assert compaction.statistics_counters(None) == {}
