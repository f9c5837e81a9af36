"""The bulk write path: batches become sorted SST files that RocksDB ingests.

Why: see :mod:`joinstate.sstfiles` (which writes the files).  Only *blind appends*
qualify: indexes whose inserts never read state
(:attr:`joinstate.IndexInfo.appends_blindly`).  Writes of one side are accumulated
into runs of ``run_rows`` rows, so fewer, larger files reach L0.  Pending runs are
invisible to readers, so the driver ingests a side's pending run before anything reads
that side (a push to the other side probes it; a delete reads its own side).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from joinstate.sstfiles import write_sst
from population.errors import BulkLoadRefused

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate import BulkSink, Database, WriteBlock
    from joinstate.transaction import Record

__all__ = ["STAGING", "SstIngester", "remove_staging", "staging_dir"]

STAGING = "population-sst"


def staging_dir(store_path: str | Path, join: str) -> Path:
    """Where the SST files of ``join``'s population are written before ingestion.

    One directory per join (join names are path-safe), so that two joins of one store
    never share file names.  Nothing there is needed after a crash: the files of an
    ingestion that began were moved under the store's own ``ingest-pending/``, so a
    resumed population (or :func:`remove_staging`) deletes what is left.
    """
    return Path(store_path) / STAGING / join


def remove_staging(store_path: str | Path, join: str) -> None:
    """Delete ``join``'s leftover staging files (and the parent directory once empty)."""
    path = staging_dir(store_path, join)
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()

log = logging.getLogger(__name__)


class SstIngester:
    """Collects blind-append writes per side and ingests them as sorted SST files."""

    def __init__(self, store: Database, run_rows: int, join: str) -> None:
        self.store = store
        self.run_rows = run_rows
        self.join = join
        self.tmp = staging_dir(store.path, join)
        # Per side, per column family: the run's keys and values as Arrow chunks (packed:
        # no Python object per row until the SST writer needs one).
        self.pending: dict[str, dict[str, tuple[list[pa.Array], list[pa.Array]]]] = {}
        self.records: dict[str, dict[bytes, bytes | None]] = {}
        self.pending_rows: dict[str, int] = {}
        self.files: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self.bytes = 0
        self._seq = 0

    def sink(self, side: str) -> BulkSink:
        """Return a ``Join.apply`` sink collecting ``side``'s writes.

        Refuses (raises :class:`BulkLoadRefused` before keeping anything) if the batch
        deletes, so that ``apply`` aborts without writing anything, counters included,
        and the caller can redo the batch through a normal WriteBatch.
        """

        def collect(blocks: Sequence[WriteBlock], records: Sequence[Record]) -> None:
            for block in blocks:
                if block.deletes:
                    raise BulkLoadRefused(
                        f"{side}: a bulk-loaded batch deletes from {block.column_family}; "
                        "only appends can be ingested"
                    )
            per_cf = self.pending.setdefault(side, {})
            n = 0
            for block in blocks:
                got = per_cf.setdefault(block.column_family, ([], []))
                keys, values = block.arrow()
                got[0].append(keys)
                got[1].append(values)
                n += len(keys)
            self.pending_rows[side] = self.pending_rows.get(side, 0) + n
            self.records.setdefault(side, {}).update(records)

        return collect

    def has_pending(self, side: str) -> bool:
        """Return whether ``side`` has collected writes not yet ingested."""
        return bool(self.pending_rows.get(side))

    def maybe_ingest(self, side: str) -> None:
        """Ingest ``side``'s run if it reached ``run_rows`` rows."""
        if self.pending_rows.get(side, 0) >= self.run_rows:
            self.ingest(side)

    def ingest(self, side: str) -> None:
        """Sort ``side``'s pending writes per column family, write SST files, ingest them."""
        per_cf = self.pending.pop(side, None)
        records = self.records.pop(side, {})
        self.pending_rows[side] = 0
        if not per_cf:
            return
        self.tmp.mkdir(parents=True, exist_ok=True)
        files: dict[str, list[str]] = {}
        for cf, (key_chunks, value_chunks) in per_cf.items():
            keys = pa.concat_arrays(key_chunks)
            if not len(keys):
                continue
            values = pa.concat_arrays(value_chunks)
            key_chunks.clear()
            value_chunks.clear()
            self._seq += 1
            path = self.tmp / f"{self._seq:06d}.sst"
            size = write_sst(self.store.cf_options(cf), path, keys, values)
            files[cf] = [str(path)]
            self.bytes += size
            self.files[side] = self.files.get(side, 0) + 1
            self.rows[side] = self.rows.get(side, 0) + len(keys)
            log.debug("ingesting %d rows (%d bytes) into %s", len(keys), size, cf)
        # The files and the counters/markers of the batches they hold become durable
        # together (an interrupted ingestion is completed when the store is reopened).
        self.store.ingest_durably(files, list(records.items()))

    def ingest_all(self) -> None:
        """Ingest every side's pending writes."""
        for side in list(self.pending):
            self.ingest(side)

    def discard(self) -> None:
        """Drop pending writes and temporary files (failure path).

        The counters of the dropped batches were never made durable; the caller reloads
        the join so that its in-memory counters match the store again.
        """
        self.pending.clear()
        self.pending_rows.clear()
        self.records.clear()
        remove_staging(self.store.path, self.join)
