"""TPC-DS data and queries from DuckDB's ``tpcds`` extension, offline and cached.

Why this module: the benchmarks want real TPC-DS data (its value formats, NULL foreign
keys, ~29 sales per customer up to SF1) rather than synthetic rows, and must run
without network access.  The ``duckdb-extension-tpcds``
package ships the extension binary for the installed DuckDB; it is ``LOAD``-ed from its
file path (no ``INSTALL``, no download).

``dsdgen`` always generates every table of a scale factor (the extension has no table
filter), which takes ~15-20 s and ~1 GB of memory at SF1, so :func:`tables` writes the
requested tables (and columns) to Parquet once and reuses them: under
``~/.cache/joinstate/tpcds/sf<sf>/`` unless ``JOINSTATE_TPCDS_CACHE`` or ``cache_dir``
say otherwise.  Files are written to a temporary name and renamed, so an interrupted or
concurrent generation never leaves a truncated file that a later run would trust.
"""

from __future__ import annotations

import functools
import hashlib
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    import duckdb

__all__ = ["cache_root", "connect", "extension_path", "query", "tables"]

CACHE_ENV = "JOINSTATE_TPCDS_CACHE"
"""Environment variable naming the cache root (the ``sf<sf>`` directories go under it)."""


def extension_path() -> Path:
    """The ``tpcds.duckdb_extension`` file shipped for the installed DuckDB version.

    The package may hold builds for several DuckDB versions (``extensions/v1.x.y/``); the
    one matching ``duckdb.__version__`` is preferred, else the only one there is.
    """
    import importlib.util

    import duckdb  # the bench extra

    # Located, not imported: the package is only a carrier for the binary (no typing).
    spec = importlib.util.find_spec("duckdb_extension_tpcds")
    if spec is None or spec.origin is None:
        raise RuntimeError("the duckdb-extension-tpcds package is not installed "
                           "(pip install -e '.[bench]')")
    base = Path(spec.origin).parent / "extensions"
    found = sorted(base.glob("**/*.duckdb_extension"))
    if not found:
        raise RuntimeError(f"no *.duckdb_extension file under {base}: reinstall "
                           "duckdb-extension-tpcds for this DuckDB version")
    exact = [p for p in found if p.parent.name == f"v{duckdb.__version__}"]
    if exact:
        return exact[0]
    if len(found) == 1:
        return found[0]
    raise RuntimeError(f"several tpcds extension builds under {base} and none for DuckDB "
                       f"{duckdb.__version__}: {[str(p) for p in found]}")


def connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the tpcds extension loaded from its file.

    ``allow_unsigned_extensions`` is set because a pip-shipped build need not carry the
    signature DuckDB checks for extensions it downloaded itself; nothing is fetched.
    """
    import duckdb

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute("SET enable_progress_bar = false")  # dsdgen would draw one on a terminal
    path = str(extension_path()).replace("'", "''")
    con.execute(f"LOAD '{path}'")
    return con


def _sf_label(sf: float) -> str:
    """``1`` -> ``sf1``, ``0.1`` -> ``sf0.1``: one directory per scale factor."""
    return f"sf{sf:g}"


def cache_root() -> Path:
    """The cache root: ``$JOINSTATE_TPCDS_CACHE`` or ``~/.cache/joinstate/tpcds``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "joinstate" / "tpcds"


def _file_name(name: str, columns: Sequence[str] | None) -> str:
    """Whole tables are ``<name>.parquet``; projections carry a digest of their columns.

    The digest keeps two callers asking for different columns of the same table from
    reading each other's file (a projection is cheap to store, and its name says so).
    """
    if columns is None:
        return f"{name}.parquet"
    digest = hashlib.sha1(",".join(columns).encode()).hexdigest()[:10]
    return f"{name}-{digest}.parquet"


def _quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def tables(
    sf: float,
    names: Iterable[str],
    columns: Mapping[str, Sequence[str]] | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, Path]:
    """One Parquet file per TPC-DS table ``names`` at scale factor ``sf``, cached.

    ``columns`` maps a table name to the columns to keep (in that order); tables not in
    it keep every column.  Returns ``{name: path}``.  Only missing files cause a
    ``dsdgen`` run, and one run serves every missing table of the call.  ``cache_dir`` is
    the directory for this scale factor's files (default: ``cache_root()/sf<sf>``).
    """
    if sf <= 0:
        raise ValueError(f"sf={sf} must be > 0")
    names = list(names)
    columns = dict(columns or {})
    unknown = set(columns) - set(names)
    if unknown:
        raise ValueError(f"columns given for tables not requested: {sorted(unknown)}")
    out_dir = Path(cache_dir) if cache_dir is not None else cache_root() / _sf_label(sf)
    paths = {n: out_dir / _file_name(n, columns.get(n)) for n in names}
    missing = [n for n in names if not paths[n].is_file()]
    if not missing:
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    con = connect()
    try:
        con.execute(f"CALL dsdgen(sf={float(sf)!r})")
        for n in missing:
            cols = columns.get(n)
            select = ", ".join(_quote(c) for c in cols) if cols else "*"
            tmp = paths[n].with_name(f".{paths[n].name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
            try:
                con.execute(f"COPY (SELECT {select} FROM {_quote(n)}) TO "
                            f"'{str(tmp).replace(chr(39), chr(39) * 2)}' (FORMAT parquet)")
                os.replace(tmp, paths[n])
            finally:
                tmp.unlink(missing_ok=True)
    finally:
        con.close()
    return paths


@functools.cache
def _queries() -> dict[int, str]:
    con = connect()
    try:
        rows = con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall()
    finally:
        con.close()
    return {int(nr): str(text) for nr, text in rows}


def query(n: int) -> str:
    """The official text of TPC-DS query ``n`` (1-99), as the extension ships it."""
    qs = _queries()
    if n not in qs:
        raise ValueError(f"TPC-DS query {n} does not exist (1..{max(qs)})")
    return qs[n]
