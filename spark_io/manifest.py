"""The manifest: what a state directory holds, so ``apply`` and ``open`` route identically.

One small JSON file per join, ``<state_dir>/_spark/<join>.json``, written by the driver
(atomically: temporary file, then rename) and read by the driver only; executors get
the :class:`Manifest` pickled inside their task.  It records everything that decides
where a row goes and how it is stored:

* the shard count and the partitioner version (changing either re-routes keys);
* the join spec: both sides' Arrow schemas (Spark schemas follow from them), join
  keys, unique keys, ``how`` and suffixes; every shard's catalog holds the same spec,
  and ``StateStore.join`` refuses a shard whose spec differs;
* the population step: its operation id while it runs (``populating``: kept if it
  fails, so that ``populate(resume=True)`` continues into the same output directory)
  and once it has completed (``populated``);
* where operation outputs go (``output_uri``: recorded when the join is created, so a
  resumed ``populate`` and ``open`` find them; not part of the spec);
* with ``checkpoint_uri``, the durable location of the shards and, per shard, the id of
  its last **committed** checkpoint (``checkpoints``).  The driver records them after
  every successful job; a task opens its shard as exactly that checkpoint
  (:class:`ShardStorage`), so work of a failed job that some shard checkpointed anyway is
  rolled back on the next access, wherever the shard runs.  The write that records an
  operation's checkpoints also records its id (``committed_op``): that write is the
  operation's commit (:mod:`spark_io.operation`).

Layout of a state directory::

    <state_dir>/shard-00000 ... shard-NNNNN   one RocksDB directory (StateStore) per shard
    <state_dir>/_spark/<join>.json            this manifest
    <state_dir>/_spark/outputs/<operation>/   Parquet output of populate/apply (the
                                              default without checkpoint_uri)
    <state_dir>/_spark/reports/<operation>.json
    <output_uri>/<operation>/                 Parquet output, wherever output_uri says
                                              (default <checkpoint_uri>/_outputs)

With ``checkpoint_uri`` and ``local_dir``, the shard directories are working copies on
each executor, under ``<local_dir>/<12 hex digits naming the checkpoint_uri>/``, and
``<checkpoint_uri>/shard-NNNNN/`` holds each shard's checkpoints
(:mod:`joinstate.checkpoint`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from joinstate import JoinSpecMismatchError, Side
from joinstate.catalog import spec_diff
from joinstate.checkpoint import DEFAULT_KEEP, child_uri
from spark_io.args import normalize_how
from spark_io.errors import ManifestError

if TYPE_CHECKING:
    from joinstate import Join, SideName, StateStore

__all__ = [
    "FORMAT",
    "JOIN_PARTITIONER",
    "JOIN_PARTITIONERS",
    "PARTITIONER",
    "PIPELINE_FORMAT",
    "Manifest",
    "PipelineManifest",
    "ShardStorage",
    "manifest_path",
    "other_owners",
    "pipeline_manifest_path",
    "shard_key",
    "shard_path",
    "write_durably",
]

FORMAT = 1
PARTITIONER = "xxh3-canonical-key-mod-shards/spark-murmur3-pmod"
"""Rows go to shard ``xxh3(canonical key) % shards`` (NULL keys to shard 0); Spark
partition == shard (routing.py).  Pipelines route so, and joins created before
:data:`JOIN_PARTITIONER`."""
JOIN_PARTITIONER = "xxh3-canonical-key-mod-shards/null-keys-by-row-hash64/spark-murmur3-pmod"
"""A join's rows: as :data:`PARTITIONER`, but rows whose key has a NULL go to shard
``row_hash64(row) % shards`` (:mod:`spark_io.rowhash`) instead of all to shard 0."""
JOIN_PARTITIONERS = (JOIN_PARTITIONER, PARTITIONER)
"""The partitioners a join manifest may record (new joins get the first)."""


def shard_path(state_dir: str | Path, shard: int) -> Path:
    """The RocksDB directory of one shard."""
    return Path(state_dir) / f"shard-{shard:05d}"


def manifest_path(state_dir: str | Path, name: str) -> Path:
    """Where the manifest of join ``name`` lives."""
    return Path(state_dir) / "_spark" / f"{name}.json"


def shard_key(shard: int, stage: str | None = None) -> str:
    """A shard store's path relative to the state directory (and checkpoint location)."""
    name = f"shard-{shard:05d}"
    return name if stage is None else f"{stage}/{name}"


