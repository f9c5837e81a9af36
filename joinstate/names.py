r"""Every column-family name and every ``__meta__`` key of a state store, in one place.

An index is named after what it indexes — a *source* (a join's input side, or a
pipeline collection) and the key columns — not after the operator that asked for it, so
that two operators needing the same rows on the same key can share one index.  A join
``sales`` has the sources ``sales.left`` and ``sales.right``.

Column families of one index ``<cf>``:

* ``<cf>``        rows with a non-NULL key, keyed by 8-byte key hash + canonical key + ...
* ``<cf>.nulls``  rows whose key has a NULL (they never match; outer joins emit them)
* ``<cf>.deg``    per-key total weight, for sides whose degree an outer/semi/anti join needs

``__meta__`` holds bookkeeping only, never data; its keys are ``<kind>\x00<parts>``:
the layout version, one catalog entry per join, each join's phase, commit records,
per-column-family counters (big-endian int64, updated in the same write as the data),
the measured costs of applying change batches (the planner's history), the intents of
multi-step changes in flight (:mod:`joinstate.intents`) and undo records
(``undo\x00<tag>\x00<sequence>``, :mod:`joinstate.transaction`).

Column families of one group-by aggregation ``<base>`` (:mod:`joinstate.aggregate`):

* ``agg[<base>]``         one entry per group: its key values and aggregate state
* ``agg[<base>].minmax``  the multiset of (group, value) -> count behind min/max

The family of one pipeline source's row record (:mod:`joinstate._source_rows`):

* ``rows[<pipeline>~<source>]``  the 128-bit hashes of every row the source holds, one
  value per (hash bucket, push), which lets the source refuse a retraction of a row
  it does not hold

Every family of pipeline ``p`` starts with ``ix.p~``, ``agg[p~`` or ``rows[p~``
(:func:`pipeline_column_families`); ``~`` is not allowed in names, so no other
pipeline's or join's family does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from joinstate.errors import JoinStateError, SchemaMismatchError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "COUNTER_NAMES",
    "DROP_INTENT_PREFIX",
    "INGEST_INTENT_PREFIX",
    "LAYOUT_VERSION_KEY",
    "META_CF",
    "UNDO_PREFIX",
    "aggregate_cf",
    "aggregate_values_cf",
    "batch_cost_key",
    "batch_cost_prefix",
    "commit_key",
    "commit_prefix",
    "counter_key",
    "counter_prefix",
    "degree_cf",
    "drop_intent_key",
    "file_safe",
    "index_cf",
    "ingest_intent_key",
    "initial_outputs_key",
    "is_keyed_cf",
    "join_spec_key",
    "join_spec_prefix",
    "nulls_cf",
    "option_aliases",
    "phase_key",
    "pipeline_aggregate_of",
    "pipeline_column_families",
    "pipeline_index_of",
    "pipeline_owner",
    "pipeline_spec_key",
    "planner_history_key",
    "planner_history_prefix",
    "progress_key",
    "progress_prefix",
    "source_of_join_side",
    "source_rows_cf",
    "source_rows_of",
    "undo_prefix",
    "validate_name",
    "view_sql_key",
    "window_rows_cf",
]

META_CF = "__meta__"
"""The bookkeeping column family (catalog, phases, commit records, counters)."""

LAYOUT_VERSION_KEY = b"layout_version"

COUNTER_NAMES = ("rows", "entries", "seq", "keys")
"""Counters kept per column family: total weight, stored entries, batch sequence, keys."""

_INDEX = "ix."
_ROWS = "rows["
_NULLS = ".nulls"
_DEGREE = ".deg"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}$")


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid join/source name, else raise naming ``kind``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SchemaMismatchError(
            f"{kind} name {name!r} must be 1-128 characters of letters, digits, '_' or '-'"
        )
    return name


def source_of_join_side(join: str, side: str) -> str:
    """The source a join's side indexes: ``<join>.<side>``."""
    return f"{join}.{side}"


def index_cf(source: str, key: Sequence[str]) -> str:
    """The column family of the index of ``source`` on ``key``."""
    return f"{_INDEX}{source}[{','.join(key)}]"


def window_rows_cf(pipeline: str, stream: str, window: str, key: str) -> str:
    """The index a window operator keeps of its input's rows, by partition.

    ``ix.<pipeline>~<stream>~<window>[<key>]``: the form of an index of ``stream`` owned
    by one reader (the window operator ``window``), so that inspecting, verifying and
    dropping a pipeline treat it as the index it is; ``key`` is the column holding each
    row's encoded partition.
    """
    return index_cf(f"{pipeline}~{stream}~{window}", [key])


