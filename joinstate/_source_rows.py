"""The row record of a pipeline source: which rows it holds, so it can refuse a retraction.

A source must refuse the retraction of a row it does not hold, before anything is
written.  Its indexes cannot always tell: an index keeps only the columns its readers
need, so a retracted row that differs from a stored one in an unread column would take
the stored row away, and a source read only by an aggregate or a filter has no index.
Where an index of the source holds every column of every row (no filter, no nulled
columns), the pipeline lets it decide; every other source keeps this record.

What it keeps, in the column family ``rows[<pipeline>~<source>]``
(:func:`joinstate.names.source_rows_cf`): a 128-bit hash of every row (all of the
source's columns; :func:`row_hashes`) and its weight.  Rows are identified by the hash
alone, so "exact" means: two different rows pushed to one source are taken for one
with probability about ``n**2 / 2**129`` (``n`` the rows it ever held), far below the
rate of undetected hardware errors.

Why the layout is not a RocksDB entry per row: a put per inserted row (~1 µs) would cost
a population about a fifth more; a read per inserted row more again.  So inserts are
*blind appends of one value per push and hash bucket*: key = the push's sequence number
(8 bytes, big-endian) + the bucket (the top 6 bits of the hash's first half: 64
buckets), so every push appends after all existing keys; value = a tag byte, then 16
bytes per row hash, then (tag 2 only: some weight is not 1) an int64 little-endian
weight per hash.  An insert-only push therefore costs a vectorised hash per row
(~0.05 µs) plus at most 64 puts, and 16 bytes per row of state (24 when a weight is
not 1; RocksDB's own key overhead is per value, not per row).

Retractions are decided by an exact in-memory multiset of the hashes, the same sorted
runs a bag index's entry map uses (:class:`~joinstate._keyset.EntryMap`, 32 bytes per
entry).  It is built from the record by one scan when a push first retracts (a load that
only inserts never builds it), then kept up to date after every commit; a retraction of
a row held fewer times than retracted raises :class:`OverRetractionError` before
anything is staged.  A retraction is appended like an insert (a negative weight), so a
bucket that has collected more superseded entries than live ones (or many small values)
is rewritten, from the in-memory multiset and without a read, as one consolidated value
in the same transaction: the record stays within about twice the live rows, and every
push stays bounded by the buckets it touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate._keyset import EntryMap
from joinstate.codec import RowCodec
from joinstate.errors import OverRetractionError, StateCorruptedError
from joinstate.keys import row_hash
from joinstate.names import source_rows_of
from joinstate.transaction import ABSENT
from joinstate.zset import checked_add, checked_sum, checked_sum_by, consolidate, group_rows

if TYPE_CHECKING:
    from collections.abc import Callable

    from joinstate.db import Database
    from joinstate.transaction import Transaction

__all__ = ["SourceRows", "check_record", "row_hashes"]

BUCKETS = 64
_SHIFT = np.uint64(58)
_ONES = 1  # value tag: every weight is 1, only the hashes follow
_WEIGHTED = 2  # value tag: the hashes, then one int64 weight per hash
_HASH = 16
_COMPACT_MIN = 256
"""Superseded entries a bucket may hold beyond its live ones before it is rewritten."""
_VALUES_MIN = 64
_VALUES_PER_ENTRIES = 16
"""A bucket is also rewritten once it holds more than 64 + entries / this many values: a
rewrite then copies at most this many entries per value it removes, and a scan parses
at most one value per this many entries."""
_HASH_ROWS = 1 << 14
"""Rows hashed at a time: the lanes and scratch arrays stay in the CPU cache."""
_SEEDS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))
_MULS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))
_SHIFTS = (np.uint64(29), np.uint64(32))
_MULS2 = np.array(_MULS, np.uint64).reshape(2, 1)
_SHIFTS2 = np.array(_SHIFTS, np.uint64).reshape(2, 1)
_F1, _F2, _F33 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33)


def _fmix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (a bijection with full avalanche), in place."""
    h ^= h >> _F33
    h *= _F1
    h ^= h >> _F33
    h *= _F2
    h ^= h >> _F33
    return h


_CODECS: dict[pa.DataType, RowCodec] = {}
_STRINGS = {pa.string(): pa.binary(), pa.binary(): pa.binary(),
            pa.large_string(): pa.large_binary(), pa.large_binary(): pa.large_binary()}