def other_owners(state_dir: str | Path, mine: Path) -> list[tuple[Path, str | None]]:
    """Every other join or pipeline manifest in ``state_dir``, with its checkpoint_uri.

    Shard stores are shared by every join of a state directory; a checkpointed shard is
    replaced by its checkpoint whenever its working copy is not exactly it, which would
    discard another owner's writes, so a checkpointed state directory has one owner.
    """
    folder = Path(state_dir) / "_spark"
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        if path.resolve() == mine.resolve() or path.name.startswith("."):
            continue
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and "format" in raw:
            spec = raw["spec"] if isinstance(raw.get("spec"), dict) else raw
            uri = spec.get("checkpoint_uri")
            out.append((path, uri if isinstance(uri, str) else None))
    return out


@dataclass(frozen=True)
class ShardStorage:
    """Where the shard stores of one join or pipeline live; pickled into every task.

    Without ``checkpoint_uri`` a shard is the directory ``<state_dir>/<key>``, shared by
    every task that opens it.  With it, the durable copy is ``<checkpoint_uri>/<key>``
    and a task works on a local copy (:meth:`local_path`) that it opens as exactly the
    checkpoint ``checkpoints[key]`` (restoring it when the copy is missing, older, or has
    writes no checkpoint holds) and checkpoints again after writing
    (:func:`spark_io._worker.open_store`).
    """

    state_dir: str
    checkpoint_uri: str | None = None
    local_dir: str | None = None
    checkpoints: dict[str, str] = field(default_factory=dict)
    keep: int = DEFAULT_KEEP
    committed: dict[str, str] = field(default_factory=dict)
    """The ids the manifest records, when ``checkpoints`` is ahead of them (an operation
    of several jobs): kept at the location whatever ``keep`` says, for a rollback."""

    def local_path(self, key: str) -> Path:
        """The shard's working directory, resolved where this runs (an executor).

        A relative ``local_dir`` is taken from the executor's working directory (its own
        scratch directory on standalone, YARN and Kubernetes clusters).
        """
        if self.checkpoint_uri is None or self.local_dir is None:
            return Path(self.state_dir) / key
        tag = hashlib.sha1(self.checkpoint_uri.encode()).hexdigest()[:12]
        return Path(self.local_dir).absolute() / tag / key

    def uri(self, key: str) -> str:
        """The shard's checkpoint location."""
        assert self.checkpoint_uri is not None
        return child_uri(self.checkpoint_uri, key)

    def exists(self, key: str) -> bool:
        """Whether the shard holds state (was checkpointed; without checkpoints, on disk)."""
        if self.checkpoint_uri is not None:
            return key in self.checkpoints
        return (self.local_path(key) / "CURRENT").exists()

    def protected(self, key: str) -> list[str]:
        """Checkpoint ids of ``key`` that retention must keep: expected and committed."""
        ids = {self.checkpoints.get(key), self.committed.get(key)}
        return sorted(i for i in ids if i)


def _side_to_json(side: Side) -> dict[str, Any]:
    spec = side.to_spec()
    return {
        "schema": spec["schema"], "columns": spec["columns"],
        "key": spec["key"], "unique_key": spec["unique_key"],
    }


def _side_from_json(raw: dict[str, Any], where: str) -> Side:
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
        return Side(schema, key=list(raw["key"]), unique_key=raw.get("unique_key"))
    except (KeyError, TypeError, ValueError, pa.ArrowInvalid) as exc:
        raise ManifestError(f"{where}: the side description is unreadable: {exc}") from exc


