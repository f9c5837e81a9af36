"""A few readable lines from :meth:`joinstate.Join.stats` (what ``joinstate inspect`` prints).

``join.stats()`` stays a raw dict (every counter and RocksDB property, for tools);
:func:`stats_summary` picks what a person reading a terminal wants: per side the
layout, rows, distinct keys, bytes, L0 files and whether auto-compaction is on.
"""

from __future__ import annotations

from typing import Any

__all__ = ["auto_compaction", "human_bytes", "side_facts", "stats_summary"]

_COLUMNS = ("side", "layout", "rows", "entries", "distinct keys", "bytes", "L0 files",
            "auto-compaction")


def human_bytes(n: int | float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"?"``."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop always returns


def auto_compaction(rocksdb: dict[str, dict[str, Any]]) -> str:
    """``"on"``, ``"off"`` or ``"off for <families>"`` from one side's per-family flags.

    A family whose flag is unknown (no OPTIONS file yet) has RocksDB's default: on.
    """
    off = sorted(cf for cf, p in rocksdb.items() if p.get("auto_compaction_disabled"))
    if not off:
        return "on"
    if len(off) == len(rocksdb):
        return "off"
    return "off for " + ", ".join(off)


def side_facts(side: dict[str, Any]) -> dict[str, Any]:
    """The summary fields of one side of ``stats()``: layout, rows, keys, bytes, L0, compaction."""
    rocksdb: dict[str, dict[str, Any]] = side.get("rocksdb") or {}
    l0 = [p.get("num-files-at-level0") for p in rocksdb.values()]
    return {
        "layout": side.get("layout"),
        "rows": side.get("rows"),
        "null_key_rows": side.get("null_key_rows"),
        "distinct_keys": side.get("distinct_keys"),
        "bytes": side.get("bytes"),
        "l0_files": sum(n for n in l0 if n is not None) if any(
            n is not None for n in l0) else None,
        "auto_compaction": auto_compaction(rocksdb),
    }


def _num(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else "?"


def stats_summary(stats: dict[str, Any]) -> str:
    """A few aligned lines summarising a :meth:`joinstate.Join.stats` dict.

    The join, its type and phase; then per side: layout, rows (with NULL-key rows if
    any), entries, distinct keys, bytes (SST files + memtables), L0 files and auto-compaction;
    then what RocksDB did since the store was opened, when statistics are on.
    """
    lines = [f"join {stats.get('join')} ({stats.get('how')}, phase {stats.get('phase')})"]
    table = [list(_COLUMNS)]
    for label in ("left", "right"):
        side = stats.get(label)
        if not isinstance(side, dict):
            continue
        f = side_facts(side)
        rows = _num(f["rows"])
        if f["null_key_rows"]:
            rows += f" ({f['null_key_rows']:,} NULL key)"
        table.append([
            label, str(f["layout"]), rows, _num(side.get("entries")), _num(f["distinct_keys"]),
            human_bytes(f["bytes"]), _num(f["l0_files"]), f["auto_compaction"],
        ])
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    for r in table:
        lines.append("  " + "  ".join(
            cell.ljust(w) if i in (0, 1, len(_COLUMNS) - 1) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip())
    act = stats.get("rocksdb_activity") or {}
    if any(act.values()):
        lines.append(
            "  RocksDB since open: compaction "
            f"{human_bytes(act.get('compaction_read_bytes', 0))} read, "
            f"{human_bytes(act.get('compaction_write_bytes', 0))} written; flush "
            f"{human_bytes(act.get('flush_write_bytes', 0))}; WAL "
            f"{human_bytes(act.get('wal_bytes', 0))}; stalls "
            f"{act.get('stall_micros', 0) / 1e6:.2f} s"
        )
    return "\n".join(lines)
