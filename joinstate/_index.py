"""One index: a source's rows by join key, in three column families of a state store.

The index composes what the other modules own: its :mod:`~joinstate.layouts` object
(how rows are keyed, staged, probed, decoded), a bag layout for rows whose key has a
NULL (they never match, yet outer/anti joins emit them and ``state()`` shows them), an
optional degree family (per-key total weight, for sides an outer/semi/anti join tracks),
and the probe cache with its :class:`~joinstate._probe.ProbePolicy`.  Column-family
names come from :mod:`joinstate.names`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate._probe import Entries, ProbeCache, ProbePolicy
from joinstate.batch import PreparedBatch
from joinstate.codec import RowCodec
from joinstate.errors import StateCorruptedError
from joinstate.keys import KeyCodec, hash_prefix, prefix_bytes, row_hash
from joinstate.layouts import LAYOUTS, BagLayout
from joinstate.names import degree_cf, nulls_cf
from joinstate.schema import conform_delta
from joinstate.views import IndexInfo
from joinstate.zset import Groups, checked_add, checked_sum_by, consolidate, group_keys

if TYPE_CHECKING:
    from joinstate.db import Database
    from joinstate.side import Side, SideName
    from joinstate.transaction import Transaction

__all__ = ["Index", "Staged"]

log = logging.getLogger(__name__)


class Staged:
    """What staging a batch found out that the operator needs (degree crossings)."""

    __slots__ = ("deg_new", "deg_old")

    def __init__(self) -> None:
        self.deg_old: np.ndarray | None = None
        self.deg_new: np.ndarray | None = None


class Index:
    """Storage of one source's rows by join key (rows, NULL-key rows, degrees)."""

    def __init__(
        self, store: Database, cf: str, label: SideName, side: Side, key_codec: KeyCodec,
        track_degree: bool,
    ) -> None:
        self.store = store
        self.cf = cf
        self.label: SideName = label
        self.side = side
        self.schema = side.schema
        self.key_codec = key_codec
        self.row_codec = RowCodec(side.schema)
        self.layout = LAYOUTS[side.layout].for_side(store, cf, label, side, key_codec,
                                                    self.row_codec)
        self.nulls = BagLayout(store, nulls_cf(cf), label, side.key, key_codec, self.row_codec)
        self.track_degree = track_degree
        self.cf_nulls = nulls_cf(cf)
        self.cf_deg = degree_cf(cf)
        self.cache: ProbeCache | None = None
        # Rows merged into the cache since it was last probed: keeping a cache costs
        # O(delta) per write; once that exceeds the cache's own size with nobody probing
        # it (its side is being loaded), rebuilding later is cheaper, so it is dropped.
        self.cache_maintained = 0
        self.policy = ProbePolicy(store.options.probe, store.options.probe_cache_max_rows)

    def _cache_stamp(self) -> list[int]:
        return [self.store.counter(self.cf, "seq"), self.store.counter(self.cf, "entries")]

    def restore_cache(self) -> None:
        """Rebuild the probe cache at open if the side had one when the store closed.

        Called once the join's spec is known to match the catalog (the rows decode).

        The decision to cache a side was paid for by the probes before the close (ski
        rental); making the first batches after a reopen pay for it again would make
        them slower than the tenth.  Only the decision is kept, not the rows.
        """
        if self.store.read_only or self.policy.mode == "point":
            return
        try:
            saved = self.store.load_arrays(f"probe-cache-{self.cf}", self._cache_stamp())
        except Exception as exc:  # zipfile.BadZipFile on a CRC mismatch: only a hint lost
            log.warning("ignoring the saved probe-cache decision of %s: %s", self.cf, exc)
            saved = None
        if saved is not None and "cached" in saved and len(saved["cached"]) and \
                int(saved["cached"][0]):
            cache = self.build_cache()
            if len(cache) <= self.policy.max_rows:
                self.cache = cache

    def verify(self, owner: str) -> dict[str, int]:
        """Read every stored entry (rows and NULL-key rows) and check it against the counters.

        Returns ``{"rows", "entries", "null_rows", "null_entries"}``.  A checksum failure
        reading a block, a count that disagrees with its counter, or in-memory state that
        decides writes without reading (the bag entry map, the unique key set) disagreeing
        with what was read raises :class:`~joinstate.errors.StateCorruptedError`; ``owner``
        ("join 'j', left side") names where in the message.
        """
        counted: dict[str, int] = {}
        for layout, part in ((self.layout, ""), (self.nulls, "null_")):
            _, w, _ = layout.scan()
            got = {"rows": int(w.sum()) if len(w) else 0, "entries": len(w)}
            for what, n in got.items():
                counted[part + what] = n
                want = self.store.counter(layout.cf, what)
                if n != want:
                    raise StateCorruptedError(
                        f"{owner}: {layout.cf} holds {n} {what} but its counter says "
                        f"{want}; the state is inconsistent: restore it from a copy or "
                        "repopulate")
            layout.check_derived()
        return counted

    # ---- names, counters, views -------------------------------------------------------

    def column_families(self) -> tuple[str, ...]:
        """Rows, NULL-key rows and (if tracked) degrees."""
        return (self.cf, self.cf_nulls) + ((self.cf_deg,) if self.track_degree else ())

    @property
    def entries(self) -> int:
        """Stored entries of the rows family."""
        return self.store.counter(self.cf, "entries")

    @property
    def rows(self) -> int:
        """Total multiplicity stored, NULL-key rows included."""
        return self.store.counter(self.cf, "rows") + self.store.counter(self.cf_nulls, "rows")

    def info(self) -> IndexInfo:
        """A read-only snapshot for drivers."""
        return IndexInfo(
            name=self.cf, column_family=self.cf, column_families=self.column_families(),
            data_column_families=(self.cf, self.cf_nulls), layout=self.side.layout,
            tracks_degree=self.track_degree,
            appends_blindly=self.layout.blind_inserts and not self.track_degree,
            bulk_loadable=not self.track_degree,
            rows=self.rows, entries=self.entries, cached=self.cache is not None,
        )

    def known_keys(self) -> int | None:
        """Distinct non-NULL keys if a counter knows them for free."""
        if self.layout.one_entry_per_key:
            return self.entries
        if self.track_degree:
            return self.store.counter(self.cf_deg, "keys")
        return None

    def count_distinct_keys(self) -> int:
        """Distinct non-NULL keys stored (a counter if one knows, else a pass)."""
        known = self.known_keys()
        return known if known is not None else self.layout.distinct_keys(self.entries)

    # ---- batch preparation ------------------------------------------------------------

    def prepare(self, delta: pa.Table | pa.RecordBatch) -> PreparedBatch:
        """Conform, encode and consolidate a delta (cancelling +1/-1 of the same row)."""
        table, w = conform_delta(self.schema, delta, self.label)
        return self.prepare_rows(table, w)

    def prepare_rows(self, table: pa.Table, w: np.ndarray) -> PreparedBatch:
        """:meth:`prepare` for rows and int64 weights given apart (a pipeline's change).

        Rows already in the index's schema (the columns a pipeline's plan stores, as
        its operators produce them) are taken as they are; anything else is conformed
        (cast, checked) as :meth:`prepare` does, which costs ~0.2 ms per call even when
        nothing changes.  Either way the columns come out as one chunk each.
        """
        if not table.schema.equals(self.schema) or any(
                c.null_count for c, f in zip(table.columns, self.schema, strict=True)
                if not f.nullable):
            table, _ = conform_delta(self.schema, table, self.label)
        elif any(c.num_chunks != 1 for c in table.columns):
            table = table.combine_chunks()
        enc = self.row_codec.encode(table)
        rh = row_hash(enc)
        idx, w = consolidate(rh, enc, w, f"{self.label} side: the summed weight of a row")
        if len(idx) != table.num_rows or not (idx == np.arange(len(idx))).all():
            table = table.take(pa.array(idx))
            enc, rh = enc.take(idx), rh.take(idx)
        canon, null = self.key_codec.encode(table)
        khash = hash_prefix(canon)
        nonnull = np.flatnonzero(~null)
        inv = np.full(len(w), -1, dtype=np.int64)
        kg = group_keys(khash[nonnull], canon.take(nonnull))
        inv[nonnull] = kg.inv
        order = None if kg.order is None else nonnull[kg.order]
        batch = PreparedBatch(self.label, table, w, enc, rh, canon, khash, null,
                              Groups(inv, nonnull[kg.first], order))
        self.layout.check_within(batch)
        return batch

    # ---- staging ----------------------------------------------------------------------

    def stage(self, batch: PreparedBatch, txn: Transaction) -> Staged:
        """Validate ``batch`` against stored state and stage its writes into ``txn``.

        Raises if a multiplicity would go below zero, a unique key would hold two rows
        or a weight would overflow; nothing has been written then.
        """
        staged = Staged()
        seq = self.store.counter(self.cf, "seq") + 1
        txn.add(self.cf, "seq", 1)
        null_rows = np.flatnonzero(batch.null)
        # Rows in key-hash order when grouping kept it: the layouts write in key order.
        order = batch.keys.order
        rows = order if order is not None and len(order) == len(batch.null) - len(null_rows) \
            else np.flatnonzero(~batch.null)
        if len(null_rows):
            empty = Bytes.from_fixed(np.zeros((len(null_rows), 0), np.uint8))
            self.nulls.stage(batch, null_rows, empty, seq, txn)
        if len(rows):
            group_prefix = Bytes.concat_rows(
                [prefix_bytes(batch.khash[rows]), batch.canon.take(rows)]
            )
            self.layout.stage(batch, rows, group_prefix, seq, txn)
            if self.track_degree:
                self._stage_degree(batch, staged, txn)
        return staged

    def _stage_degree(self, batch: PreparedBatch, staged: Staged, txn: Transaction) -> None:
        kg = batch.keys
        nonnull = kg.inv >= 0
        d = checked_sum_by(kg.inv[nonnull], batch.w[nonnull], len(kg),
                           f"{self.label} side: the summed weight of a key")
        dkeys = Bytes.concat_rows(
            [prefix_bytes(batch.khash[kg.first]), batch.canon.take(kg.first)]
        ).to_list()
        old = self.degrees_by_keys(dkeys)
        new = checked_add(old, d, f"{self.label} side: the degree of a key")
        for k, n_old, n_new in zip(dkeys, old.tolist(), new.tolist(), strict=True):
            if n_new != n_old:
                txn.put(self.cf_deg, k,
                        None if n_new == 0 else n_new.to_bytes(8, "little", signed=True))
        staged.deg_old, staged.deg_new = old, new
        txn.add(self.cf_deg, "keys",
                int(((old == 0) & (new > 0)).sum()) - int(((old > 0) & (new == 0)).sum()))

    def degrees_by_keys(self, dkeys: list[bytes]) -> np.ndarray:
        """Stored degree of each key (prefix + canon), 0 if absent."""
        vals = _rocks.multi_get(self.store.cf(self.cf_deg), dkeys, self.store.path,
                                f"read {self.cf_deg}")
        return np.fromiter(
            (0 if v is None else int.from_bytes(v, "little", signed=True) for v in vals),
            np.int64, len(dkeys),
        )

    # ---- reading ----------------------------------------------------------------------

    def scan(self) -> tuple[pa.Table, np.ndarray, Bytes]:
        """Every stored entry with a non-NULL key (bag entries unconsolidated)."""
        return self.layout.scan()

    def scan_all(self) -> tuple[pa.Table, np.ndarray, Bytes]:
        """Every stored entry, NULL-key rows included, unconsolidated: rows, weights, encodings."""
        rows_a, w_a, enc_a = self.layout.scan()
        rows_b, w_b, enc_b = self.nulls.scan()
        return (pa.concat_tables([rows_a, rows_b]), np.concatenate([w_a, w_b]),
                Bytes.concat([enc_a, enc_b]))

    def state(self) -> tuple[pa.Table, np.ndarray]:
        """The consolidated content of the index, NULL-key rows included."""
        rows, w, enc = self.scan_all()
        idx, sums = consolidate(row_hash(enc), enc, w, f"{self.label} side state weight")
        return rows.take(pa.array(idx)), sums

    def build_cache(self) -> ProbeCache:
        """Scan the side into an in-memory probe cache (consolidated)."""
        rows, w, enc = self.layout.scan()
        rh = row_hash(enc)
        idx, w = consolidate(rh, enc, w, f"{self.label} side cache weight")
        if len(idx) != len(rh):
            rows, enc, rh = rows.take(pa.array(idx)), enc.take(idx), rh.take(idx)
        canon, _ = self.key_codec.encode(rows)
        return ProbeCache(rows, w, rh, enc, canon, hash_prefix(canon))

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """All stored entries whose join key equals one of the queries (distinct keys)."""
        nq = len(qhash)
        policy = self.policy
        if self.cache is not None and policy.mode == "point":
            self.cache = None
        if self.cache is None and nq:
            entries = max(self.entries, 0)
            per_key = policy.rows_per_key(entries, self.known_keys())
            if policy.should_scan(entries, self.layout.point_cost(nq, per_key)):
                cache = self.build_cache()
                if len(cache) <= policy.max_rows:
                    self.cache = cache
                    self.cache_maintained = 0
                return cache.probe(qcanon, qhash)
        if self.cache is not None:
            self.cache_maintained = 0
            return self.cache.probe(qcanon, qhash)
        if nq == 0:
            return Entries(self.schema.empty_table(), np.zeros(0, np.int64), np.zeros(0, np.int64))
        found = self.layout.probe(qcanon, qhash)
        policy.observed(len(found.w), nq)
        return found

    def degrees(self, qcanon: Bytes, qhash: np.ndarray) -> np.ndarray:
        """Total weight stored under each query key."""
        if self.cache is None and self.track_degree:
            dkeys = Bytes.concat_rows([prefix_bytes(qhash), qcanon]).to_list()
            return self.degrees_by_keys(dkeys)
        e = self.probe(qcanon, qhash)
        return checked_sum_by(e.q, e.w, len(qhash), f"{self.label} side: a key's degree")

    def settle(self) -> None:
        """Finish deferred in-memory work (see :meth:`joinstate.Join.settle`)."""
        for layout in (self.layout, self.nulls):
            layout.settle()

    def save(self) -> None:
        """Keep derived in-memory state beside the store (called when it closes)."""
        for layout in (self.layout, self.nulls):
            layout.save()
        cached = np.array([self.cache is not None], dtype=np.int64)
        self.store.save_arrays(f"probe-cache-{self.cf}", self._cache_stamp(), cached=cached)

    def reset(self) -> None:
        """Forget in-memory state derived from the index: probe cache, key set, entry maps.

        For a driver whose writes went to a bulk sink that never made them durable:
        derived state already counted them (the entry maps decide retractions without
        reading, so they must not keep rows the store does not have).  The store's
        counters must have been re-read first (``Database.forget_counters``).
        """
        self.cache = None
        self.policy.side_changed()
        for layout in (self.layout, self.nulls):
            layout.reset()

    def after_write(self, batch: PreparedBatch) -> None:
        """Keep the probe cache coherent with a batch that was just written."""
        self.policy.side_changed()
        if self.cache is None:
            return
        self.cache_maintained += batch.rows
        if self.cache_maintained > len(self.cache):
            self.cache = None
            return
        cache = self.cache.apply(batch, ~batch.null)
        self.cache = cache if len(cache) <= self.policy.max_rows else None
