"""Helpers for the fault tests (tests/test_faults.py): snapshots, damage, a tiny disk.

Nothing here knows joinstate's internals: a store is compared through its public face
(``join.state``, ``join.rows``) and damaged through its files, the way an operator's
disk, a bad cable or a wrong ``rm`` would do it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import rocksdict as rd

import joinstate
from joinstate import testing

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Iterator, Sequence

W = joinstate.WEIGHT
Row = tuple[Any, ...]


def table(schema: pa.Schema, rows: Sequence[Row], weights: Sequence[int] | None = None
          ) -> pa.Table:
    """A delta of ``rows`` (tuples in schema order), with ``_weight`` if given."""
    cols = {f.name: pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)}
    if weights is not None:
        cols[W] = pa.array(list(weights), pa.int64())
    return pa.table(cols)


def zset(t: pa.Table) -> Counter[Row]:
    """A change set as a Z-set of exact row tuples, floats compared bit for bit.

    ``-0.0`` stays apart from ``0.0`` (every NaN is one NaN): a fault must leave the state
    exactly as it was, not merely SQL-equal.
    """
    return testing.zset(t, float_bits=True)


def snapshot(join: joinstate.Join) -> dict[str, Any]:
    """Everything observable about a join's state: both sides' content and counters."""
    return {
        side: (zset(join.state(side)), join.rows(side))
        for side in ("left", "right")
    }


def fingerprint(path: Path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> sha256 of its bytes); dirs as 'dir'."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def sst_files(path: Path) -> list[Path]:
    """The store's SST files, largest first."""
    return sorted(path.glob("*.sst"), key=lambda p: p.stat().st_size, reverse=True)


def flip_bytes(file: Path, n: int = 64) -> None:
    """Invert ``n`` bytes in the middle of ``file`` (a bad sector, not a truncation)."""
    size = file.stat().st_size
    assert size > 4 * n, f"{file} is too small to damage in the middle ({size} bytes)"
    with file.open("r+b") as f:
        f.seek(size // 2)
        raw = f.read(n)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in raw))
        f.flush()
        os.fsync(f.fileno())


def truncate_half(file: Path) -> None:
    """Cut ``file`` to half its length."""
    size = file.stat().st_size
    with file.open("r+b") as f:
        f.truncate(size // 2)


def copy_store(src: Path, dst: Path) -> Path:
    """A byte copy of a closed store directory (LOCK included, as a backup tool would)."""
    shutil.copytree(src, dst)
    return dst


# ---- a tiny disk -----------------------------------------------------------------------


def small_disk(path: Path, size: str = "4m") -> Iterator[Tmpfs]:
    """A mounted tmpfs of ``size`` for one test (a fixture body); skipped where it cannot be."""
    import pytest

    disk = Tmpfs(path, size)
    reason = disk.mount()
    if reason is not None:
        pytest.skip(reason)
    try:
        yield disk
    finally:
        disk.unmount()


class Tmpfs:
    """A tmpfs mounted at ``path`` with a size limit; ``resize`` remounts it in place."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size
        self.mounted = False

    def mount(self) -> str | None:
        """Mount it; returns None, or why it could not be mounted (the skip reason)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if shutil.which("mount") is None:
            return "no mount(8) on this machine: cannot make a small disk to fill"
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)],
            capture_output=True, text=True, check=False,
        )
        if r.returncode != 0:
            return (f"cannot mount a {self.size} tmpfs at {self.path} to fill it "
                    f"(needs root / CAP_SYS_ADMIN): {r.stderr.strip() or r.returncode}")
        self.mounted = True
        return None

    def resize(self, size: str) -> None:
        subprocess.run(
            ["mount", "-o", f"remount,size={size}", str(self.path)],
            capture_output=True, text=True, check=True,
        )
        self.size = size

    def unmount(self) -> None:
        if not self.mounted:
            return
        r = subprocess.run(["umount", str(self.path)], capture_output=True, text=True,
                           check=False)
        if r.returncode != 0:  # something still holds a file: detach lazily
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        self.mounted = False


# ---- another user ----------------------------------------------------------------------

_OPEN_SCRIPT = """
import json, sys
import joinstate
path, read_only = sys.argv[1], sys.argv[2] == "1"
try:
    with joinstate.StateStore(path, read_only=read_only) as store:
        print(json.dumps({"ok": True, "joins": store.joins()}))
except BaseException as exc:
    print(json.dumps({"ok": False, "type": type(exc).__name__,
                      "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}))
"""

NOBODY = 65534

_CRASH_SCRIPT = """
import os, sys
import numpy as np, pyarrow as pa
import joinstate
path, batches, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
side = joinstate.Side(pa.schema([("k", pa.int64()), ("s", pa.string())]), key=["k"])
store = joinstate.StateStore(path)
join = store.join("crash", left=side, right=side)
for b in range(batches):
    k = np.arange(b * rows, (b + 1) * rows)
    join.push("left", pa.table({"k": k, "s": [f"{i:08d}" + "x" * 80 for i in k]}))
os._exit(0)  # a crash: no close, no flush; every push is only in the WAL
"""

CRASH_SIDE_SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string())])


def crash_after_pushes(path: Path, batches: int, rows: int) -> None:
    """In a child process: push ``batches`` left batches of ``rows`` rows, then die."""
    r = subprocess.run([sys.executable, "-c", _CRASH_SCRIPT, str(path), str(batches), str(rows)],
                       capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def unprivileged_reason() -> str | None:
    """None if :func:`open_as_nobody` can run, else why not (the skip reason)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        return ("running as root, whom file modes do not stop (CAP_DAC_OVERRIDE), and "
                "setpriv(1) is not installed to drop to an unprivileged user")
    return None


def open_as_nobody(path: Path, *, read_only: bool = False) -> dict[str, Any]:
    """Open ``path`` as a store in a child process running as an unprivileged user.

    As root, file modes do not apply to us, so the child drops to ``nobody`` with no
    capabilities (setpriv); otherwise it runs as ourselves.  Returns what happened:
    ``{"ok": True, ...}`` or ``{"ok": False, "type", "mro", "message"}``.
    """
    cmd = [sys.executable, "-c", _OPEN_SCRIPT, str(path), "1" if read_only else "0"]
    if os.geteuid() == 0:
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
               "--inh-caps=-all", *cmd]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=120,
                       cwd="/")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the child printed no result (rc {r.returncode}): {r.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@contextlib.contextmanager
def world_readable_tempdir() -> Iterator[Path]:
    """A directory an unprivileged child can reach (pytest's tmp_path is mode 0700)."""
    d = Path(tempfile.mkdtemp(prefix="joinstate-faults-", dir="/tmp"))
    try:
        d.chmod(0o755)
        yield d
    finally:
        for p in [d, *d.rglob("*")]:
            with contextlib.suppress(OSError):
                p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(d, ignore_errors=True)


def dump_store(path: Path) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of every column family of the store at ``path``."""
    names = list(rd.Rdict.list_cf(str(path), rd.Options(raw_mode=True)))
    db = rd.Rdict(str(path), rd.Options(raw_mode=True),
                  column_families={n: rd.Options(raw_mode=True) for n in names if n != "default"},
                  access_type=rd.AccessType.read_only(False))
    try:
        out = {}
        for n in names:
            cf = db.get_column_family(n)
            out[n] = dict(cf.items())
            del cf
        return out
    finally:
        db.close()
        del db
