"""What a store keeps of a SQL view, so that it can be reopened from the store alone.

:func:`planner.compile` fixes a view's definition in the store; beside it this module
keeps a *view record* (``__meta__`` key :func:`joinstate.names.view_sql_key`): the SQL
as written, each source's exact Arrow schema and unique key, the row counts the view was
compiled with, the join orders chosen (estimates from the data at the time decided
them: the same SQL attaches to the same definition later, whatever the data has become),
free-form metadata of the caller (the command keeps the paths it loaded
from), and a digest of the stored definition.

Why the digest: a record left behind by a pipeline that was dropped and built again
another way must never be taken for the new one's; a record whose digest is not the
stored definition's is ignored.

:func:`planner.reopen` compiles the recorded SQL over the recorded sources again; the compiler
checks the result against the stored definition, so a record that no longer compiles to
it (another joinstate version) is refused, never pushed into.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

import joinstate
from joinstate.names import pipeline_spec_key, view_sql_key

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ViewRecord", "record_view", "stored_view"]

_FORMAT = 2


@dataclass(frozen=True)
class ViewRecord:
    """A compiled view as the store keeps it (see the module docstring).

    ``sources`` maps a source name to ``(schema, unique key)``; ``rows`` holds the row
    counts given when it was compiled; ``metadata`` is the caller's (JSON-able);
    ``also_unique``: the further unique keys of the sources that declare some;
    ``join_orders``: each inner join group's order, as the compiler met them;
    ``peels``: the joins peeled off each GROUP BY over joins (eager aggregation), as the
    compiler met them (a record written before eager aggregation has none: nothing
    peeled).
    Records written before sources were kept have ``sources`` empty: such a view is
    quoted in messages but cannot be reopened.
    """

    sql: str
    sources: Mapping[str, tuple[pa.Schema, tuple[str, ...] | None]] = field(
        default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    also_unique: Mapping[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    join_orders: tuple[tuple[str, ...], ...] = ()
    peels: tuple[int, ...] = ()

    def to_json(self, definition: bytes) -> bytes:
        """The record's bytes, bound to the stored ``definition``."""
        return json.dumps({
            "format": _FORMAT, "sql": self.sql,
            "definition": hashlib.sha256(definition).hexdigest(),
            "sources": {n: {"schema": base64.b64encode(s.serialize().to_pybytes()).decode(),
                            "unique_key": None if uk is None else list(uk),
                            **({"also_unique": [list(k) for k in self.also_unique[n]]}
                               if self.also_unique.get(n) else {})}
                        for n, (s, uk) in self.sources.items()},
            "rows": dict(self.rows), "metadata": dict(self.metadata),
            "join_orders": [list(o) for o in self.join_orders],
            **({"peels": list(self.peels)} if any(self.peels) else {}),
        }).encode()

    @classmethod
    def from_json(cls, raw: bytes, definition: bytes) -> ViewRecord | None:
        """The record in ``raw`` if it belongs to ``definition``; None otherwise."""
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("sql"), str) or \
                    doc.get("definition") != hashlib.sha256(definition).hexdigest():
                return None
            sources = {
                str(n): (pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s["schema"]))),
                         None if s.get("unique_key") is None else tuple(s["unique_key"]))
                for n, s in (doc.get("sources") or {}).items()}
            rows = {str(n): int(r) for n, r in (doc.get("rows") or {}).items()}
            also = {str(n): tuple(tuple(str(c) for c in k) for k in s["also_unique"])
                    for n, s in (doc.get("sources") or {}).items() if s.get("also_unique")}
            metadata = doc.get("metadata") or {}
            orders = tuple(tuple(str(n) for n in o) for o in doc.get("join_orders") or ())
            peels = tuple(int(k) for k in doc.get("peels") or ())
        except (ValueError, TypeError, KeyError, AttributeError, pa.ArrowException):
            return None
        return cls(doc["sql"], sources, rows, metadata if isinstance(metadata, dict) else {},
                   also, orders, peels)



def record_view(store: joinstate.StateStore, name: str, record: ViewRecord) -> None:
    """Keep ``record`` for pipeline ``name``, bound to its stored definition."""
    definition = store.meta_get(pipeline_spec_key(name))
    if definition is None:
        msg = f"internal: pipeline {name!r} has no stored definition to record a view for"
        raise joinstate.JoinSpecMismatchError(msg)
    store.meta_put(view_sql_key(name), record.to_json(definition))


def stored_view(store: joinstate.StateStore, name: str) -> ViewRecord | None:
    """The view record of pipeline ``name``, or None (not compiled from SQL, or stale)."""
    definition = store.meta_get(pipeline_spec_key(name))
    raw = store.meta_get(view_sql_key(name))
    if definition is None or raw is None:
        return None
    return ViewRecord.from_json(raw, definition)

