"""Durable progress of a population, and resuming it after a crash or an exception.

Every batch the driver applies commits, in the same transaction as the batch's rows and
counters (:meth:`joinstate.Join.apply` ``progress=``), a JSON *marker* for its side:
batches and rows consumed so far, a running digest of the input batches read so far,
the source's identity when known, the run's strategy, order, small side and
``batch_rows``, and ``done`` once the side is exhausted.  With the WAL on (always, for
population), the durable marker of a side says exactly which of its batches are in the
state, also after a kill -9 in the middle of an SST ingestion (the core completes it on
reopen).  The driver clears the markers when the join goes live; a ``go_live=False``
call leaves both sides' markers ``done`` (the next call clears them), so other markers on
a join that is not live mean an interrupted population.

Resuming re-reads each source, skips (and digests) the batches the marker counts, and
refuses an input whose digest differs: skipping by position is only right for the same
batches in the same order.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import xxhash

from population.errors import PopulationError, PopulationInterruptedError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from joinstate import Join, SideName

__all__ = [
    "MARKER_FORMAT",
    "Marker",
    "OutputBatch",
    "batch_digest",
    "completed",
    "interrupted",
    "markers",
    "source_identity",
]

MARKER_FORMAT = 1
SIDES: tuple[SideName, SideName] = ("left", "right")
EMPTY_DIGEST = "0" * 32


@dataclass(frozen=True)
class OutputBatch:
    """Which input batch an output delta comes from: ``side`` and its 0-based ``index``.

    Given to a ``sink`` that takes a second argument.  After a resume, outputs of batches
    with ``index >= report.redelivered[side]`` that the crashed run delivered are
    delivered again (with the same ``side`` and ``index``): an idempotent sink keyed by
    ``(side, index)`` sees every output exactly once.
    """

    side: str
    index: int


@dataclass(frozen=True)
class Marker:
    """One side's durable progress (what :meth:`joinstate.Join.progress` holds, decoded)."""

    side: SideName
    batches: int
    rows: int
    digest: str
    done: bool
    strategy: dict[str, Any]
    order: str
    small: str
    small_from: str
    batch_rows: int
    source: dict[str, Any] | None = None
    go_live: bool = True
    format: int = MARKER_FORMAT

    def to_bytes(self) -> bytes:
        """The marker as stored (compact JSON)."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> Marker:
        """Decode a stored marker; :class:`PopulationError` if it is not one of ours."""
        try:
            d = json.loads(raw)
            if d.get("format") != MARKER_FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {MARKER_FORMAT}")
            return cls(**d)
        except (ValueError, TypeError, AttributeError) as exc:
            raise PopulationError(
                f"{where}: the population progress marker is unreadable ({exc}); drop the "
                "join (store.drop_join) and populate it again"
            ) from exc

    def describe(self) -> str:
        """``"12 batches, 48,000 rows, done"``."""
        return (f"{self.batches} batches, {self.rows:,} rows, "
                f"{'done' if self.done else 'not done'}")

    def summary(self) -> dict[str, Any]:
        """What an error or a report shows of a marker."""
        return {"batches": self.batches, "rows": self.rows, "done": self.done}


def markers(join: Join) -> dict[str, Marker]:
    """The durable progress markers of ``join`` (sides without one are left out)."""
    out: dict[str, Marker] = {}
    for side in SIDES:
        raw = join.progress(side)
        if raw is not None:
            out[side] = Marker.from_bytes(raw, f"join {join.name!r}, {side} side")
    return out


def completed(found: Mapping[str, Marker]) -> bool:
    """Whether ``found`` are the markers a finished ``go_live=False`` call leaves.

    Such a call (a driver loading the sides in separate calls) keeps its markers, both
    sides done, until the join goes live; the next call starts afresh.
    """
    return (set(found) == set(SIDES)
            and all(m.done and not m.go_live for m in found.values()))


def interrupted(join: Join) -> dict[str, Marker]:
    """The markers of an interrupted population of ``join``; empty if there is none.

    A live join has finished its population, whatever markers a crash left behind, and
    so has a ``go_live=False`` call whose both sides are done.
    """
    if join.phase == "live":
        return {}
    found = markers(join)
    return {} if completed(found) else found


def batch_digest(previous: str, batch: pa.RecordBatch | pa.Table) -> str:
    """The running digest (hex) after reading ``batch``.

    xxh3_128 over the previous digest and the Arrow IPC encoding of the batch:
    deterministic for the same data cut into the same batches.
    """
    h = xxhash.xxh3_128()
    h.update(bytes.fromhex(previous))
    batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
    for b in batches:
        h.update(b.serialize())
    return h.hexdigest()


def source_identity(data: Any) -> dict[str, Any] | None:
    """A Parquet path and its size, when the input is one; None otherwise."""
    if isinstance(data, str | Path):
        p = Path(data)
        try:
            return {"path": str(p.resolve()), "bytes": p.stat().st_size}
        except OSError:
            return {"path": str(p), "bytes": None}
    return None


def interrupted_message(join: Join, found: Mapping[str, Marker]) -> str:
    """The message of :class:`PopulationInterruptedError`: progress and both remedies."""
    any_marker = next(iter(found.values()))
    progress = "; ".join(
        f"{side} side: {found[side].describe() if side in found else 'nothing loaded'}"
        for side in SIDES
    )
    where = f" in {join.store.path}" if join.store is not None else ""
    loaded = [f"the {s} side's first {m.batches}" for s, m in found.items() if m.batches]
    empty = [s for s in SIDES if s not in found or not found[s].batches]
    takes = ("each side with batches loaded must give those same batches first ("
             + ", ".join(loaded) + "; checked by digest, a Parquet file also by its size),"
             " and a side loaded completely nothing more" if loaded else
             "no batch is loaded yet")
    after = ("; the batches after them"
             + (f" and a side with nothing loaded ({' and '.join(empty)})" if empty else "")
             + " may be new input, e.g. a corrected file")
    return (
        f"join {join.name!r}{where} has an interrupted population ({progress}; strategy "
        f"{any_marker.strategy.get('name')!r}, order {any_marker.order!r}, batch_rows "
        f"{any_marker.batch_rows}). Either continue it with population.populate(..., "
        f"resume=True): {takes}{after}; or discard it with store.drop_join({join.name!r}), "
        "create the join again and populate it from scratch"
    )


def sink_takes_batch(sink: Callable[..., Any]) -> bool:
    """Whether ``sink`` accepts a second positional argument (an :class:`OutputBatch`)."""
    try:
        inspect.signature(sink).bind(None, None)
    except (TypeError, ValueError):
        return False
    return True


def raise_interrupted(join: Join, found: Mapping[str, Marker], detail: str = "") -> None:
    """Raise :class:`PopulationInterruptedError` for ``found`` (``detail`` first)."""
    msg = interrupted_message(join, found)
    raise PopulationInterruptedError(
        f"{detail}: {msg}" if detail else msg,
        {s: m.summary() for s, m in found.items()},
    )
