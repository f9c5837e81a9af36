"""``joinstate view``: a SQL view created, populated, changed and read from the command line.

Every answer is checked against DuckDB running the same SQL over the same data: the
Parquet files as given, then those tables with every applied change file added
(inserts, deletes, an update as delete + insert).  The change file of each ``apply``,
integrated onto the view read before it, must give the view read after it.  Errors are
one line naming the flag at fault, and leave the state as it was.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from cli_runner import assert_one_line_error, run

from joinstate.testing import assert_zset_equal, integrate, zset

if TYPE_CHECKING:
    from pathlib import Path

SALES = pa.schema([("sk", pa.int64()), ("ck", pa.int32()), ("amt", pa.decimal128(9, 2)),
                   ("note", pa.string())])
CUSTOMER = pa.schema([("c_sk", pa.int64()), ("name", pa.string()), ("region", pa.string())])

VIEW_SQL = """
SELECT c.region, c.name, count(*) AS n, sum(s.amt) AS total, max(s.sk) AS last_sale
FROM sales s JOIN customer c ON s.ck = c.c_sk
WHERE s.amt > 0
GROUP BY c.region, c.name
"""
TOP_SQL = """
SELECT c.name, sum(s.amt) AS total
FROM sales s, customer c
WHERE s.ck = c.c_sk
GROUP BY c.name
ORDER BY total DESC, c.name
LIMIT 3
"""


def _sales(first: int, n: int) -> pa.Table:
    sks = list(range(first, first + n))
    return pa.table({
        "sk": sks,
        "ck": [k % 11 for k in sks],  # customer 10 has sales but no customer row
        "amt": [Decimal(f"{(k * 37) % 200 - 20}.{k % 100:02d}") for k in sks],
        "note": [None if k % 7 == 0 else f"n{k % 3}" for k in sks],
    }, schema=SALES)


def _customers() -> pa.Table:
    ids = list(range(10))
    return pa.table({"c_sk": ids, "name": [f"cust{i}" for i in ids],
                     "region": [("north", "south", "east")[i % 3] for i in ids]},
                    schema=CUSTOMER)


class Data:
    """The view's inputs on disk, and what DuckDB says the view holds."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sales_dir = root / "sales"
        self.sales_dir.mkdir()
        pq.write_table(_sales(0, 120), self.sales_dir / "part-0.parquet")
        pq.write_table(_sales(120, 80), self.sales_dir / "part-1.parquet")
        self.customer = root / "customer.parquet"
        pq.write_table(_customers(), self.customer)
        self.tables = {"sales": pa.concat_tables([_sales(0, 120), _sales(120, 80)]),
                       "customer": _customers()}
        self.state = root / "state"
        self.sql_file = root / "view.sql"
        self.sql_file.write_text(VIEW_SQL)
        self._n = 0

    def source_flags(self) -> list[str]:
        return ["--source", f"sales={self.sales_dir}", "--source", f"customer={self.customer}",
                "--unique", "customer=c_sk"]

    def change_file(self, source: str, table: pa.Table) -> Path:
        """Write a change file and add it to what DuckDB reads."""
        self._n += 1
        path = self.root / f"change-{self._n}-{source}.parquet"
        pq.write_table(table, path)
        current = integrate([self.tables[source], table])
        schema = self.tables[source].schema
        rows = [dict(zip(schema.names, r, strict=True)) for r, w in sorted(
            current.items(), key=repr) for _ in range(w)]
        self.tables[source] = pa.Table.from_pylist(rows, schema=schema)
        return path

    def duckdb(self, sql: str) -> pa.Table:
        con = duckdb.connect()
        for name, table in self.tables.items():
            con.register(name, table)
        return con.execute(sql).to_arrow_table()


@pytest.fixture
def data(tmp_path: Path) -> Data:
    return Data(tmp_path)


def _read(data: Data, name: str = "v", *extra: Any) -> pa.Table:
    out = data.root / f"read-{name}.parquet"
    result = run("view", "read", data.state, name, "--output", out, *extra)
    assert result.exit_code == 0, result.output
    return pq.read_table(out)


