"""A damaged derived file (beside the store) is rebuilt, never a failed open."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

import joinstate

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip"])
def test_load_arrays_treats_a_damaged_file_as_missing(tmp_path: Path, damage: str) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        store.save_arrays("thing", [1, 2], a=np.arange(1000))
        assert store.load_arrays("thing", [1, 2]) is not None
        f = next((tmp_path / "s" / "derived").glob("thing*.npz"))
        raw = bytearray(f.read_bytes())
        if damage == "truncate":
            raw = raw[: len(raw) // 2]
        elif damage == "garbage":
            raw = bytearray(b"not a zip file at all" * 10)
        else:
            raw[len(raw) // 2] ^= 0xFF
        f.write_bytes(bytes(raw))
        got = store.load_arrays("thing", [1, 2])
        # a flipped byte inside the compressed payload may go unnoticed by numpy, but a
        # damaged archive never raises out of load_arrays
        if damage != "flip":
            assert got is None
