"""What the physical rules plan over: shapes, statistics, history, settings, decisions.

Everything here is plain frozen data, so that a rule is a pure function of it and a
golden test can build one by hand.  :mod:`planner.shape` builds these from a
:class:`joinstate.Join` or a :class:`joinstate.Pipeline`; :mod:`planner.plan` runs the
rules over them.

Names: a *stream* is anything with rows (a source, an operator's output; a join's two
sides are the streams ``"left"`` and ``"right"``); an *index* is a stream's rows by key
in one column family, named by that family; a *reader* is one operator input reading an
index.  A *source* is a stream that population loads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from planner.errors import PlannerError
from planner.history import History
from planner.rule import latest_decision

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from planner.rule import Decision
    from planner.stats import SourceStats

__all__ = [
    "IndexShape",
    "JoinShape",
    "PlanContext",
    "PlannerSettings",
    "ReaderShape",
    "ShareGroup",
    "StreamShape",
]

_MIB = 1 << 20


@dataclass(frozen=True)
class PlannerSettings:
    """The thresholds the physical rules use; each says where its value comes from.

    ``asymmetry_ratio``: a join whose big input has at least this many times the small
    one's rows is populated asymmetrically (Epsio's policy pays once the big side's
    load dominates; within 4x there is little asymmetry to use).  ``bulk_min_rows``:
    the least big-side rows for sorted SST ingestion (``bench population`` measured
    bulk ahead of the other strategies from 300k rows on; below, one SST file per run
    costs more than it saves).  ``probe_cache_max_rows``: the store's limit for an
    in-memory probe cache (``StoreOptions.probe_cache_max_rows``).  ``shards``: the
    Spark shard count if fixed, else decided from ``cores`` and ``shard_max_bytes``.
    ``replicate_max_bytes``: the largest input copied to every shard instead of
    shuffled (Spark's broadcast-join threshold, 10 MiB, for the same reason: a copy
    that small costs less than moving the other input).  ``memtable_bytes``: the
    store's memtable size (``StoreOptions.write_buffer_size``): an index smaller than
    that is never flushed while it loads, so RocksDB never compacts it either.
    """

    asymmetry_ratio: float = 4.0
    bulk_min_rows: int = 100_000
    probe_cache_max_rows: int = 2_000_000
    shards: int | None = None
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    shard_max_bytes: int = 1024 * _MIB
    replicate_max_bytes: int = 10 * _MIB
    memtable_bytes: int = 64 * _MIB

    def __post_init__(self) -> None:
        problems = []
        if not self.asymmetry_ratio >= 1:
            problems.append(f"asymmetry_ratio={self.asymmetry_ratio!r} must be >= 1")
        for name in ("bulk_min_rows", "probe_cache_max_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                problems.append(f"{name}={v!r} must be an int >= 0")
        for name in ("cores", "shard_max_bytes", "replicate_max_bytes", "memtable_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{name}={v!r} must be an int >= 1")
        if self.shards is not None and (isinstance(self.shards, bool)
                                        or not isinstance(self.shards, int) or self.shards < 1):
            problems.append(f"shards={self.shards!r} must be an int >= 1 or None")
        if problems:
            raise PlannerError("invalid PlannerSettings: " + "; ".join(problems))

    def replace(self, **changes: Any) -> PlannerSettings:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class StreamShape:
    """One stream of a pipeline: an operator's output or a source.

    ``kind`` is the operator kind (``source``, ``filter``, ``project``, ``union``,
    ``join``, ``agg``, ``joinall``), ``inputs`` the labels of its input streams,
    ``columns`` its column names, ``params`` what the pipeline's definition records
    about it (join keys and ``how``, group keys, ...).
    """

    name: str
    kind: str
    inputs: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    def type_of(self, column: str) -> str | None:
        """The type (as the pipeline's definition spells it) of ``column``, if known."""
        if column in self.columns and len(self.types) == len(self.columns):
            return self.types[self.columns.index(column)]
        return None


@dataclass(frozen=True)
class ReaderShape:
    """One operator input reading an index.

    ``stream`` is what it reads (after its filters and column picks), ``filtered``
    whether a filter lies between the index's stream and it, ``columns`` the columns of
    the index's stream it needs and ``filter_columns`` those its filters read (both named
    as in the index's stream).
    """

    name: str
    stream: str
    columns: tuple[str, ...] = ()
    filtered: bool = False
    filter_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class IndexShape:
    """One index: ``stream``'s rows by ``key`` in column family ``name``.

    ``written_by``/``read_by``: the sources whose pushes write / probe it;
    ``readers``: the operator inputs reading it (for index sharing); ``rows``: rows it
    holds now.  ``label`` names it for people (``left side``, ``customer by ck``).
    """

    name: str
    stream: str
    key: tuple[str, ...]
    layout: Literal["key", "unique", "bag"] = "bag"
    unique_key: tuple[str, ...] | None = None
    columns: tuple[str, ...] = ()
    written_by: tuple[str, ...] = ()
    read_by: tuple[str, ...] = ()
    readers: tuple[ReaderShape, ...] = ()
    bulk_loadable: bool = True
    tracks_degree: bool = False
    rows: int = 0
    label: str = ""


@dataclass(frozen=True)
class ShareGroup:
    """Operator inputs that can read one index: ``stream``'s rows by ``key``.

    The readers reach ``stream`` through filters and column picks only, so one index
    holding ``columns`` (the union of what they need) serves them all; ``indexes`` are
    the column families holding it now (one if shared, one per reader if not).
    """

    stream: str
    key: tuple[str, ...]
    readers: tuple[ReaderShape, ...]
    columns: tuple[str, ...] = ()
    indexes: tuple[str, ...] = ()


@dataclass(frozen=True)
class JoinShape:
    """One binary join: its input streams, keys, type and the indexes of its inputs."""

    name: str
    left: str
    right: str
    left_key: tuple[str, ...] = ()
    right_key: tuple[str, ...] = ()
    how: str = "inner"
    left_index: str = ""
    right_index: str = ""

    def stream(self, side: str) -> str:
        """The input stream of ``side`` (``"left"``/``"right"``)."""
        return self.left if side == "left" else self.right

    def index(self, side: str) -> str:
        """The index (column family) of ``side``'s input."""
        return self.left_index if side == "left" else self.right_index


@dataclass(frozen=True)
class PlanContext:
    """Everything a physical rule reads; rules return decisions, never mutate this.

    ``kind``/``name``: what is planned (a join or a pipeline) and the root subject of
    its plan.  ``sources``: statistics per source (a join's are ``"left"``/``"right"``).
    ``share_groups``/``share_indexes``: a pipeline's shareable inputs and its setting
    (one switch, or per stream as ``Pipeline(share_indexes={stream: bool})`` takes it).
    ``stream_rows``: estimated rows of every stream (sources and derived streams), and
    ``stream_rows_from`` how each was obtained.  ``given``: choices the caller fixed
    (``strategy``, ``small_side``, ``order``, ``compaction``, ``memtables``,
    ``probe``, ``shards``); rules record them as given instead of deciding.
    ``decisions``: what the rules before this one decided.
    """

    kind: Literal["join", "pipeline"]
    name: str
    sources: Mapping[str, SourceStats]
    joins: tuple[JoinShape, ...] = ()
    indexes: tuple[IndexShape, ...] = ()
    share_groups: tuple[ShareGroup, ...] = ()
    share_indexes: bool | Mapping[str, bool] = True
    streams: Mapping[str, StreamShape] = field(default_factory=dict)
    stream_rows: Mapping[str, int | None] = field(default_factory=dict)
    stream_rows_from: Mapping[str, str] = field(default_factory=dict)
    history: History = field(default_factory=lambda: History(""))
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    given: Mapping[str, Any] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()

    def rows(self, stream: str) -> int | None:
        """Estimated rows of ``stream`` (a source's own count first), or None."""
        src = self.sources.get(stream)
        if src is not None and src.rows is not None:
            return src.rows
        return self.stream_rows.get(stream)

    def lower_bound(self, stream: str) -> int:
        """The least rows ``stream`` holds (a source's counted rows, else 0)."""
        src = self.sources.get(stream)
        if src is not None:
            return src.lower_bound
        n = self.stream_rows.get(stream)
        return n if n is not None else 0

    def decision(self, topic: str, subject: str | None = None) -> Decision | None:
        """The latest decision on ``topic`` about ``subject`` (default: the root)."""
        return latest_decision(self.decisions, topic, self.name if subject is None else subject)

    def choice(self, topic: str, subject: str | None = None, default: Any = None) -> Any:
        """The choice of :meth:`decision`, or ``default`` if there is none."""
        d = self.decision(topic, subject)
        return default if d is None else d.choice

    def index(self, name: str) -> IndexShape | None:
        """The index whose column family is ``name``."""
        return next((ix for ix in self.indexes if ix.name == name), None)

    def with_decisions(self, more: Iterable[Decision]) -> PlanContext:
        """A copy with ``more`` decisions appended."""
        return dataclasses.replace(self, decisions=(*self.decisions, *more))