def _create(data: Data, name: str = "v", sql: str | None = None) -> None:
    result = run("view", "create", data.state, name,
                 "--sql", f"@{data.sql_file}" if sql is None else sql, *data.source_flags())
    assert result.exit_code == 0, result.output


def _matches_duckdb(data: Data, name: str = "v", sql: str = VIEW_SQL) -> pa.Table:
    got = _read(data, name)
    want = data.duckdb(sql)
    assert got.num_rows > 0
    assert_zset_equal(got, want, what=f"view {name}")
    return got


def _apply(data: Data, source: str, table: pa.Table, name: str = "v",
           *extra: Any) -> pa.Table:
    """Apply a change file; check the view's change set against the view before/after."""
    before = _read(data, name)
    path = data.change_file(source, table)
    out = data.root / f"out-{path.stem}.parquet"
    result = run("view", "apply", data.state, name, source, path, "--output", out, *extra)
    assert result.exit_code == 0, result.output
    assert "applied" in result.output
    after = _read(data, name)
    if "LIMIT" in result.output:  # the change set is of the whole answer
        assert "applies when it is read" in result.output
    else:
        assert_zset_equal(integrate([before, pq.read_table(out)]), zset(after),
                          what="view before + the change set apply wrote")
    return after


def _weighted(table: pa.Table, weight: int) -> pa.Table:
    return table.append_column("_weight", pa.array([weight] * table.num_rows, pa.int64()))


def test_create_apply_read_match_duckdb(data: Data) -> None:
    _create(data)
    _matches_duckdb(data)

    # inserts: new sales, without _weight (every row an insert)
    _apply(data, "sales", _sales(200, 30))
    _matches_duckdb(data)

    # deletes: some existing sales, _weight -1
    gone = data.tables["sales"].take(pa.array([0, 3, 5, 121, 122, 201]))
    _apply(data, "sales", _weighted(gone, -1))
    _matches_duckdb(data)

    # updates: a customer renamed and moved (delete the old row, insert the new one);
    # and one sale's amount changed
    cust = data.tables["customer"]
    old = cust.filter(pa.compute.equal(cust["c_sk"], 4))
    new = pa.table({"c_sk": [4], "name": ["renamed"], "region": ["west"]}, schema=CUSTOMER)
    _apply(data, "customer", pa.concat_tables([_weighted(old, -1), _weighted(new, 1)]))
    _matches_duckdb(data)
    sales = data.tables["sales"]
    one = sales.filter(pa.compute.equal(sales["sk"], 17))
    changed = one.set_column(2, "amt", pa.array([Decimal("999.99")], pa.decimal128(9, 2)))
    _apply(data, "sales", pa.concat_tables([_weighted(one, -1), _weighted(changed, 1)]))
    got = _matches_duckdb(data)
    assert "renamed" in got["name"].to_pylist()

    # a customer that had no row arrives: its sales join now
    _apply(data, "customer", pa.table({"c_sk": [10], "name": ["late"], "region": ["north"]},
                                      schema=CUSTOMER))
    assert "late" in _matches_duckdb(data)["name"].to_pylist()


def test_order_by_limit_and_outputs(data: Data) -> None:
    """A top-N view reads in its order; --output .csv and the terminal table work."""
    _create(data, "top", TOP_SQL)
    want = data.duckdb(TOP_SQL)
    got = _read(data, "top")
    assert got.to_pylist() == want.to_pylist()
    _apply(data, "sales", _sales(300, 40), "top")
    want = data.duckdb(TOP_SQL)
    assert _read(data, "top").to_pylist() == want.to_pylist()

    csv = data.root / "top.csv"
    result = run("view", "read", data.state, "top", "--output", csv)
    assert result.exit_code == 0, result.output
    back = pacsv.read_csv(csv)
    assert back.column_names == ["name", "total"]
    assert back["name"].to_pylist() == want["name"].to_pylist()

    result = run("view", "read", data.state, "top")  # a table on the terminal
    assert result.exit_code == 0, result.output
    for name in want["name"].to_pylist():
        assert name in result.output
    assert "3 rows" in result.output

    result = run("view", "read", data.state, "top", "--limit", "1")
    assert result.exit_code == 0, result.output
    assert want["name"][0].as_py() in result.output
    assert want["name"][2].as_py() not in result.output
    assert "2 more rows" in result.output


