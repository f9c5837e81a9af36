"""A checkpoint never reuses a file at the location that it has not verified.

Checkpoints are incremental: a file already at the location is not uploaded again.  If
that copy rotted (bytes flipped on the location's disk) while the store's own file is
intact, a checkpoint that reused it blindly would reference the damaged copy, and so would
every later one.  So a checkpoint reads back each file it reuses and uploads again any
that does not match (``verify="all"``, the default); ``verify="changed"`` reads back
only files whose listing (size, modification time) changed since this store uploaded or
verified them.  A restore that meets a damaged file says which checkpoints do not use
it, or that none does.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from faults import flip_bytes, zset

import joinstate
from joinstate import checkpoint as ck

if TYPE_CHECKING:
    from pathlib import Path

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
SIDE = joinstate.Side(SCHEMA, key=["k"])


def rows(start: int, n: int) -> pa.Table:
    keys = list(range(start, start + n))
    return pa.table({"k": pa.array(keys, pa.int64()), "v": [f"value-{k:08d}" * 4 for k in keys]})


def state(store: joinstate.StateStore) -> dict[str, Any]:
    j = store.join("j")
    return {s: zset(j.state(s)) for s in ("left", "right")}


def object_path(remote: Path, info: ck.CheckpointInfo, name: str) -> Path:
    f = next(f for f in info.files if f.name == name)
    return remote / "objects" / f.object


def largest_sst(info: ck.CheckpointInfo) -> str:
    return max((f for f in info.files if f.name.endswith(".sst")), key=lambda f: f.size).name


def rot(path: Path, *, keep_mtime: bool) -> None:
    """Flip bytes in the middle; with ``keep_mtime`` the listing shows no change at all."""
    st = path.stat()
    flip_bytes(path, 64)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_damaged_reused_file_is_uploaded_again(tmp_path: Path, keep_mtime: bool) -> None:
    remote = tmp_path / "remote"
    with joinstate.StateStore(tmp_path / "s") as store:
        j = store.join("j", left=SIDE, right=SIDE)
        j.push("left", rows(0, 20_000))
        first = store.checkpoint(str(remote))
        name = largest_sst(first)
        rot(object_path(remote, first, name), keep_mtime=keep_mtime)
        j.push("right", rows(0, 50))
        second = store.checkpoint(str(remote))
        want = state(store)
    assert name in {f.name for f in second.files}  # the damaged file is still needed
    assert name in second.repaired and name in second.transferred
    reused = {f.name for f in second.files} - set(second.transferred)
    assert set(second.verified) >= reused | {name}
    with joinstate.StateStore.restore(str(remote), tmp_path / "r") as restored:
        assert state(restored) == want
        restored.verify()
    # The file was the same object for the first checkpoint: it restores again too.
    with joinstate.StateStore.restore(str(remote), tmp_path / "r1",
                                      checkpoint=first.id) as restored:
        restored.verify()


def test_changed_mode_rereads_only_files_whose_listing_changed(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    with joinstate.StateStore(tmp_path / "s") as store:
        j = store.join("j", left=SIDE, right=SIDE)
        j.push("left", rows(0, 20_000))
        first = store.checkpoint(str(remote), verify="changed")
        j.push("right", rows(0, 50))
        quiet = store.checkpoint(str(remote), verify="changed")
        assert quiet.verified == ()  # nothing changed at the location: nothing re-read
        name = largest_sst(quiet)
        time.sleep(0.01)
        rot(object_path(remote, quiet, name), keep_mtime=False)
        j.push("right", rows(50, 50))
        third = store.checkpoint(str(remote), verify="changed")
        want = state(store)
    assert name in third.verified and name in third.repaired
    assert set(third.verified) == {name}
    with joinstate.StateStore.restore(str(remote), tmp_path / "r") as restored:
        assert state(restored) == want
    assert first.id != third.id


def test_bad_verify_mode_is_named(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store, \
            pytest.raises(joinstate.OptionsError, match="verify='sometimes'"):
        store.checkpoint(str(tmp_path / "remote"), verify="sometimes")  # type: ignore[arg-type]


def test_a_restore_names_the_checkpoints_that_do_not_use_a_damaged_file(tmp_path: Path
                                                                       ) -> None:
    remote = tmp_path / "remote"
    with joinstate.StateStore(tmp_path / "s") as store:
        j = store.join("j", left=SIDE, right=SIDE)
        j.push("left", rows(0, 5_000))
        old = store.checkpoint(str(remote))
        want_old = state(store)
        j.push("right", rows(0, 20_000))
        store.flush()
        new = store.checkpoint(str(remote))
    fresh = max((f for f in new.files if f.name.endswith(".sst")
                 and f.object not in {g.object for g in old.files}), key=lambda f: f.size)
    flip_bytes(remote / "objects" / fresh.object, 64)
    with pytest.raises(joinstate.CheckpointCorruptedError) as info:
        joinstate.StateStore.restore(str(remote), tmp_path / "r")
    msg = str(info.value)
    assert fresh.name in msg and old.id in msg, msg
    with joinstate.StateStore.restore(str(remote), tmp_path / "r", checkpoint=old.id) as r:
        assert state(r) == want_old
    # A file every checkpoint uses: the message says no other checkpoint helps.
    shared = largest_sst(old)
    assert shared in {f.name for f in new.files}
    flip_bytes(object_path(remote, old, shared), 64)
    with pytest.raises(joinstate.CheckpointCorruptedError,
                       match="no other checkpoint there can replace it"):
        joinstate.StateStore.restore(str(remote), tmp_path / "r2", checkpoint=old.id)