def nulls_cf(index: str) -> str:
    """The family holding the index's NULL-key rows."""
    return index + _NULLS


def degree_cf(index: str) -> str:
    """The family holding the index's per-key total weights."""
    return index + _DEGREE


def aggregate_cf(base: str) -> str:
    """The family of the groups of aggregation ``base`` (one entry per group).

    The brackets close the name, so no ``base`` makes it collide with another
    aggregation's families (or an index's, which start with ``ix.``).
    """
    return f"agg[{base}]"


def aggregate_values_cf(base: str) -> str:
    """The family of the (group, value) multiset behind aggregation ``base``'s min/max."""
    return aggregate_cf(base) + ".minmax"


def source_rows_cf(pipeline: str, source: str) -> str:
    """The family of the row record of ``source`` of pipeline ``pipeline``.

    Not an index: its keys do not start with a key hash (no prefix extractor), and its
    ``entries`` counter counts row hashes, not RocksDB keys.
    """
    return f"{_ROWS}{pipeline}~{source}]"


def source_rows_of(cf: str) -> tuple[str, str] | None:
    """``(pipeline, source)`` of a row-record family name, None for any other family."""
    if not (cf.startswith(_ROWS) and cf.endswith("]") and "~" in cf):
        return None
    pipeline, _, source = cf[len(_ROWS):-1].partition("~")
    return pipeline, source


def pipeline_index_of(cf: str, pipeline: str) -> tuple[str, str | None, list[str]] | None:
    """``(stream, reader, key)`` of an index family of pipeline ``pipeline``, else None.

    The index of a stream shared by its readers is ``ix.<pipeline>~<stream>[<key>]``;
    one owned by a single reader (sharing off) ``ix.<pipeline>~<stream>~<reader>[<key>]``.
    Its ``.nulls`` and ``.deg`` families are not indexes of their own (None).
    """
    prefix = f"{_INDEX}{pipeline}~"
    if not (cf.startswith(prefix) and cf.endswith("]") and "[" in cf[len(prefix):]):
        return None
    label, key = cf[len(prefix):-1].split("[", 1)
    stream, _, reader = label.partition("~")
    return stream, reader or None, key.split(",")


def pipeline_aggregate_of(cf: str, pipeline: str) -> str | None:
    """The operator label of an aggregate family ``agg[<pipeline>~<label>]``, else None."""
    prefix = f"agg[{pipeline}~"
    if not (cf.startswith(prefix) and cf.endswith("]")):
        return None
    return cf[len(prefix):-1]


def pipeline_column_families(families: Sequence[str], pipeline: str) -> list[str]:
    """Those of ``families`` (a store's column families) that hold pipeline ``pipeline``.

    Indexes (with their ``.nulls``/``.deg`` families), aggregates (with ``.minmax``) and
    source row records: what dropping the pipeline must drop.
    """
    prefixes = (f"{_INDEX}{pipeline}~", f"agg[{pipeline}~", f"{_ROWS}{pipeline}~")
    return [cf for cf in families if cf.startswith(prefixes)]


def is_keyed_cf(cf: str) -> bool:
    """Whether ``cf``'s keys start with the 8-byte key hash (prefix extractor applies)."""
    return cf.startswith(_INDEX) and not cf.endswith(_NULLS)


def option_aliases(cf: str) -> tuple[str, ...]:
    """Names by which ``StoreOptions.index_overrides`` may address family ``cf``.

    The family's own name, and for an index family its source (``sales.right``; the
    NULL-key and degree families as ``sales.right.nulls`` / ``sales.right.deg``), so a
    user can tune a join side without knowing the naming scheme.
    """
    if cf.startswith(_INDEX) and "]" in cf:
        source = cf[len(_INDEX):cf.index("[")]
        return (cf, source + cf[cf.rindex("]") + 1:])
    return (cf,)


# ---- __meta__ keys -----------------------------------------------------------------------

def join_spec_prefix() -> bytes:
    """Prefix of every catalog entry."""
    return b"join\x00"


def join_spec_key(join: str) -> bytes:
    """Catalog entry of join ``join`` (its JSON spec)."""
    return join_spec_prefix() + join.encode()


def pipeline_spec_key(pipeline: str) -> bytes:
    """Catalog entry of pipeline ``pipeline`` (its JSON definition)."""
    return b"pipeline\x00" + pipeline.encode()


