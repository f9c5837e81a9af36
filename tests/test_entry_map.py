"""Read-free retractions on a bag side: the exact entry map, in memory and on disk.

A bag side's retractions are decided by an in-memory map of every stored entry (row
hash -> batch sequence, count) and written blindly, without reading RocksDB.  That is
only right if the map is exact, so these tests check it from every side:

* the map itself against a plain dict model (random adds, lookups, count changes,
  merges of its runs, directories of long runs);
* retractions through the map (full, partial, of rows with several entries, refused
  over-retractions) against the oracle, with ``verify()`` comparing map and index;
* the map after a clean reopen (loaded and used), after a crash (its file is stale:
  retractions go by seeks until a scan rebuilds it), and after damage to its file
  (a flipped bit, a consistent-looking file with wrong counts, a file of another
  store): never trusted, outputs exact throughout.
"""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
import textwrap
import zipfile
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest

import joinstate
from joinstate._keyset import _DIR_MIN, EntryMap
from tests.oracle import join_oracle, zset_add, zset_from_table

if TYPE_CHECKING:
    from pathlib import Path

LEFT = pa.schema([("k", pa.int64()), ("name", pa.string())])
RIGHT = pa.schema([("k", pa.int64()), ("v", pa.int64())])
U64 = np.uint64


# ---- the map on its own ----------------------------------------------------------------


def _model_lookup(model: dict[tuple[int, int, int], int], lo: np.ndarray, hi: np.ndarray
                  ) -> Counter[tuple[int, int, int]]:
    want: Counter[tuple[int, int, int]] = Counter()
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        for (x, y, s), c in model.items():
            if (x, y) == (a, b) and c:
                want[(i, s, c)] += 1
    return want


@pytest.mark.parametrize("seed", range(4))
def test_entry_map_against_a_dict(seed: int) -> None:
    """Adds, lookups and count changes, with few distinct low halves (collisions)."""
    rng = np.random.default_rng(seed)
    emap = EntryMap()
    model: dict[tuple[int, int, int], int] = {}
    for step in range(60):
        n = int(rng.integers(1, 40))
        lo = rng.integers(0, 50, n).astype(U64)  # many rows share the low 64 bits
        hi = rng.integers(0, 3, n).astype(U64)
        pairs = {(int(a), int(b)) for a, b in zip(lo, hi, strict=True)}
        lo = np.array([p[0] for p in pairs], U64)
        hi = np.array([p[1] for p in pairs], U64)
        seq = np.full(len(lo), step, U64)
        count = rng.integers(1, 4, len(lo)).astype(np.int64)
        emap.add(lo, hi, seq, count)
        for a, b, s, c in zip(lo.tolist(), hi.tolist(), seq.tolist(), count.tolist(),
                              strict=True):
            model[(a, b, s)] = c
        if step % 3 == 0:
            q = rng.integers(0, 50, 30).astype(U64)
            qh = rng.integers(0, 3, 30).astype(U64)
            found = emap.lookup(q, qh)
            got = Counter(zip(found.qi.tolist(), found.seq.tolist(), found.count.tolist(),
                              strict=True))
            assert got == _model_lookup(model, q, qh)
            new = rng.integers(0, 3, len(found)).astype(np.int64)  # 0 removes
            if step % 2:
                emap.add(np.array([7], U64), np.array([1], U64), np.array([1000 + step], U64),
                         np.array([1], np.int64))  # entries move before the update
                model[(7, 1, 1000 + step)] = 1
                emap.settle()
            emap.set_counts(found, new)
            keys = [(int(q[i]), int(qh[i]), int(s)) for i, s in
                    zip(found.qi.tolist(), found.seq.tolist(), strict=True)]
            for key, c in zip(keys, new.tolist(), strict=True):
                model[key] = c
        assert len(emap) == sum(1 for c in model.values() if c)
        assert emap.total() == sum(model.values())
    lo, hi, seq, count = emap.arrays()
    assert (lo[1:] >= lo[:-1]).all()
    assert sorted(zip(lo.tolist(), hi.tolist(), seq.tolist(), count.tolist(), strict=True)) \
        == sorted((a, b, s, c) for (a, b, s), c in model.items() if c)
    again = EntryMap.from_sorted(lo, hi, seq, count)
    q = np.arange(50, dtype=U64)
    for h in range(3):
        f1 = emap.lookup(q, np.full(50, h, U64))
        f2 = again.lookup(q, np.full(50, h, U64))
        assert sorted(zip(f1.qi.tolist(), f1.seq.tolist(), strict=True)) == \
            sorted(zip(f2.qi.tolist(), f2.seq.tolist(), strict=True))


