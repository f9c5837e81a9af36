"""What is maintained: the one protocol joins and pipelines share, and their bookkeeping.

A :class:`~joinstate.Join` and a :class:`~joinstate.Pipeline` are both *maintained*
outputs over named inputs (a join's ``left``/``right`` sides, a pipeline's sources).
Population, the planner and the Spark drivers program against :class:`Maintained`
alone: they push change sets to inputs and get every output's change set back, commit
progress markers with the pushes, move the phase to ``live``, and read which indexes a
push to an input writes and probes (population's compaction schedules come from them).

Both keep the same records in ``__meta__`` under their *owner* name (a join's name,
``pipeline~<name>`` for a pipeline: :func:`joinstate.names.pipeline_owner`), through one
:class:`Bookkeeping`: the phase, one progress marker per input, and commit records
(:mod:`joinstate.commits`).  Going live is one transaction (the phase and the removal of
every marker, plus whatever the object owes its outputs), so a crash leaves either an
interrupted population with its markers or a live object with none.

Why :class:`~joinstate.Join` stays its own class rather than a one-operator pipeline:
its state is laid out for one join (a degree family on a preserved side, one index per
side whose batches may go to a bulk SST sink, the probe caches, its ``Side`` spec in the
catalog), drivers use its prepared-batch API (Spark's direct population, the recompute
path), and its stores, catalog entries and column-family names must keep opening.  A
pipeline's join operator shares the join rule (:mod:`joinstate.joinrule`) with it;
what the two share beyond that is this protocol and the bookkeeping below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from joinstate import commits
from joinstate.errors import SchemaMismatchError
from joinstate.names import commit_key, commit_prefix, phase_key, progress_key
from joinstate.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from joinstate.db import Database
    from joinstate.transaction import BulkSink
    from joinstate.views import IndexInfo

__all__ = ["PHASES", "Bookkeeping", "Kind", "Maintained", "Phase"]

Kind = Literal["join", "pipeline"]
Phase = Literal["population", "live"]
PHASES: tuple[Phase, Phase] = ("population", "live")


@runtime_checkable
class Maintained(Protocol):
    """Outputs kept incrementally over named inputs in a state store.

    The contract every implementation keeps:

    * :meth:`push_change` is one transaction: the state change, the commit record (with
      ``commit_id``) and the progress marker (with ``progress``) are written together or
      not at all; ``before_commit`` receives the outputs after validation and before
      anything is written (if it raises, nothing is written).  Returns ``{output name:
      change set}`` for every output (:attr:`output_names`), each with a ``_weight``
      column.  The sum of every change set returned equals the outputs of the sum of every
      change pushed (the Z-set contract).
    * ``sink``: the push's writes go to a bulk sink instead of a WriteBatch; only an input
      whose :meth:`bulk_loadable` is true takes one, and a push whose staging reads state
      raises :class:`~joinstate.errors.BulkWriteRefused` having written nothing.
    * :meth:`go_live` ends population in one write (phase ``live``, every progress marker
      removed) and returns what the object still owed its outputs (a pipeline's global
      aggregates over empty inputs), delivered to ``before_commit`` first.
    """

    name: str

    @property
    def kind(self) -> Kind:
        """``"join"`` or ``"pipeline"``: what plans, reports and messages call it."""
        ...

    @property
    def owner(self) -> str:
        """The name its ``__meta__`` records (phase, markers, commits, history) are kept under."""
        ...

    @property
    def store(self) -> Database | None:
        """The store it is attached to (None once the store closed)."""
        ...

    @property
    def inputs(self) -> tuple[str, ...]:
        """Input names: a join's ``("left", "right")``, a pipeline's sources."""
        ...

    @property
    def output_names(self) -> tuple[str, ...]:
        """Output names, the keys of what :meth:`push_change` returns (a join: its name)."""
        ...

    def input_label(self, input_name: str, /) -> str:
        """How messages name an input: ``"the left side"``, ``"source 'sales'"``."""
        ...

    def input_schema(self, input_name: str, /) -> pa.Schema:
        """The columns a change set to ``input_name`` carries (without ``_weight``)."""
        ...

    def input_unique_key(self, input_name: str, /) -> tuple[str, ...] | None:
        """The input's declared unique key, if any."""
        ...

    def input_keys(self, input_name: str, /) -> tuple[tuple[str, ...], ...]:
        """Keys population samples the input's statistics by (a join side's join key)."""
        ...

    def push_change(
        self, input_name: str, delta: pa.Table | pa.RecordBatch, /, *,
        commit_id: str | None = None, progress: bytes | None = None,
        before_commit: Callable[[dict[str, pa.Table]], object] | None = None,
        sink: BulkSink | None = None,
    ) -> dict[str, pa.Table]:
        """Apply a change set to an input; every output's change set (see the class)."""
        ...

    def committed(self, commit_id: str) -> bool:
        """Whether a push with ``commit_id`` has been applied."""
        ...

    def progress(self, input_name: str, /) -> bytes | None:
        """The durable progress marker a driver committed with the input's pushes."""
        ...

    def clear_progress(self) -> None:
        """Remove every input's progress marker."""
        ...

    def go_live(self, before_commit: Callable[[dict[str, pa.Table]], object] | None = None
                ) -> dict[str, pa.Table]:
        """End population atomically; return (and first deliver) what is owed the outputs."""
        ...

    @property
    def phase(self) -> Phase:
        """``"population"`` until :meth:`go_live` (or :meth:`set_phase`)."""
        ...

    def set_phase(self, phase: Phase) -> None:
        """Record the phase (persisted)."""
        ...

    def indexes(self) -> list[IndexInfo]:
        """Views of every index of the state."""
        ...

    def written_indexes(self, input_name: str, /) -> list[IndexInfo]:
        """Views of the indexes a push to ``input_name`` writes."""
        ...

    def probed_indexes(self, input_name: str, /) -> list[IndexInfo]:
        """Views of the indexes a push to ``input_name`` reads."""
        ...

    def bulk_loadable(self, input_name: str, /) -> bool:
        """Whether pushes to ``input_name`` may be offered to a bulk sink."""
        ...

    def column_families(self) -> tuple[str, ...]:
        """Every column family of the state."""
        ...

    def operator_rows(self) -> dict[str, int]:
        """Rows of change each operator produced since the object was created, by label."""
        ...

    def settle(self) -> None:
        """Finish in-memory work deferred during a load, before the live phase."""
        ...

    def reload(self) -> None:
        """Forget cached counters and derived in-memory state after a failed bulk load."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters and RocksDB facts (a JSON-able dict)."""
        ...

    def summary(self) -> str:
        """A small readable table of the state."""
        ...

    def verify(self) -> dict[str, Any]:
        """Read the state and check it against its counters (raises if they disagree)."""
        ...