"""Variable-length types whose one-column encodings are those of the binary type named:
a value's bytes after its NULL flag and u32 length (a NULL encodes as the empty value)."""
_JOINED_BYTES = 1 << 30
"""Most bytes of string columns joined into one ``binary`` array (its offsets are 32-bit)."""


def _codec_of(t: pa.DataType) -> RowCodec:
    """The one-column codec of type ``t`` (built once per type)."""
    codec = _CODECS.get(t)
    if codec is None:
        codec = _CODECS[t] = RowCodec(pa.schema([pa.field("v", t)]))
    return codec


def _xxh3_words(enc: Bytes) -> np.ndarray:
    """``xxh3_128`` of each encoding as an (n, 2) array of little-endian 64-bit words."""
    return np.ascontiguousarray(row_hash(enc).matrix()).view("<u8")


def _string_words(parts: list[pa.Array]) -> list[np.ndarray]:
    """:func:`_words`' hashes of several string or binary columns, computed together.

    Each column's words are the ``xxh3_128`` of its one-column encodings; those of a
    string column and of its bytes viewed as binary are the same bytes, so the columns
    are viewed as binary, joined into one array and encoded and hashed by one call each
    (per column, a separate codec call costs ~0.1 ms, which is most of a small push to a
    wide dimension table).  Returns an (n, 2) word array per column, in order.
    """
    n = len(parts[0]) if parts else 0
    out: list[np.ndarray | None] = [None] * len(parts)
    groups: list[list[int]] = []
    for family in (pa.binary(), pa.large_binary()):
        current: list[int] = []
        size = 0
        for i, p in enumerate(parts):
            if _STRINGS[p.type] != family:
                continue
            if current and family == pa.binary() and size + p.nbytes > _JOINED_BYTES:
                groups.append(current)  # 32-bit offsets: a joined array stays below 2 GiB
                current, size = [], 0
            current.append(i)
            size += p.nbytes
        if current:
            groups.append(current)
    for mine in groups:
        family = _STRINGS[parts[mine[0]].type]
        joined = pa.concat_arrays([parts[i].view(family) for i in mine])
        rh = _xxh3_words(_codec_of(family).encode(pa.table({"v": joined})))
        for j, i in enumerate(mine):
            out[i] = rh[j * n:(j + 1) * n]
    return [x for x in out if x is not None]


def _words(arr: pa.Array, valid: np.ndarray | None) -> list[np.ndarray]:
    """A column's values as 64-bit words (NULLs as 0), the row hash's input.

    Fixed-width values are their bytes, zero-extended (a fixed_size_binary, or a decimal
    of more than 18 digits, several words); floats canonical as the row codec stores
    them (-0.0 as 0.0, one NaN); variable-length values (and anything else) the two
    halves of the ``xxh3_128`` of their one-column :class:`~joinstate.codec.RowCodec`
    encoding.
    """
    n = len(arr)
    t = arr.type
    fixed = (pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_time(t)
             or pa.types.is_timestamp(t) or pa.types.is_duration(t)
             or pa.types.is_decimal128(t) or pa.types.is_fixed_size_binary(t))
    words: list[np.ndarray]
    if pa.types.is_boolean(t):
        words = [np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), np.uint64)]
    elif pa.types.is_floating(t) and t.bit_width in (32, 64):
        v = np.array(arr.to_numpy(zero_copy_only=False), dtype=f"<f{t.bit_width // 8}")
        v[v == 0] = 0.0
        v[np.isnan(v)] = np.nan
        words = [v.view(f"<u{t.bit_width // 8}").astype(np.uint64)]
    elif fixed:
        width = t.byte_width
        raw = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * width:
                                                        (arr.offset + n) * width]
        if width in (1, 2, 4, 8):
            words = [raw.view(f"<u{width}").astype(np.uint64, copy=False)]
        elif pa.types.is_decimal128(t) and t.precision <= 18:
            # |value| < 10**18 < 2**63: the high word only repeats the low word's sign.
            words = [raw.view("<u8")[::2]]
        else:
            mat = raw.reshape(n, width)
            pad = -width % 8
            if pad:
                mat = np.concatenate([mat, np.zeros((n, pad), np.uint8)], axis=1)
            w64 = np.ascontiguousarray(mat).view("<u8")
            words = [w64[:, j] for j in range(w64.shape[1])]
    else:
        rh = _xxh3_words(_codec_of(t).encode(pa.table({"v": arr})))
        words = [rh[:, 0], rh[:, 1]]
    if valid is not None:
        words = [np.where(valid, x, np.uint64(0)) for x in words]
    return words


