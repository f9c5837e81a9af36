"""Multi-step changes RocksDB cannot make atomic, made crash-safe by an intent record.

RocksDB ingests SST files one column family at a time and drops families one at a time,
and neither can be combined with a WriteBatch.  So such a change first writes an
*intent* to ``__meta__`` through the WAL (what is to happen, and the records that
describe its result), then does the steps, then writes the records and deletes the
intent in one batch.  A store opened after a crash anywhere in between finishes every
intent it finds (:func:`finish_interrupted`) before anything can use the state, so the
data and the counters describing it always become durable together.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any, Protocol

import rocksdict as rd

from joinstate import _rocks
from joinstate.names import (
    DROP_INTENT_PREFIX,
    INGEST_INTENT_PREFIX,
    META_CF,
    drop_intent_key,
    file_safe,
    ingest_intent_key,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

__all__ = ["STAGING", "Record", "drop_durably", "fill_records", "finish_interrupted",
           "ingest_durably", "write_then_ingest"]

log = logging.getLogger(__name__)

_PENDING = "ingest-pending"

STAGING = "ingest-staging"
"""Where a transaction writes the SST files of its blind inserts before
:func:`write_then_ingest` moves them under ``ingest-pending/`` (left over only by a
crash before its batch was written: removed at the next open)."""

Record = tuple[bytes, bytes | None]
"""A ``__meta__`` write: key and value (None deletes the key)."""


class OpenStore(Protocol):
    """What an intent needs of the open store it runs in (the store module's ``Database``).

    Declared here rather than imported: the store calls these functions while it opens,
    so the dependency runs one way, from the store to this module.
    """

    path: Path

    def require_writable(self, what: str) -> None: ...
    def handle(self, name: str) -> Any: ...
    def write(self, wb: rd.WriteBatch, *, durable: bool = False) -> None: ...
    def ingest(self, cf: str, paths: Sequence[str]) -> None: ...
    def meta_get(self, key: bytes) -> bytes | None: ...
    def meta_keys(self, prefix: bytes) -> list[bytes]: ...
    def drop_column_families(self, names: Sequence[str]) -> None: ...
    def forget_counters(self, cfs: Sequence[str]) -> None: ...
    def drop_derived(self, cfs: Sequence[str]) -> None: ...


def fill_records(wb: rd.WriteBatch, meta: Any, records: Sequence[Record]) -> None:
    """Add ``__meta__`` writes to ``wb`` (``meta``: the family's handle)."""
    for key, raw in records:
        if raw is None:
            wb.delete(key, meta)
        else:
            wb.put(key, raw, meta)


def finish_interrupted(db: OpenStore) -> None:
    """Complete every ingestion and drop a crash interrupted (at a read-write open)."""
    _finish_ingests(db)
    _finish_drops(db)


def ingest_durably(db: OpenStore, files: Mapping[str, Sequence[str]],
                   records: Sequence[Record]) -> None:
    """Ingest SST files into several families and write ``records``, crash-safely.

    RocksDB ingests one family at a time and cannot ingest and write a batch
    atomically, so the ingestion is recorded first: the files are moved under
    ``ingest-pending/`` and an intent naming them and the records is written through
    the WAL; then each family ingests its files (moved, so an ingested file leaves
    the pending directory); then the records are written and the intent removed, in
    one batch.  A store opened after a crash anywhere in between finishes the job
    (ingesting again what is still pending is harmless: the same keys with the same
    values).  So the data and the counters describing it become durable together.
    """
    db.require_writable("ingest files")
    intent, moved = _stage(db, files)
    doc = {"files": moved, "records": [[k.hex(), None if v is None else v.hex()]
                                       for k, v in records]}
    wb = rd.WriteBatch(raw_mode=True)
    wb.put(ingest_intent_key(intent), json.dumps(doc).encode(), db.handle(META_CF))
    db.write(wb, durable=True)
    _complete_ingest(db, intent, doc)


def write_then_ingest(db: OpenStore, wb: rd.WriteBatch, files: Mapping[str, Sequence[str]]
                      ) -> None:
    """Write ``wb`` and ingest ``files`` (per family), crash-safely, in that order.

    For a transaction whose blind inserts went to SST files while the rest of its
    writes (counters, markers, other families) are in ``wb``: the intent naming the
    files is put into ``wb`` itself, so the batch and the promise to ingest become
    durable together (through the WAL even where the store writes without it).  A
    crash before the batch leaves only files, removed at the next open; a crash after
    it is finished at the next open, before anything reads the state.
    """
    db.require_writable("write a batch and ingest files")
    intent, moved = _stage(db, files)
    doc: dict[str, Any] = {"files": moved, "records": []}
    wb.put(ingest_intent_key(intent), json.dumps(doc).encode(), db.handle(META_CF))
    db.write(wb, durable=True)
    _complete_ingest(db, intent, doc)


def _stage(db: OpenStore, files: Mapping[str, Sequence[str]]
           ) -> tuple[str, dict[str, list[str]]]:
    """Move ``files`` under a new intent's pending folder: its id, and the names per family."""
    intent = uuid.uuid4().hex
    pending = db.path / _PENDING / intent
    with _rocks.rocks_errors(db.path, "stage files for ingestion"):
        pending.mkdir(parents=True)
        moved: dict[str, list[str]] = {}
        for cf, paths in files.items():
            for p in paths:
                dest = pending / f"{len(moved.get(cf, ())):06d}-{file_safe(cf)}.sst"
                os.replace(p, dest)
                moved.setdefault(cf, []).append(dest.name)
    return intent, moved


def _complete_ingest(db: OpenStore, intent: str, doc: dict[str, Any]) -> None:
    pending = db.path / _PENDING / intent
    for cf, names in doc["files"].items():
        paths = [str(pending / n) for n in names if (pending / n).exists()]
        if paths:
            db.ingest(cf, paths)
    records: list[Record] = [(bytes.fromhex(k), None if v is None else bytes.fromhex(v))
                             for k, v in doc["records"]]
    records.append((ingest_intent_key(intent), None))
    wb = rd.WriteBatch(raw_mode=True)
    fill_records(wb, db.handle(META_CF), records)
    db.write(wb, durable=True)
    shutil.rmtree(pending, ignore_errors=True)


def _finish_ingests(db: OpenStore) -> None:
    """Complete ingestions a crash interrupted (see :func:`ingest_durably`)."""
    for key in db.meta_keys(INGEST_INTENT_PREFIX):
        raw = db.meta_get(key)
        if raw is None:
            continue
        intent = key[len(INGEST_INTENT_PREFIX):].decode()
        log.warning("%s: completing an SST ingestion interrupted by a crash (%s)",
                    db.path, intent)
        _complete_ingest(db, intent, json.loads(raw))
    leftovers = db.path / _PENDING
    if leftovers.exists() and not db.meta_keys(INGEST_INTENT_PREFIX):
        shutil.rmtree(leftovers, ignore_errors=True)
    shutil.rmtree(db.path / STAGING, ignore_errors=True)


def drop_durably(db: OpenStore, cfs: Sequence[str], records: Sequence[Record]) -> None:
    """Drop column families and write ``records``, crash-safely.

    RocksDB drops one family at a time and cannot drop and write a batch atomically,
    so the records (a catalog entry and counters deleted, say) are written in one
    batch with an intent naming the families; then the families go, with their
    derived files, and the intent is removed.  A store opened after a crash in
    between finishes the drop before anything can use the families, so the catalog
    and counters never describe families that are gone, nor do families outlive
    their catalog entry (a new definition of the same name would find old rows).
    """
    db.require_writable("drop column families")
    intent = uuid.uuid4().hex
    doc = {"families": list(cfs)}
    wb = rd.WriteBatch(raw_mode=True)
    fill_records(wb, db.handle(META_CF),
                 [*records, (drop_intent_key(intent), json.dumps(doc).encode())])
    db.write(wb, durable=True)
    _complete_drop(db, intent, doc)


def _complete_drop(db: OpenStore, intent: str, doc: dict[str, Any]) -> None:
    families = [str(cf) for cf in doc["families"]]
    db.drop_column_families(families)
    db.forget_counters(families)
    db.drop_derived(families)
    wb = rd.WriteBatch(raw_mode=True)
    fill_records(wb, db.handle(META_CF), [(drop_intent_key(intent), None)])
    db.write(wb, durable=True)


def _finish_drops(db: OpenStore) -> None:
    """Complete drops a crash interrupted (see :func:`drop_durably`)."""
    for key in db.meta_keys(DROP_INTENT_PREFIX):
        raw = db.meta_get(key)
        if raw is None:
            continue
        intent = key[len(DROP_INTENT_PREFIX):].decode()
        log.warning("%s: completing a drop of column families interrupted by a crash "
                    "(%s)", db.path, intent)
        _complete_drop(db, intent, json.loads(raw))