def view_sql_key(pipeline: str) -> bytes:
    """The SQL a pipeline was compiled from (owned by the SQL compiler), as JSON.

    Bookkeeping for messages: it quotes the stored view when other SQL is compiled under
    the same name, and names the definition it was recorded with.
    """
    return b"sql\x00" + pipeline.encode()


def pipeline_owner(pipeline: str) -> str:
    """The owner name of a pipeline's commit records and progress markers.

    ``~`` is not allowed in join names, so a pipeline never shares them with a join.
    """
    return f"pipeline~{pipeline}"


def initial_outputs_key(pipeline: str) -> bytes:
    """The change sets a new pipeline owes its outputs (a global aggregate's first row).

    Written when the pipeline is created, returned with the first push that carries
    rows, and deleted by it (see ``joinstate.Pipeline.push``).
    """
    return b"initial\x00" + pipeline.encode()


def phase_key(join: str) -> bytes:
    """The phase (``population`` / ``live``) of join ``join``."""
    return b"phase\x00" + join.encode()


def commit_prefix(owner: str) -> bytes:
    """Prefix of every commit record of ``owner`` (a join)."""
    return b"commit\x00" + owner.encode() + b"\x00"


def commit_key(owner: str, commit_id: str) -> bytes:
    """The commit record of ``commit_id`` (a digest of the change set, then its output)."""
    if not isinstance(commit_id, str) or not commit_id:
        raise SchemaMismatchError(f"commit_id={commit_id!r} must be a non-empty string")
    return commit_prefix(owner) + commit_id.encode()


def progress_key(join: str, side: str) -> bytes:
    """A population progress marker of one side of join ``join`` (owned by the driver)."""
    return b"progress\x00" + join.encode() + b"\x00" + side.encode()


def progress_prefix(join: str) -> bytes:
    """Prefix of every progress marker of join ``join``."""
    return b"progress\x00" + join.encode() + b"\x00"


def planner_history_prefix() -> bytes:
    """Prefix of every record of what earlier runs measured (owned by the planner)."""
    return b"planner\x00"


def planner_history_key(subject: str) -> bytes:
    """What earlier runs measured for ``subject`` (a join or a pipeline), as JSON.

    Bookkeeping, not data: the planner reads it to prefer what was measured over its
    static estimates.
    """
    return planner_history_prefix() + subject.encode()


def batch_cost_prefix(owner: str) -> bytes:
    """Prefix of every batch-cost record of ``owner`` (a join, or a pipeline's owner name)."""
    return b"cost\x00" + owner.encode() + b"\x00"


def batch_cost_key(owner: str, input_name: str, strategy: str) -> bytes:
    """Measured costs of applying change batches to one input of ``owner`` one way.

    ``input_name`` is a join side (``left``/``right``) or a pipeline source; ``strategy``
    the way the batches were applied (``incremental``/``recompute``).  Written by the
    executor after each batch, read by the planner's batch rule; a hint, never needed
    for correctness (a missing record means built-in defaults).
    """
    return batch_cost_prefix(owner) + input_name.encode() + b"\x00" + strategy.encode()


INGEST_INTENT_PREFIX = b"ingest\x00"
"""Prefix of the records of SST ingestions in flight (see ``Database.ingest_durably``)."""


def ingest_intent_key(intent: str) -> bytes:
    """The record of one SST ingestion in flight."""
    return INGEST_INTENT_PREFIX + intent.encode()


DROP_INTENT_PREFIX = b"drop\x00"
"""Prefix of the records of column-family drops in flight (``Database.drop_durably``)."""


def drop_intent_key(intent: str) -> bytes:
    """The record of one drop of column families in flight."""
    return DROP_INTENT_PREFIX + intent.encode()


UNDO_PREFIX = b"undo\x00"
"""Prefix of every undo record (:mod:`joinstate.transaction`)."""


def undo_prefix(tag: str) -> bytes:
    """The key prefix of the undo records of ``tag`` (no NUL byte allowed in it)."""
    if not tag or "\x00" in tag:
        msg = f"undo tag {tag!r} must be a non-empty string without NUL bytes"
        raise JoinStateError(msg)
    return UNDO_PREFIX + tag.encode() + b"\x00"


def file_safe(name: str) -> str:
    """``name`` (a column family's, say) usable as a file name: other characters -> ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def counter_prefix(cf: str) -> bytes:
    """Prefix of every counter of column family ``cf``."""
    return b"stat\x00" + cf.encode() + b"\x00"


def counter_key(cf: str, name: str) -> bytes:
    """The counter ``name`` (one of :data:`COUNTER_NAMES`) of column family ``cf``."""
    return counter_prefix(cf) + name.encode()
