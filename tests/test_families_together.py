"""Column families created together: one step for a new store, options given at creation.

RocksDB rewrites its OPTIONS file (every family's options) at each family it creates and
at each ``set_options``.  :meth:`joinstate.StateStore.families_together` defers the
creation of the families first used in its block and creates them by one re-open;
options set before that (auto-compaction off for a population's load, a memtable) are
creation options and cost no ``set_options``.  These tests count the RocksDB calls
through a wrapper around ``rocksdict.Rdict`` and check that the state is the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_population_pipeline import build, data, reference

import joinstate
import population
from joinstate import db as dbmod
from joinstate.options import IndexOptions
from joinstate.testing import integrate

if TYPE_CHECKING:
    import pyarrow as pa

_REAL = dbmod.rd.Rdict


class _Counted:
    """A rocksdict ``Rdict`` whose family creations and ``set_options`` are counted."""

    def __init__(self, calls: dict[str, list[Any]], db: Any) -> None:
        self._calls = calls
        self._db = db

    def create_column_family(self, name: str, options: Any) -> Any:
        self._calls["create"].append(name)
        return _CountedFamily(self._calls, name, self._db.create_column_family(name, options))

    def get_column_family(self, name: str) -> Any:
        return _CountedFamily(self._calls, name, self._db.get_column_family(name))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._db, attr)


class _CountedFamily:
    def __init__(self, calls: dict[str, list[Any]], name: str, cf: Any) -> None:
        self._calls = calls
        self._name = name
        self._cf = cf

    def set_options(self, options: dict[str, str]) -> None:
        self._calls["set_options"].append((self._name, dict(options)))
        self._cf.set_options(options)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._cf, attr)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every RocksDB open (families listed), family creation and set_options."""
    seen: dict[str, list[Any]] = {"open": [], "create": [], "set_options": []}

    class Rdict:
        list_cf = staticmethod(_REAL.list_cf)

        def __new__(cls, path: str, *args: Any, **kwargs: Any) -> Any:
            seen["open"].append(sorted(kwargs.get("column_families") or ()))
            return _Counted(seen, _REAL(path, *args, **kwargs))

    monkeypatch.setattr(dbmod.rd, "Rdict", Rdict)
    return seen


