"""Durable progress of a population, and resuming it after a crash or an exception.

Every batch the driver applies commits, in the same transaction as the batch's state
change (:meth:`joinstate.maintained.Maintained.push_change` ``progress=``), a JSON
*marker* for its input: batches and rows consumed so far, a running digest of the input
batches read so far, the input's identity when known (a Parquet file and its size), the
run's parameters (strategy, order, small side, ``batch_rows``, the inputs it loads) and
``done`` once the input is exhausted.  With the WAL on (always, for population), the
durable marker of an input says exactly which of its batches are in the state, also
after a kill -9 in the middle of an SST ingestion (the core completes it on reopen).
The driver clears the markers when the target goes live; a ``go_live=False`` call leaves
its inputs' markers ``done`` (the next call clears them), so other markers on a target
that is not live mean an interrupted population.

Resuming re-reads each input, skips (and digests) the batches the marker counts, and
refuses an input whose digest differs: skipping by position is only right for the same
batches in the same order.  A pipeline's markers written before the run's parameters
were recorded in this form (``batches``, ``rows``, ``digest``, ``done``, ``batch_rows``
and the strategy's name only) are read too.
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

    from joinstate.maintained import Maintained

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
EMPTY_DIGEST = "0" * 32


@dataclass(frozen=True)
class OutputBatch:
    """Which input batch an output delta comes from: ``side`` (the input) and its ``index``.

    Given to a ``sink`` that takes a second argument.  After a resume, outputs of batches
    with ``index >= report.redelivered[side]`` that the crashed run delivered are
    delivered again (with the same ``side`` and ``index``): an idempotent sink keyed by
    ``(side, index)`` sees every output exactly once.  What a pipeline owes its outputs
    when it goes live (the first rows of global aggregates over inputs that stayed empty)
    comes from no input batch: it is delivered with :data:`GO_LIVE`.
    """

    side: str
    index: int


GO_LIVE = OutputBatch("", 0)
"""The :class:`OutputBatch` of the outputs a target hands over when it goes live."""


@dataclass(frozen=True)
class Marker:
    """One input's durable progress (what ``target.progress(input)`` holds, decoded).

    ``order`` is the run's load order: a join's mode (``small-first``, ``interleaved``,
    ``as-given``) or a pipeline's list of sources, None when not recorded (then the
    planner decides again); ``inputs`` the inputs the run loads (None: every input of
    the target).
    """

    side: str
    batches: int
    rows: int
    digest: str
    done: bool
    strategy: dict[str, Any]
    order: str | list[str] | None
    small: str | None
    small_from: str
    batch_rows: int | None
    source: dict[str, Any] | None = None
    go_live: bool = True
    inputs: list[str] | None = None
    format: int = MARKER_FORMAT

    def to_bytes(self) -> bytes:
        """The marker as stored (compact JSON)."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str, side: str = "", remedy: str = "") -> Marker:
        """Decode a stored marker; :class:`PopulationError` if it is not one of ours.

        ``side`` names the input a marker without one belongs to (an older pipeline
        marker); ``remedy`` ends the message of an unreadable one.
        """
        try:
            d = json.loads(raw)
            if not isinstance(d, dict):
                raise TypeError(f"a JSON {type(d).__name__}, not an object")
            if "format" not in d:
                return cls._legacy(d, side)
            if d.get("format") != MARKER_FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {MARKER_FORMAT}")
            return cls(**d)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PopulationError(
                f"{where}: the population progress marker is unreadable ({exc}); "
                f"{remedy or 'drop the state and populate it again'}"
            ) from exc

    @classmethod
    def _legacy(cls, d: dict[str, Any], side: str) -> Marker:
        """A pipeline's marker from before the run's parameters were recorded here."""
        br = d.get("batch_rows")
        strategy = d.get("strategy")
        return cls(side=side, batches=int(d["batches"]), rows=int(d["rows"]),
                   digest=str(d["digest"]), done=bool(d["done"]),
                   strategy={"name": str(strategy)} if strategy else {}, order=None,
                   small=None, small_from="", batch_rows=None if br is None else int(br))

    def describe(self) -> str:
        """``"12 batches, 48,000 rows, done"``."""
        return (f"{self.batches} batch{'es' if self.batches != 1 else ''}, {self.rows:,} rows, "
                f"{'done' if self.done else 'not done'}")

    def summary(self) -> dict[str, Any]:
        """What an error or a report shows of a marker."""
        return {"batches": self.batches, "rows": self.rows, "done": self.done}