def test_long_runs_are_searched_through_their_directory() -> None:
    rng = np.random.default_rng(1)
    n = 4 * _DIR_MIN + 17
    lo = np.sort(rng.integers(0, 2**64 - 1, n, dtype=U64))
    lo[100:110] = lo[100]  # a row with several entries
    emap = EntryMap.from_sorted(lo, np.zeros(n, U64), np.arange(n, dtype=U64),
                                np.ones(n, np.int64))
    run = emap.runs[0]
    assert run.dir is not None
    q = np.concatenate([rng.integers(0, 2**64 - 1, 5000, dtype=U64), lo[::7],
                        np.array([0, 2**64 - 1, lo[0], lo[-1]], U64)])
    assert (run.first_at_or_after(q) == np.searchsorted(lo, q, side="left")).all()
    found = emap.lookup(lo[[100, 5, n - 1]], np.zeros(3, U64))
    assert Counter(found.qi.tolist()) == {0: 10, 1: 1, 2: 1}


# ---- through a join ----------------------------------------------------------------


def _table(rows: list[tuple[int, int]], w: list[int] | None = None) -> pa.Table:
    t = pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}, schema=RIGHT)
    return t if w is None else t.append_column("_weight", pa.array(w, pa.int64()))


class Run:
    """A join customer(k unique) x sales(bag), its integrated inputs and outputs."""

    def __init__(self, path: Path, options: joinstate.StoreOptions | None = None) -> None:
        self.path = path
        self.options = options or joinstate.StoreOptions(probe="point")
        self.left: Counter[tuple[Any, ...]] = Counter()
        self.right: Counter[tuple[Any, ...]] = Counter()
        self.out: Counter[tuple[Any, ...]] = Counter()
        self.store: joinstate.StateStore | None = None
        self.join: joinstate.Join | None = None

    def open(self) -> joinstate.Join:
        self.store = joinstate.StateStore(self.path, self.options)
        self.join = self.store.join(
            "j", left=joinstate.Side(LEFT, ["k"], ["k"]), right=joinstate.Side(RIGHT, ["k"]))
        return self.join

    def close(self) -> None:
        assert self.store is not None
        self.store.close()

    def push(self, side: str, table: pa.Table) -> None:
        assert self.join is not None
        out = self.join.push(side, table)  # type: ignore[arg-type]
        self.out = zset_add(self.out, zset_from_table(out, out.schema.names[:-1]))
        model = self.left if side == "left" else self.right
        delta = zset_from_table(table, ["k", "name"] if side == "left" else ["k", "v"])
        model.update(delta)
        for r in [r for r, c in model.items() if c == 0]:
            del model[r]
        self.check()

    def check(self) -> None:
        assert self.join is not None
        assert self.out == join_oracle(self.left, self.right, [0], [0], "inner", 2, 2)
        assert zset_from_table(self.join.state("right"), ["k", "v"]) == self.right

    @property
    def emap(self) -> EntryMap | None:
        assert self.join is not None
        layout = self.join.right.layout  # the core's own object
        return layout.emap  # type: ignore[attr-defined,no-any-return]


