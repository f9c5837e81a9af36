"""Checkpoints of a state store through pyarrow.fs (joinstate.checkpoint).

A local directory plays the durable location; a counting (and, where needed, failing or
killing) pyarrow filesystem handler around it sees every file written, independently
of what the checkpoint code reports about itself.  Stores are compared through their
public face (state, outputs of the same pushes, ``verify()``) and against the
plain-Python join oracle.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest
import xxhash
from faults import flip_bytes, truncate_half, zset
from oracle import join_oracle, zset_add, zset_from_table

import joinstate
from joinstate import checkpoint as ck
from joinstate.working_copy import open_checkpoint

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

CUSTOMER = pa.schema([("k", pa.int64()), ("name", pa.string())])
SALES = pa.schema([("k", pa.int64()), ("amount", pa.float64()), ("note", pa.string())])
W = joinstate.WEIGHT


# ---- data ---------------------------------------------------------------------------------


class Feed:
    """Deterministic change batches for a customer (unique key) ⋈ sales (bag) left join,
    with the integrated inputs kept for the oracle."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.left: Counter[tuple[Any, ...]] = Counter()
        self.right: Counter[tuple[Any, ...]] = Counter()
        self.next_key = 0

    def batches(self, n: int) -> Iterator[tuple[str, pa.Table]]:
        for _ in range(n):
            yield from self.round()

    def round(self) -> Iterator[tuple[str, pa.Table]]:
        rng = self.rng
        new = list(range(self.next_key, self.next_key + 40))
        self.next_key += 40
        yield "left", self._delta("left", [((k, f"c{k}"), 1) for k in new])
        keys = list(range(self.next_key))
        sales = [((rng.choice(keys), round(rng.random() * 100, 2), f"n{rng.randrange(5)}"), 1)
                 for _ in range(300)]
        sales += [((None, 1.5, "null key"), 1)]
        yield "right", self._delta("right", sales)
        stored = [r for r, w in self.right.items() for _ in range(w)]
        gone = rng.sample(stored, 60)
        yield "right", self._delta("right", [(r, -1) for r in gone])
        k = rng.choice(keys[:-40] or keys)
        if (k, f"c{k}") in self.left:
            yield "left", self._delta("left", [((k, f"c{k}"), -1), ((k, f"c{k}-v2"), 1)])

    def _delta(self, side: str, rows: list[tuple[tuple[Any, ...], int]]) -> pa.Table:
        into = self.left if side == "left" else self.right
        for r, w in rows:
            into[r] += w
            if into[r] == 0:
                del into[r]
        schema = CUSTOMER if side == "left" else SALES
        cols = {f.name: pa.array([r[i] for r, _ in rows], f.type) for i, f in enumerate(schema)}
        cols[W] = pa.array([w for _, w in rows], pa.int64())
        return pa.table(cols)

    def expected(self) -> Counter[tuple[Any, ...]]:
        return join_oracle(self.left, self.right, [0], [0], "left", 2, 3)


def open_join(store: joinstate.StateStore) -> joinstate.Join:
    return store.join(
        "cs", left=joinstate.Side(CUSTOMER, key=["k"], unique_key=["k"]),
        right=joinstate.Side(SALES, key=["k"]), how="left")


