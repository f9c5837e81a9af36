"""Driver-side checks of every argument of :class:`~spark_io.SparkJoin` and its methods.

Everything here runs before anything is written (no manifest, no directory) and before
any Spark job, so a wrong argument fails at once with an error naming the argument, the
value and what is accepted, instead of minutes later inside a task.  Join-spec
arguments raise :class:`joinstate.SchemaMismatchError`, population arguments
:class:`population.PopulationError`, checkpoint arguments :class:`joinstate.OptionsError`.

Join types accept Spark's spellings (case-insensitive, as ``DataFrame.join``) and are
normalised to joinstate's: see :data:`JOIN_TYPES`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import population
from joinstate import (
    JoinStateError,
    NotAStateStoreError,
    OptionsError,
    SchemaMismatchError,
    StoreOptions,
)
from joinstate.checkpoint import Location
from joinstate.names import validate_name
from population.strategy import PRESETS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate import SideName

__all__ = [
    "JOIN_TYPES",
    "check_bool",
    "check_checkpoint_uri",
    "check_columns",
    "check_dataframe",
    "check_keep_checkpoints",
    "check_keep_outputs",
    "check_key",
    "check_local_dir",
    "check_name",
    "check_op_id",
    "check_options",
    "check_path",
    "check_retain",
    "check_shards",
    "check_side",
    "check_small_side",
    "check_sole_owner",
    "check_state_dir",
    "check_strategy",
    "check_suffixes",
    "normalize_how",
]

JOIN_TYPES: dict[str, str] = {
    "inner": "inner",
    "outer": "full", "full": "full", "fullouter": "full", "full_outer": "full",
    "left": "left", "leftouter": "left", "left_outer": "left",
    "right": "right", "rightouter": "right", "right_outer": "right",
    "semi": "left_semi", "leftsemi": "left_semi", "left_semi": "left_semi",
    "anti": "left_anti", "leftanti": "left_anti", "left_anti": "left_anti",
}
"""Every accepted ``how`` (Spark's join-type names) and the joinstate join type it means."""

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def normalize_how(how: object) -> str:
    """The joinstate name of join type ``how`` (Spark's aliases accepted, any case)."""
    key = how.strip().lower() if isinstance(how, str) else None
    if key is None or key not in JOIN_TYPES:
        raise SchemaMismatchError(
            f"how={how!r} is not a join type; accepted (case-insensitive, as Spark's "
            f"DataFrame.join): {', '.join(JOIN_TYPES)}"
        )
    return JOIN_TYPES[key]


def check_name(name: object) -> str:
    """A join name (it names the manifest file and each shard's join)."""
    return validate_name("join", name)


def check_key(value: object, argument: str, *, optional: bool = False) -> list[str] | None:
    """A list of column names (a single string is one column, as in Spark)."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(c, str) and c for c in value):
        return list(value)
    raise SchemaMismatchError(
        f"{argument}={value!r} must be a column name or a non-empty list of column names"
        + (" (or None)" if optional else "")
    )


def check_shards(shards: object) -> int:
    """The shard count: an int between 1 and 65536."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 65_536:
        raise SchemaMismatchError(f"shards={shards!r} must be an int between 1 and 65536")
    return shards


def check_suffixes(suffixes: object) -> tuple[str, str]:
    """Two different strings appended to clashing output column names."""
    if (isinstance(suffixes, (list, tuple)) and len(suffixes) == 2
            and all(isinstance(s, str) for s in suffixes) and suffixes[0] != suffixes[1]):
        return (suffixes[0], suffixes[1])
    raise SchemaMismatchError(
        f"suffixes={suffixes!r} must be a pair of two different strings, e.g. ('', '_right')")


def check_options(options: object) -> StoreOptions | None:
    """``None`` or a :class:`joinstate.StoreOptions`."""
    if options is None or isinstance(options, StoreOptions):
        return options
    raise SchemaMismatchError(
        f"options={options!r} must be a joinstate.StoreOptions or None")


def check_path(value: object, argument: str) -> Path:
    """A local path (``str`` or ``os.PathLike``), resolved."""
    if isinstance(value, str) and value and "://" not in value:
        return Path(value).resolve()
    if isinstance(value, os.PathLike) and not isinstance(os.fspath(value), bytes):
        return Path(os.fspath(value)).resolve()
    raise SchemaMismatchError(
        f"{argument}={value!r} must be a local directory path (str or pathlib.Path) that "
        "every executor sees; URIs such as s3:// or hdfs:// are not supported"
    )


def check_state_dir(value: object) -> Path:
    """``state_dir`` as a path (:func:`check_path`) that is a directory or can become one.

    Checked on the driver before any Spark job: an existing file there, or under it,
    raises :class:`joinstate.NotAStateStoreError` naming it.
    """
    path = check_path(value, "state_dir")
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise NotAStateStoreError(
                    f"state_dir={str(path)!r}: {parent} is a file, not a directory; nothing "
                    "was changed; choose a directory (missing ones are created)")
            break
    return path


def check_keep_outputs(keep: object) -> int | None:
    """How many operation output directories to keep: ``None`` (all) or an int >= 1."""
    if keep is None or (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1):
        return keep
    raise SchemaMismatchError(
        f"keep_outputs={keep!r} must be None (keep every output) or an int >= 1")


def check_side(side: object, argument: str = "side") -> SideName:
    """``"left"`` or ``"right"``."""
    if side == "left" or side == "right":
        return "left" if side == "left" else "right"
    raise SchemaMismatchError(f"{argument}={side!r} must be 'left' or 'right'")


def check_small_side(side: object) -> SideName | None:
    """``None`` (decided from row counts), ``"left"`` or ``"right"``."""
    if side is None:
        return None
    if side == "left" or side == "right":
        return "left" if side == "left" else "right"
    raise population.PopulationError(
        f"small_side={side!r} must be None (the side with fewer rows), 'left' or 'right'")


def check_strategy(strategy: object) -> str:
    """A population strategy name: a :func:`population.preset` name or ``"auto"``."""
    if strategy == "auto":
        return "auto"
    if not isinstance(strategy, str):
        raise population.PopulationError(
            f"strategy={strategy!r} must be one of {(*PRESETS, 'auto')} (a name: Spark tasks "
            "record it in the manifest)"
        )
    population.preset(strategy)  # raises PopulationError naming the accepted names
    return strategy


def check_bool(value: object, argument: str) -> bool:
    """A real ``bool`` (``resume=1`` is refused: it is easy to pass by position)."""
    if isinstance(value, bool):
        return value
    raise SchemaMismatchError(f"{argument}={value!r} must be True or False")


def check_op_id(value: object, argument: str, *, optional: bool = True) -> str | None:
    """An operation or sink id: it becomes a directory name and part of commit ids."""
    if value is None and optional:
        return None
    if isinstance(value, str) and _ID.match(value):
        return value
    raise SchemaMismatchError(
        f"{argument}={value!r} must be 1-200 characters of letters, digits, '.', '_' or '-' "
        "(starting with a letter or digit)" + (", or None" if optional else "")
    )


def check_retain(retain: object) -> int:
    """How many micro-batch ids each shard remembers: an int >= 1."""
    if isinstance(retain, int) and not isinstance(retain, bool) and retain >= 1:
        return retain
    raise SchemaMismatchError(f"retain={retain!r} must be an int >= 1")


def check_dataframe(value: object, argument: str) -> Any:
    """A pyspark ``DataFrame`` (classic or Spark Connect)."""
    from pyspark.sql import DataFrame

    if isinstance(value, DataFrame):
        return value
    raise SchemaMismatchError(
        f"{argument} must be a pyspark.sql.DataFrame, got {type(value).__name__}")


def check_columns(names: Sequence[str], available: Sequence[str], argument: str) -> None:
    """Every column of ``names`` is in ``available``."""
    missing = [n for n in names if n not in available]
    if missing:
        raise SchemaMismatchError(
            f"{argument} names {'columns' if len(missing) > 1 else 'column'} "
            f"{', '.join(map(repr, missing))} not in the DataFrame (columns: "
            f"{', '.join(available)})"
        )


def check_checkpoint_uri(value: object) -> str | None:
    """``None`` or a checkpoint location: a URI pyarrow.fs opens, or a local path.

    A local path is made absolute here, on the driver: executors resolve relative
    paths against their own working directories.
    """
    if value is None:
        return None
    return check_location(value, "checkpoint_uri")


def check_location(value: object, argument: str,
                   error: type[JoinStateError] = OptionsError) -> str:
    """A directory by local path (made absolute here, on the driver) or pyarrow.fs URI."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise error(
            f"{argument}={value!r} must be a directory path or a URI pyarrow.fs opens "
            "(s3://bucket/prefix, gs://..., hdfs://..., file:///...) that the driver and "
            "every executor reach by that name")
    try:
        Location.of(value)
    except OptionsError as exc:
        raise error(f"{argument}: {exc}") from exc
    return value if "://" in value else str(Path(value).resolve())


def check_output_uri(value: object) -> str | None:
    """``None`` (the default location) or where operation outputs go (:func:`check_location`)."""
    return None if value is None else check_location(value, "output_uri")


def check_same_output_uri(given: str | None, stored: str, owner: str, state_dir: Path) -> None:
    """Refuse an explicit ``output_uri`` other than the one ``owner`` was created with."""
    if given is not None and given != stored:
        raise OptionsError(
            f"output_uri={given!r}: {owner} in {state_dir} was created with output_uri "
            f"{stored!r}, which a resumed populate() and apply(op_id=...) replays rely on; "
            "omit output_uri to use it, or use a new state_dir")


def check_local_dir(value: object, checkpoint_uri: str | None) -> str | None:
    """Where executors keep working copies of checkpointed shards (needs a checkpoint_uri).

    Kept as given: a relative path is resolved on each executor (its working directory).
    """
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "://" in value:
        raise OptionsError(
            f"local_dir={value!r} must be None or a local directory path (relative paths "
            "are resolved on each executor, in its working directory)")
    if checkpoint_uri is None:
        raise OptionsError(
            f"local_dir={value!r} needs checkpoint_uri=: without checkpoints every task "
            "must see the one copy of each shard, in state_dir")
    return value


def check_keep_checkpoints(keep: object) -> int:
    """How many checkpoints each shard keeps at its location: an int >= 1."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise OptionsError(f"keep_checkpoints={keep!r} must be an int >= 1")
    return keep


def check_sole_owner(others: list[tuple[Path, str | None]], checkpoint_uri: str | None,
                     state_dir: Path) -> None:
    """Refuse to share a state directory when checkpoints are involved.

    ``others``: the other joins' and pipelines' manifests in ``state_dir`` with their
    ``checkpoint_uri`` (:func:`spark_io.manifest.other_owners`).  Their shards are the
    same stores, and a checkpointed shard is replaced by its checkpoint whenever its
    copy differs, which would discard the other owner's writes.
    """
    clash = [p for p, uri in others if checkpoint_uri is not None or uri is not None]
    if clash:
        raise OptionsError(
            f"state_dir={str(state_dir)!r} already holds {', '.join(p.name for p in clash)}; "
            "a state directory with checkpoints (checkpoint_uri) holds one join or pipeline: "
            "use a state_dir of its own")