def test_retractions_through_the_map(tmp_path: Path) -> None:
    """Full, partial and multi-entry retractions; refusals change nothing."""
    run = Run(tmp_path / "s")
    run.open()
    try:
        run.push("left", pa.table({"k": list(range(5)), "name": list("abcde")}, schema=LEFT))
        rows = [(k % 5, v) for k, v in enumerate(range(40))]
        run.push("right", _table(rows, [3] * 40))  # three copies: one entry each
        run.push("right", _table(rows[:10], [2] * 10))  # a second entry for ten rows
        assert run.emap is not None and len(run.emap) == 50
        run.push("right", _table(rows[:20], [-1] * 20))  # partial: first entry rewritten
        entries = run.join.index("right").entries  # type: ignore[union-attr]
        assert entries == 40, "a partial retraction rewrites in place"
        run.push("right", _table(rows[:10], [-4] * 10))  # exhausts the ten with two entries
        assert run.join.index("right").entries == 30  # type: ignore[union-attr]
        run.push("right", _table(rows[30:], [-3] * 10))  # full deletes
        before = run.join.state("right")  # type: ignore[union-attr]
        for bad in (_table(rows[:1], [-1]), _table([(0, 999)], [-1]),
                    _table([rows[12], rows[13]], [-1, -3])):
            with pytest.raises(joinstate.OverRetractionError):
                run.join.push("right", bad)  # type: ignore[union-attr]
            assert run.join.state("right").equals(before)  # type: ignore[union-attr]
        run.push("right", _table(rows[12:14], [-2, -2]))  # the map was left as it was
        assert run.store is not None and run.store.verify()
    finally:
        run.close()


def test_the_map_is_loaded_after_a_clean_reopen(tmp_path: Path) -> None:
    run = Run(tmp_path / "s")
    run.open()
    run.push("left", pa.table({"k": [1, 2], "name": ["x", "y"]}, schema=LEFT))
    run.push("right", _table([(1, v) for v in range(30)] + [(2, 5)]))
    run.push("right", _table([(1, v) for v in range(10)], [-1] * 10))
    run.close()
    run.open()
    try:
        assert run.emap is not None and len(run.emap) == 21  # loaded, not rebuilt
        run.push("right", _table([(1, v) for v in range(10, 20)], [-1] * 10))
        run.push("right", _table([(1, 0), (2, 5)], [2, 1]))
        assert run.store is not None and run.store.verify()
    finally:
        run.close()


