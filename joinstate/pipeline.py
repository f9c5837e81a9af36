"""The pipeline runtime: a graph attached to a state store, kept incrementally.

::

    import joinstate as js
    customer = js.source("customer", schema=..., unique_key=["c_customer_sk"])
    sales = js.source("store_sales", schema=...)
    per_year = (sales.join(customer, on=("ss_customer_sk", "c_customer_sk"))
                     .group_by(["c_customer_id"])
                     .aggregate(total=("sum", "ss_net_paid")))
    graph = js.Graph().output("per_year", per_year)
    p = js.Pipeline(store, "q4", graph)
    outs = p.push("store_sales", delta)     # {output name: change set}

What is maintained is the :class:`~joinstate.graph.Graph`; how, the physical plan
(:mod:`joinstate.physical`: columns, shared indexes, readers); each node's change is
computed by its operator (:mod:`joinstate.ops`).  This module attaches them to a store:

* **Attaching** (:meth:`Pipeline.compile`, at the first push) opens the indexes and the
  operators' own state and checks the definition against the one the store holds; a
  different one is refused, naming the first difference.  A new pipeline is created in
  one transaction that also runs the rows its global aggregates have over no input.
* **A push is one transaction.**  The source checks and stages its change, then every
  node reachable from it computes its change in topological order; every index whose
  stream changed, every operator's state and the commit record are staged into one
  :class:`~joinstate.transaction.Transaction` and written together, so a failure
  anywhere (an over-retraction, an overflow, a full disk) changes nothing.  Reads see
  the state before the push, which is what the operators' delta rules assume.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from joinstate import commits
from joinstate._index import Index
from joinstate.definition import check_stored, definition, definition_bytes, stored_layout
from joinstate.errors import (
    BulkWriteRefused,
    SchemaMismatchError,
    StateClosedError,
)
from joinstate.graph import Graph, Materialized
from joinstate.inspect import describe, summary_of
from joinstate.maintained import Bookkeeping, Kind, Phase
from joinstate.names import (
    initial_outputs_key,
    pipeline_owner,
    pipeline_spec_key,
    validate_name,
)
from joinstate.nodes import Node, SourceNode
from joinstate.ops import OperatorBase, PushContext, operator_for
from joinstate.ops.aggregate import AggregateOp
from joinstate.ops.base import Strategies
from joinstate.ops.source import SourceOp
from joinstate.physical import LAYOUT, PhysicalPlan, check_sharing
from joinstate.schema import WEIGHT, conform_delta
from joinstate.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from joinstate.ops.base import Delta
    from joinstate.side import SideName
    from joinstate.store import StateStore
    from joinstate.transaction import BulkSink
    from joinstate.views import IndexInfo

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Pipeline:
    """A graph's outputs maintained in a :class:`StateStore` under a name.

    ``graph``: what is maintained (:class:`joinstate.Graph`); ``share_indexes``: whether
    operators reading one stream on one key share its index (``False``: one index per
    operator input; a mapping: per source name or operator label, default shared).  The
    definition is fixed in the store by the first push (or :meth:`compile`); attaching
    another graph under a name the store holds raises
    :class:`~joinstate.errors.JoinSpecMismatchError`, naming what differs.

    A :class:`~joinstate.maintained.Maintained` object: its inputs are the sources, its
    outputs the graph's; its ``__meta__`` records are kept under ``pipeline~<name>``.
    """

    kind: Kind = "pipeline"

    def __init__(self, store: StateStore, name: str, graph: Graph, *,
                 share_indexes: bool | Mapping[str, bool] = True) -> None:
        validate_name("pipeline", name)
        if not isinstance(graph, Graph):
            raise SchemaMismatchError(
                f"pipeline {name!r}: graph must be a joinstate.Graph (build streams with "
                "joinstate.source(...), name outputs with joinstate.Graph().output(...)), "
                f"got {type(graph).__name__}")
        self.store: StateStore | None = store
        self.name = name
        self.graph = graph
        self.share_indexes = check_sharing(share_indexes)
        self.records = Bookkeeping(pipeline_owner(name), tuple(graph.sources),
                                   f"pipeline {name!r}")
        self._physical: PhysicalPlan | None = None
        self._compiled = False
        self._ops: dict[int, OperatorBase] = {}
        self._index: dict[int, Index] = {}
        """id(IndexPlan) -> its opened index."""
        self._reach: dict[int, frozenset[int]] = {}
        self._produced: dict[int, int] = {}
        # Change sets the pipeline owes its outputs since it was created (a global
        # aggregate's first row), returned with the first push that carries rows.
        self._initial: dict[str, pa.Table] | None = None

    @property
    def physical(self) -> PhysicalPlan:
        """The physical plan (store-less; computed on first use)."""
        if self._physical is None:
            store = self.store
            # A pipeline the store already holds keeps the index layout it was created
            # with (its definition records it); a new one gets today's.
            raw = None if store is None or store.closed else store.meta_get(
                pipeline_spec_key(self.name))
            layout = LAYOUT if raw is None else stored_layout(raw)
            self._physical = PhysicalPlan.of(self.graph, self.share_indexes,
                                             what=f"pipeline {self.name!r}", layout=layout)
        return self._physical

    # ---- read-only facts ----------------------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...]:
        """Source names, in definition order."""
        return tuple(self.graph.sources)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Output names, in definition order."""
        return tuple(self.graph.outputs)

    @property
    def owner(self) -> str:
        """The name of the pipeline's ``__meta__`` records: ``pipeline~<name>``."""
        return self.records.owner

    def input_label(self, input_name: str) -> str:
        """``"source 'sales'"``."""
        return f"source {input_name!r}"

    def input_keys(self, input_name: str) -> tuple[tuple[str, ...], ...]:
        """None: population samples a source's statistics without keys."""
        self._source(input_name)
        return ()

    def bulk_loadable(self, input_name: str) -> bool:
        """Never: a push reads the state its operators keep, which a bulk sink hides."""
        self._source(input_name)
        return False

    def source_schema(self, name: str) -> pa.Schema:
        """The declared schema of source ``name``."""
        return self._source(name).schema

    def source_unique_key(self, name: str) -> tuple[str, ...] | None:
        """The declared unique key of source ``name``."""
        return self._source(name).unique_key

    # The protocol's names for the same facts: a pipeline's inputs are its sources.
    inputs = sources
    output_names = outputs
    input_schema = source_schema
    input_unique_key = source_unique_key

    def output_schema(self, name: str) -> pa.Schema:
        """The schema of output ``name``'s change sets (its columns and ``_weight``)."""
        return self._named(self.graph.output_schema, name)

    def _source(self, name: str) -> SourceNode:
        return self._named(self.graph.source, name)

    def _materialized(self, name: str) -> Materialized:
        return self._named(self.graph.materialized_output, name)

    def _named(self, lookup: Callable[[str], T], name: str) -> T:
        """``lookup(name)``, its refusal naming this pipeline."""
        try:
            return lookup(name)
        except SchemaMismatchError as exc:
            raise SchemaMismatchError(f"pipeline {self.name!r}: {exc}") from None

    def indexes(self) -> list[IndexInfo]:
        """Read-only views of the pipeline's indexes (compiles the pipeline)."""
        self.compile()
        return [self._index[id(ip)].info() for ip in self.physical.indexes]

    def column_families(self) -> tuple[str, ...]:
        """Every column family the pipeline's state uses."""
        self.compile()
        out: list[str] = []
        for ip in self.physical.indexes:
            out += self._index[id(ip)].column_families()
        for op in self._ops.values():
            if not isinstance(op, SourceOp):
                out += op.column_families()
        for op in self._ops.values():
            if isinstance(op, SourceOp):
                out += op.column_families()
        return tuple(out)

    def explain(self) -> str:
        """The compiled plan in words: each index and its readers, the state, the graph."""
        self.compile()
        phys = self.physical
        lines = [f"pipeline {self.name!r} (indexes {phys.sharing_text()})"]
        for ip in phys.indexes:
            idx = self._index[id(ip)]
            lines.append("  " + phys.explain_index(ip, idx.cf, idx.side.layout))
        for op in self._ops.values():
            if isinstance(op, AggregateOp):
                lines.append(f"  aggregate {op.node.label}: families "
                             f"{list(op.column_families())}")
        for op in self._ops.values():
            if isinstance(op, SourceOp):
                lines.append(f"  source {op.node.name}: retractions "
                             f"{op.checked_by(self.name)}")
        lines += ["  " + line for op in self._ops.values() for line in op.explain_state()]
        lines += ["  " + line for line in self.graph.explain().splitlines()]
        return "\n".join(lines)

    def probed_indexes(self, name: str) -> list[IndexInfo]:
        """Views of the indexes a push to source ``name`` reads.

        Population uses them: an index that no source still to be loaded reads may stop
        compacting while it is written.
        """
        self._source(name)
        self.compile()
        return [self._index[id(ip)].info() for ip in self.physical.probed_by(name)]

    def written_indexes(self, name: str) -> list[IndexInfo]:
        """Views of the indexes a push to source ``name`` writes (population uses them)."""
        self._source(name)
        self.compile()
        return [self._index[id(ip)].info() for ip in self.physical.written_by(name)]

    def recompute_candidates(self, source: str) -> dict[str, list[IndexInfo]]:
        """Operators a push to ``source`` reaches that have a recompute path, by label.

        Each with views of the indexes that path would scan (the planner's cost input).
        """
        start = self._source(source)
        self.compile()
        reach = self._reachable(start.id)
        out: dict[str, list[IndexInfo]] = {}
        for nid, op in self._ops.items():
            if nid in reach and op.recomputable:
                changed = [i.id in reach for i in op.node.inputs]
                out[op.node.label] = [i.info() for i in op.scanned_indexes(self._index, changed)]
        return out

    def operator_rows(self) -> dict[str, int]:
        """Rows of change each operator produced since this object was created, by label.

        Counted with multiplicity; the per-operator part of population reports.
        """
        return {self.graph.nodes[nid].label: n for nid, n in sorted(self._produced.items())}

    def read(self, name: str) -> pa.Table:
        """The current contents of materialized output ``name`` (no ``_weight``).

        A row held k times appears k times; ``order_by`` sorts (NULLs last, as DuckDB
        and Spark do for ascending keys) and ``limit`` keeps the first rows.
        """
        m = self._materialized(name)
        return m.present(self.held(name)).cast(self.graph.outputs[name].schema)

    def held(self, name: str) -> pa.Table:
        """The rows materialized output ``name`` holds, each as often as held, unordered.

        Hidden ordering columns included: what :meth:`read` orders and limits, and what
        a reader of several shards merges before it does.
        """
        m = self._materialized(name)
        store = self._require_store()
        self.compile()
        op = self._ops[m.node.id]
        assert isinstance(op, AggregateOp)
        with store.lock:
            state = op.state().state()
        counts = state.column(m.count).to_numpy()
        rows = state.drop_columns([m.count])
        if len(counts) and not (counts == 1).all():
            rows = rows.take(pa.array(np.repeat(np.arange(len(counts)), counts)))
        return rows

    # ---- phase and progress ---------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """``"population"`` until a driver calls :meth:`go_live` (or :meth:`set_phase`)."""
        return self.records.phase(self._require_store())

    def set_phase(self, phase: Phase) -> None:
        """Record the pipeline's phase (persisted)."""
        self.records.set_phase(self._require_store(), phase)

    def go_live(self, before_commit: Callable[[dict[str, pa.Table]], object] | None = None
                ) -> dict[str, pa.Table]:
        """End population: phase ``live``, every progress marker gone; return what is owed.

        One write, so a crash leaves either the interrupted population with its markers
        (a resume loads only what is missing) or a live pipeline, never a population
        without markers that a resume would load again from the start.  What the
        pipeline still owes its outputs (the change sets of its global aggregates' first
        rows, when no push carried a row yet) is handed over in the same write: given to
        ``before_commit`` before anything is written (if it raises, nothing is), and
        returned; from then on nothing is owed.
        """
        store = self._require_store()
        self.compile()
        with store.lock:
            owed = dict(self._initial or {})
            txn = Transaction(store)
            self.records.go_live(txn)
            if owed:
                txn.record(initial_outputs_key(self.name), None)
                txn.after_commit(functools.partial(setattr, self, "_initial", None))
            outs = {} if not owed else {
                name: owed[name] if name in owed else self._consolidated(node, None)
                for name, node in self.graph.outputs.items()}
            if before_commit is not None:
                before_commit(outs)
            txn.commit()
        return outs

    def progress(self, source: str) -> bytes | None:
        """The durable progress marker a driver committed with ``source``'s pushes."""
        self._source(source)
        return self.records.progress(self._require_store(), source)

    def clear_progress(self) -> None:
        """Remove every source's progress marker (a driver does so when it finishes)."""
        self.records.clear_progress(self._require_store())

    def committed(self, commit_id: str) -> bool:
        """Whether a push with ``commit_id`` has been applied."""
        return self.records.committed(self._require_store(), commit_id)

    def forget_commits(self, keep: Callable[[str], bool] | None = None) -> int:
        """Drop recorded commit ids (and their outputs) for which ``keep`` is false."""
        return self.records.forget_commits(self._require_store(), keep)

    # ---- attaching ----------------------------------------------------------------------

    def compile(self) -> None:
        """Fix the definition: plan, open the state, check it against the store's catalog.

        Called by the first :meth:`push`; idempotent.
        """
        if self._compiled:
            return
        store = self._require_store()
        if not self.graph.outputs:
            raise SchemaMismatchError(f"pipeline {self.name!r} has no outputs; name one with "
                                      "graph.output(name, stream)")
        with store.lock:
            self.physical  # noqa: B018 - plans (and raises for a bad definition) first
            spec = self._spec()
            key = pipeline_spec_key(self.name)
            raw = store.meta_get(key)
            check_stored(f"pipeline {self.name!r}", store.path, raw, spec,
                         read_only=store.read_only)
            self._open_state(store)
            if raw is None:
                self._create(store, key, spec)
            else:
                owed = store.meta_get(initial_outputs_key(self.name))
                self._initial = None if owed is None else commits.unpack(owed)
            # Registered once its state exists (another object holding the name is refused
            # here, before this one wrote anything): a definition refused while it is
            # created (an expression failing on a global aggregate's first row) leaves no
            # object holding the name.
            store.register(self)
            self._compiled = True

    def _spec(self) -> dict[str, Any]:
        """The definition stored in the catalog: the graph's, and the sharing setting."""
        return definition(self.graph, self.share_indexes, self.physical.layout)

    def _open_state(self, store: StateStore) -> None:
        phys = self.physical
        for ip in phys.indexes:
            label: SideName = ip.base.label  # type: ignore[assignment]
            idx = Index(store, ip.cf(self.name), label, ip.side(), ip.key_codec(),
                        track_degree=False)
            for name in idx.column_families():
                store.cf(name)
            idx.restore_cache()
            self._index[id(ip)] = idx
        nodes = [n for n in self.graph.nodes
                 if n.id in phys.columns or isinstance(n, SourceNode)]
        for n in sorted(nodes, key=lambda n: not isinstance(n, SourceNode)):
            op = operator_for(n, phys)
            op.open(store, self.name)
            self._ops[n.id] = op
        self._ops = dict(sorted(self._ops.items()))

    def _create(self, store: StateStore, key: bytes, spec: dict[str, Any]) -> None:
        """Record the definition, in one transaction with the state it starts with.

        A pipeline starts from empty sources, where every aggregate without group keys
        already has its row (count 0, the other aggregates NULL), as in SQL.  That row
        flows through the operators after it (their state takes it now, so a
        materialized output shows it before any push) and the change sets it makes are
        kept in ``__meta__``, owed to the outputs: :meth:`push` returns them with the
        first change set that carries rows.
        """
        txn = Transaction(store)
        seeds = {nid: d for nid, op in self._ops.items() if (d := op.initial()) is not None}
        owed: dict[str, pa.Table] = {}
        if seeds:
            blame = ("the row a global aggregate has over no input (counts 0, the other "
                     "aggregates NULL), which the pipeline emits when it is created")
            ctx = PushContext(txn, self._index, self.name, blame)
            owed = {n: t for n, t in self._run(seeds, ctx).items() if t.num_rows}
        if owed:
            txn.record(initial_outputs_key(self.name), commits.pack(owed))
        txn.record(key, definition_bytes(spec))
        txn.commit()
        self._initial = owed or None

    # ---- lifecycle ------------------------------------------------------------------------

    def _require_store(self) -> StateStore:
        if self.store is None or self.store.closed:
            raise StateClosedError(f"pipeline {self.name!r} is bound to a closed state store")
        return self.store

    def detach(self) -> None:
        """Called by the store on close: derived state is saved, the pipeline is unusable."""
        store = self.store
        if store is not None and not store.closed and not store.read_only:
            for idx in self._indexes():
                try:
                    idx.save()
                except OSError as exc:  # derived state only: the next open rebuilds it
                    log.warning("could not save derived state of %s: %s", idx.cf, exc)
        self.store = None
        for idx in self._indexes():
            idx.cache = None

    def _sources(self) -> list[SourceOp]:
        return [op for op in self._ops.values() if isinstance(op, SourceOp)]

    def _indexes(self) -> list[Index]:
        """Every opened index: the plan's and those operators keep as their own state."""
        return [*self._index.values(), *(i for op in self._ops.values()
                                         for i in op.own_indexes())]

    def settle(self) -> None:
        """Finish in-memory work deferred during a load (see :meth:`joinstate.Join.settle`)."""
        store = self._require_store()
        self.compile()
        with store.lock:
            for idx in self._indexes():
                idx.settle()

    def warm(self) -> dict[str, float]:
        """Build now the in-memory state a first retraction would build; seconds per source.

        A source checked by its row record decides retractions from an exact in-memory
        multiset of its row hashes, built by one scan of the record when a push first
        retracts after the store opened (an insert-only load never builds it): about
        0.4 s per million rows held.  A caller for whom the first change after a
        population or a reopen must be as fast as the tenth calls this first.
        """
        store = self._require_store()
        self.compile()
        out: dict[str, float] = {}
        with store.lock:
            for op in self._sources():
                if op.record is not None:
                    t0 = time.perf_counter()
                    op.warm()
                    out[op.node.name] = time.perf_counter() - t0
        return out

    def reload(self) -> None:
        """Forget cached counters and what indexes and row records derived in memory.

        Each is read again from the store when next used.
        """
        store = self._require_store()
        self.compile()
        with store.lock:
            store.forget_counters(self.column_families())
            for idx in self._indexes():
                idx.reset()
            for op in self._sources():
                op.reset()

    # ---- pushing --------------------------------------------------------------------------

    def push(
        self, source: str, delta: pa.Table | pa.RecordBatch, *, commit_id: str | None = None,
        progress: bytes | None = None,
        before_commit: Callable[[dict[str, pa.Table]], object] | None = None,
        sink: BulkSink | None = None, strategies: Strategies | Mapping[str, str] | None = None,
        ingest: Collection[str] = (),
    ) -> dict[str, pa.Table]:
        """Apply a change set to ``source``; return every output's change set.

        One transaction: the indexes, aggregates and commit record of every operator the
        source feeds are written together or not at all (a push that would take a row
        below zero, break a unique key or overflow changes nothing).  ``commit_id`` makes
        the push idempotent as :meth:`joinstate.Join.push` does: a repeat with the same
        source and change returns the recorded outputs without applying anything, with
        another change raises :class:`~joinstate.errors.CommitConflictError`.
        ``progress`` is a driver's marker for this source, committed with the push;
        ``before_commit`` receives the outputs after validation, before anything is
        written (if it raises, nothing is written).  ``sink`` is refused
        (:class:`~joinstate.errors.BulkWriteRefused`): a push reads the state its
        operators keep, which a bulk sink's pending writes would hide from it.
        ``strategies``: per operator label, ``"incremental"`` (the default) or
        ``"recompute"`` (read its input state by whole-index scans: same output and
        state); a :class:`~joinstate.ops.base.Strategies` also receives every operator's
        timed run.  ``ingest``: index column families whose blind inserts this push
        writes as ingested SST files (:meth:`joinstate.transaction.Transaction.ingest_into`:
        the same state, no memtable; a population's pushes use it).

        A source refuses a retraction of a row it does not hold (see
        :func:`joinstate.source`).

        The Z-set contract: the sum of every output change set ever returned equals the
        output applied to the sum of every change set pushed.  A pipeline starts from
        empty sources, where an aggregate without group keys already has its row (count
        0, the other aggregates NULL): the change sets that row makes are returned with
        the first push whose change set has a row of non-zero weight (whatever source it
        goes to), consolidated with that push's own.  A push before it with no such row
        returns empty change sets, as any push without one does.
        """
        self._require_store()
        self._source(source)
        if sink is not None:
            raise BulkWriteRefused(
                f"pipeline {self.name!r}, source {source!r}: a push reads the state its "
                "operators keep, so it cannot be bulk-written; nothing was written")
        return self._push({source: delta}, commit_id=commit_id, progress=progress,
                          before_commit=before_commit, strategies=strategies, ingest=ingest)

    def push_many(
        self, changes: Mapping[str, pa.Table | pa.RecordBatch], *,
        commit_id: str | None = None,
        before_commit: Callable[[dict[str, pa.Table]], object] | None = None,
        strategies: Strategies | Mapping[str, str] | None = None,
    ) -> dict[str, pa.Table]:
        """Apply change sets to several sources in one push; return every output's change set.

        The same as pushing each source in turn and summing the outputs, but one
        transaction (all or nothing) in which every operator runs once: an operator
        that several of the changes reach computes its change from all of them together
        (a join with both inputs changed adds ΔL ⋈ ΔR to the two one-sided probes), so a
        batch of changes to a fact table and its dimensions costs one pass through the
        graph instead of one per source.  ``commit_id``, ``before_commit`` and
        ``strategies`` are :meth:`push`'s; the commit's digest covers every source's
        change, so a retry must repeat the same changes to the same sources.
        """
        if not changes:
            raise SchemaMismatchError(
                f"pipeline {self.name!r}: push_many was given no change set; give at least "
                f"one of its sources {list(self.sources)}")
        return self._push(dict(changes), commit_id=commit_id, progress=None,
                          before_commit=before_commit, strategies=strategies, ingest=())

    def _push(
        self, changes: dict[str, pa.Table | pa.RecordBatch], *, commit_id: str | None,
        progress: bytes | None, before_commit: Callable[[dict[str, pa.Table]], object] | None,
        strategies: Strategies | Mapping[str, str] | None, ingest: Collection[str],
    ) -> dict[str, pa.Table]:
        """The one transaction of :meth:`push` and :meth:`push_many`."""
        store = self._require_store()
        srcs = {name: self._source(name) for name in changes}
        names = ", ".join(repr(n) for n in changes)
        what = f"source {names}" if len(changes) == 1 else f"sources {names}"
        self.compile()
        chosen = Strategies.of(strategies)
        chosen.check({op.node.label: op for op in self._ops.values()},
                     f"pipeline {self.name!r}, push to {names}")
        with store.lock:
            conformed = {name: conform_delta(srcs[name].schema, d, f"source {name!r}")
                         for name, d in changes.items()}
            change = b""
            if commit_id is not None:
                parts = [commits.digest(name, t, w) for name, (t, w) in conformed.items()]
                change = parts[0] if len(parts) == 1 else commits.combined(
                    sorted(zip(conformed, parts, strict=True)))
            replayed = self.records.replay(store, commit_id, change, what, self.outputs)
            if replayed is not None:
                return replayed
            store.require_writable(f"push to {what} of pipeline {self.name!r}")
            txn = Transaction(store)
            if ingest:
                txn.ingest_into(ingest)
            ctx = PushContext(txn, self._index, self.name, f"this push to {names}", chosen)
            seeds: dict[int, Delta] = {}
            for name, (table, w) in conformed.items():
                first = self._ops[srcs[name].id].push([(table, w)], ctx)
                if first is not None:
                    seeds[srcs[name].id] = first
            outs = self._run(seeds, ctx)
            if self._initial is not None and any(w.any() for _, w in conformed.values()):
                outs = self._with_initial(outs, self._initial)
                txn.record(initial_outputs_key(self.name), None)
                txn.after_commit(functools.partial(setattr, self, "_initial", None))
            if commit_id is not None:
                self.records.stage_commit(txn, commit_id, change, outs)
            if progress is not None:
                (source,) = changes
                self.records.stage_progress(txn, source, progress)
            if before_commit is not None:
                before_commit(outs)
            txn.commit()
            return outs

    push_change = push
    """:meth:`push` (the :class:`~joinstate.maintained.Maintained` protocol's name)."""

    def _reachable(self, nid: int) -> frozenset[int]:
        found = self._reach.get(nid)
        if found is None:
            found = self._reach[nid] = frozenset(
                self.physical.reachable(self.graph.nodes[nid]))
        return found

    def _run(self, seeds: dict[int, Delta], ctx: PushContext) -> dict[str, pa.Table]:
        """Propagate change sets given at some nodes (``seeds``) through the graph.

        The seeds are the pushed source's change (already checked and staged into its
        own indexes by its operator), or at creation the global aggregates' first rows.
        """
        phys = self.physical
        deltas: dict[int, Delta] = {nid: d for nid, d in seeds.items() if len(d[1])}
        reach: set[int] = set()
        for nid in deltas:
            reach |= self._reachable(nid)
        for nid, op in self._ops.items():
            node = op.node
            if nid not in reach or isinstance(node, SourceNode):
                continue
            ins = [deltas.get(i.id) for i in node.inputs]
            out: Delta | None = None
            if any(d is not None for d in ins):
                with ctx.expression_errors(_what(node)):
                    out = ctx.run(op, ins)
                if out is not None and len(out[1]):
                    produced = int(np.abs(out[1]).sum())
                    ctx.txn.after_commit(functools.partial(self._count, nid, produced))
            seed = deltas.get(nid)
            if seed is not None and out is not None and len(out[1]):
                out = (pa.concat_tables([seed[0], out[0]]), np.concatenate([seed[1], out[1]]))
            elif seed is not None:
                out = seed
            if out is not None and len(out[1]):
                deltas[nid] = out
        for ip in phys.indexes:
            d = deltas.get(ip.base.id)
            if d is not None and id(ip) not in ctx.staged:
                with ctx.expression_errors(f"the filter of index {self._index[id(ip)].cf}"):
                    ctx.stage(ip, d)
        return {name: self._consolidated(node, deltas.get(node.id))
                for name, node in self.graph.outputs.items()}

    def _with_initial(self, outs: dict[str, pa.Table], owed: dict[str, pa.Table]
                      ) -> dict[str, pa.Table]:
        """``outs`` plus the change sets owed since creation, consolidated per output."""
        merged = {}
        for name, table in outs.items():
            extra = owed.get(name)
            if extra is None or not extra.num_rows:
                merged[name] = table
                continue
            both = pa.concat_tables([extra.cast(table.schema), table])
            w = both.column(WEIGHT).to_numpy()
            merged[name] = self._consolidated(self.graph.outputs[name],
                                              (both.drop_columns([WEIGHT]), w))
        return merged

    def _count(self, nid: int, n: int) -> None:
        self._produced[nid] = self._produced.get(nid, 0) + n

    def _consolidated(self, node: Node, d: Delta | None) -> pa.Table:
        schema = self.physical.schemas[node.id].append(
            pa.field(WEIGHT, pa.int64(), nullable=False))
        if d is None or not len(d[1]):
            return schema.empty_table()
        table, w = d
        idx, sums = self._ops[node.id].consolidate(table, w)
        if len(idx) != table.num_rows or not (idx == np.arange(len(idx))).all():
            table = table.take(pa.array(idx))
        return pa.Table.from_arrays([*table.columns, pa.array(sums, pa.int64())],
                                    schema=schema)

    # ---- state: summaries and checks ----------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Sources, outputs, phase and, per index and aggregate, counters and RocksDB facts.

        The same dict as :func:`joinstate.inspect.describe` (which needs no definition).
        """
        store = self._require_store()
        self.compile()
        with store.lock:
            return describe(store, self.name)

    def summary(self) -> str:
        """A small readable table of the pipeline's state, one row per index and aggregate.

        Per row: rows, entries, bytes (SST files + memtables), L0 files and whether
        auto-compaction is on; above it the phase, sources and outputs.  What
        ``joinstate inspect`` prints per pipeline.
        """
        return summary_of(self.stats())

    def verify(self) -> dict[str, Any]:
        """Read the pipeline's state and check it against its counters.

        Every index (rows and entries of both layouts, and the in-memory state that
        decides writes without reading: entry maps, key sets), every source's row record
        (values, a row never held a negative number of times, counters, the in-memory
        multiset) and, where a source has both, that its record and an index holding all
        of its rows agree on how many it holds.  Returns the counts per index and record;
        raises :class:`~joinstate.errors.StateCorruptedError` at the first disagreement
        (derived in-memory state is rebuilt first).
        """
        store = self._require_store()
        self.compile()
        out: dict[str, Any] = {"indexes": {}, "row_records": {}}
        with store.lock:
            for idx in self._indexes():
                out["indexes"][idx.cf] = idx.verify(f"pipeline {self.name!r}")
            for op in self._sources():
                facts = op.verify(self._index, self.name)
                if facts is not None and op.record is not None:
                    out["row_records"][op.record.cf] = facts
        return out


def _what(node: Node) -> Callable[[], str]:
    """How an expression error names ``node`` (computed only when one happens)."""
    return lambda: f"operator {node.label} {node.params()}"