def test_inline_sql_glob_sources_and_commit_id(data: Data) -> None:
    """--sql inline, a glob source; --commit-id applies a change file exactly once."""
    result = run("view", "create", data.state, "v", "--sql", VIEW_SQL,
                 "--source", f"sales={data.sales_dir}/part-*.parquet",
                 "--source", f"customer={data.customer}", "--unique", "customer=c_sk")
    assert result.exit_code == 0, result.output
    _matches_duckdb(data)
    path = data.change_file("sales", _sales(500, 10))
    first = run("view", "apply", data.state, "v", "sales", path, "--commit-id", "batch-1")
    assert first.exit_code == 0, first.output
    again = run("view", "apply", data.state, "v", "sales", path, "--commit-id", "batch-1")
    assert again.exit_code == 0, again.output
    assert "already applied" in again.output
    _matches_duckdb(data)  # once, not twice
    other = data.root / "other.parquet"
    pq.write_table(_sales(600, 2), other)
    conflict = run("view", "apply", data.state, "v", "sales", other, "--commit-id", "batch-1")
    assert_one_line_error(conflict, 2, "--commit-id")
    _matches_duckdb(data)


def test_inspect_verify_list(data: Data) -> None:
    _create(data)
    result = run("view", "inspect", data.state, "v")
    assert result.exit_code == 0, result.output
    assert "GROUP BY" in result.output
    assert "joinstate view" not in result.output.split("GROUP BY")[1].split("\n")[0]
    for needle in ("sales", "customer", "unique c_sk", "live"):
        assert needle in result.output, result.output
    facts = json.loads(run("view", "inspect", data.state, "v", "--json").output)
    assert facts["name"] == "v"
    assert facts["sql"].strip() == VIEW_SQL.strip()
    assert {s["name"] for s in facts["sources"]} == {"sales", "customer"}
    assert facts["rows"] == data.duckdb(VIEW_SQL).num_rows
    assert facts["pipeline"]["phase"] == "live"

    result = run("view", "verify", data.state, "v")
    assert result.exit_code == 0, result.output
    assert "consistent" in result.output

    _create(data, "top", TOP_SQL)
    result = run("view", "list", data.state)
    assert result.exit_code == 0, result.output
    assert "v" in result.output and "top" in result.output
    assert "ORDER BY" in result.output


# ---- errors ---------------------------------------------------------------------------


def test_bad_flags(data: Data) -> None:
    sql = f"@{data.sql_file}"
    cases: list[tuple[list[Any], tuple[str, ...]]] = [
        (["--sql", sql, "--source", "sales"], ("--source", "NAME=PATH")),
        (["--sql", sql, "--source", f"sales={data.root}/nope.parquet",
          "--source", f"customer={data.customer}"], ("--source sales", "does not exist")),
        (["--sql", sql, *data.source_flags()[:4], "--unique", "customer=nope"],
         ("--unique", "nope")),
        (["--sql", sql, *data.source_flags()[:4], "--unique", "other=c_sk"],
         ("--unique", "--source")),
        (["--sql", f"@{data.root}/missing.sql", *data.source_flags()], ("--sql",)),
        (["--sql", sql, "--source", f"sales={data.sales_dir}"], ("customer", "--source")),
        (["--sql", "SELECT name, lag(c_sk) OVER (ORDER BY c_sk) FROM customer",
          *data.source_flags()], ("--sql", "window function")),
        (["--sql", "SELEC broken", *data.source_flags()], ("--sql",)),
        (["--sql", sql, *data.source_flags(), "--strategy", "bulk"], ("--strategy",)),
        (["--sql", sql, *data.source_flags(), "--source", f"sales={data.customer}"],
         ("--source", "twice")),
    ]
    for flags, needles in cases:
        result = run("view", "create", data.state, "v", *flags)
        assert_one_line_error(result, 2, *needles)
        assert not data.state.exists(), flags  # nothing created
    result = run("view", "create", data.state, "bad~name", "--sql", sql, *data.source_flags())
    assert_one_line_error(result, 2, "NAME 'bad~name'")
    result = run("view", "create", data.state, "v", "--sql", sql, *data.source_flags(),
                 "--source", f"my.table={data.customer}")
    assert_one_line_error(result, 2, "--source my.table")
    assert not data.state.exists()

    _create(data)
    before = _read(data)
    change = data.change_file("sales", _sales(700, 3))
    for args, needles in [
        (["apply", data.state, "nope", "sales", change], ("nope", "v")),
        (["apply", data.state, "v", "orders", change], ("orders", "sales", "customer")),
        (["apply", data.state, "v", "sales", data.root / "none.parquet"], ("none.parquet",)),
        (["read", data.state, "v", "--output", data.root / "x.json"], ("--output", ".csv")),
        (["read", data.state, "v", "--limit", "0"], ("--limit",)),
        (["read", data.root / "nowhere", "v"], ("nowhere",)),
        (["inspect", data.state, "nope"], ("nope",)),
    ]:
        assert_one_line_error(run("view", *args), 2, *needles)
    assert_zset_equal(_read(data), zset(before), what="view after refused commands")


