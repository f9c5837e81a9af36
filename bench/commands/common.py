"""What every ``joinstate`` subcommand shares: exit codes, one-line errors, stores, inputs.

A subcommand is a thin layer over library calls; what it adds is said here once: how
an error becomes one line with an exit status, how a state directory (one store, or a
Spark directory of ``shard-NNNNN`` stores) is found, how a Parquet input (file,
directory, glob) is opened, and how progress markers read back.
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from joinstate.changes import CHANGE_TYPE, from_changes

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow.dataset as pads
    from rich.console import Console

    from joinstate.side import SideName

__all__ = [
    "CONTEXT", "EXIT_CHECK_FAILED", "EXIT_CORRUPTED", "EXIT_ERROR", "EXIT_OK", "SIDES",
    "CliError", "describe_progress", "drop_hint", "in_flags", "one_line", "open_dataset",
    "progress_of", "read_changes", "require_existing", "rich_console", "single_store",
    "split_columns", "stage_of", "stores_of", "write_parquet",
]

EXIT_OK = 0
EXIT_CORRUPTED = 1
"""The state is inconsistent (``StateCorruptedError``)."""
EXIT_CHECK_FAILED = 1
"""A benchmark's answer differs from DuckDB's (``bench tpcds``; its report says where)."""
EXIT_ERROR = 2
"""A usage error, a locked or missing store, a bad input file ..."""

SIDES: tuple[SideName, SideName] = ("left", "right")
_SHARD = re.compile(r"^shard-(\d{5})$")



class CliError(Exception):
    """A one-line error the command reports (message and exit status)."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(text: str) -> str:
    """``text`` on one line, without terminal escape codes a library put in it."""
    return " ".join(_ANSI.sub("", str(text)).split())


def in_flags(text: str, terms: Sequence[tuple[str, str]]) -> str:
    """A library message with its API terms replaced by the command's flags.

    The libraries say what a Python caller passes (``resume=True``, ``sources``); the
    person at the terminal typed flags.  ``terms`` pairs each API phrase with what the
    command calls it; the message is otherwise the library's own.
    """
    for api, flag in terms:
        text = text.replace(api, flag)
    return one_line(text)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
"""Every command's click settings: ``-h`` as well as ``--help``, 100 columns of help."""

# ---- stores and inputs ---------------------------------------------------------------


def _shard_dirs(directory: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in directory.iterdir()
                  if p.is_dir() and (m := _SHARD.match(p.name)))


def stores_of(state_dir: Path) -> list[tuple[int | None, Path]]:
    """``[(shard or None, store path)]``: the store itself, or every shard of a Spark dir.

    A ``spark_io.SparkJoin`` directory holds ``shard-NNNNN`` stores; a
    ``spark_io.SparkPipeline`` directory one such set per stage (``<stage>/shard-NNNNN``).
    """
    if state_dir.is_dir() and not (state_dir / "CURRENT").exists():
        shards = _shard_dirs(state_dir)
        if shards:
            return [(n, p) for n, p in shards]
        staged = [(n, p) for stage in sorted(state_dir.iterdir())
                  if stage.is_dir() and not stage.name.startswith(("_", "."))
                  for n, p in _shard_dirs(stage)]
        if staged:
            return [(n, p) for n, p in staged]
    return [(None, state_dir)]


def stage_of(state_dir: Path, path: Path) -> str | None:
    """The SparkPipeline stage a shard store belongs to (None for other layouts)."""
    return path.parent.name if path.parent != state_dir and path != state_dir else None


def single_store(state_dir: Path, command: str) -> Path:
    """The store ``command`` writes to: an existing, unsharded state store."""
    stores = stores_of(state_dir)
    if stores[0][0] is not None:
        raise CliError(
            f"{state_dir} is a Spark state directory ({len(stores)} shards); {command} "
            "works on one store: use spark_io.SparkJoin for sharded joins, or pass one "
            "shard's directory"
        )
    return state_dir


def require_existing(state_dir: Path) -> None:
    """Refuse a command that needs a store where there is none."""
    if not (state_dir / "CURRENT").exists():
        raise CliError(
            f"no state store at {state_dir}; create one with 'joinstate populate' (or "
            "joinstate.StateStore) first"
        )


def split_columns(text: str | None) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]`` (a column list flag); None for no flag."""
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def open_dataset(spec: str, what: str) -> pads.Dataset:
    """A Parquet file, a directory of them (as Spark writes), or a glob, as one dataset.

    Hive-style ``key=value`` directories under a directory (or under the fixed part of
    a glob) become columns, as Spark reads them back; files starting with ``_`` or
    ``.`` (``_SUCCESS``, ``.crc``) are skipped.
    """
    import pyarrow.dataset as ds

    kwargs: dict[str, Any] = {"format": "parquet"}
    if any(ch in spec for ch in "*?["):
        files = [f for f in sorted(glob.glob(spec, recursive=True)) if Path(f).is_file()]
        if not files:
            raise CliError(f"{what}: the pattern {spec!r} matches no files; check the path")
        fixed = []
        for part in Path(spec).parts:
            if any(ch in part for ch in "*?["):
                break
            fixed.append(part)
        source: Any = files
        kwargs.update(partitioning="hive", partition_base_dir=str(Path(*fixed or ["."])))
    elif Path(spec).is_dir():
        source = spec
        kwargs["partitioning"] = "hive"
    elif Path(spec).exists():
        source = spec
    else:
        raise CliError(f"{what}: {spec} does not exist; give a Parquet file, a directory "
                       "of Parquet files or a glob")
    try:
        return ds.dataset(source, **kwargs)
    except (OSError, pa.ArrowException) as exc:
        raise CliError(f"{what}: cannot read {spec} as Parquet: {one_line(str(exc))}"
                       ) from exc


def read_changes(spec: str) -> pa.Table:
    """A change file as a weighted change set (``_weight``, ``_change_type`` or neither)."""
    try:
        table = open_dataset(spec, "CHANGES").to_table()
    except (OSError, pa.ArrowException) as exc:
        raise CliError(f"CHANGES: cannot read {spec}: {one_line(str(exc))}") from exc
    if CHANGE_TYPE in table.column_names:
        return from_changes(table)
    return table


def write_parquet(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path``, creating its directory."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def rich_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr), without highlighting of numbers and paths."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# ---- inspect -------------------------------------------------------------------------


def progress_of(raw: bytes | None) -> Any:
    """A stored progress marker, decoded (its raw text if it is not JSON)."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw.decode("utf-8", "replace")}


def describe_progress(progress: dict[str, Any], names: Sequence[str] = SIDES) -> str:
    """``left 3 batches, 300 rows; right nothing loaded`` (sides, or a pipeline's sources)."""
    parts = []
    for name in names:
        p = progress.get(name)
        if p is None:
            parts.append(f"{name} nothing loaded")
        elif isinstance(p, dict) and "batches" in p:
            parts.append(f"{name} {p['batches']} batches, {p.get('rows', 0):,} rows"
                         f"{', done' if p.get('done') else ''}")
        else:
            parts.append(f"{name} {p}")
    return "; ".join(parts)


def drop_hint(path: Path, name: str) -> str:
    """What to say about deleting ``name`` (a join or pipeline) to start over."""
    return f"drop it with 'joinstate drop {path} {name} --yes'"