def _options_file(path: Path) -> str:
    latest = max(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    return latest.read_text()


def _family_option(path: Path, cf: str, option: str) -> str:
    """``option`` of family ``cf`` in the store's latest OPTIONS file."""
    section = _options_file(path).split(f'[CFOptions "{cf}"]', 1)[1].split("[CFOptions", 1)[0]
    for line in section.splitlines():
        key, _, value = line.strip().partition("=")
        if key == option:
            return value
    raise AssertionError(f"{option} not in the options of {cf}")


def test_a_new_pipelines_families_are_created_in_one_step(
    tmp_path: Path, calls: dict[str, list[Any]]
) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        opens = len(calls["open"])
        with store.families_together():
            p = build(store)
            p.compile()
            assert not calls["create"]  # nothing created one at a time
        families = {cf for ix in p.indexes() for cf in ix.column_families}
        assert families <= set(store.column_families())
        # one re-open listing every family, no family created on its own
        assert len(calls["open"]) == opens + 1
        assert families <= set(calls["open"][-1])
        assert not calls["create"]


def test_options_set_before_creation_are_creation_options(
    tmp_path: Path, calls: dict[str, list[Any]]
) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        with store.families_together():
            store.cf("ix.a")
            store.cf("ix.b")
            store.set_cf_options("ix.a", {"disable_auto_compactions": "true"})
            store.recreate_empty("ix.b", IndexOptions(memtable="hash_skip_list"))
            # a family not created yet reads as empty, and creates nothing
            assert store.cf("ix.a").get([b"k1", b"k2"]) == [None, None]
            assert store.property_int("ix.a", "rocksdb.num-files-at-level0") == 0
            assert not calls["set_options"] and not calls["create"]
        assert not calls["set_options"] and not calls["create"]
        assert _family_option(store.path, "ix.a", "disable_auto_compactions") == "true"
        assert _family_option(store.path, "ix.b", "disable_auto_compactions") == "false"
        assert "HashSkipList" in _family_option(store.path, "ix.b", "memtable_factory")
        # switched on later: one call, and a later creation keeps what each family has
        store.set_cf_options("ix.a", {"disable_auto_compactions": "false"})
        with store.families_together():
            store.cf("ix.c")
        assert _family_option(store.path, "ix.a", "disable_auto_compactions") == "false"
        assert "HashSkipList" in _family_option(store.path, "ix.b", "memtable_factory")
        assert calls["set_options"] == [("ix.a", {"disable_auto_compactions": "false"})]
        store.cf("ix.c").put(b"\x00" * 8 + b"k", b"v")
        assert store.cf("ix.c").get(b"\x00" * 8 + b"k") == b"v"


def test_population_creates_the_families_it_loads_with_compaction_off(
    tmp_path: Path, calls: dict[str, list[Any]]
) -> None:
    d = data()
    outs: list[dict[str, pa.Table]] = []
    with joinstate.StateStore(tmp_path / "s") as store, store.families_together():
        p = build(store)
        p.compile()
        report = population.populate(p, sources=d, strategy="asymmetric", progress=False,
                                     batch_rows=700, sink=outs.append)
        disabled = [a["cf"] for a in report.actions if a["action"] == "disable"]
        enabled = [a["cf"] for a in report.actions if a["action"] == "enable"]
        assert disabled and sorted(disabled) == sorted(enabled)
        # every switch-off was a creation option: only the switches back on were calls
        assert sorted(cf for cf, _ in calls["set_options"]) == sorted(enabled)
        assert all(o == {"disable_auto_compactions": "false"} for _, o in calls["set_options"])
        assert not calls["create"]
        got = integrate([o["per_year"] for o in outs if "per_year" in o])
        assert got == reference(d)
    for cf in disabled:  # the families end with auto-compaction on
        assert _family_option(tmp_path / "s", cf, "disable_auto_compactions") == "false"


_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    import joinstate
    from test_population_pipeline import build
    store = joinstate.StateStore({path!r})
    with store.families_together():
        p = build(store)
        p.compile()
        os.kill(os.getpid(), 9)  # killed before the families were created
""")


def test_a_kill_before_the_families_exist_resumes_exactly(tmp_path: Path) -> None:
    path = tmp_path / "s"
    child = _CHILD.format(tests=str(Path(__file__).parent), path=str(path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", child], env=env, check=False,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    d = data()
    outs: list[dict[str, pa.Table]] = []
    with joinstate.StateStore(path) as store:
        p = build(store)
        p.compile()
        families = {cf for ix in p.indexes() for cf in ix.column_families}
        assert families <= set(store.column_families())
        population.populate(p, sources=d, strategy="asymmetric", progress=False,
                            batch_rows=700, sink=outs.append)
        got = integrate([o["per_year"] for o in outs if "per_year" in o])
        assert got == reference(d)
        assert store.verify()


def test_statistics_stay_cumulative_across_the_creation(tmp_path: Path) -> None:
    options = joinstate.StoreOptions(statistics=True)
    with joinstate.StateStore(tmp_path / "s", options) as store:
        for i in range(200):
            store.meta_put(b"k%d" % i, b"v" * 100)
        before = store.activity()
        assert before["wal_bytes"] > 0
        with store.families_together():
            store.cf("ix.a")
        after = store.activity()
        assert all(after[k] >= v for k, v in before.items())
        assert after["wal_bytes"] >= before["wal_bytes"]


def test_only_indexes_nothing_writes_before_their_switch_off_are_off_from_the_start() -> None:
    from types import SimpleNamespace

    from compaction import PopulationStarted, SideFinished
    from population.schedule import PlannedCompaction

    class Control:
        def __init__(self) -> None:
            self.off: list[str] = []

        def disable(self, cf: str, reason: str) -> None:
            self.off.append(cf)

        def compact(self, cf: str, reason: str) -> float:
            return 0.0

    schedule = {
        # written by "a" first: off only when "b" starts (its compaction still runs)
        "early": {"disable_before": ["b"], "compact_after": ["a"], "written_by": ["a", "b"]},
        # written by "b" only: nothing to compact before, off from the start
        "late": {"disable_before": ["b"], "compact_after": [], "written_by": ["b"]},
        "auto": {"disable_before": [], "compact_after": [], "written_by": ["a"]},
    }
    infos: Any = {cf: SimpleNamespace(data_column_families=(cf, cf + ".nulls"))
                  for cf in schedule}
    policy = PlannedCompaction(schedule, ["a", "b"], infos)
    control: Any = Control()
    policy.observe(PopulationStarted(None), control)
    assert control.off == ["late", "late.nulls"]
    policy.observe(SideFinished("a", small=False), control)  # type: ignore[arg-type]
    assert control.off[2:] == ["early", "early.nulls", "late", "late.nulls"]