def test_refused_change_leaves_the_view(data: Data) -> None:
    """A delete of a row the source does not hold changes nothing."""
    _create(data)
    before = _read(data)
    ghost = _weighted(_sales(9000, 1), -1)
    path = data.root / "ghost.parquet"
    pq.write_table(ghost, path)
    result = run("view", "apply", data.state, "v", "sales", path)
    assert_one_line_error(result, 2, "sales")
    assert_zset_equal(_read(data), zset(before), what="view after a refused delete")


def test_existing_name_with_other_sql(data: Data) -> None:
    _create(data)
    before = _read(data)
    result = run("view", "create", data.state, "v", "--sql", TOP_SQL, *data.source_flags())
    out = assert_one_line_error(result, 2, "'v'", "joinstate drop", "GROUP BY")
    assert "joinstate view" not in out.split("GROUP BY")[1]  # the SQL as written
    assert_zset_equal(_read(data), zset(before), what="view after a refused create")
    # the same SQL again: the view is there and live
    again = run("view", "create", data.state, "v", "--sql", f"@{data.sql_file}",
                *data.source_flags())
    assert_one_line_error(again, 2, "already", "view apply")


def test_wrong_column_types(data: Data) -> None:
    """A source file or a change file whose column has another type is refused."""
    bad = data.sales_dir / "part-2.parquet"
    pq.write_table(pa.table({"sk": [900], "ck": pa.array([1], pa.int32()), "amt": ["12.50"],
                             "note": ["x"]}), bad)
    result = run("view", "create", data.state, "v", "--sql", f"@{data.sql_file}",
                 *data.source_flags())
    assert_one_line_error(result, 2, "--source sales", "part-2.parquet", "amt")
    assert not data.state.exists()
    bad.unlink()

    _create(data)
    before = _read(data)
    path = data.root / "bad-change.parquet"
    pq.write_table(pa.table({"sk": [901], "ck": pa.array([1], pa.int32()),
                             "amt": ["12.50"], "note": ["x"]}), path)
    result = run("view", "apply", data.state, "v", "sales", path)
    assert_one_line_error(result, 2, "amt")
    assert_zset_equal(_read(data), zset(before), what="view after a refused change")

    # a source whose column type the SQL cannot take (a string join key)
    strs = data.root / "customer-str.parquet"
    pq.write_table(pa.table({"c_sk": ["1"], "name": ["a"], "region": ["r"]}), strs)
    result = run("view", "create", data.state, "w", "--sql", f"@{data.sql_file}",
                 "--source", f"sales={data.sales_dir}", "--source", f"customer={strs}")
    assert_one_line_error(result, 2, "--sql")


def test_recorded_sql_is_what_was_written(data: Data) -> None:
    """The view re-attaches from the store alone (SQL and sources), as a new process would."""
    _create(data)
    moved = data.root / "moved"
    data.sales_dir.rename(moved)  # the source files are not needed after create
    data.customer.unlink()
    assert run("view", "read", data.state, "v").exit_code == 0
    path = data.change_file("sales", _sales(800, 5))
    result = run("view", "apply", data.state, "v", "sales", path)
    assert result.exit_code == 0, result.output
    assert_zset_equal(_read(data), data.duckdb(VIEW_SQL), what="view")
    counts = Counter(r["region"] for r in _read(data).to_pylist())
    assert sum(counts.values()) == _read(data).num_rows


