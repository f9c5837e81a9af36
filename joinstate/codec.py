"""Row codec: Arrow rows to compact binary values and back, in bulk.

Layout of one encoded row (all integers little-endian, Arrow's own byte order)::

    [null bitmap: ceil(ncols/8) bytes][fixed-width fields][u32 length per variable field]
    [variable field bytes, in column order]

NULL fields are zero-filled, so equal rows always encode to equal bytes: the encoding
doubles as the row's identity (consolidation and the bag layout's row hash rely on it).

Encoding and decoding never loop over rows in Python: fixed fields are numpy matrix
columns, variable fields are joined by Arrow's ``binary_join_element_wise`` and split
again by one numpy gather (Feldera abandoned a RocksDB prototype over per-row
deserialisation cost; this is what avoids it).

Floats are stored canonicalised: ``-0.0`` becomes ``0.0`` and every NaN (any sign or
payload) becomes the one quiet NaN numpy and Java produce (``0x7FF8000000000000`` for
float64, ``0x7FC00000`` for float32), so a stored ``-0.0`` reads back as ``0.0``.  Row
identity must equal SQL equality, as the join keys already do (``joinstate.keys``):
Spark normalises ``-0.0`` and NaN for joins and grouping (``NormalizeFloatingNumbers``),
so a row inserted as ``-0.0`` must be retractable as ``0.0``.  Checked on Spark 4.3
``local[1]``: inner joins (sort-merge, broadcast and shuffled hash) match a ``-0.0`` key
with ``0.0`` and NaN with NaN (any payload or sign), and ``groupBy`` puts ``-0.0`` with
``0.0`` and every NaN in one group whose key comes out as ``0.0`` / ``0x7FF8000000000000``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._bytes import Bytes
from joinstate.errors import StateCorruptedError

__all__ = ["RowCodec"]


@dataclass(frozen=True)
class _Field:
    index: int
    name: str
    type: pa.DataType
    width: int | None  # None: variable length
    offset: int  # byte offset of the fixed field (or of its u32 length) in the header


# How encode() reads a field's values, decided once per schema: encoding a change of a
# few rows costs mostly per-column overhead, and a batch encodes a dozen tables.  _RAW:
# the value bytes as Arrow holds them; _CONVERTED: booleans (bits to bytes) and floats
# (canonical zero and NaN), through _fixed_matrix; _VAR: strings and binaries.
_RAW, _CONVERTED, _VAR = range(3)


def _fixed_width(t: pa.DataType) -> int | None:
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal128(t):
        return int(t.byte_width)
    if (
        pa.types.is_string(t) or pa.types.is_large_string(t)
        or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    ):
        return None
    return int(t.bit_width // 8)


def _value_bytes(arr: pa.Array, width: int) -> np.ndarray:
    """The (rows, width) bytes of a fixed-width array's values, a view of Arrow's buffer."""
    start = arr.offset * width
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return raw[start : start + len(arr) * width].reshape(len(arr), width)


def _fixed_matrix(arr: pa.Array, width: int, valid: np.ndarray | None) -> np.ndarray:
    n = len(arr)
    if pa.types.is_boolean(arr.type):
        filled = pc.fill_null(arr, False) if valid is not None else arr
        return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.uint8).reshape(n, 1)
    mat = _value_bytes(arr, width)
    owned = False
    if pa.types.is_floating(arr.type):
        mat, owned = _canonical_floats(mat, width)
    if valid is not None:
        if not owned:
            mat = mat.copy()  # never write into the caller's Arrow buffer
        mat[~valid] = 0
    return mat


_CANONICAL_NAN: dict[int, np.ndarray] = {
    8: np.array([np.nan], dtype="<f8"), 4: np.array([np.nan], dtype="<f4"),
}


def _canonical_floats(mat: np.ndarray, width: int) -> tuple[np.ndarray, bool]:
    """``mat`` (n rows of ``width``-byte floats) with -0.0 and NaNs canonical.

    ``v == 0`` is true for both zeros, so assigning ``+0.0`` there folds ``-0.0``; every
    NaN gets numpy's one quiet NaN (positive sign, no payload).  Copied only when a row
    changes; the flag says whether the result is a fresh array.
    """
    v = mat.view(f"<f{width}").reshape(len(mat))
    zero = v == 0
    nan = np.isnan(v)
    fix = (zero & np.signbit(v)) | nan
    if nan.any():
        fix[nan] = v[nan].view(f"<u{width}") != _CANONICAL_NAN[width].view(f"<u{width}")[0]
    if not fix.any():
        return mat, False
    out = v.copy()
    out[zero] = 0.0
    out[nan] = _CANONICAL_NAN[width][0]
    return out.view(np.uint8).reshape(len(mat), width), True


class RowCodec:
    """Encode and decode rows of one Arrow schema."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.bitmap_bytes = (len(schema) + 7) // 8
        fields: list[_Field] = []
        pos = self.bitmap_bytes
        for i, f in enumerate(schema):
            w = _fixed_width(f.type)
            if w is not None:
                fields.append(_Field(i, f.name, f.type, w, pos))
                pos += w
        for i, f in enumerate(schema):
            if _fixed_width(f.type) is None:
                fields.append(_Field(i, f.name, f.type, None, pos))
                pos += 4
        self.fields = sorted(fields, key=lambda fl: fl.index)
        self.var_fields = [f for f in self.fields if f.width is None]
        self.header_bytes = pos
        self._plan: list[tuple[int, int, int, int, pa.Scalar | None]] = []
        for f in self.fields:
            if f.width is None:
                empty = pa.scalar(b"" if _is_binary(f.type) else "", f.type)
                self._plan.append((f.index, _VAR, f.offset, 4, empty))
            elif pa.types.is_boolean(f.type) or pa.types.is_floating(f.type):
                self._plan.append((f.index, _CONVERTED, f.offset, f.width, None))
            else:
                self._plan.append((f.index, _RAW, f.offset, f.width, None))

    # ---- encode -----------------------------------------------------------------------

    def encode(self, table: pa.Table) -> Bytes:
        """Encode every row of ``table`` (columns in schema order)."""
        n = table.num_rows
        header = np.zeros((n, self.header_bytes), dtype=np.uint8)
        nulls: np.ndarray | None = None
        var_parts: list[Bytes] = []
        for index, kind, offset, width, empty in self._plan:
            col = table.column(index)
            if isinstance(col, pa.ChunkedArray):
                arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            else:
                arr = col
            valid = None
            if arr.null_count:
                valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                if nulls is None:
                    nulls = np.zeros((n, len(self._plan)), dtype=bool)
                nulls[:, index] = ~valid
            if kind == _RAW:
                view = header[:, offset : offset + width]
                view[...] = _value_bytes(arr, width)
                if valid is not None:
                    view[~valid] = 0
            elif kind == _VAR:
                if valid is not None:
                    arr = pc.fill_null(arr, empty)
                part = Bytes.from_arrow(arr)
                lengths = part.lengths().astype("<u4")
                header[:, offset : offset + 4] = lengths.view(np.uint8).reshape(n, 4)
                var_parts.append(part)
            else:
                header[:, offset : offset + width] = _fixed_matrix(arr, width, valid)
        if self.bitmap_bytes and nulls is not None:
            header[:, : self.bitmap_bytes] = np.packbits(nulls, axis=1, bitorder="little")
        return Bytes.concat_rows([Bytes.from_fixed(header), *var_parts])

    # ---- decode -----------------------------------------------------------------------

    def decode(self, rows: Bytes, skip: int = 0) -> pa.Table:
        """Decode encoded rows; ``skip`` bytes before each row are ignored (e.g. a count)."""
        n = len(rows)
        h = self.header_bytes
        starts = rows.offsets[:-1] + skip
        if n and int(rows.lengths().min()) < skip + h:
            raise StateCorruptedError(
                f"stored row shorter than its header ({skip + h} bytes) for schema "
                f"{self.schema.names}: the catalog and the data disagree"
            )
        if rows.width is not None:
            mat = rows.matrix()[:, skip : skip + h]
        else:
            mat = rows.data[starts[:, None] + np.arange(h, dtype=np.int64)]
        bitmap = mat[:, : self.bitmap_bytes]
        if bitmap.any():
            nulls = np.unpackbits(bitmap, axis=1, count=len(self.fields),
                                  bitorder="little").astype(bool)
            any_null: list[bool] = np.asarray(nulls.any(axis=0), dtype=bool).tolist()
        else:  # no NULL anywhere (the common case): no per-column mask to build
            nulls = np.zeros((n, 0), dtype=bool)
            any_null = [False] * len(self.fields)
        arrays: list[pa.Array] = []
        var_cursor = starts + h
        for f in self.fields:
            has_nulls = any_null[f.index]
            null_col = nulls[:, f.index] if has_nulls else None
            validity = (
                pa.py_buffer(np.packbits(~null_col, bitorder="little"))
                if null_col is not None else None
            )
            if f.width is not None:
                vals = np.ascontiguousarray(mat[:, f.offset : f.offset + f.width])
                if pa.types.is_boolean(f.type):
                    arrays.append(pa.array(vals[:, 0].astype(bool), mask=null_col))
                else:
                    arrays.append(
                        pa.Array.from_buffers(f.type, n, [validity, pa.py_buffer(vals)])
                    )
                continue
            lens = (
                np.ascontiguousarray(mat[:, f.offset : f.offset + 4])
                .view("<u4").reshape(n).astype(np.int64)
            )
            new_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lens, out=new_offsets[1:])
            total = int(new_offsets[-1])
            pos = np.repeat(var_cursor - new_offsets[:-1], lens) + np.arange(total, dtype=np.int64)
            data = rows.data[pos] if total else np.zeros(0, dtype=np.uint8)
            var_cursor = var_cursor + lens
            large = pa.types.is_large_string(f.type) or pa.types.is_large_binary(f.type)
            if not large and total >= 2**31:
                raise StateCorruptedError(
                    f"column {f.name!r}: {total} bytes in one batch exceed the 2 GiB limit of "
                    f"{f.type}; declare it large_string/large_binary"
                )
            offs = new_offsets if large else new_offsets.astype(np.int32)
            arrays.append(
                pa.Array.from_buffers(
                    f.type, n, [validity, pa.py_buffer(offs), pa.py_buffer(data)]
                )
            )
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))