def _remedy(target: Maintained) -> str:
    return (f"discard it with store.drop_{target.kind}({target.name!r}), create the "
            f"{target.kind} again and populate it from scratch")


def markers(target: Maintained) -> dict[str, Marker]:
    """The durable progress markers of ``target`` (inputs without one are left out)."""
    out: dict[str, Marker] = {}
    for name in target.inputs:
        raw = target.progress(name)
        if raw is not None:
            out[name] = Marker.from_bytes(
                raw, f"{target.kind} {target.name!r}, {target.input_label(name)}", name,
                _remedy(target))
    return out


def completed(found: Mapping[str, Marker], inputs: tuple[str, ...] | None = None) -> bool:
    """Whether ``found`` are the markers a finished ``go_live=False`` call leaves.

    Such a call (a driver loading a join's sides in separate calls) keeps its markers,
    every input it loaded done, until the target goes live; the next call starts
    afresh.  The inputs a run loads are recorded in its markers (``inputs``: every one
    must have a done marker); markers that do not record them stand for ``inputs``
    (default: a join's two sides).
    """
    if not found:
        return False
    first = next(iter(found.values()))
    loaded = first.inputs if first.inputs is not None else list(inputs or ("left", "right"))
    return (set(found) == set(loaded)
            and all(m.done and not m.go_live for m in found.values()))


def interrupted(target: Maintained) -> dict[str, Marker]:
    """The markers of an interrupted population of ``target``; empty if there is none.

    A live target has finished its population, whatever markers a crash left behind, and
    so has a ``go_live=False`` call whose inputs are all done.
    """
    if target.phase == "live":
        return {}
    found = markers(target)
    return {} if completed(found, target.inputs) else found


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


def interrupted_message(target: Maintained, found: Mapping[str, Marker]) -> str:
    """The message of :class:`PopulationInterruptedError`: progress and both remedies."""
    first = next(iter(found.values()))
    shown = first.inputs if first.inputs is not None else list(target.inputs)
    shown = [*shown, *(s for s in found if s not in shown)]
    progress = "; ".join(
        f"{_label(target, s)}: {found[s].describe() if s in found else 'nothing loaded'}"
        for s in shown)
    store = target.store
    where = f" in {store.path}" if store is not None else ""
    loaded = [f"the first {m.batches} of {target.input_label(s)}" for s, m in found.items()
              if m.batches]
    empty = [_label(target, s) for s in shown if s not in found or not found[s].batches]
    takes = ("each input with batches loaded must give those same batches first ("
             + ", ".join(loaded) + "; checked by digest, a Parquet file also by its size),"
             " and an input loaded completely nothing more" if loaded else
             "no batch is loaded yet")
    after = ("; the batches after them"
             + (f" and the inputs with nothing loaded ({', '.join(empty)})" if empty else "")
             + " may be new input, e.g. a corrected file")
    params = [f"strategy {first.strategy.get('name')!r}" if first.strategy.get("name") else "",
              f"order {first.order!r}" if first.order is not None else "",
              f"batch_rows {first.batch_rows}" if first.batch_rows is not None else ""]
    shown_params = ", ".join(p for p in params if p)
    return (
        f"{target.kind} {target.name!r}{where} has an interrupted population ({progress}"
        f"{'; ' + shown_params if shown_params else ''}). Either continue it with "
        f"population.populate(..., resume=True): {takes}{after}; or {_remedy(target)}"
    )


def _label(target: Maintained, input_name: str) -> str:
    """``"left side"``, ``"source 'sales'"``: an input's label without its article."""
    return target.input_label(input_name).removeprefix("the ")


def sink_takes_batch(sink: Callable[..., Any]) -> bool:
    """Whether ``sink`` accepts a second positional argument (an :class:`OutputBatch`)."""
    try:
        inspect.signature(sink).bind(None, None)
    except (TypeError, ValueError):
        return False
    return True


def raise_interrupted(target: Maintained, found: Mapping[str, Marker], detail: str = ""
                      ) -> None:
    """Raise :class:`PopulationInterruptedError` for ``found`` (``detail`` first)."""
    msg = interrupted_message(target, found)
    raise PopulationInterruptedError(
        f"{detail}: {msg}" if detail else msg,
        {s: m.summary() for s, m in found.items()},
    )