def _corrupt_page(file: Path, row_group: int) -> bytes:
    """Flip one byte of ``row_group``'s first data page so that it cannot be decoded.

    The footer stays intact (the file is listed and counted); reading the row group
    fails.  Returns the file's original bytes.
    """
    original = file.read_bytes()
    meta = pq.ParquetFile(file).metadata.row_group(row_group).column(0)
    for offset in range(meta.data_page_offset, meta.data_page_offset + 256):
        data = bytearray(original)
        data[offset] ^= 0xFF
        file.write_bytes(bytes(data))
        try:
            pq.ParquetFile(file).read_row_group(row_group)
        except (OSError, pa.ArrowException):
            return original
    file.write_bytes(original)
    raise AssertionError(f"no byte of {file}'s row group {row_group} breaks its decoding")


def test_damaged_file_partial_load_then_resume(data: Data) -> None:
    """A page that cannot be decoded stops the load; --resume finishes it once restored."""
    bad = data.sales_dir / "part-1.parquet"
    pq.write_table(_sales(120, 80), bad, row_group_size=40, compression="snappy")
    original = _corrupt_page(bad, 1)
    flags = ["--sql", f"@{data.sql_file}", *data.source_flags(), "--batch-rows", 50,
             "--no-progress"]
    out = assert_one_line_error(run("view", "create", data.state, "v", *flags), 2,
                                str(bad), "row group 1", "--source sales", "partial",
                                "--resume", f"joinstate drop {data.state} v")
    assert "resume=True" not in out and "drop_pipeline" not in out, out
    for args in (["read", data.state, "v"],
                 ["apply", data.state, "v", "sales", data.change_file("sales", _sales(900, 1))]):
        assert_one_line_error(run("view", *args), 2, "population in progress", "--resume")
    again = run("view", "create", data.state, "v", *flags)  # without --resume: refused
    assert_one_line_error(again, 2, "--resume", "joinstate drop")
    bad.write_bytes(original)
    done = run("view", "create", data.state, "v", *flags, "--resume")
    assert done.exit_code == 0, done.output
    data.tables["sales"] = pa.concat_tables([_sales(0, 120), _sales(120, 80)])
    _matches_duckdb(data)


def test_damaged_file_before_anything_loads_keeps_nothing(data: Data) -> None:
    pq.write_table(_customers(), data.customer, compression="snappy")
    _corrupt_page(data.customer, 0)
    result = run("view", "create", data.state, "v", "--sql", f"@{data.sql_file}",
                 *data.source_flags())
    assert_one_line_error(result, 2, str(data.customer), "--source customer",
                          "nothing was loaded")
    assert not data.state.exists()


@pytest.mark.parametrize("sql", [
    "SELECT count(*) AS n, sum(amt) AS total, min(note) AS first_note FROM sales "
    "WHERE sk >= 1000",  # no row qualifies until the apply: the one row of a global aggregate
    "SELECT c.name, coalesce(sum(s.amt), 0) AS total, "
    "CASE WHEN count(s.sk) > 15 THEN 'big' ELSE 'small' END AS size "
    "FROM customer c LEFT JOIN sales s ON s.ck = c.c_sk GROUP BY c.name",
    "SELECT DISTINCT note FROM sales WHERE ck IN (SELECT c_sk FROM customer "
    "WHERE region = 'north') UNION ALL SELECT name FROM customer WHERE c_sk < 3",
])
def test_other_views_match_duckdb(data: Data, sql: str) -> None:
    _create(data, "w", sql)
    assert_zset_equal(_read(data, "w"), data.duckdb(sql), what="view after create")
    _apply(data, "sales", pa.concat_tables([_weighted(_sales(1000, 25), 1),
                                            _weighted(data.tables["sales"].slice(0, 4), -1)]),
           "w")
    assert_zset_equal(_read(data, "w"), data.duckdb(sql), what="view after apply")
