"""The baseline: leave RocksDB's own compaction alone (what the other policies improve on)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compaction.control import CompactionControl
    from compaction.policy import Event

__all__ = ["RocksDBDefaults"]


class RocksDBDefaults:
    """Does nothing: auto-compaction stays on for every column family.

    It exists so the symmetric baseline goes through exactly the same driver code as
    the other strategies, and differs from them only in the policy.
    """

    name = "rocksdb-defaults"

    def observe(self, event: Event, control: CompactionControl) -> None:
        """Ignore every event."""
