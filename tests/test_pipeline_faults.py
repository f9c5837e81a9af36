"""Faults for pipelines, as tests/test_faults.py does for joins.

* threads: pushes into two sources of one pipeline from two threads, with a reader of a
  materialized output running: every push is one transaction, so the reader never sees
  part of one and the final output equals a plain evaluation of the final inputs;
* disk full: pushes into a pipeline on a 4 MiB tmpfs until it is full raise
  ``StateIOError``; ``close()`` works; after the disk grows, a reopen holds exactly the
  committed pushes (checked against a plain evaluation) and accepts more;
* a flipped byte: 64 bytes inverted in the middle of every big SST of a closed pipeline
  store; a push probing the damaged index raises ``StateCorruptedError`` (point and
  scan probes) and changes nothing, ``verify()`` finds the damage;
* int64 overflow: an aggregate's count and a join's output weight past int64 raise
  ``WeightOverflowError`` and change nothing; the pipeline goes on from where it was.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from faults import Tmpfs
from faults import small_disk as mount_small_disk

import joinstate

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

A = pa.schema([("k", pa.int64()), ("v", pa.int64())])
B = pa.schema([("k", pa.int64()), ("s", pa.string())])


def define() -> joinstate.Graph:
    a = joinstate.source("a", A)
    b = joinstate.source("b", B)
    joined = a.join(b, on="k").select({"k": "k", "v": "v"})
    totals = joined.group_by("k").aggregate(total=("sum", pc.field("v")), n=("count", None))
    graph = joinstate.Graph()
    graph = graph.output("totals", totals, materialize=True)
    return graph


def delta(schema: pa.Schema, keys: np.ndarray, values: list[Any], w: int = 1) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()),
                     schema.names[1]: pa.array(values, schema.field(1).type),
                     joinstate.WEIGHT: pa.array(np.full(len(keys), w), pa.int64())})


def expected(a_rows: list[tuple[int, int]], b_rows: list[tuple[int, str]]
             ) -> Counter[tuple[Any, ...]]:
    b_count = Counter(k for k, _ in b_rows)
    total: Counter[int] = Counter()
    n: Counter[int] = Counter()
    for k, v in a_rows:
        if b_count[k]:
            total[k] += v * b_count[k]
            n[k] += b_count[k]
    return Counter({(k, total[k], n[k]): 1 for k in n})


def as_rows(t: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(zip(t["k"].to_pylist(), t["total"].to_pylist(), t["n"].to_pylist(),
                       strict=True))


def test_two_threads_push_two_sources_of_one_pipeline(tmp_path: Path) -> None:
    batches, rows = 40, 300
    a_rows = [(int(k), int(k) % 7) for b in range(batches)
              for k in range(b * rows, (b + 1) * rows)]
    b_rows = [(int(k), "x") for b in range(batches)
              for k in range(b * rows, (b + 1) * rows) if k % 3]
    errors: list[BaseException] = []
    seen: list[int] = []
    stop = threading.Event()
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "t", define())
        p.compile()

        def push_a() -> None:
            try:
                for b in range(batches):
                    part = a_rows[b * rows:(b + 1) * rows]
                    p.push("a", delta(A, np.array([k for k, _ in part]), [v for _, v in part]))
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        def push_b() -> None:
            try:
                for b in range(batches):
                    keys = np.array([k for k in range(b * rows, (b + 1) * rows) if k % 3])
                    p.push("b", delta(B, keys, ["x"] * len(keys)))
            except BaseException as exc:
                errors.append(exc)

        def read() -> None:
            while not stop.is_set():
                try:
                    t = p.read("totals")
                    seen.append(int(pc.sum(t["n"]).as_py() or 0))
                except BaseException as exc:
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=f) for f in (push_a, push_b)]
        reader = threading.Thread(target=read)
        reader.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        reader.join()
        assert not errors, errors
        want = expected(a_rows, b_rows)
        assert as_rows(p.read("totals")) == want
        assert seen == sorted(seen), "a reader saw the output shrink: it saw part of a push"
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "t", define())
        assert as_rows(p.read("totals")) == want


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Tmpfs]:
    """A 4 MiB tmpfs; skipped (with the reason) where it cannot be mounted."""
    yield from mount_small_disk(tmp_path / "disk", "4m")


def fill(p: joinstate.Pipeline, **push: Any) -> tuple[list[tuple[int, int]], BaseException]:
    """Push 1,000-row batches to ``a`` until one fails: the rows committed, the failure."""
    committed: list[tuple[int, int]] = []
    for b in range(400):
        keys = np.arange(b * 1000, (b + 1) * 1000) // 1000 * 1000 + np.arange(1000) % 7
        values = list(range(b * 1000, (b + 1) * 1000))  # distinct rows: no consolidation
        try:
            p.push("a", delta(A, keys, values), commit_id=f"a{b}", **push)
        except Exception as exc:
            return committed, exc
        committed += [(int(k), v) for k, v in zip(keys, values, strict=True)]
    raise AssertionError("4 MiB never filled")


@pytest.mark.parametrize("through_files", [False, True], ids=["write-batch", "sst-files"])
def test_disk_full_during_pipeline_pushes(small_disk: Tmpfs, monkeypatch: pytest.MonkeyPatch,
                                          through_files: bool) -> None:
    """The disk fills during pushes (``sst-files``: pushes that write their inserts as
    ingested SST files, the path of population pushes): a named error, the failed push
    applied nowhere, and the store reopened on a bigger disk holds exactly the committed
    pushes and takes more."""
    import joinstate.transaction

    monkeypatch.setattr(joinstate.transaction, "INGEST_MIN_ROWS", 1)
    path = small_disk.path / "store"
    store = joinstate.StateStore(path)
    p = joinstate.Pipeline(store, "d", define())
    p.push("b", delta(B, np.arange(0, 10**6, 1000), ["y" * 50] * 1000))
    push: dict[str, Any] = {"ingest": p.column_families()} if through_files else {}
    committed, failure = fill(p, **push)
    assert len(committed) >= 2000, len(committed)  # several pushes went through
    assert isinstance(failure, joinstate.StateIOError), f"{type(failure)!r}: {failure}"
    # One more (tiny) push: the disk is still full, unless the failed push's staged SST
    # files were all that filled it (they are removed when it fails), in which case the
    # push may fit.  Either way: a named error, or a push that counts.
    try:
        p.push("a", delta(A, np.array([0]), [1]), **push)
    except joinstate.StateIOError:
        pass
    else:
        assert through_files, "the WAL path stays failed once RocksDB has met a full disk"
        committed.append((0, 1))
    store.close()
    store.close()
    small_disk.resize("64m")
    b_rows = [(int(k), "y" * 50) for k in np.arange(0, 10**6, 1000)]
    with joinstate.StateStore(path) as store:
        p = joinstate.Pipeline(store, "d", define())
        assert as_rows(p.read("totals")) == expected(committed, b_rows)
        n = len(committed) // 1000
        assert p.committed(f"a{n - 1}")
        assert not p.committed(f"a{n}")
        store.verify()  # raises if a count disagrees with its files or counters
        p.push("a", delta(A, np.array([0]), [5]), **push)  # writable again
        assert as_rows(p.read("totals")) == expected([*committed, (0, 5)], b_rows)


# ---- a flipped byte in a pipeline's state --------------------------------------------------

CORRUPT_ROWS = 20_000


def define_wide() -> joinstate.Graph:
    """``a ⋈ b`` on ``k``, b's long strings kept (its index fills SSTs of many blocks), and
    a materialized count per key of ``a`` (small: stays readable when the big files are
    damaged, so it shows whether a failed push changed anything)."""
    a = joinstate.source("a", A)
    b = joinstate.source("b", B)
    graph = joinstate.Graph()
    graph = graph.output("pairs", a.join(b, on="k").select({"k": "k", "v": "v", "s": "s"}))
    graph = graph.output("per_key", a.group_by("k").aggregate(n=("count", None)), materialize=True)
    return graph


@pytest.fixture(scope="module")
def pristine_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from faults import sst_files

    path = tmp_path_factory.mktemp("pristine-pipeline") / "store"
    keys = np.arange(CORRUPT_ROWS)
    with joinstate.StateStore(path) as store:
        p = joinstate.Pipeline(store, "wide", define_wide())
        p.push("b", delta(B, keys, [f"row {i:08d} " + "x" * 80 for i in keys.tolist()]))
        p.push("a", delta(A, keys[:10], list(range(10))))
        store.flush()
    assert any(f.stat().st_size > 1 << 20 for f in sst_files(path)), sst_files(path)
    return path


def _open_wide(path: Path) -> tuple[joinstate.StateStore, joinstate.Pipeline] | None:
    try:
        store = joinstate.StateStore(path)
    except joinstate.StateCorruptedError:
        return None  # refusing to open a damaged store is a right answer too
    p = joinstate.Pipeline(store, "wide", define_wide())
    return store, p


def test_pristine_pipeline_copy_answers(pristine_pipeline: Path, tmp_path: Path) -> None:
    """The control: the undamaged copy joins every probed key."""
    from faults import copy_store

    opened = _open_wide(copy_store(pristine_pipeline, tmp_path / "store"))
    assert opened is not None
    store, p = opened
    with store:
        outs = p.push("a", delta(A, np.arange(CORRUPT_ROWS), [1] * CORRUPT_ROWS))
        assert outs["pairs"].num_rows == CORRUPT_ROWS
        assert p.read("per_key").num_rows == CORRUPT_ROWS


@pytest.mark.parametrize("probe", ["point", "scan"])
def test_flipped_sst_block_fails_a_pipeline_push_and_applies_nothing(
        pristine_pipeline: Path, tmp_path: Path, probe: str) -> None:
    from faults import copy_store, flip_bytes, sst_files

    path = copy_store(pristine_pipeline, tmp_path / "store")
    for sst in sst_files(path):
        if sst.stat().st_size > 1 << 20:
            flip_bytes(sst, 64)
    try:
        store = joinstate.StateStore(path, joinstate.StoreOptions(probe=probe))  # type: ignore[arg-type]
    except joinstate.StateCorruptedError:
        return  # refusing to open a damaged store is a right answer too
    p = joinstate.Pipeline(store, "wide", define_wide())
    with store:
        before = p.read("per_key")
        with pytest.raises(joinstate.StateCorruptedError):
            outs = p.push("a", delta(A, np.arange(CORRUPT_ROWS), [1] * CORRUPT_ROWS))
            pytest.fail(f"the push returned {outs['pairs'].num_rows} of {CORRUPT_ROWS} pairs")
        # one transaction: a's index and the per-key counts are as before the push
        assert p.read("per_key").equals(before)
        with pytest.raises(joinstate.StateCorruptedError):
            store.verify()


# ---- int64 overflow inside a pipeline --------------------------------------------------------


def test_aggregate_count_overflow_applies_nothing(tmp_path: Path) -> None:
    """A group's count(*) past int64 (huge weights): WeightOverflowError, nothing written,
    the pipeline goes on from where it was."""
    big = (1 << 62)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "wide", define_wide())
        p.push("b", delta(B, np.array([1]), ["one"]))
        p.push("a", delta(A, np.array([1]), [5], w=big))
        before = p.read("per_key")
        with pytest.raises(joinstate.WeightOverflowError):
            p.push("a", delta(A, np.array([1, 1]), [6, 7], w=big))
        assert p.read("per_key").equals(before)
        # b's side of the join still holds one row: a retraction of a's row pairs once
        outs = p.push("a", delta(A, np.array([1]), [5], w=-big))
        assert outs["pairs"].column(joinstate.WEIGHT).to_pylist() == [-big]
        assert p.read("per_key").num_rows == 0


def test_join_output_weight_overflow_applies_nothing(tmp_path: Path) -> None:
    """weight(a row) x weight(b row) past int64 in the join: refused, nothing written."""
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "wide", define_wide())
        p.push("b", delta(B, np.array([1]), ["one"], w=1 << 40))
        with pytest.raises(joinstate.WeightOverflowError):
            p.push("a", delta(A, np.array([1]), [5], w=1 << 40))
        assert p.read("per_key").num_rows == 0
        outs = p.push("a", delta(A, np.array([1]), [5], w=2))
        assert outs["pairs"].column(joinstate.WEIGHT).to_pylist() == [2 << 40]