class Bookkeeping:
    """The ``__meta__`` records of one maintained object: phase, progress, commits.

    ``owner``: the name the records are kept under; ``inputs``: the input names (each has
    at most one progress marker); ``what``: how messages name the object (``join 'j'``).
    Every method takes the open store: the object owns its lifetime.
    """

    __slots__ = ("inputs", "owner", "what")

    def __init__(self, owner: str, inputs: tuple[str, ...], what: str) -> None:
        self.owner = owner
        self.inputs = inputs
        self.what = what

    # ---- phase ----------------------------------------------------------------------------

    def phase(self, store: Database) -> Phase:
        """The recorded phase (``population`` when none is recorded)."""
        return "live" if store.meta_get(phase_key(self.owner)) == b"live" else "population"

    def set_phase(self, store: Database, phase: str) -> None:
        """Record ``phase`` (one write)."""
        if phase not in PHASES:
            raise SchemaMismatchError(f"phase={phase!r} must be 'population' or 'live'")
        with store.lock:
            store.meta_put(phase_key(self.owner), phase.encode())

    def go_live(self, txn: Transaction) -> None:
        """Stage the end of population into ``txn``: phase live, every marker removed."""
        for name in self.inputs:
            txn.record(progress_key(self.owner, name), None)
        txn.record(phase_key(self.owner), b"live")

    # ---- progress -------------------------------------------------------------------------

    def progress(self, store: Database, input_name: str) -> bytes | None:
        """The marker committed with ``input_name``'s pushes."""
        return store.meta_get(progress_key(self.owner, input_name))

    def stage_progress(self, txn: Transaction, input_name: str, marker: bytes) -> None:
        """Stage ``input_name``'s marker into a push's transaction."""
        txn.record(progress_key(self.owner, input_name), marker)

    def clear_progress(self, store: Database) -> None:
        """Remove every input's marker (one write)."""
        with store.lock:
            txn = Transaction(store)
            for name in self.inputs:
                txn.record(progress_key(self.owner, name), None)
            txn.commit()

    # ---- commit records -------------------------------------------------------------------

    def commit_key(self, commit_id: str | None) -> bytes | None:
        """Where the record of ``commit_id`` is kept (None without an id)."""
        return None if commit_id is None else commit_key(self.owner, commit_id)

    def committed(self, store: Database, commit_id: str) -> bool:
        """Whether a push with ``commit_id`` has been applied."""
        return store.meta_get(commit_key(self.owner, commit_id)) is not None

    def replay(self, store: Database, commit_id: str | None, change: bytes, this_push: str,
               outputs: tuple[str, ...]) -> dict[str, pa.Table] | None:
        """The recorded outputs if ``commit_id`` was committed (a conflict if not this change).

        None when there is no id or nothing is recorded under it: the push goes ahead.
        """
        if commit_id is None:
            return None
        recorded = store.meta_get(commit_key(self.owner, commit_id))
        if recorded is None:
            return None
        return commits.replay(recorded, change, what=f"commit id {commit_id!r} of {self.what}",
                              this_push=this_push, outputs=outputs)

    def stage_commit(self, txn: Transaction, commit_id: str, change: bytes,
                     outs: dict[str, pa.Table]) -> None:
        """Stage the record of a push under ``commit_id`` into its transaction."""
        txn.record(commit_key(self.owner, commit_id), commits.record(change, outs))

    def forget_commits(self, store: Database, keep: Callable[[str], bool] | None = None
                       ) -> int:
        """Drop recorded commit ids (and their outputs) for which ``keep`` is false."""
        prefix = commit_prefix(self.owner)
        with store.lock:
            txn = Transaction(store)
            n = 0
            for k in store.meta_keys(prefix):
                if keep is None or not keep(k[len(prefix):].decode()):
                    txn.record(k, None)
                    n += 1
            txn.commit()
        return n

