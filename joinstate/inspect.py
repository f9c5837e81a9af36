"""What a store holds of a pipeline, read from the store alone: no definition needed.

A tool inspecting a state directory (``joinstate inspect``, ``verify``) has no Python
definition of the pipelines in it.  Everything here reads the catalog entry a pipeline
stores when it is created (its JSON definition), ``__meta__`` (phase, progress markers,
commit records) and the column families, whose names are parsed only through
:mod:`joinstate.names`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from joinstate._source_rows import check_record
from joinstate.activity import auto_compaction_flags
from joinstate.errors import JoinSpecMismatchError
from joinstate.names import (
    aggregate_values_cf,
    commit_prefix,
    degree_cf,
    nulls_cf,
    phase_key,
    pipeline_aggregate_of,
    pipeline_index_of,
    pipeline_owner,
    pipeline_spec_key,
    progress_key,
    source_rows_of,
)
from joinstate.summary import auto_compaction, human_bytes

if TYPE_CHECKING:
    from joinstate.store import StateStore

__all__ = ["describe", "stored_names", "summary_of", "verify_records"]


def stored_names(store: StateStore) -> list[str]:
    """Names of the pipelines whose definitions ``store`` holds, sorted."""
    prefix = pipeline_spec_key("")
    return sorted(k[len(prefix):].decode() for k in store.meta_keys(prefix))


def describe(store: StateStore, name: str) -> dict[str, Any]:
    """What ``store`` holds of pipeline ``name``, from its metadata and column families.

    Sources (name, unique key, columns), outputs, operators per kind, phase, population
    progress markers and recorded commit ids from ``__meta__``; per index
    (``ix.<pipeline>~<stream>[<key>]`` with its ``.nulls`` family), per aggregate
    (``agg[<pipeline>~<operator>]`` with ``.minmax``) and per source row record
    (``rows[<pipeline>~<source>]``: rows held, hash entries stored) the counters, bytes
    (SST files + memtables), L0 files and auto-compaction, from RocksDB; per source, what
    checks its retractions.  Raises :class:`~joinstate.errors.JoinSpecMismatchError` if
    there is no such pipeline.
    """
    raw = store.meta_get(pipeline_spec_key(name))
    if raw is None:
        raise JoinSpecMismatchError(
            f"pipeline {name!r} does not exist in {store.path} (pipelines there: "
            f"{stored_names(store)})")
    spec = json.loads(raw)
    nodes = spec.get("nodes", [])
    families = store.column_families()
    records_of = {cf: found[1] for cf in families
                  if (found := source_rows_of(cf)) is not None and found[0] == name}
    recorded = set(records_of.values())
    sources = [{"name": n.get("name"), "unique_key": n.get("unique_key"),
                "columns": n.get("columns", []), "retractions": n.get("retractions"),
                "checked_by": ("nothing (unchecked)" if n.get("retractions") == "unchecked"
                               else "its row record" if n.get("name") in recorded
                               else "its index holding every column")}
               for n in nodes if n.get("kind") == "source"]
    kinds: dict[str, int] = {}
    for n in nodes:
        kinds[n.get("kind", "?")] = kinds.get(n.get("kind", "?"), 0) + 1
    owner = pipeline_owner(name)
    progress: dict[str, Any] = {}
    for s in sources:
        marker = store.meta_get(progress_key(owner, str(s["name"])))
        if marker is not None:
            try:
                progress[str(s["name"])] = json.loads(marker)
            except ValueError:
                progress[str(s["name"])] = {"raw": marker.decode("utf-8", "replace")}
    flags = auto_compaction_flags(store.path)

    def facts(cfs: list[str]) -> dict[str, Any]:
        props = {cf: {"num-files-at-level0": store.property_int(
            cf, "rocksdb.num-files-at-level0"),
            "auto_compaction_disabled": flags.get(cf)} for cf in cfs}
        size = sum((store.property_int(cf, "rocksdb.total-sst-files-size") or 0)
                   + (store.property_int(cf, "rocksdb.cur-size-all-mem-tables") or 0)
                   for cf in cfs)
        l0 = [p["num-files-at-level0"] for p in props.values()]
        return {"bytes": size,
                "l0_files": sum(n for n in l0 if n is not None)
                if any(n is not None for n in l0) else None,
                "auto_compaction": auto_compaction(props)}

    indexes, aggregates, records = [], [], []
    for cf in families:
        if cf in records_of:
            records.append({"column_family": cf, "source": records_of[cf],
                            "rows": store.counter(cf, "rows"),
                            "entries": store.counter(cf, "entries"), **facts([cf])})
            continue
        index = pipeline_index_of(cf, name)
        operator = pipeline_aggregate_of(cf, name)
        if index is not None:
            stream, reader, key = index
            parts = [cf] + [c for c in (nulls_cf(cf), degree_cf(cf)) if c in families]
            indexes.append({
                "column_family": cf, "stream": stream, "reader": reader, "key": key,
                "rows": store.counter(cf, "rows"), "entries": store.counter(cf, "entries"),
                "null_key_rows": store.counter(nulls_cf(cf), "rows"), **facts(parts)})
        elif operator is not None:
            minmax = aggregate_values_cf(f"{name}~{operator}")
            parts = [cf] + [c for c in (minmax,) if c in families]
            aggregates.append({"column_family": cf, "operator": operator,
                               "groups": store.counter(cf, "entries"), **facts(parts)})
    phase = store.meta_get(phase_key(owner))
    return {
        "name": name, "phase": "live" if phase == b"live" else "population",
        "share_indexes": spec.get("share_indexes"), "sources": sources,
        "outputs": list(spec.get("outputs", {})),
        "materialized": list(spec.get("materialized", {})), "operators": kinds,
        "indexes": indexes, "aggregates": aggregates, "row_records": records,
        "population_progress": progress,
        "commit_ids": len(store.meta_keys(commit_prefix(owner))),
    }


def verify_records(store: StateStore, name: str) -> dict[str, dict[str, int]]:
    """Check every source row record of pipeline ``name`` from the store alone.

    Needs no definition (``joinstate verify`` has none): each record's values must parse,
    hold no row a negative number of times and agree with its counters.  Returns
    ``{column family: {"rows", "entries", "distinct"}}``; raises
    :class:`~joinstate.errors.StateCorruptedError` otherwise.
    """
    with store.lock:
        return {cf: check_record(store, cf) for cf in store.column_families()
                if (found := source_rows_of(cf)) is not None and found[0] == name}


def summary_of(facts: dict[str, Any]) -> str:
    """:func:`describe`'s dict as a few lines and a small table (``Pipeline.summary``)."""

    def num(v: object) -> str:
        return f"{v:,}" if isinstance(v, int) else "?"

    shared = facts.get("share_indexes")
    sharing = "?" if shared is None else "shared" if shared else "one per operator input"
    lines = [
        f"pipeline {facts['name']} (phase {facts['phase']}, indexes {sharing})",
        "  sources: " + ", ".join(
            str(s["name"]) + (f" (unique {','.join(s['unique_key'])})"
                              if s.get("unique_key") else "")
            + (" (retractions unchecked)" if s.get("retractions") == "unchecked" else "")
            for s in facts["sources"]),
        "  outputs: " + ", ".join(
            o + (" (materialized)" if o in facts.get("materialized", []) else "")
            for o in facts["outputs"]),
    ]
    table = [["state", "rows", "entries", "bytes", "L0 files", "auto-compaction"]]
    for ix in facts["indexes"]:
        what = f"index {ix['stream']}" + (f"~{ix['reader']}" if ix.get("reader") else "")
        rows = num(ix["rows"]) + (f" (+{ix['null_key_rows']:,} NULL key)"
                                  if ix.get("null_key_rows") else "")
        table.append([f"{what} [{','.join(ix['key'])}]", rows, num(ix["entries"]),
                      human_bytes(ix["bytes"]), num(ix["l0_files"]),
                      str(ix["auto_compaction"])])
    for agg in facts["aggregates"]:
        table.append([f"aggregate {agg['operator']}", f"{num(agg['groups'])} groups",
                      num(agg["groups"]), human_bytes(agg["bytes"]),
                      num(agg["l0_files"]), str(agg["auto_compaction"])])
    for rec in facts.get("row_records", []):
        table.append([f"row record {rec['source']}", num(rec["rows"]),
                      num(rec["entries"]), human_bytes(rec["bytes"]),
                      num(rec["l0_files"]), str(rec["auto_compaction"])])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    left_aligned = {0, len(widths) - 1}
    lines += ["  " + "  ".join(c.ljust(w) if i in left_aligned else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))
                               ).rstrip() for r in table]
    return "\n".join(lines)