_CHILD = textwrap.dedent("""
    import os, signal, sys
    import pyarrow as pa
    import joinstate
    spec = {spec}
    left = pa.schema([("k", pa.int64()), ("name", pa.string())])
    right = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    store = joinstate.StateStore(spec["path"], joinstate.StoreOptions(probe="point"))
    join = store.join("j", left=joinstate.Side(left, ["k"], ["k"]),
                      right=joinstate.Side(right, ["k"]))
    for k, v, w in spec["pushes"]:
        join.push("right", pa.table({{"k": k, "v": v, "_weight": pa.array(w, pa.int64())}},
                                    schema=right.append(pa.field("_weight", pa.int64()))))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _crash_after(path: Path, pushes: list[tuple[list[int], list[int], list[int]]]) -> None:
    spec = {"path": str(path), "pushes": pushes}
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(spec=json.dumps(spec))],
                          check=False, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr


@pytest.mark.parametrize("rebuild", [True, False])
@pytest.mark.parametrize("writes_after_reopen", [False, True])
def test_after_a_crash_the_saved_map_is_not_trusted(tmp_path: Path, writes_after_reopen: bool,
                                                    rebuild: bool) -> None:
    """The file saved at the last clean close describes an older state after a crash.

    ``rebuild=False`` forbids building a map by scan (``unique_filter_max_rows=0``), so
    every retraction after the crash finds its entries by seeks.
    """
    options = joinstate.StoreOptions(probe="point",
                                     unique_filter_max_rows=50_000_000 if rebuild else 0)
    run = Run(tmp_path / "s", options)
    run.open()
    run.push("left", pa.table({"k": [1, 2, 3], "name": ["x", "y", "z"]}, schema=LEFT))
    rows = [(k % 3 + 1, v) for k, v in enumerate(range(60))]
    run.push("right", _table(rows))
    run.push("right", _table(rows[:6], [2] * 6))  # second entries
    run.close()  # the map is saved here
    pushes: list[tuple[list[int], list[int], list[int]]] = []
    if writes_after_reopen:
        # Retractions and inserts the saved map does not know about, then kill -9.
        pushes = [([1, 2, 3], [0, 1, 2], [-2, -1, -3]), ([1, 1], [0, 500], [1, 2])]
        for k, v, w in pushes:
            for key, val, weight in zip(k, v, w, strict=True):
                run.right[(key, val)] += weight
        run.right = Counter({r: c for r, c in run.right.items() if c})
        run.out = join_oracle(run.left, run.right, [0], [0], "inner", 2, 2)
    _crash_after(tmp_path / "s", pushes)
    run.open()
    try:
        assert (run.emap is not None) == (not writes_after_reopen)
        run.check()
        gone = [r for r in rows[3:40] if run.right[r]]
        run.push("right", _table(gone, [-run.right[r] for r in gone]))
        if writes_after_reopen:
            run.push("right", _table([(1, 500), (1, 0)], [-2, -1]))
        with pytest.raises(joinstate.OverRetractionError):
            run.join.push("right", _table(gone[:1], [-1]))  # type: ignore[union-attr]
        assert (run.emap is not None) == (rebuild or not writes_after_reopen)
        run.push("right", _table(rows[45:50], [-1] * 5))
        assert run.store is not None and run.store.verify()
    finally:
        run.close()


def _map_file(path: Path) -> Path:
    (found,) = [f for f in (path / "derived").glob("entry-map-*.npz") if ".nulls" not in f.name]
    return found


# numpy's np.load leaves the file of a truncated archive to the garbage collector.
_NUMPY_LEAK = pytest.mark.filterwarnings("ignore::ResourceWarning")


@_NUMPY_LEAK
@pytest.mark.parametrize("damage", ["flipped-bit", "wrong-counts", "other-store", "truncated"])
def test_a_damaged_map_file_is_refused(tmp_path: Path, damage: str) -> None:
    run = Run(tmp_path / "s")
    run.open()
    run.push("left", pa.table({"k": [1, 2], "name": ["x", "y"]}, schema=LEFT))
    rows = [(k % 2 + 1, v) for k, v in enumerate(range(50))]
    run.push("right", _table(rows))
    run.push("right", _table(rows[:5], [1] * 5))
    run.close()
    target = _map_file(tmp_path / "s")
    if damage == "flipped-bit":
        with zipfile.ZipFile(target) as z:
            members = sorted(z.infolist(), key=lambda i: i.header_offset)
        after_lo = next(i for i in members if i.header_offset > next(
            m.header_offset for m in members if m.filename == "lo.npy"))
        raw = bytearray(target.read_bytes())
        raw[after_lo.header_offset - 3] ^= 0x10  # in lo's last value: its CRC-32 catches it
        target.write_bytes(bytes(raw))
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:200])
    elif damage == "wrong-counts":
        with np.load(target) as data:
            arrays = {k: data[k] for k in data.files}
        arrays["count"] = arrays["count"].copy()
        arrays["count"][0] += 1  # one row seems to have a copy more than it has
        np.savez(target, **arrays)
    else:
        # The same pushes into another store: same counters, another RocksDB identity.
        other = Run(tmp_path / "o")
        other.open()
        other.push("left", pa.table({"k": [1, 2], "name": ["x", "y"]}, schema=LEFT))
        other.push("right", _table(rows))
        other.push("right", _table(rows[:5], [1] * 5))
        other.close()
        target.write_bytes(_map_file(tmp_path / "o").read_bytes())
    run.open()
    try:
        assert run.emap is None, "a damaged or foreign map is not loaded"
        run.push("right", _table(rows[:10], [-1] * 10))
        with pytest.raises(joinstate.OverRetractionError):
            run.join.push("right", _table(rows[5:6], [-1]))  # type: ignore[union-attr]
        assert run.store is not None and run.store.verify()
    finally:
        run.close()
        gc.collect()


def test_a_damaged_probe_cache_file_does_not_stop_the_open(tmp_path: Path) -> None:
    run = Run(tmp_path / "s", joinstate.StoreOptions(probe="scan"))
    run.open()
    run.push("left", pa.table({"k": [1, 2], "name": ["x", "y"]}, schema=LEFT))
    run.push("right", _table([(1, 1), (2, 2)]))
    run.close()
    for f in (tmp_path / "s" / "derived").glob("*.npz"):
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        f.write_bytes(bytes(raw))
    run.options = joinstate.StoreOptions()
    run.open()
    try:
        run.push("right", _table([(1, 1)], [-1]))
    finally:
        run.close()


@_NUMPY_LEAK
def test_random_streams_with_reopens_and_lost_map_files(tmp_path: Path) -> None:
    """Random bag deltas (copies, partial and full retractions); the map file is kept,
    dropped or damaged at each reopen; every output checked against the oracle."""
    rng = random.Random(7)
    run = Run(tmp_path / "s")
    run.open()
    run.push("left", pa.table({"k": list(range(6)), "name": list("abcdef")}, schema=LEFT))
    try:
        for step in range(30):
            rows: list[tuple[int, int]] = []
            weights: list[int] = []
            present = list(run.right.items())
            rng.shuffle(present)
            for r, c in present[: rng.randint(0, 8)]:
                rows.append(r)
                weights.append(-rng.randint(1, c))
            for _ in range(rng.randint(0, 10)):
                r = (rng.randint(0, 7), rng.randint(0, 15))
                if r not in rows:
                    rows.append(r)
                    weights.append(rng.randint(1, 3))
            if rows:
                run.push("right", _table(rows, weights))
            if step % 5 == 4:
                run.close()
                choice = rng.choice(["keep", "drop", "damage"])
                files = list((tmp_path / "s" / "derived").glob("entry-map-*.npz"))
                for f in files:
                    if choice == "drop":
                        f.unlink()
                    elif choice == "damage":
                        f.write_bytes(f.read_bytes()[:-9])
                run.open()
        assert run.store is not None and run.store.verify()
    finally:
        run.close()
        gc.collect()


def test_writes_that_never_became_durable_are_forgotten_by_reload(tmp_path: Path) -> None:
    """A bulk sink takes a batch and loses it (a failed ingestion): after ``reload()`` the
    maps of both families (NULL-key rows too) no longer know its rows."""
    with joinstate.StateStore(tmp_path / "s", joinstate.StoreOptions(probe="point")) as store:
        join = store.join("j", left=joinstate.Side(LEFT, ["k"], ["k"]),
                          right=joinstate.Side(RIGHT, ["k"]))
        kept = pa.table({"k": pa.array([1, None], pa.int64()), "v": [1, 2]}, schema=RIGHT)
        join.push("right", kept)
        lost = pa.table({"k": pa.array([1, None], pa.int64()), "v": [10, 20]}, schema=RIGHT)
        taken: list[Any] = []
        join.apply("right", join.prepare("right", lost),
                   sink=lambda blocks, records: taken.append(blocks))  # never made durable
        assert taken
        join.reload()
        for row in ({"k": [1], "v": [10]}, {"k": pa.array([None], pa.int64()), "v": [20]}):
            gone = pa.table(row, schema=RIGHT).append_column("_weight", pa.array([-1]))
            with pytest.raises(joinstate.OverRetractionError):
                join.push("right", gone)
        join.push("right", kept.append_column("_weight", pa.array([-1, -1])))
        assert join.rows("right") == 0
        assert store.verify()
