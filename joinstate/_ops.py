"""Staged writes of one push, grouped per column family.

Staging (instead of writing as we go) is what makes a push atomic: validation finishes
before anything reaches RocksDB, and the whole push then goes into one ``WriteBatch``
(or, for a bulk load, to a sink that writes sorted SST files).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import rocksdict as rd

__all__ = ["Op", "Ops"]

Op = tuple[str, bytes, bytes | None]
"""A staged write: (column family, key, value); value None deletes the key."""


class Ops:
    """Staged writes of one push, kept as per-column-family blocks.

    Blocks keep the WriteBatch fill loop tight (one handle per block, no per-row lookups)
    and let a bulk loader take each family's keys as one list.
    """

    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks: list[tuple[str, list[bytes], list[bytes | None]]] = []

    def put_many(self, cf: str, keys: list[bytes], values: list[bytes]) -> None:
        self.blocks.append((cf, keys, values))  # type: ignore[arg-type]

    def put(self, cf: str, key: bytes, value: bytes | None) -> None:
        if self.blocks and self.blocks[-1][0] == cf and len(self.blocks[-1][1]) < 4096:
            self.blocks[-1][1].append(key)
            self.blocks[-1][2].append(value)
        else:
            self.blocks.append((cf, [key], [value]))

    def delete(self, cf: str, key: bytes) -> None:
        self.put(cf, key, None)

    def __len__(self) -> int:
        return sum(len(k) for _, k, _ in self.blocks)

    def flat(self) -> list[Op]:
        """Every write as a (cf, key, value) tuple, in staging order."""
        return [(cf, k, v) for cf, ks, vs in self.blocks for k, v in zip(ks, vs, strict=True)]

    def fill(self, wb: rd.WriteBatch, handle: Callable[[str], Any]) -> None:
        """Add every write to ``wb`` (each with its column-family handle: pitfall 1)."""
        for cf, keys, values in self.blocks:
            h = handle(cf)
            put = wb.put
            if None in values:
                for k, v in zip(keys, values, strict=True):
                    if v is None:
                        wb.delete(k, h)
                    else:
                        put(k, v, h)
            else:
                for k, v in zip(keys, values, strict=True):
                    put(k, v, h)
