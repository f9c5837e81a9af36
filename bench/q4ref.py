"""DuckDB's answer to TPC-DS query 4: the reference every q4 figure is checked against.

The query text is DuckDB's own (``tpcds_queries()``); :func:`reference_sql` derives from
it the ``year_total`` CTE alone and the answer without its ``LIMIT``, and
:class:`Reference` runs them on the current tables.  Both the in-process q4 suite
(:mod:`bench.q4`) and the Spark SQL recompute (:mod:`bench.spark_sql`) check against it.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from bench import tpcds

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa

__all__ = ["Reference", "reference_sql"]


def reference_sql(text: str | None = None) -> tuple[str, str, str]:
    """``(year_total, answer, limited)`` SQL from the official DuckDB text of query 4.

    ``year_total`` is the CTE followed by ``SELECT * FROM year_total``; ``answer`` is the
    whole query without its ``LIMIT 100`` (the ORDER BY kept: harmless, and the same
    order as ``limited``, the text as shipped).  Derived from the text rather than
    copied, so the reference is the query DuckDB ships.
    """
    text = (text if text is not None else tpcds.query(4)).strip()
    m = re.search(r"\)\s*SELECT\s+t_s_secyear\.customer_id", text)
    if m is None:
        raise ValueError("query 4 text: no final 'SELECT t_s_secyear.customer_id' found")
    cte = text[:m.start() + 1]
    limited = text.rstrip(";").strip()
    answer, n = re.subn(r"\s+LIMIT\s+100\s*$", "", limited)
    if n != 1:
        raise ValueError("query 4 text: no trailing 'LIMIT 100' found")
    return cte + "\nSELECT * FROM year_total", answer, limited


class Reference:
    """DuckDB answering q4 (and its CTE) from the current tables, as Arrow tables.

    The tables are registered (zero-copy Arrow scans) before each query, so the
    reference always reads what the workload holds after its last change.
    """

    def __init__(self, memory_limit: str | None = None) -> None:
        import duckdb

        self.con: duckdb.DuckDBPyConnection = duckdb.connect()
        self.con.execute("SET enable_progress_bar = false")
        if memory_limit is not None:  # DuckDB's default is 80% of RAM: a run that also
            # holds the tables and stores itself can run out of memory at SF10
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        self.sql_year_total, self.sql_answer, self.sql_limited = reference_sql()

    def close(self) -> None:
        """Close the DuckDB connection."""
        self.con.close()

    def _run(self, tables: Mapping[str, pa.Table], sql: str) -> tuple[pa.Table, float]:
        for n, t in tables.items():
            self.con.register(n, t)
        t0 = time.perf_counter()
        out = self.con.execute(sql).to_arrow_table()
        return out, (time.perf_counter() - t0) * 1e3

    def year_total(self, tables: Mapping[str, pa.Table]) -> tuple[pa.Table, float]:
        """The CTE's rows and the ms DuckDB took."""
        return self._run(tables, self.sql_year_total)

    def answer(self, tables: Mapping[str, pa.Table]) -> tuple[pa.Table, float]:
        """All answer rows (no LIMIT) and the ms DuckDB took."""
        return self._run(tables, self.sql_answer)

    def limited(self, tables: Mapping[str, pa.Table]) -> tuple[pa.Table, float]:
        """The query as shipped (ORDER BY ... LIMIT 100)."""
        return self._run(tables, self.sql_limited)