def row_hashes(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A 128-bit hash of every row of ``table``: (first, second) 64-bit halves.

    The rows' words (:func:`_words` of each column in schema order, then one word of
    NULL flags per 64 columns) feed two independent lanes, each ``h = (h ^ word) *
    odd``, ``h ^= h >> s`` with its own seed, multiplier and shift, finished by
    MurmurHash3's avalanche ``fmix64``.  Every step is a bijection of the lane, so two
    rows differing in one word never collide; rows differing in several collide only if
    both lanes' differences cancel at once (about 2**-128 for data that is not crafted
    to do so; it is not a cryptographic hash).  Vectorised: ~0.05 µs a row for eight
    numeric columns, against ~0.25 µs for encoding each row and calling ``xxh3_128`` on
    it.  Equal values (SQL equality: -0.0 = 0.0, one NaN) hash equally; NULL differs from
    every value.  The record stores these hashes: changing the function changes the
    stored format.
    """
    n = table.num_rows
    lo = np.empty(n, np.uint64)
    hi = np.empty(n, np.uint64)
    ncols = table.num_columns
    with np.errstate(over="ignore"):
        for start in range(0, n, _HASH_ROWS):
            m = min(n - start, _HASH_ROWS)
            # Both lanes as the rows of one (2, m) array: each step is one numpy call for
            # the two lanes (a wide table's small push is mostly per-call overhead).
            lanes = np.empty((2, m), np.uint64)
            lanes[0], lanes[1] = _SEEDS
            tmp = np.empty((2, m), np.uint64)
            nulls = [np.zeros(m, np.uint64) for _ in range(max(1, (ncols + 63) // 64))]
            # Only the slice's chunks are joined (a whole column would be copied).
            parts = [col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
                     for col in table.slice(start, m).columns]
            strings = [i for i, part in enumerate(parts) if part.type in _STRINGS]
            hashed = dict(zip(strings, _string_words([parts[i] for i in strings]),
                              strict=True))
            for i, part in enumerate(parts):
                valid = None
                if part.null_count:
                    valid = np.asarray(part.is_valid().to_numpy(zero_copy_only=False), bool)
                    nulls[i // 64] |= (~valid).astype(np.uint64) << np.uint64(i % 64)
                got = hashed.get(i)
                words = _words(part, valid) if got is None else [
                    got[:, 0] if valid is None else np.where(valid, got[:, 0], np.uint64(0)),
                    got[:, 1] if valid is None else np.where(valid, got[:, 1], np.uint64(0))]
                for word in words:
                    _mix(lanes, word, tmp)
            for word in nulls:
                _mix(lanes, word, tmp)
            a = _fmix(lanes[0])
            lanes[1] ^= a
            lo[start:start + m] = a
            hi[start:start + m] = _fmix(lanes[1])
    return lo, hi


def _mix(lanes: np.ndarray, word: np.ndarray, tmp: np.ndarray) -> None:
    """One word into both lanes, in place: ``h = (h ^ word) * mul; h ^= h >> shift``."""
    np.bitwise_xor(lanes, word, out=lanes)
    np.multiply(lanes, _MULS2, out=lanes)
    np.right_shift(lanes, _SHIFTS2, out=tmp)
    np.bitwise_xor(lanes, tmp, out=lanes)


def _bucket(lo: np.ndarray) -> np.ndarray:
    """Each hash's bucket, as uint8 (numpy sorts 8-bit keys by radix, in linear time)."""
    return (lo >> _SHIFT).astype(np.uint8)


def _key(bucket: int, seq: int) -> bytes:
    """The push's sequence number, then the bucket.

    Sequence first: every push writes after every key there is, so RocksDB's flushed
    files never overlap older ones and reach the bottom level by trivial moves instead
    of compactions rewriting the record (a bucket's values are found through the
    in-memory list of its sequence numbers, not by a key range).
    """
    return seq.to_bytes(8, "big") + bytes((bucket,))


