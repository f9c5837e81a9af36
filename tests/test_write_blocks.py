"""Write blocks (packed or listed) and the bulk loader's sort and SST write.

An index stages a batch's inserts packed; a ``WriteBatch`` commit makes ``bytes`` of
them, and the bulk loader sorts and writes them without doing so for the whole run.
Both must deliver exactly the staged key/value pairs, in byte order for SST files,
whatever the key widths and however the run is cut into slices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest
import rocksdict as rd
from hypothesis import given, settings
from hypothesis import strategies as st

import joinstate
from joinstate import WriteBlock
from joinstate._bytes import Bytes
from joinstate.sstfiles import sorted_order as _sorted_order
from joinstate.sstfiles import write_sorted as _write_sorted

if TYPE_CHECKING:
    from pathlib import Path


def test_packed_block_materialises_on_demand() -> None:
    keys = Bytes.from_list([b"k1", b"k2\x00", b""])
    values = Bytes.from_list([b"v", b"", b"\x00"])
    block = WriteBlock("cf", keys, values)
    assert len(block) == 3
    assert not block.deletes
    k, v = block.arrow()
    assert k.type == pa.large_binary() and k.to_pylist() == [b"k1", b"k2\x00", b""]
    assert v.to_pylist() == [b"v", b"", b"\x00"]
    assert block.keys == [b"k1", b"k2\x00", b""]
    assert block.values == [b"v", b"", b"\x00"]


def test_listed_block_with_a_delete_has_no_arrow_form() -> None:
    block = WriteBlock("cf", [b"a", b"b"], [b"1", None])
    assert block.deletes
    with pytest.raises(joinstate.JoinStateError, match="deletes"):
        block.arrow()
    assert WriteBlock("cf", [b"a"], [b"1"]).arrow()[0].to_pylist() == [b"a"]


def test_block_length_mismatch_is_refused() -> None:
    with pytest.raises(joinstate.JoinStateError, match="2 keys but 1 values"):
        WriteBlock("cf", [b"a", b"b"], [b"1"])


def test_single_puts_do_not_append_to_a_packed_block(tmp_path: Path) -> None:
    """``put`` after a packed ``put_many`` opens a new block; a commit writes all."""
    with joinstate.StateStore(tmp_path / "s") as store:
        txn = store.transaction()
        txn.put_many("t", Bytes.from_list([b"a", b"b"]), Bytes.from_list([b"1", b"2"]))
        txn.put("t", b"c", b"3")
        txn.put("t", b"d", b"4")
        txn.delete("t", b"a")
        assert [len(b) for b in txn.blocks] == [2, 3]
        txn.commit()
        cf = store.cf("t")
        assert {k: cf.get(k) for k in (b"a", b"b", b"c", b"d")} == {
            b"a": None, b"b": b"2", b"c": b"3", b"d": b"4"}


def _sst_items(path: Path) -> list[tuple[bytes, bytes]]:
    opts = rd.Options(raw_mode=True)
    reader = rd.Rdict(str(path.parent / "db"), options=opts)
    try:
        reader.ingest_external_file([str(path)])
        return list(reader.items())
    finally:
        reader.close()
        rd.Rdict.destroy(str(path.parent / "db"), opts)


@settings(deadline=None, max_examples=40)
@given(data=st.data(), width=st.one_of(st.none(), st.integers(1, 12)),
       put_rows=st.sampled_from([1, 3, 7, 4096]))
def test_sorted_sst_holds_every_pair_in_byte_order(
        tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, width: int | None,
        put_rows: int) -> None:
    """Fixed-width keys (numpy's sort, NUL bytes included) and variable-width keys
    (Arrow's sort) both come out in memcmp order, across put slices of any size."""
    keys = data.draw(st.sets(st.binary(min_size=width or 0, max_size=width or 9),
                             min_size=1, max_size=60))
    ordered = list(keys)
    data.draw(st.randoms()).shuffle(ordered)
    values = [bytes([i % 256]) * (i % 5) for i in range(len(ordered))]
    k = pa.array(ordered, pa.large_binary())
    v = pa.array(values, pa.large_binary())
    order = _sorted_order(k)
    assert [ordered[i] for i in order.tolist()] == sorted(ordered)
    path = tmp_path_factory.mktemp("sst") / "f.sst"
    writer = rd.SstFileWriter(options=rd.Options(raw_mode=True))
    writer.open(str(path))
    _write_sorted(writer, k, v, order, put_rows)
    writer.finish()
    assert _sst_items(path) == sorted(zip(ordered, values, strict=True))


@pytest.mark.parametrize("keys", [[b"ab\x00", b"zz\x01", b"ab\x00"], [b"a", b"bb", b"a"]])
def test_a_duplicate_key_in_a_run_is_corruption(keys: list[bytes]) -> None:
    with pytest.raises(joinstate.StateCorruptedError, match="one key twice"):
        _sorted_order(pa.array(keys, pa.large_binary()))


def test_sorted_order_of_a_sliced_array() -> None:
    """A run chunk that is a slice of a bigger array (non-zero offset) sorts its own rows."""
    base = pa.array([b"zz", b"cc", b"aa", b"bb", b"00"], pa.large_binary())
    part = base.slice(1, 3)
    assert np.asarray(_sorted_order(part)).tolist() == [1, 2, 0]