@dataclass(frozen=True)
class Manifest:
    """The routing and join spec of one sharded join (see the module docstring)."""

    name: str
    shards: int
    left: Side
    right: Side
    how: str = "inner"
    suffixes: tuple[str, str] = ("", "_right")
    populated: str | None = None
    partitioner: str = JOIN_PARTITIONER
    populating: dict[str, Any] | None = None
    checkpoint_uri: str | None = None
    checkpoints: dict[str, str] = field(default_factory=dict)
    output_uri: str | None = None
    """Where operation outputs go (:mod:`spark_io.outputs`); None: ``<state_dir>/_spark/
    outputs`` (manifests written before it was recorded)."""
    committed_op: str | None = None
    """The last operation whose checkpoints this manifest commits (with checkpoints)."""

    def __post_init__(self) -> None:
        # Spark's join-type aliases ("outer", "leftouter", ...) are stored as joinstate's.
        object.__setattr__(self, "how", normalize_how(self.how))
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) \
                or not 1 <= self.shards <= 65_536:
            raise ManifestError(f"shards={self.shards!r} must be an int between 1 and 65536")
        if self.partitioner not in JOIN_PARTITIONERS:
            raise ManifestError(
                f"join {self.name!r} routes rows with partitioner {self.partitioner!r}, which "
                f"this spark_io does not know ({', '.join(JOIN_PARTITIONERS)}); use the "
                "spark_io version that created it")

    # ---- the join each shard holds ------------------------------------------------------

    def join(self, store: StateStore) -> Join:
        """Create or re-attach this join in a shard's store (same spec on every shard)."""
        how: Any = self.how
        return store.join(self.name, left=self.left, right=self.right, how=how,
                          suffixes=self.suffixes)

    def side(self, label: SideName) -> Side:
        """The :class:`Side` called ``label`` (``"left"`` or ``"right"``)."""
        if label == "left":
            return self.left
        if label == "right":
            return self.right
        raise ManifestError(f"side={label!r} must be 'left' or 'right'")

    def spec(self) -> dict[str, Any]:
        """Everything that must agree for two manifests to describe the same state."""
        return {
            "name": self.name, "shards": self.shards, "how": self.how,
            "suffixes": list(self.suffixes), "partitioner": self.partitioner,
            "left": _side_to_json(self.left), "right": _side_to_json(self.right),
            "checkpoint_uri": self.checkpoint_uri,
        }

    def outputs(self, state_dir: str | Path) -> str:
        """Where this join's operation outputs live."""
        return self.output_uri or str(Path(state_dir) / "_spark" / "outputs")

    def storage(self, state_dir: str | Path, local_dir: str | None = None,
                keep: int = DEFAULT_KEEP) -> ShardStorage:
        """Where this join's shards live, expecting their committed checkpoints."""
        return ShardStorage(str(state_dir), self.checkpoint_uri, local_dir,
                            dict(self.checkpoints), keep)

    def check_same(self, other: Manifest, state_dir: str | Path) -> None:
        """Raise :class:`JoinSpecMismatchError` naming every field where the specs differ."""
        diffs = spec_diff(self.spec(), other.spec())
        if diffs:
            raise JoinSpecMismatchError(
                f"join {self.name!r} in {state_dir} was created with a different spec "
                f"({'; '.join(diffs)}); use SparkJoin.open() to re-attach, or a new state_dir"
            )

    # ---- persistence --------------------------------------------------------------------

    def to_json(self) -> str:
        """The manifest file's text."""
        return json.dumps(
            {"format": FORMAT, **self.spec(), "populated": self.populated,
             "populating": self.populating, "checkpoints": self.checkpoints,
             "output_uri": self.output_uri, "committed_op": self.committed_op},
            indent=2, sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> Manifest:
        """Parse a manifest file's text; :class:`ManifestError` says what is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"{where} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ManifestError(
                f"{where} has format {raw.get('format') if isinstance(raw, dict) else None!r}; "
                f"this spark_io reads format {FORMAT}"
            )
        try:
            return cls(
                name=str(raw["name"]), shards=int(raw["shards"]),
                left=_side_from_json(raw["left"], where),
                right=_side_from_json(raw["right"], where),
                how=str(raw["how"]), suffixes=(str(raw["suffixes"][0]), str(raw["suffixes"][1])),
                populated=raw.get("populated"), partitioner=str(raw["partitioner"]),
                populating=raw.get("populating"), checkpoint_uri=raw.get("checkpoint_uri"),
                checkpoints={str(k): str(v) for k, v in (raw.get("checkpoints") or {}).items()},
                output_uri=raw.get("output_uri"), committed_op=raw.get("committed_op"),
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise ManifestError(f"{where} lacks a field: {exc!r}") from exc

    def write(self, state_dir: str | Path) -> Path:
        """Write atomically (temporary file in the same directory, then rename)."""
        return write_durably(manifest_path(state_dir, self.name), self.to_json())

    @classmethod
    def read(cls, state_dir: str | Path, name: str) -> Manifest:
        """The manifest of join ``name`` in ``state_dir``."""
        path = manifest_path(state_dir, name)
        if not path.exists():
            raise ManifestError(
                f"no join {name!r} in {state_dir} (expected manifest {path}); create it with "
                "spark_io.SparkJoin(spark, name, left=..., right=..., state_dir=...)"
            )
        manifest = cls.from_json(path.read_text(), str(path))
        if manifest.name != name:
            raise ManifestError(f"{path} describes join {manifest.name!r}, not {name!r}")
        return manifest

    def replace(self, **changes: Any) -> Manifest:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


# ---- pipelines ---------------------------------------------------------------------------

PIPELINE_FORMAT = 2
"""Format 2: a distributed plan (stages chained in one job per operation), recorded as
the planner's decisions.  Format 1 (one Spark job per stage input) is refused."""


def pipeline_manifest_path(state_dir: str | Path, name: str) -> Path:
    """Where the manifest of pipeline ``name`` lives."""
    return Path(state_dir) / "_spark" / f"pipeline-{name}.json"


@dataclass(frozen=True)
class PipelineManifest:
    """What a state directory holds of one :class:`spark_io.SparkPipeline`.

    ``graph``: the stored definition (``Graph.spec()``), compared on re-attach;
    ``plan``: the decisions of its distributed plan (:func:`planner.distribute.
    from_decisions` rebuilds the same stages from them), fixed by the first operation;
    ``populated`` / ``populating``: the population's operation id once it completed /
    while it runs (a driver that dies leaves it, and the next operation starts the
    stores over); ``checkpoints``/``committed_op``: as for :class:`Manifest`.
    """

    name: str
    shards: int
    graph: dict[str, Any]
    checkpoint_uri: str | None = None
    output_uri: str | None = None
    plan: tuple[dict[str, Any], ...] | None = None
    populated: str | None = None
    populating: str | None = None
    checkpoints: dict[str, str] = field(default_factory=dict)
    committed_op: str | None = None

    def spec(self) -> dict[str, Any]:
        """Everything that must agree for the same state: name, shards, graph, location."""
        return {"name": self.name, "shards": self.shards, "graph": self.graph,
                "checkpoint_uri": self.checkpoint_uri}

    def check_same(self, other: PipelineManifest, state_dir: str | Path) -> None:
        """Raise :class:`JoinSpecMismatchError` naming every field where the specs differ."""
        diffs = spec_diff(self.spec(), other.spec())
        if diffs:
            raise JoinSpecMismatchError(
                f"pipeline {self.name!r} in {state_dir} was created with a different "
                f"definition or shard count ({'; '.join(diffs)}); use a new state_dir (or "
                "name)")

    def storage(self, state_dir: str | Path, local_dir: str | None = None,
                keep: int = DEFAULT_KEEP, current: dict[str, str] | None = None
                ) -> ShardStorage:
        """Where the stage stores live, expecting ``current`` (default: the committed)."""
        return ShardStorage(str(state_dir), self.checkpoint_uri, local_dir,
                            dict(self.checkpoints if current is None else current), keep,
                            committed=dict(self.checkpoints))

    def to_json(self) -> str:
        """The manifest file's text."""
        return json.dumps(
            {"format": PIPELINE_FORMAT, "kind": "pipeline", **self.spec(),
             "output_uri": self.output_uri,
             "plan": None if self.plan is None else list(self.plan),
             "populated": self.populated, "populating": self.populating,
             "checkpoints": self.checkpoints, "committed_op": self.committed_op},
            indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> PipelineManifest:
        """Parse a manifest file's text; :class:`ManifestError` says what is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"{where} is not valid JSON: {exc}") from exc
        fmt = raw.get("format") if isinstance(raw, dict) else None
        if fmt != PIPELINE_FORMAT:
            raise ManifestError(
                f"{where} has format {fmt!r}; this spark_io reads pipeline format "
                f"{PIPELINE_FORMAT}" + (" (format 1 ran one Spark job per stage; its stores "
                                        "are laid out otherwise): use a new state_dir and "
                                        "populate it again" if fmt == 1 else ""))
        try:
            plan = raw.get("plan")
            return cls(
                name=str(raw["name"]), shards=int(raw["shards"]), graph=dict(raw["graph"]),
                checkpoint_uri=raw.get("checkpoint_uri"), output_uri=raw.get("output_uri"),
                plan=None if plan is None else tuple(dict(d) for d in plan),
                populated=raw.get("populated"), populating=raw.get("populating"),
                checkpoints={str(k): str(v) for k, v in (raw.get("checkpoints") or {}).items()},
                committed_op=raw.get("committed_op"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where} lacks a field: {exc!r}") from exc

    def write(self, state_dir: str | Path) -> Path:
        """Write atomically and durably (temporary file, fsync, rename)."""
        return write_durably(pipeline_manifest_path(state_dir, self.name), self.to_json())

    @classmethod
    def read(cls, state_dir: str | Path, name: str) -> PipelineManifest | None:
        """The manifest of pipeline ``name`` in ``state_dir``, or None if there is none."""
        path = pipeline_manifest_path(state_dir, name)
        if not path.exists():
            return None
        manifest = cls.from_json(path.read_text(), str(path))
        if manifest.name != name:
            raise ManifestError(f"{path} describes pipeline {manifest.name!r}, not {name!r}")
        return manifest

    def replace(self, **changes: Any) -> PipelineManifest:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


def write_durably(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically and durably.

    A temporary file in the same directory, fsync, then rename: a crash leaves the old
    file or the new one, whole.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