def _parse(value: bytes, cf: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One stored value -> (lo, hi, weight)."""
    tag, body = value[:1], memoryview(value)[1:]
    width = _HASH if tag == bytes((_ONES,)) else _HASH + 8 if tag == bytes((_WEIGHTED,)) else 0
    if not width or len(body) % width:
        msg = (f"{cf}: a stored value of {len(value)} bytes is not a row record (tag "
               f"{value[:1]!r}); the store is damaged: restore it from a copy or repopulate")
        raise StateCorruptedError(msg)
    n = len(body) // width
    halves = np.frombuffer(body, dtype="<u8", count=2 * n).reshape(n, 2).astype(np.uint64)
    if width == _HASH:
        w = np.ones(n, np.int64)
    else:
        w = np.frombuffer(body, dtype="<i8", offset=_HASH * n).astype(np.int64)
    return halves[:, 0], halves[:, 1], w


def _values(lo: np.ndarray, hi: np.ndarray, w: np.ndarray, buckets: np.ndarray
            ) -> list[tuple[int, bytes]]:
    """One value per bucket present: ``(bucket, value)``, hashes in bucket order."""
    order = np.argsort(buckets, kind="stable")
    counts = np.bincount(buckets, minlength=BUCKETS)
    mat = np.empty((len(lo), 2), dtype="<u8")
    np.take(lo, order, out=mat[:, 0])
    np.take(hi, order, out=mat[:, 1])
    raw = mat.tobytes()
    ones = bool((w == 1).all())
    weights = b"" if ones else w[order].astype("<i8").tobytes()
    out = []
    start = 0
    for b in np.flatnonzero(counts).tolist():
        stop = start + int(counts[b])
        body = raw[_HASH * start:_HASH * stop]
        if ones:
            out.append((b, bytes((_ONES,)) + body))
        else:
            out.append((b, bytes((_WEIGHTED,)) + body + weights[8 * start:8 * stop]))
        start = stop
    return out


def _hash_bytes(lo: np.ndarray, hi: np.ndarray) -> Bytes:
    mat = np.empty((len(lo), 2), dtype="<u8")
    mat[:, 0], mat[:, 1] = lo, hi
    return Bytes.from_fixed(mat.view(np.uint8).reshape(len(lo), _HASH))


def _consolidated(lo: np.ndarray, hi: np.ndarray, w: np.ndarray, what: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal hashes summed, zeros dropped."""
    rh = _hash_bytes(lo, hi)
    g = group_rows(rh, rh)
    if len(g) == len(w):
        keep = np.flatnonzero(w)
        return lo[keep], hi[keep], w[keep]
    sums = checked_sum_by(g.inv, w, len(g), what)
    keep = np.flatnonzero(sums)
    first = g.first[keep]
    return lo[first], hi[first], sums[keep]


class _Scan:
    """Everything stored in a record, parsed and checked.

    Values whose weights are all 1 (every insert-only push's) are parsed together: one
    join of their bytes and one ``frombuffer``, not a numpy call per value.
    """

    __slots__ = ("entries", "hi", "lo", "seqs", "w")

    def __init__(self, pairs: list[tuple[bytes, bytes]], cf: str) -> None:
        self.seqs: list[list[int]] = [[] for _ in range(BUCKETS)]
        ones: list[bytes] = []
        ones_buckets: list[int] = []
        parts = []
        for k, v in pairs:
            if len(k) != 9 or k[8] >= BUCKETS:
                msg = (f"{cf}: key {k.hex()} is not a row record's key; the store is "
                       "damaged: restore it from a copy or repopulate")
                raise StateCorruptedError(msg)
            self.seqs[k[8]].append(int.from_bytes(k[:8], "big"))
            if v[:1] == bytes((_ONES,)) and (len(v) - 1) % _HASH == 0:
                ones.append(v)
                ones_buckets.append(k[8])
            else:
                lo, hi, w = _parse(v, cf)
                parts.append((lo, hi, w, np.full(len(w), k[8], np.uint8)))
        if ones:
            counts = np.fromiter(((len(v) - 1) // _HASH for v in ones), np.int64, len(ones))
            body = b"".join(memoryview(v)[1:] for v in ones)
            halves = np.frombuffer(body, dtype="<u8").reshape(-1, 2)
            parts.append((halves[:, 0], halves[:, 1], np.ones(len(halves), np.int64),
                          np.repeat(np.array(ones_buckets, np.uint8), counts)))
        if parts:
            lo, hi, w, buckets = (np.concatenate(x) for x in zip(*parts, strict=True))
            if (_bucket(lo) != buckets).any():
                msg = (f"{cf}: a stored value holds row hashes of another bucket than its "
                       "key's; the store is damaged: restore it from a copy or repopulate")
                raise StateCorruptedError(msg)
            self.lo, self.hi, self.w = lo.astype(np.uint64), hi.astype(np.uint64), w
        else:
            self.lo = self.hi = np.zeros(0, np.uint64)
            self.w = np.zeros(0, np.int64)
        self.entries = len(self.w)


class SourceRows:
    """The row record of one source (see the module docstring).

    ``describe(i)`` names row ``i`` of a pushed change set in error messages.
    """

    def __init__(self, store: Database, cf: str, pipeline: str, source: str,
                 schema: pa.Schema) -> None:
        self.store = store
        self.cf = cf
        self.pipeline = pipeline
        self.source = source
        self.schema = schema
        self.emap: EntryMap | None = None
        # Valid while the map exists: per bucket, the hash entries stored, the sequence
        # numbers of its values, and the live entries of the map (the rewrite rule
        # compares them; a rewrite deletes the values it replaces by their keys).
        self.stored = np.zeros(BUCKETS, np.int64)
        self.seqs: list[list[int]] = [[] for _ in range(BUCKETS)]
        self.mapped = np.zeros(BUCKETS, np.int64)
        store.cf(cf)

    @property
    def what(self) -> str:
        """How messages name the record's source."""
        return f"pipeline {self.pipeline!r}, source {self.source!r}"

    # ---- reading ----------------------------------------------------------------------

    def scan(self) -> _Scan:
        """Every stored value, parsed."""
        (pairs,) = _rocks.range_entries(self.store.cf(self.cf), [b""], self.store.path,
                                        f"read {self.cf}")
        return _Scan(pairs, self.cf)

    def contents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, _Scan]:
        """The consolidated multiset (lo, hi, count) the record holds, checked.

        Raises :class:`StateCorruptedError` if a row is held a negative number of times
        or the counters disagree with the stored values.
        """
        scan = self.scan()
        lo, hi, w = _consolidated(scan.lo, scan.hi, scan.w, f"{self.cf}: a row's multiplicity")
        problem = None
        if (w < 0).any():
            problem = "a row is held a negative number of times"
        elif checked_sum(w, f"rows of {self.cf}") != self.store.counter(self.cf, "rows"):
            problem = (f"it holds {checked_sum(w, 'rows')} rows, its counter says "
                       f"{self.store.counter(self.cf, 'rows')}")
        elif scan.entries != self.store.counter(self.cf, "entries"):
            problem = (f"it holds {scan.entries} entries, its counter says "
                       f"{self.store.counter(self.cf, 'entries')}")
        if problem is not None:
            raise StateCorruptedError(
                f"{self.what}: the row record {self.cf} is inconsistent ({problem}); "
                "retractions checked against it cannot be trusted: restore the store from a "
                "copy or repopulate")
        return lo, hi, w, scan

    def _map(self) -> EntryMap:
        """The in-memory multiset, built from the record by one scan if there is none."""
        if self.emap is None:
            lo, hi, w, scan = self.contents()
            order = np.argsort(lo, kind="stable")
            self.emap = EntryMap.from_sorted(lo[order], hi[order],
                                             np.zeros(len(lo), np.uint64), w[order])
            self.stored = np.bincount(_bucket(scan.lo), minlength=BUCKETS).astype(np.int64)
            self.seqs = scan.seqs
            self.mapped = np.bincount(_bucket(lo), minlength=BUCKETS).astype(np.int64)
        return self.emap

    def reset(self) -> None:
        """Forget the in-memory multiset (rebuilt from the record when next needed)."""
        self.emap = None
        self.stored = np.zeros(BUCKETS, np.int64)
        self.seqs = [[] for _ in range(BUCKETS)]
        self.mapped = np.zeros(BUCKETS, np.int64)

    def warm(self) -> int:
        """Build the in-memory multiset now rather than at the first retraction; rows held."""
        return self._map().total()

    # ---- staging ----------------------------------------------------------------------

    def stage(self, table: pa.Table, w: np.ndarray, txn: Transaction,
              describe: Callable[[int], Any]) -> None:
        """Check a change set of the source against the record; stage its writes.

        ``table`` holds every column of the source.  Raises
        :class:`OverRetractionError` (nothing staged) if it retracts a row more times
        than the source holds it, counting the change set's own inserts.
        """
        n = len(w)
        if not n:
            return
        lo, hi = row_hashes(table)
        rows = np.arange(n, dtype=np.int64)
        if self.emap is not None or not (w > 0).all():
            # Net weight per row: an insert and a retraction of one row in the same push
            # cancel, and the map needs one entry per row and push.  A row is its hash
            # here as everywhere in the record (the map and the stored values hold
            # nothing else), so equal hashes are equal rows: re-encoding the rows that
            # share one (every column of a wide dimension row, ~1 ms) would decide
            # nothing the map could keep apart.
            hashes = _hash_bytes(lo, hi)
            rows, w = consolidate(hashes, hashes, w, f"{self.what}: the summed weight of a row")
            lo, hi = lo[rows], hi[rows]
            if not len(w):
                return
        neg = np.flatnonzero(w < 0)
        emap = self._map() if len(neg) else self.emap
        settle: list[Callable[[], object]] = []
        zeroed = np.zeros(BUCKETS, np.int64)
        if len(neg):
            assert emap is not None
            txn.note_read()
            found = emap.lookup(lo[neg], hi[neg])
            what = f"{self.what}: a row's multiplicity"
            held = checked_sum_by(found.qi, found.count, len(neg), what)
            after = checked_add(held, w[neg], what)
            bad = np.flatnonzero(after < 0)
            if len(bad):
                j = int(bad[0])
                raise OverRetractionError(
                    f"{self.what}: the push retracts the row {describe(int(rows[neg[j]]))} "
                    f"{-int(w[neg[j]])} time(s), but the source holds it {int(held[j])} "
                    "time(s); a source can only retract rows it holds, equal in every "
                    "column; nothing was applied")
            # A row's first entry keeps its new count, the others are emptied.
            order = np.argsort(found.qi, kind="stable")
            qi = found.qi[order]
            first = np.ones(len(qi), dtype=bool)
            first[1:] = qi[1:] != qi[:-1]
            counts = np.empty(len(qi), np.int64)
            counts[order] = np.where(first, after[qi], 0)
            gone = (counts == 0) & (found.count != 0)
            zeroed = np.bincount(_bucket(found.lo[gone]), minlength=BUCKETS).astype(np.int64)
            settle.append(lambda: emap.set_counts(found, counts))
        seq = self.store.counter(self.cf, "seq") + 1
        txn.add(self.cf, "seq", 1)
        txn.add(self.cf, "rows", checked_sum(w, f"rows of {self.cf}"))
        buckets = _bucket(lo)
        written = np.bincount(buckets, minlength=BUCKETS).astype(np.int64)
        rewrite = self._to_rewrite(written, buckets, w, zeroed) if emap is not None else []
        plain = np.ones(len(w), dtype=bool)
        entries = 0
        new_stored: dict[int, int] = {}
        for b in rewrite:
            assert emap is not None
            mine = buckets == b
            plain &= ~mine
            entries += self._stage_rewrite(emap, b, lo[mine], hi[mine], w[mine], seq, txn,
                                           new_stored)
        keep = np.flatnonzero(plain)
        values = _values(lo[keep], hi[keep], w[keep], buckets[keep])
        # New keys: ``seq`` is this push's number, above every stored value's.
        txn.put_many(self.cf, [_key(b, seq) for b, _ in values], [v for _, v in values],
                     prior=ABSENT)
        entries += len(keep)
        txn.add(self.cf, "entries", entries)
        if emap is None:
            return
        pos = np.flatnonzero(w > 0)
        added = (lo[pos], hi[pos], np.full(len(pos), seq, np.uint64), w[pos])
        plain_written = np.bincount(buckets[keep], minlength=BUCKETS)
        plain_buckets = [b for b, _ in values]
        grown = np.bincount(buckets[pos], minlength=BUCKETS)

        def bookkeeping() -> None:
            for fn in settle:
                fn()
            emap.add(*added)
            self.stored += plain_written
            for b in plain_buckets:
                self.seqs[b].append(seq)
            for b, size in new_stored.items():
                self.stored[b] = size
                self.seqs[b] = [seq] if size else []
            self.mapped += grown - zeroed

        txn.after_commit(bookkeeping)

    def _to_rewrite(self, written: np.ndarray, buckets: np.ndarray, w: np.ndarray,
                    zeroed: np.ndarray) -> list[int]:
        """The buckets this push rewrites: too many superseded entries, or values."""
        grown = np.bincount(buckets[w > 0], minlength=BUCKETS)
        stored = self.stored + written
        live = self.mapped + grown - zeroed
        values = np.array([len(s) for s in self.seqs], np.int64) + (written > 0)
        due = ((stored > 2 * live + _COMPACT_MIN)
               | (values > _VALUES_MIN + stored // _VALUES_PER_ENTRIES))
        return np.flatnonzero(due & (written > 0)).tolist()

    def _stage_rewrite(self, emap: EntryMap, b: int, lo: np.ndarray, hi: np.ndarray,
                       w: np.ndarray, seq: int, txn: Transaction, new_stored: dict[int, int]
                       ) -> int:
        """Replace bucket ``b``'s values by one: its rows after this push, consolidated.

        The rows come from the exact in-memory multiset (the committed state) plus this
        push's changes, so nothing is read; the replaced values are deleted by key.
        Returns the change of the entries counter.
        """
        start = b << int(_SHIFT)
        mlo, mhi, mcount = emap.between(start, start + (1 << int(_SHIFT)))
        lo_n, hi_n, w_n = _consolidated(np.concatenate([mlo, lo]), np.concatenate([mhi, hi]),
                                        np.concatenate([mcount, w]),
                                        f"{self.what}: a row's multiplicity")
        if (w_n < 0).any():  # the retractions were checked: the map would be wrong
            msg = (f"{self.what}: the in-memory multiset of {self.cf} holds a row a negative "
                   "number of times; reopen the store (it is rebuilt) and verify it")
            raise StateCorruptedError(msg)
        deletes: list[bytes | None] = [None] * len(self.seqs[b])
        txn.put_many(self.cf, [_key(b, s) for s in self.seqs[b]], deletes)
        if len(w_n):
            ((_, value),) = _values(lo_n, hi_n, w_n, np.full(len(w_n), b, np.uint8))
            txn.put(self.cf, _key(b, seq), value)
        new_stored[b] = len(w_n)
        return len(w_n) - int(self.stored[b])

    # ---- checking ---------------------------------------------------------------------

    def verify(self) -> dict[str, int]:
        """Check the record against its counters and the in-memory multiset.

        Returns ``{"rows", "entries", "distinct"}``; raises :class:`StateCorruptedError`
        if they disagree (the multiset is rebuilt from the record first).
        """
        lo, hi, w, scan = self.contents()
        if self.emap is not None:
            mlo, mhi, _, mcount = self.emap.arrays()
            mlo, mhi, mcount = _consolidated(mlo, mhi, mcount, "entry map counts")
            stored = np.bincount(_bucket(scan.lo), minlength=BUCKETS)
            if _multiset(mlo, mhi, mcount) != _multiset(lo, hi, w) or \
                    [sorted(s) for s in self.seqs] != [sorted(s) for s in scan.seqs] or \
                    not (stored == self.stored).all():
                self.emap = None
                self._map()
                raise StateCorruptedError(
                    f"{self.what}: the in-memory multiset of {self.cf} (or its list of "
                    "stored values) disagreed with the record (it has been rebuilt from "
                    "it); retractions decided by it may have been wrong: restore the store "
                    "from a copy or repopulate")
        return {"rows": int(w.sum()) if len(w) else 0, "entries": scan.entries,
                "distinct": len(w)}


def _multiset(lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> bytes:
    order = np.lexsort((hi, lo))
    return np.stack([lo[order], hi[order], w[order].view(np.uint64)]).tobytes()


def check_record(store: Database, cf: str) -> dict[str, int]:
    """Check a row record from the store alone (no pipeline definition needed).

    Raises :class:`StateCorruptedError` if its values do not parse, a row is held a
    negative number of times, or its counters disagree; returns what :meth:`verify`
    returns.
    """
    found = source_rows_of(cf)
    if found is None:
        msg = f"internal: {cf!r} is not the family of a source's row record"
        raise StateCorruptedError(msg)
    return SourceRows(store, cf, found[0], found[1], pa.schema([])).verify()
