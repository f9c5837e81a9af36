"""The join operator: push a change set into one side, get the output change set.

For a push of Δ into side S with other side O (DESIGN.md §1), the output is
Δ ⋈ O, and then S := S + Δ.  Outer, semi and anti joins add terms that depend on how
the per-key multiplicity ("degree") of a side crosses zero:

* S preserved (its unmatched rows are null-extended): Δ rows whose key has no O rows.
* O preserved: when S's degree for key k goes 0 -> >0, O's rows of k lose their
  null-extended row (-); when it goes >0 -> 0 they get it back (+).
* left_semi / left_anti: only left rows are output, filtered by right degree > 0 / == 0.

A push is one WriteBatch: own-side rows, degree changes and counters are committed
together or not at all, after validation.  The output is assembled with Arrow ``take``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import pyarrow as pa
import rocksdict as rd

from joinstate._bytes import Bytes
from joinstate._index import Batch, SideIndex, Staged
from joinstate._ops import Ops
from joinstate._probe import Entries
from joinstate._zset import expand, group_rows, sum_by
from joinstate.activity import auto_compaction_flags
from joinstate.errors import JoinSpecMismatchError, SchemaMismatchError, StateClosedError
from joinstate.keys import KeyCodec, hash_prefix, key_plan, row_hash, single_plan
from joinstate.schema import WEIGHT
from joinstate.side import Side
from joinstate.store import META_CF

if TYPE_CHECKING:
    from collections.abc import Callable

    from joinstate.store import StateStore

__all__ = ["How", "Join", "Phase", "output_schema"]

How = Literal["inner", "left", "right", "full", "left_semi", "left_anti"]
Phase = Literal["population", "live"]
_HOWS: tuple[str, ...] = get_args(How)
SPEC_VERSION = 1


class Join:
    """A symmetric hash join whose two sides live in a :class:`StateStore`.

    Obtain one with :meth:`StateStore.join`.  Not thread-safe (one writer per store).
    """

    def __init__(
        self, store: StateStore, name: str, left: Side, right: Side, how: str,
        suffixes: tuple[str, str],
    ) -> None:
        if how not in _HOWS:
            raise SchemaMismatchError(f"how={how!r} must be one of {_HOWS}")
        for label, side in (("left", left), ("right", right)):
            if not isinstance(side, Side):
                raise SchemaMismatchError(
                    f"{label} must be a joinstate.Side, got {type(side).__name__}"
                )
            side.validate_types(label)
        if (
            not isinstance(suffixes, tuple | list) or len(suffixes) != 2
            or not all(isinstance(s, str) for s in suffixes)
        ):
            raise SchemaMismatchError(f"suffixes={suffixes!r} must be a pair of strings")
        self.store: StateStore | None = store
        self.name = name
        self.how = how
        self.left_side, self.right_side = left, right
        self.suffixes = (suffixes[0], suffixes[1])
        plan = key_plan(left.schema, left.key, right.schema, right.key)
        self.spec: dict[str, Any] = {
            "version": SPEC_VERSION, "how": how, "suffixes": list(self.suffixes),
            "left": left.to_spec(), "right": right.to_spec(),
        }
        self.output_schema = self._output_schema()
        track_left = how in ("right", "full")
        track_right = how in ("left", "full", "left_semi", "left_anti")
        self.left = self._index("left", left, plan, track_left)
        self.right = self._index("right", right, plan, track_right)
        stored = store.catalog_get(name)
        if stored is None and store.read_only:
            raise JoinSpecMismatchError(
                f"join {name!r} does not exist in {store.path} (opened read-only); joins "
                f"there: {store.joins()}"
            )
        if stored is None:
            store.catalog_put(name, self.spec)
        elif stored != self.spec:
            self._raise_spec_mismatch(stored)
        for idx in (self.left, self.right):
            for cf in idx.column_families():
                store.cf(cf)

    def _index(self, label: str, side: Side, plan: Any, track: bool) -> SideIndex:
        assert self.store is not None
        uniq = None
        if side.layout == "unique":
            assert side.unique_key is not None
            uniq = KeyCodec(side.unique_key, single_plan(side.schema, side.unique_key), label)
        return SideIndex(
            self.store, f"j.{self.name}.{label}", label, side.schema, side.key, side.unique_key,
            KeyCodec(side.key, plan, label), uniq, side.layout, track,
        )

    def _raise_spec_mismatch(self, stored: dict[str, Any]) -> None:
        diffs = []
        for k in sorted(set(stored) | set(self.spec)):
            a, b = stored.get(k), self.spec.get(k)
            if a == b:
                continue
            if isinstance(a, dict) and isinstance(b, dict):
                for kk in sorted(set(a) | set(b)):
                    if kk != "schema" and a.get(kk) != b.get(kk):
                        diffs.append(f"{k}.{kk}: stored {a.get(kk)!r}, given {b.get(kk)!r}")
            else:
                diffs.append(f"{k}: stored {a!r}, given {b!r}")
        raise JoinSpecMismatchError(
            f"join {self.name!r} already exists in {self.store.path if self.store else '?'} "
            f"with a different spec ({'; '.join(diffs) or 'schema metadata differs'}); use a "
            "new join name or drop the old state"
        )

    def _detach(self) -> None:
        self.store = None
        self.left.cache = None
        self.right.cache = None

    def _require_store(self) -> StateStore:
        if self.store is None or self.store.closed:
            raise StateClosedError(f"join {self.name!r} is bound to a closed state store")
        return self.store

    # ---- output schema ----------------------------------------------------------------

    def _output_schema(self) -> pa.Schema:
        return output_schema(self.left_side, self.right_side, self.how, self.suffixes)

    def _assemble(
        self, left: pa.Table | None, right: pa.Table | None, w: np.ndarray
    ) -> pa.Table:
        n = len(w)
        cols: list[pa.Array] = []
        if left is not None:
            cols += [c.combine_chunks() for c in left.columns]
        else:
            cols += [pa.nulls(n, f.type) for f in self.left_side.schema]
        if self.how not in ("left_semi", "left_anti"):
            if right is not None:
                cols += [c.combine_chunks() for c in right.columns]
            else:
                cols += [pa.nulls(n, f.type) for f in self.right_side.schema]
        cols.append(pa.array(w, type=pa.int64()))
        return pa.Table.from_arrays(cols, schema=self.output_schema)

    # ---- push -------------------------------------------------------------------------

    def push(
        self, side: Literal["left", "right"], delta: pa.Table | pa.RecordBatch, *,
        commit_id: str | None = None,
    ) -> pa.Table:
        """Apply a change set to ``side``; return the join's output change set.

        Atomic: a batch that would take a row's multiplicity below zero (or break a
        declared unique key) raises and changes nothing.

        ``commit_id`` makes the push idempotent (exactly-once under retries): the id and
        the output are committed in the same WriteBatch as the state change, and a push
        with an id already committed returns the recorded output without applying the
        delta again.  Ids are kept until :meth:`forget_commits`.
        """
        return self.apply(side, self.prepare(side, delta), commit_id=commit_id)

    def prepare(self, side: Literal["left", "right"], delta: pa.Table | pa.RecordBatch) -> Batch:
        """Conform, encode and consolidate a delta without touching state.

        Drivers (population, Spark workers) use this with :meth:`apply` to overlap or
        redirect work; :meth:`push` is ``apply(prepare(...))``.
        """
        self._require_store()
        return self._sides(side)[0].prepare(delta)

    def apply(
        self, side: Literal["left", "right"], batch: Batch, *, commit_id: str | None = None,
        sink: Callable[[Ops], None] | None = None,
    ) -> pa.Table:
        """Apply a prepared batch; see :meth:`push`.

        ``sink``, if given, receives the data writes as :class:`~joinstate._ops.Ops`
        (per column family: keys and values; a None value deletes) instead of a
        WriteBatch, e.g. to write them as sorted SST files for ingestion; counters are
        still written through a WriteBatch after the sink returns.  Only the bulk-load
        path uses it: it gives up atomicity with the counters.
        """
        store = self._require_store()
        s, o = self._sides(side)
        ckey = self._commit_key(commit_id) if commit_id is not None else None
        if ckey is None or store.cf(META_CF).get(ckey) is None:
            store.require_writable(f"push to the {side} side of join {self.name!r}")
        if ckey is not None:
            recorded = store.cf(META_CF).get(ckey)
            if recorded is not None:
                return _ipc_read(recorded)
        out = self.output_schema.empty_table()
        ops = Ops()
        stats: dict[str, dict[str, int]] = {}
        if batch.n:
            seq = s.stat(s.cf, "seq") + 1
            staged, ops = s.stage(batch, seq)
            stats = staged.stats
            stats.setdefault(s.cf, {})["seq"] = 1
            out = self._output(side, s, o, batch, staged)
        wb = rd.WriteBatch(raw_mode=True)
        if sink is not None:
            sink(ops)
        else:
            ops.fill(wb, store.handle)
        meta = store.stage_meta_ints(wb, stats)
        if ckey is not None:
            wb.put(ckey, _ipc_write(out), store.handle(META_CF))
        store.write(wb)
        store.publish_meta(meta)
        if batch.n:
            s.after_write(batch)
        return out

    def _sides(self, side: str) -> tuple[SideIndex, SideIndex]:
        if side == "left":
            return self.left, self.right
        if side == "right":
            return self.right, self.left
        raise SchemaMismatchError(f"side={side!r} must be 'left' or 'right'")

    def _commit_key(self, commit_id: str) -> bytes:
        if not isinstance(commit_id, str) or not commit_id:
            raise SchemaMismatchError(f"commit_id={commit_id!r} must be a non-empty string")
        return b"commit\x00" + self.name.encode() + b"\x00" + commit_id.encode()

    def committed(self, commit_id: str) -> bool:
        """Whether a push with ``commit_id`` has been applied."""
        store = self._require_store()
        return store.cf(META_CF).get(self._commit_key(commit_id)) is not None

    def forget_commits(self, keep: Callable[[str], bool] | None = None) -> int:
        """Drop recorded commit ids (and their outputs) for which ``keep`` is false."""
        store = self._require_store()
        prefix = b"commit\x00" + self.name.encode() + b"\x00"
        meta = store.cf(META_CF)
        wb = rd.WriteBatch(raw_mode=True)
        h = store.handle(META_CF)
        n = 0
        for k in list(meta.keys(from_key=prefix)):
            if not k.startswith(prefix):
                break
            if keep is None or not keep(k[len(prefix):].decode()):
                wb.delete(k, h)
                n += 1
        store.write(wb)
        return n

    # ---- phase ------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """``"population"`` until a driver calls :meth:`set_phase` ``("live")``."""
        store = self._require_store()
        raw = store.cf(META_CF).get(b"phase\x00" + self.name.encode())
        return "live" if raw == b"live" else "population"

    def set_phase(self, phase: Phase) -> None:
        """Record the join's phase (persisted in ``__meta__``)."""
        if phase not in ("population", "live"):
            raise SchemaMismatchError(f"phase={phase!r} must be 'population' or 'live'")
        store = self._require_store()
        store.meta_put(b"phase\x00" + self.name.encode(), phase.encode())

    def rows(self, side: Literal["left", "right"]) -> int:
        """Total multiplicity stored on ``side`` (NULL-key rows included); O(1)."""
        self._require_store()
        idx = self._sides(side)[0]
        return idx.stat(idx.cf, "rows") + idx.stat(idx.cf_nulls, "rows")

    def index(self, side: Literal["left", "right"]) -> SideIndex:
        """The storage of one side: column-family names, layout, counters (for drivers)."""
        return self._sides(side)[0]

    def shard_of(
        self, side: Literal["left", "right"], table: pa.Table | pa.RecordBatch, shards: int
    ) -> np.ndarray:
        """Shard number of every row: ``xxh3(canonical key) % shards``.

        Equal keys get equal shards on both sides whatever their integer widths; rows
        with a NULL key go to shard 0 (they never match, any shard is correct).
        """
        idx = self._sides(side)[0]
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        canon, null = idx.key_codec.encode(table.select(idx.key))
        h = hash_prefix(canon) % np.uint64(shards)
        h[null] = 0
        return h.astype(np.int64)

    def _output(
        self, side: str, s: SideIndex, o: SideIndex, batch: Batch, staged: Staged
    ) -> pa.Table:
        is_left = side == "left"
        how = self.how
        kg = batch.keys
        G = len(kg)
        qcanon: Bytes = batch.canon.take(kg.first)
        qhash = batch.khash[kg.first]
        parts: list[pa.Table] = []

        def orient(mine: pa.Table | None, other: pa.Table | None, w: np.ndarray) -> pa.Table:
            return self._assemble(mine, other, w) if is_left else self._assemble(other, mine, w)

        if how in ("left_semi", "left_anti"):
            if is_left:
                deg = o.degrees(qcanon, qhash)
                matched = np.zeros(batch.n, dtype=bool)
                nn = kg.inv >= 0
                matched[nn] = deg[kg.inv[nn]] > 0
                keep = matched if how == "left_semi" else ~matched
                idx = np.flatnonzero(keep)
                if len(idx):
                    parts.append(self._assemble(batch.rows.take(pa.array(idx)), None, batch.w[idx]))
            else:
                self._transitions(staged, o, qcanon, qhash, parts, sign=(
                    1 if how == "left_semi" else -1))
            return _concat(parts, self.output_schema)

        entries = o.probe(qcanon, qhash) if G else None
        if entries is not None and len(entries.w):
            ri, ei = expand(kg.inv, entries.q, G)
            if len(ri):
                parts.append(orient(
                    batch.rows.take(pa.array(ri)), entries.rows.take(pa.array(ei)),
                    batch.w[ri] * entries.w[ei],
                ))
        s_preserved = (is_left and how in ("left", "full")) or (
            not is_left and how in ("right", "full"))
        o_preserved = (is_left and how in ("right", "full")) or (
            not is_left and how in ("left", "full"))
        if s_preserved:
            odeg = sum_by(entries.q, entries.w, G) if entries is not None else np.zeros(0, np.int64)
            unmatched = batch.null.copy()
            nn = kg.inv >= 0
            unmatched[nn] = odeg[kg.inv[nn]] == 0
            idx = np.flatnonzero(unmatched)
            if len(idx):
                parts.append(orient(batch.rows.take(pa.array(idx)), None, batch.w[idx]))
        if o_preserved:
            self._transitions(staged, o, qcanon, qhash, parts, sign=-1, entries=entries,
                              other_is_left=not is_left)
        return _concat(parts, self.output_schema)

    def _transitions(
        self, staged: Staged, o: SideIndex, qcanon: Bytes, qhash: np.ndarray,
        parts: list[pa.Table], sign: int, entries: Entries | None = None,
        other_is_left: bool = True,
    ) -> None:
        """Emit O's rows for keys whose own-side degree crossed zero.

        ``sign`` is the sign for a 0 -> >0 crossing (the opposite for >0 -> 0).
        """
        if staged.deg_old is None or staged.deg_new is None:
            return  # the batch had only NULL keys: no degree changed
        old, new = staged.deg_old, staged.deg_new
        up = (old == 0) & (new > 0)
        down = (old > 0) & (new == 0)
        crossing = np.flatnonzero(up | down)
        if not len(crossing):
            return
        if entries is None:
            sub = o.probe(qcanon.take(crossing), qhash[crossing])
            q = crossing[sub.q]
            entries = Entries(sub.rows, sub.w, q)
        sel = np.flatnonzero(up[entries.q] | down[entries.q])
        if not len(sel):
            return
        factor = np.where(up[entries.q[sel]], sign, -sign)
        rows = entries.rows.take(pa.array(sel))
        w = entries.w[sel] * factor
        if other_is_left:
            parts.append(self._assemble(rows, None, w))
        else:
            parts.append(self._assemble(None, rows, w))

    # ---- inspection -------------------------------------------------------------------

    def state(self, side: Literal["left", "right"]) -> pa.Table:
        """The consolidated content of ``side``: its columns plus ``_weight`` (> 0)."""
        self._require_store()
        if side not in ("left", "right"):
            raise SchemaMismatchError(f"side={side!r} must be 'left' or 'right'")
        idx = self.left if side == "left" else self.right
        parts_rows, parts_w, parts_enc = [], [], []
        for cf in (idx.cf, idx.cf_nulls):
            rows, w, enc = idx.scan(cf)
            parts_rows.append(rows)
            parts_w.append(w)
            parts_enc.append(enc)
        rows = pa.concat_tables(parts_rows)
        w = np.concatenate(parts_w)
        enc = Bytes.concat(parts_enc)
        g = group_rows(row_hash(enc), enc)
        sums = sum_by(g.inv, w, len(g))
        keep = sums != 0
        rows = rows.take(pa.array(g.first[keep]))
        return rows.append_column(pa.field(WEIGHT, pa.int64(), nullable=False),
                                  pa.array(sums[keep], pa.int64()))

    def stats(self) -> dict[str, Any]:
        """Per-index counters and RocksDB properties.

        ``distinct_keys`` is exact: kept as a counter where the layout or a degree index
        makes that free, counted by a scan otherwise (costs a pass over the side).
        """
        store = self._require_store()
        out: dict[str, Any] = {
            "join": self.name, "how": self.how, "phase": self.phase,
            # DB-wide and cumulative since the store was opened (RocksDB has no per-CF
            # statistics): compaction read/write bytes, flush and WAL bytes, stalls.
            "rocksdb_activity": store.activity(),
        }
        compaction_off = auto_compaction_flags(store.path)
        for label, idx in (("left", self.left), ("right", self.right)):
            keys: int | None = idx._known_keys()
            if keys is None:
                keys = idx.count_distinct_keys()
            props: dict[str, dict[str, Any]] = {}
            total_bytes = 0
            for cf in idx.column_families():
                p = {
                    name: store.property_int(cf, "rocksdb." + name)
                    for name in _PROPERTIES
                }
                p["auto_compaction_disabled"] = compaction_off.get(cf)
                props[cf] = p
                total_bytes += (p["total-sst-files-size"] or 0) + (
                    p["cur-size-all-mem-tables"] or 0)
            out[label] = {
                "layout": idx.layout,
                "rows": self.rows(label),  # type: ignore[arg-type]
                "null_key_rows": idx.stat(idx.cf_nulls, "rows"),
                "entries": idx.entries,
                "distinct_keys": keys,
                "bytes": total_bytes,
                "probe_cache_rows": None if idx.cache is None else len(idx.cache),
                "rocksdb": props,
            }
        return out


