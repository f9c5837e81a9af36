"""Commit records: what makes a push with a commit id idempotent, for joins and pipelines.

A push given a ``commit_id`` stores, in the same transaction as its writes, a record
under :func:`joinstate.names.commit_key` of the pushing object's owner name: the format
tag ``JSM1``, a 16-byte digest of (input name, consolidated change set) and the outputs
the push returned, by output name, as Arrow IPC (:func:`pack`).  A repeat of the same
change returns the recorded outputs without applying anything; another change under the
same id is a :class:`~joinstate.errors.CommitConflictError`.

The digest does not depend on row order or on how the change was split into rows of
weight one: it hashes the consolidated Z-set (sorted 128-bit row hashes and their summed
weights) after the input's name.  A join's record and a pipeline's are the same format;
so is the digest, which is also what the two older formats recorded, so their records
keep replaying:

* ``JSC1`` (joins before): tag, digest, then the one output as a single IPC stream;
* ``JSP1`` (pipelines before): tag, digest, then :func:`pack`'s named outputs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import xxhash

from joinstate.codec import RowCodec
from joinstate.errors import CommitConflictError
from joinstate.keys import row_hash
from joinstate.zset import consolidate

if TYPE_CHECKING:
    from joinstate._bytes import Bytes

__all__ = ["FORMAT", "change_digest", "combined", "digest", "pack", "record", "replay", "unpack"]

FORMAT = b"JSM1"
"""A commit record: this tag, the 16-byte change digest, then :func:`pack`'s outputs."""
_JOIN_V1 = b"JSC1"
_PIPELINE_V1 = b"JSP1"
_DIGEST_BYTES = 16


def change_digest(input_name: str, row_hashes: Bytes, weights: np.ndarray) -> bytes:
    """16 bytes identifying (input, change) from a *consolidated* change's row hashes.

    ``row_hashes``: the 16-byte hash of each distinct row (:func:`joinstate.keys.row_hash`
    of its canonical encoding); ``weights``: each row's summed, non-zero weight.
    """
    h = xxhash.xxh3_128()
    h.update(input_name.encode() + b"\x00")
    if len(weights):
        mat = np.ascontiguousarray(row_hashes.matrix())
        words = mat.view("<u8")
        order = np.lexsort((words[:, 1], words[:, 0]))
        h.update(np.ascontiguousarray(mat[order]).tobytes())
        h.update(np.asarray(weights)[order].astype("<i8").tobytes())
    return h.digest()


def digest(input_name: str, table: pa.Table, w: np.ndarray) -> bytes:
    """:func:`change_digest` of a change set given as rows and weights (consolidated here)."""
    enc = RowCodec(table.schema).encode(table)
    rh = row_hash(enc)
    idx, sums = consolidate(rh, enc, w, f"input {input_name!r}: the summed weight of a row")
    return change_digest(input_name, rh.take(idx), sums)


def combined(parts: list[tuple[str, bytes]]) -> bytes:
    """16 bytes identifying a push to several inputs: their names and :func:`digest` s.

    ``parts`` in input-name order, so the digest does not depend on the order the
    changes were given in; a push to one input keeps that input's own digest.
    """
    h = xxhash.xxh3_128()
    h.update(b"several inputs\x00")
    for name, d in parts:
        h.update(name.encode() + b"\x00" + d)
    return h.digest()


def pack(outs: dict[str, pa.Table]) -> bytes:
    """Named tables as bytes: a length-prefixed JSON header, then one IPC stream each."""
    blobs = [_ipc(t) for t in outs.values()]
    header = json.dumps([[n, len(b)] for n, b in zip(outs, blobs, strict=True)]).encode()
    return len(header).to_bytes(4, "big") + header + b"".join(blobs)


def unpack(raw: bytes) -> dict[str, pa.Table]:
    """The tables :func:`pack` wrote."""
    n = int.from_bytes(raw[:4], "big")
    header = json.loads(raw[4:4 + n])
    pos = 4 + n
    out = {}
    for name, size in header:
        out[name] = pa.ipc.open_stream(pa.py_buffer(raw[pos:pos + size])).read_all()
        pos += size
    return out


def record(change: bytes, outs: dict[str, pa.Table]) -> bytes:
    """The commit record of a push: its change digest and its outputs."""
    if len(change) != _DIGEST_BYTES:
        msg = f"a change digest has {_DIGEST_BYTES} bytes, got {len(change)}"
        raise ValueError(msg)
    return FORMAT + change + pack(outs)


def replay(recorded: bytes, change: bytes, *, what: str, this_push: str,
           outputs: tuple[str, ...]) -> dict[str, pa.Table]:
    """The outputs recorded for a repeated push, or a conflict if the change differs.

    ``what`` names the commit (``commit id 'x' of join 'j'``), ``this_push`` the input
    the repeat went to (``the left side``, ``source 'sales'``); ``outputs`` are the
    output names, in order (a ``JSC1`` record holds the join's one output unnamed).
    Raises :class:`~joinstate.errors.CommitConflictError` for another change, another
    input, or a record in no format this module reads.
    """
    tag = recorded[:4]
    if tag not in (FORMAT, _JOIN_V1, _PIPELINE_V1):
        raise CommitConflictError(
            f"{what} was recorded in a format this joinstate does not read (tag {tag!r}), "
            "so a retry cannot be recognised; use a new commit id")
    if recorded[4:4 + _DIGEST_BYTES] != change:
        raise CommitConflictError(
            f"{what} was already committed with a different change set or input (this push: "
            f"{this_push}); a retry must repeat the same change to the same input, a new "
            "change needs a new commit id; nothing was applied")
    body = recorded[4 + _DIGEST_BYTES:]
    if tag == _JOIN_V1:
        return {outputs[0]: pa.ipc.open_stream(pa.py_buffer(body)).read_all()}
    return unpack(body)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
