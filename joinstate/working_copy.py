"""Working copies of checkpointed stores: open one as exactly a given checkpoint.

A store that moves between machines (a Spark shard whose task lands on another executor)
is used through a local working copy.  The copy may be missing (a new machine), behind
(another machine committed since), or ahead (a task wrote and then failed before its
checkpoint): only a copy that records exactly the expected checkpoint, with nothing
written since, may be used as it is; every other case restores the checkpoint over it.

This sits above both :mod:`joinstate.store` and :mod:`joinstate.checkpoint` (it opens
stores and restores checkpoints), so neither of those imports the other's caller.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from joinstate.checkpoint import Location, is_replaceable, local_checkpoint, restore
from joinstate.errors import NotAStateStoreError, StateCorruptedError
from joinstate.store import StateStore

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from joinstate.options import StoreOptions

__all__ = ["How", "open_checkpoint"]

log = logging.getLogger(__name__)

How = Literal["local", "restored", "new"]
"""How :func:`open_checkpoint` got its store: the copy as it was, restored, or new."""


def open_checkpoint(
    uri: str, path: str | Path, checkpoint: str | None,
    options: StoreOptions | None = None, *, read_only: bool = False,
    filesystem: pafs.FileSystem | None = None,
) -> tuple[StateStore, How]:
    """Open the working copy ``path`` as exactly checkpoint ``checkpoint`` of ``uri``.

    The copy is opened as it is (``"local"``) if it records that checkpoint and RocksDB
    has written nothing since; otherwise (or if the copy is damaged) the checkpoint is
    restored over it (``"restored"``), so writes made after it (by a task that failed
    before its own checkpoint, say) are discarded.  ``checkpoint=None`` means the state was never
    checkpointed: the copy starts empty (``"new"``), whatever it held.  Only a joinstate
    store or working copy is ever replaced; anything else raises
    :class:`~joinstate.errors.NotAStateStoreError`.  Returns the open store and how.
    """
    target = Path(path)
    loc = Location.of(uri, filesystem)
    if checkpoint is None:
        if target.is_dir() and any(target.iterdir()):
            if not is_replaceable(target):
                raise NotAStateStoreError(
                    f"{target} holds files that are not a joinstate store; nothing was "
                    "changed; choose another directory for the working copies")
            shutil.rmtree(target)
        return StateStore(target, options, read_only=read_only), "new"
    mine = local_checkpoint(target)
    if mine is not None and mine.id == checkpoint and mine.location == loc.key \
            and (target / "CURRENT").exists():
        try:
            store = StateStore(target, options, read_only=read_only)
        except (StateCorruptedError, NotAStateStoreError) as exc:
            # A damaged working copy: the checkpoint is the state, restore it.
            log.warning("working copy %s cannot be opened (%s); restoring checkpoint %s",
                        target, exc, checkpoint)
        else:
            try:
                if store.last_sequence() == mine.sequence:
                    return store, "local"
            except BaseException:
                store.close()
                raise
            store.close()
    restore(uri, target, checkpoint=checkpoint, replace=True, filesystem=filesystem)
    return StateStore(target, options, read_only=read_only), "restored"