_PROPERTIES = (
    "num-files-at-level0", "num-files-at-level1", "estimate-num-keys", "total-sst-files-size",
    "live-sst-files-size", "cur-size-all-mem-tables", "estimate-pending-compaction-bytes",
    "compaction-pending", "num-running-compactions", "estimate-live-data-size",
)


def output_schema(
    left: Side, right: Side, how: str = "inner", suffixes: tuple[str, str] = ("", "_right")
) -> pa.Schema:
    """The schema of a join's output deltas, without creating a store.

    Left columns, then right columns (names colliding with a left name get
    ``suffixes``), then ``_weight``; semi and anti joins output left columns only.
    """
    lnames = left.schema.names
    if how in ("left_semi", "left_anti"):
        fields = [pa.field(f.name, f.type) for f in left.schema]
        return pa.schema([*fields, pa.field(WEIGHT, pa.int64(), nullable=False)])
    rnames = right.schema.names
    both = set(lnames) & set(rnames)
    lout = [n + suffixes[0] if n in both else n for n in lnames]
    rout = [n + suffixes[1] if n in both else n for n in rnames]
    names = lout + rout
    if len(set(names)) != len(names) or WEIGHT in names:
        raise SchemaMismatchError(
            f"output column names collide after applying suffixes {suffixes}: "
            f"{names}; choose other suffixes"
        )
    fields = [pa.field(n, f.type) for n, f in zip(lout, left.schema, strict=True)]
    fields += [pa.field(n, f.type) for n, f in zip(rout, right.schema, strict=True)]
    return pa.schema([*fields, pa.field(WEIGHT, pa.int64(), nullable=False)])


def _ipc_write(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _ipc_read(raw: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(raw)).read_all()


def _concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    if not parts:
        return schema.empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