def push_all(join: joinstate.Join, batches: Iterator[tuple[str, pa.Table]]
             ) -> Counter[tuple[Any, ...]]:
    """Push every batch; the outputs summed (plain values, comparable with the oracle)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for side, delta in batches:
        t = join.push(side, delta)
        out = zset_add(out, zset_from_table(t, [n for n in t.column_names if n != W]))
    return out


def state_of(join: joinstate.Join) -> dict[str, Counter[tuple[Any, ...]]]:
    return {side: zset(join.state(side)) for side in ("left", "right")}


# ---- a filesystem that counts (and can fail or die) -------------------------------------------


class Watched(pafs.FileSystemHandler):
    """A local directory as a pyarrow filesystem that logs every write, move and delete.

    ``fail_on(path)`` returning True makes that write raise (an interrupted upload);
    ``die_on(path)`` makes the process kill itself with SIGKILL halfway through it.
    """

    def __init__(self, fail_on: Callable[[str], bool] | None = None,
                 die_on: Callable[[str], bool] | None = None) -> None:
        self.local = pafs.LocalFileSystem()
        self.log: list[tuple[str, str]] = []
        self.fail_on = fail_on
        self.die_on = die_on

    # what the checkpoint code uses
    def open_output_stream(self, path: str, metadata: Any) -> Any:
        self.log.append(("write", path))
        if self.fail_on is not None and self.fail_on(path):
            raise OSError(f"injected failure writing {path}")
        stream = self.local.open_output_stream(path)
        if self.die_on is not None and self.die_on(path):
            return pa.PythonFile(_DyingWriter(stream), mode="w")
        return stream

    def move(self, src: str, dest: str) -> None:
        self.log.append(("move", dest))
        self.local.move(src, dest)

    def delete_file(self, path: str) -> None:
        self.log.append(("delete", path))
        self.local.delete_file(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def open_input_stream(self, path: str) -> Any:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.local.open_input_file(path)

    # the rest of the interface, plain delegation
    def get_type_name(self) -> str:
        return "watched-local"

    def equals(self, other: Any) -> bool:
        return self is other

    def normalize_path(self, path: str) -> str:
        return path

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not in tests")

    def copy_file(self, src: str, dest: str) -> None:
        self.local.copy_file(src, dest)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.local.open_append_stream(path)

    def moved_to(self, folder: str) -> list[str]:
        """Names published under ``folder`` (``objects`` or ``checkpoints``), in order."""
        return [p.rsplit("/", 1)[-1] for op, p in self.log
                if op == "move" and p.rsplit("/", 2)[-2] == folder]


class _DyingWriter:
    """Writes half of the first chunk it gets, then SIGKILLs its own process."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.closed = False

    def write(self, data: Any) -> int:
        raw = bytes(data)
        self.stream.write(raw[: max(1, len(raw) // 2)])
        self.stream.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        return len(raw)  # not reached

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        self.stream.close()
        self.closed = True


def watched(handler: Watched) -> pafs.FileSystem:
    return pafs.PyFileSystem(handler)


def object_name(path: Path) -> str:
    """The object a local file becomes: xxh3-128 of its bytes and its size."""
    return f"{xxhash.xxh3_128_hexdigest(path.read_bytes())}-{path.stat().st_size}"


def manifest_doc(remote: Path, cid: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((remote / "checkpoints" / f"{cid}.json").read_text())
    return doc


def hidden_leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ---- round trip ----------------------------------------------------------------------------


def test_round_trip_restores_an_identical_join(tmp_path: Path) -> None:
    feed = Feed(1)
    remote = tmp_path / "remote"
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        out = push_all(join, feed.batches(3))
        expected_then = feed.expected()
        info = store.checkpoint(str(remote))
        at_checkpoint = state_of(join)
        rows = {side: join.rows(side) for side in ("left", "right")}
        # The original goes on; the restored copy must then behave exactly like it.
        later = list(feed.batches(2))
        out_a = push_all(join, iter(later))
    assert out == expected_then
    assert info.files and set(info.transferred) == {f.name for f in info.files}
    assert "CURRENT" in {f.name for f in info.files}
    with joinstate.StateStore.restore(str(remote), tmp_path / "b") as restored:
        copy = open_join(restored)
        assert state_of(copy) == at_checkpoint
        assert {side: copy.rows(side) for side in ("left", "right")} == rows
        counts = restored.verify()["joins"]["cs"]
        assert counts["left"]["rows"] == sum(at_checkpoint["left"].values())
        # Retractions on the restored bag side (its entry map is rebuilt), updates on the
        # unique side: the same pushes give the same outputs, and the sum of all outputs
        # is the oracle's join of the integrated inputs.
        out_b = push_all(copy, iter(later))
        restored.verify()
    assert out_b == out_a
    assert zset_add(out, out_b) == feed.expected()
    assert ck.local_checkpoint(tmp_path / "b") == ck.LocalCheckpoint(
        info.id, ck.Location.of(str(remote)).key, info.sequence)


def test_round_trip_of_a_pipeline(tmp_path: Path) -> None:
    """A join feeding an aggregate: the restored pipeline's outputs equal the original's."""
    remote = tmp_path / "remote"

    def build(store: joinstate.StateStore) -> joinstate.Pipeline:
        c = joinstate.source("customer", CUSTOMER, unique_key="k")
        s = joinstate.source("sales", SALES)
        joined = s.join(c, on="k", suffixes=("", "_c"))
        graph = (joinstate.Graph()
                 .output("totals", joined.group_by(["name"]).aggregate(
                     total=("sum", "amount"), n=("count", None), top=("max", "amount")))
                 .output("big", joined.filter(pc.field("amount") > 50).select(["k", "amount"])))
        return joinstate.Pipeline(store, "per_customer", graph)

    feed = Feed(3)
    batches = list(feed.batches(4))
    head, tail = batches[:8], batches[8:]
    name = {"left": "customer", "right": "sales"}
    with joinstate.StateStore(tmp_path / "a") as store:
        p = build(store)
        for side, delta in head:
            p.push(name[side], delta)
        store.checkpoint(str(remote))
        original = [{o: zset(t) for o, t in p.push(name[side], delta).items()}
                    for side, delta in tail]
    with joinstate.StateStore.restore(str(remote), tmp_path / "b") as restored:
        p2 = build(restored)
        again = [{o: zset(t) for o, t in p2.push(name[side], delta).items()}
                 for side, delta in tail]
        restored.verify()
    assert again == original
    assert any(o["totals"] for o in original)  # the comparison covered real changes


# ---- incremental upload ------------------------------------------------------------------


def test_second_checkpoint_uploads_only_new_files(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    feed = Feed(4)
    handler = Watched()
    fs = watched(handler)
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        push_all(join, feed.batches(2))
        first = store.checkpoint(str(remote), filesystem=fs)
        ssts_first = {p.name for p in (tmp_path / "a").glob("*.sst")}
        objects_first = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino)
                         for p in (remote / "objects").iterdir()}
        handler.log.clear()
        push_all(join, feed.batches(1))
        second = store.checkpoint(str(remote), filesystem=fs)
        ssts_second = {p.name for p in (tmp_path / "a").glob("*.sst")}
        new_ssts = ssts_second - ssts_first
        new_objects = {object_name(tmp_path / "a" / n) for n in new_ssts}
    assert new_ssts, "the second round must have flushed new SST files"
    assert {n for n in second.transferred if n.endswith(".sst")} == new_ssts
    published = handler.moved_to("objects")
    # Every new SST went up once; no object of the first checkpoint was written again.
    assert new_objects <= set(published)
    assert not set(published) & set(objects_first)
    assert len(published) == len(set(published)) == len(second.transferred)
    for name, stamp in objects_first.items():
        p = remote / "objects" / name
        assert (p.stat().st_mtime_ns, p.stat().st_ino) == stamp
    assert second.transferred_bytes < second.bytes
    # The manifest is published last, after every object.
    kinds = [p.rsplit("/", 2)[-2] for op, p in handler.log if op == "move"]
    assert kinds[-1] == "checkpoints" and kinds.count("checkpoints") == 1
    assert first.id < second.id and second.generation == first.generation + 1


# ---- interrupted uploads -----------------------------------------------------------------


def test_half_finished_upload_is_not_a_checkpoint(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    feed = Feed(5)
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        push_all(join, feed.batches(2))
        first = store.checkpoint(str(remote))
        at_first = state_of(join)
        push_all(join, feed.batches(1))
        writes = []

        def fail_on_second_object(path: str) -> bool:
            if "/objects/" in path:
                writes.append(path)
            return len(writes) == 2

        handler = Watched(fail_on_second_object)
        with pytest.raises(joinstate.CheckpointIOError, match="injected failure") as err:
            store.checkpoint(str(remote), filesystem=watched(handler))
        assert isinstance(err.value, joinstate.StateIOError)
        assert len(writes) >= 2
        assert not [p for op, p in handler.log if "/checkpoints/" in p]  # no manifest
    # Files of the failed upload are there, but no manifest names them.
    assert [c.id for c in ck.list_checkpoints(str(remote))] == [first.id]
    assert ck.latest_checkpoint(str(remote)) == ck.list_checkpoints(str(remote))[0]
    with joinstate.StateStore.restore(str(remote), tmp_path / "b") as restored:
        assert state_of(open_join(restored)) == at_first
        restored.verify()


KILLED_UPLOAD = """
import sys
sys.path.insert(0, sys.argv[3])
import pyarrow.fs as pafs
import joinstate
from test_checkpoint import Feed, Watched, open_join, push_all

store_dir, remote = sys.argv[1], sys.argv[2]
store = joinstate.StateStore(store_dir)
join = open_join(store)
feed = Feed(6)
list(feed.batches(3))                 # the rounds the parent already pushed
push_all(join, feed.batches(2))       # new SST files for the next checkpoint
seen = []

def die_on_second_object(path):
    if "/objects/" in path:
        seen.append(path)
    return len(seen) == 2

store.checkpoint(remote, filesystem=pafs.PyFileSystem(Watched(die_on=die_on_second_object)))
print("not killed")
"""


def test_kill_9_during_upload_leaves_the_previous_checkpoint_usable(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    feed = Feed(6)
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        push_all(join, feed.batches(3))
        first = store.checkpoint(str(remote))
        at_first = state_of(join)
    done = subprocess.run(
        [sys.executable, "-c", KILLED_UPLOAD, str(tmp_path / "a"), str(remote),
         str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    # The process died halfway through an object: a partial hidden file is left.
    partial = [p for p in (remote / "objects").iterdir() if p.name.endswith(".tmp")]
    assert partial, sorted(p.name for p in (remote / "objects").iterdir())
    assert [c.id for c in ck.list_checkpoints(str(remote))] == [first.id]
    with joinstate.StateStore.restore(str(remote), tmp_path / "b") as restored:
        assert state_of(open_join(restored)) == at_first
        restored.verify()
    # The killed writer's store reopens (WAL replay) and checkpoints again; the
    # leftovers of the killed upload are cleaned away.
    with joinstate.StateStore(tmp_path / "a") as store:
        now = state_of(open_join(store))
        third = store.checkpoint(str(remote))
    assert now != at_first
    assert not [p for p in (remote / "objects").iterdir() if p.name.startswith(".")]
    assert not list((tmp_path / "a" / ck.LOCAL_DIR).glob("staging-*"))
    referenced = set()
    for c in ck.list_checkpoints(str(remote)):
        referenced |= {f.object for f in c.files}
    assert {p.name for p in (remote / "objects").iterdir()} == referenced
    with joinstate.StateStore.restore(str(remote), tmp_path / "c",
                                      checkpoint=third.id) as restored:
        assert state_of(open_join(restored)) == now


# ---- damaged checkpoints --------------------------------------------------------------------


@pytest.fixture
def checkpointed(tmp_path: Path) -> tuple[Path, str, dict[str, Counter[Any]]]:
    remote = tmp_path / "remote"
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        push_all(join, Feed(7).batches(2))
        info = store.checkpoint(str(remote))
        return remote, info.id, state_of(join)


def _largest_sst_object(remote: Path, cid: str) -> tuple[str, Path]:
    files = [f for f in manifest_doc(remote, cid)["files"] if f["name"].endswith(".sst")]
    f = max(files, key=lambda f: f["size"])
    return f["name"], remote / "objects" / f"{f['xxh3_128']}-{f['size']}"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_file_is_refused_and_nothing_is_restored(
        checkpointed: tuple[Path, str, dict[str, Counter[Any]]], tmp_path: Path,
        damage: str) -> None:
    remote, cid, _ = checkpointed
    name, obj = _largest_sst_object(remote, cid)
    expected = {"flip": "fails its xxh3-128 checksum", "truncate": "bytes, the manifest",
                "delete": "is missing"}[damage]
    if damage == "flip":
        flip_bytes(obj, 16)
    elif damage == "truncate":
        truncate_half(obj)
    else:
        obj.unlink()
    target = tmp_path / "restored"
    with pytest.raises(joinstate.CheckpointCorruptedError, match=expected) as err:
        joinstate.StateStore.restore(str(remote), target)
    assert name in str(err.value) and cid in str(err.value)
    assert isinstance(err.value, joinstate.StateCorruptedError)
    assert not target.exists()
    assert hidden_leftovers(tmp_path) == []


def test_damaged_checkpoint_leaves_the_replaced_store_untouched(
        checkpointed: tuple[Path, str, dict[str, Counter[Any]]], tmp_path: Path) -> None:
    remote, cid, state = checkpointed
    with joinstate.StateStore(tmp_path / "b") as other:  # another state, to be replaced
        join = open_join(other)
        push_all(join, Feed(70).batches(1))
        mine = state_of(join)
    assert mine != state
    _, obj = _largest_sst_object(remote, cid)
    flip_bytes(obj, 16)
    with pytest.raises(joinstate.CheckpointCorruptedError):
        joinstate.StateStore.restore(str(remote), tmp_path / "b", replace=True)
    with joinstate.StateStore(tmp_path / "b") as store:
        assert state_of(open_join(store)) == mine
        store.verify()
    assert hidden_leftovers(tmp_path) == []


def test_damaged_or_unknown_manifest_is_refused(
        checkpointed: tuple[Path, str, dict[str, Counter[Any]]], tmp_path: Path) -> None:
    remote, cid, _ = checkpointed
    with pytest.raises(joinstate.CheckpointNotFoundError, match=cid):
        joinstate.StateStore.restore(str(remote), tmp_path / "x", checkpoint="000000000099-0")
    with pytest.raises(joinstate.CheckpointNotFoundError, match="no checkpoint"):
        joinstate.StateStore.restore(str(tmp_path / "empty"), tmp_path / "x")
    path = remote / "checkpoints" / f"{cid}.json"
    doc = json.loads(path.read_text())
    doc["files"][0]["size"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(joinstate.CheckpointCorruptedError, match="fails its checksum"):
        joinstate.StateStore.restore(str(remote), tmp_path / "x")
    path.write_text(path.read_text()[:40])
    with pytest.raises(joinstate.CheckpointCorruptedError, match="not valid JSON"):
        joinstate.StateStore.restore(str(remote), tmp_path / "x")
    assert ck.list_checkpoints(str(remote)) == []  # the damaged one is left out
    assert not (tmp_path / "x").exists()


# ---- retention -----------------------------------------------------------------------------


def test_keep_n_checkpoints_and_only_their_files(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    feed = Feed(8)
    states, ids = [], []
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        for _ in range(5):
            push_all(join, feed.round())
            ids.append(store.checkpoint(str(remote), keep=2).id)
            states.append(state_of(join))
        kept = [c.id for c in ck.list_checkpoints(str(remote))]
        assert kept == ids[-2:]
        referenced = set()
        for cid in kept:
            referenced |= {f"{f['xxh3_128']}-{f['size']}"
                           for f in manifest_doc(remote, cid)["files"]}
        assert {p.name for p in (remote / "objects").iterdir()} == referenced
        # protect= keeps an older checkpoint beyond keep.
        protected = ids[-2]
        push_all(join, feed.round())
        newest = store.checkpoint(str(remote), keep=1, protect=[protected]).id
        assert [c.id for c in ck.list_checkpoints(str(remote))] == [protected, newest]
    for cid, state in ((protected, states[-2]), (ids[-1], None)):
        if state is None:
            with pytest.raises(joinstate.CheckpointNotFoundError):
                joinstate.StateStore.restore(str(remote), tmp_path / cid, checkpoint=cid)
            continue
        with joinstate.StateStore.restore(str(remote), tmp_path / cid, checkpoint=cid) as s:
            assert state_of(open_join(s)) == state
            s.verify()
    with pytest.raises(joinstate.CheckpointNotFoundError, match=ids[0]):
        joinstate.StateStore.restore(str(remote), tmp_path / "old", checkpoint=ids[0])


# ---- working copies --------------------------------------------------------------------------


def test_open_checkpoint_uses_restores_or_starts_a_working_copy(tmp_path: Path) -> None:
    remote = str(tmp_path / "remote")
    feed = Feed(9)
    work = tmp_path / "work"
    store, how = open_checkpoint(remote, work, None)
    assert how == "new"
    with store:
        join = open_join(store)
        push_all(join, feed.batches(1))
        info = store.checkpoint(remote)
        at_info = state_of(join)
    store, how = open_checkpoint(remote, work, info.id)
    assert how == "local"  # exactly the checkpoint: used as it is
    with store:
        push_all(open_join(store), feed.batches(1))  # a write nobody checkpointed
    store, how = open_checkpoint(remote, work, info.id)
    assert how == "restored"  # newer than the checkpoint: the write is discarded
    with store:
        assert state_of(open_join(store)) == at_info
    sst = max(work.glob("*.sst"), key=lambda p: p.stat().st_size)
    truncate_half(sst)  # a damaged working copy that still records the checkpoint
    store, how = open_checkpoint(remote, work, info.id)
    assert how == "restored"
    with store:
        assert state_of(open_join(store)) == at_info
        store.verify()
    shutil.rmtree(work)
    store, how = open_checkpoint(remote, work, info.id, read_only=True)
    assert how == "restored"
    with store:
        assert state_of(open_join(store)) == at_info
    store, how = open_checkpoint(remote, work, None)  # never checkpointed: empty
    with store:
        assert how == "new" and store.joins() == []
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(joinstate.NotAStateStoreError, match="not a joinstate store"):
        open_checkpoint(remote, foreign, None)
    with pytest.raises(joinstate.NotAStateStoreError, match="not a joinstate store"):
        open_checkpoint(remote, foreign, info.id)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_restore_reuses_matching_local_files(tmp_path: Path) -> None:
    remote = str(tmp_path / "remote")
    feed = Feed(10)
    with joinstate.StateStore(tmp_path / "a") as store:
        join = open_join(store)
        push_all(join, feed.batches(2))
        store.checkpoint(remote)
        push_all(join, feed.batches(1))
        second = store.checkpoint(remote)
    first_copy = ck.restore(remote, tmp_path / "b", checkpoint=ck.list_checkpoints(remote)[0].id)
    assert set(first_copy.transferred) == {f.name for f in first_copy.files}
    again = ck.restore(remote, tmp_path / "b", checkpoint=second.id, replace=True)
    shared = {f.name for f in first_copy.files} & {f.name for f in second.files
                                                  if f.name.endswith(".sst")}
    assert shared and not shared & set(again.transferred)
    with joinstate.StateStore(tmp_path / "b") as store:
        store.verify()


# ---- arguments -------------------------------------------------------------------------------


def test_bad_arguments_name_the_option(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "a") as store:
        for keep in (0, -1, True, "3"):
            with pytest.raises(joinstate.OptionsError, match="keep="):
                store.checkpoint(str(tmp_path / "r"), keep=keep)  # type: ignore[arg-type]
        for uri in ("", "   ", 3):
            with pytest.raises(joinstate.OptionsError, match="uri="):
                store.checkpoint(uri)  # type: ignore[arg-type]
        with pytest.raises(joinstate.OptionsError, match="foo://bucket"):
            store.checkpoint("foo://bucket/x")
        with pytest.raises(joinstate.OptionsError, match="filesystem="):
            store.checkpoint("x", filesystem="local")  # type: ignore[arg-type]
        store.checkpoint(str(tmp_path / "r"))
    assert not (tmp_path / "x").exists()
    with joinstate.StateStore(tmp_path / "a", read_only=True) as ro, \
            pytest.raises(joinstate.StateReadOnlyError, match="checkpoint"):
        ro.checkpoint(str(tmp_path / "r"))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "data.csv").write_text("1,2")
    with pytest.raises(joinstate.NotAStateStoreError, match="not empty"):
        joinstate.StateStore.restore(str(tmp_path / "r"), busy)
    with pytest.raises(joinstate.NotAStateStoreError, match="not a joinstate store"):
        joinstate.StateStore.restore(str(tmp_path / "r"), busy, replace=True)
    with pytest.raises(joinstate.NotAStateStoreError, match="regular file"):
        joinstate.StateStore.restore(str(tmp_path / "r"), busy / "data.csv" / "x")
    assert (busy / "data.csv").read_text() == "1,2"


def test_child_uri_keeps_the_query_string() -> None:
    assert ck.child_uri("s3://b/state?region=eu-west-1", "st/shard-00001") == \
        "s3://b/state/st/shard-00001?region=eu-west-1"
    assert ck.child_uri("/data/ckpt/", "shard-00000") == "/data/ckpt/shard-00000"
