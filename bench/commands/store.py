"""``joinstate inspect``, ``verify`` and ``drop``: what a store holds, whether it is sound.

``inspect`` and ``verify`` open stores read-only (safe while a writer runs) and work on
a Spark state directory shard by shard; ``drop`` deletes one join or pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import joinstate
from bench.commands.common import (
    CONTEXT,
    EXIT_OK,
    SIDES,
    CliError,
    describe_progress,
    progress_of,
    require_existing,
    single_store,
    stage_of,
    stores_of,
)
from joinstate.names import commit_prefix, pipeline_spec_key
from joinstate.summary import side_facts

__all__ = ["drop", "inspect", "verify"]


def _inspect(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``{"joins": [...], "pipelines": [...]}`` of one store, opened read-only."""
    with joinstate.StateStore(path, read_only=True) as store:
        joins = []
        for name in store.joins():
            join = store.join(name)
            stats = join.stats()
            joins.append({
                "name": name,
                "how": join.how,
                "phase": stats["phase"],
                "population_progress": {s: progress_of(join.progress(s)) for s in SIDES},
                "commit_ids": len(store.meta_keys(commit_prefix(name))),
                "sides": {s: side_facts(stats[s]) for s in SIDES},
                "stats": stats,
                "summary": join.summary(stats),
            })
        pipelines = []
        for name in joinstate.inspect.stored_names(store):
            facts = joinstate.inspect.describe(store, name)
            facts["summary"] = joinstate.inspect.summary_of(facts)
            pipelines.append(facts)
        return {"joins": joins, "pipelines": pipelines}


@click.command(context_settings=CONTEXT,
               short_help="Every join and pipeline of a store (read-only).")
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(state_dir: Path, as_json: bool) -> int:
    """Show every join and pipeline in a state store (read-only: safe while a writer runs).

    Per join: type, phase, population progress, recorded commit ids; per side: layout,
    rows, entries, distinct keys, bytes, L0 files, auto-compaction.  Per pipeline (read
    from the store: no Python definition needed): phase, sources, outputs, population
    progress, recorded commit ids; per index and aggregate: rows, entries, bytes, L0
    files, auto-compaction.  A Spark state directory (subdirectories shard-NNNNN, or
    <stage>/shard-NNNNN for a SparkPipeline) lists every shard.

    \b
    Examples:
      joinstate inspect state/
      joinstate inspect spark-state/ --json | jq '.stores[].joins[].sides'
      joinstate inspect state/ --json | jq '.stores[].pipelines[].indexes'
    """
    stores: list[dict[str, Any]] = []
    for shard, path in stores_of(state_dir):
        stores.append({"shard": shard, "path": str(path), "stage": stage_of(state_dir, path),
                       **_inspect(path)})
    if as_json:
        click.echo(json.dumps({"state_dir": str(state_dir), "stores": stores}, indent=2,
                              default=str))
        return EXIT_OK
    for store in stores:
        where = store["path"] if store["shard"] is None else f"shard {store['shard']} " \
            f"({store['path']})"
        if store["stage"] is not None:
            where = f"stage {store['stage']} {where}"
        if len(stores) > 1 or not (store["joins"] or store["pipelines"]):
            click.echo(f"{where}: {len(store['joins'])} join(s), "
                       f"{len(store['pipelines'])} pipeline(s)")
        for j in store["joins"]:
            click.echo(j["summary"])
            progress = j["population_progress"]
            if any(v is not None for v in progress.values()):
                click.echo(f"  population progress: {describe_progress(progress)}")
            click.echo(f"  recorded commit ids: {j['commit_ids']:,}")
        for p in store["pipelines"]:
            click.echo(p["summary"])
            if p["population_progress"]:
                names = [str(s["name"]) for s in p["sources"]]
                click.echo("  population progress: "
                           f"{describe_progress(p['population_progress'], names)}")
            click.echo(f"  recorded commit ids: {p['commit_ids']:,}")
    return EXIT_OK


# ---- verify --------------------------------------------------------------------------


@click.command(context_settings=CONTEXT,
               short_help="Read every block, check every counter (read-only).")
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def verify(state_dir: Path, as_json: bool) -> int:
    """Read every block of a store; check every join's and pipeline's counters (read-only).

    Pipelines: every index's row and entry counters, every aggregate's group counter,
    every source's row record and the saved derived entry maps.
    Exit status: 0 consistent, 1 corrupted (StateCorruptedError), 2 any other error
    (no store, unreadable path ...).  A Spark state directory is verified shard by shard.

    \b
    Examples:
      joinstate verify state/ && echo consistent
    """
    results = []
    for shard, path in stores_of(state_dir):
        with joinstate.StateStore(path, read_only=True) as store:
            results.append({"shard": shard, "path": str(path), **store.verify()})
    if as_json:
        click.echo(json.dumps({"state_dir": str(state_dir), "consistent": True,
                               "stores": results}, indent=2))
        return EXIT_OK
    n_joins = 0
    for r in results:
        prefix = "" if r["shard"] is None else f"shard {r['shard']}: "
        for name, sides in r["joins"].items():
            n_joins += 1
            counts = "; ".join(
                f"{s} {c['rows']:,} rows in {c['entries']:,} entries"
                + (f" (+{c['null_rows']:,} NULL-key rows)" if c.get("null_rows") else "")
                for s, c in sides.items()
            )
            click.echo(f"{prefix}join {name}: {counts}")
    n_pipelines = n_indexes = n_aggregates = 0
    for r in results:
        prefix = "" if r["shard"] is None else f"shard {r['shard']}: "
        for name, parts in r.get("pipelines", {}).items():
            ix, agg = parts["indexes"], parts["aggregates"]
            n_pipelines, n_indexes, n_aggregates = (
                n_pipelines + 1, n_indexes + len(ix), n_aggregates + len(agg))
            rows = sum(c["rows"] + c["null_rows"] for c in ix.values())
            entries = sum(c["entries"] + c["null_entries"] for c in ix.values())
            records = parts.get("source_rows", {})
            click.echo(
                f"{prefix}pipeline {name}: {len(ix)} indexes ({rows:,} rows in {entries:,} "
                f"entries), {len(agg)} aggregates "
                f"({sum(a['groups'] for a in agg.values()):,} groups)"
                + (f", {len(records)} source row records" if records else ""))
    verified = f"{n_joins} join(s)" + (
        f", {n_pipelines} pipeline(s) ({n_indexes} indexes, {n_aggregates} aggregates)"
        if n_pipelines else "")
    click.echo(f"consistent: {verified} in {len(results)} store(s) at {state_dir}")
    return EXIT_OK


# ---- drop ----------------------------------------------------------------------------


@click.command(context_settings=CONTEXT,
               short_help="Delete a join or pipeline and all of its state.")
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.argument("name", metavar="NAME")
@click.option("--yes", is_flag=True, help="Confirm: the state is deleted irreversibly.")
def drop(state_dir: Path, name: str, yes: bool) -> int:
    """Delete a join or pipeline and all of its state (irreversible; needs --yes).

    For a population that cannot be resumed (its input changed), or a join to be
    created again with other keys.  Indexes, catalog entry, phase, progress markers and
    commit records all go; other joins and pipelines of the store are untouched.

    \b
    Examples:
      joinstate drop state/ sales --yes
      joinstate drop state/ sales --yes && joinstate populate state/ sales ...
    """
    path = single_store(state_dir, "drop")
    require_existing(path)
    with joinstate.StateStore(path) as store:
        if name in store.joins():
            kind = "join"
        elif store.meta_get(pipeline_spec_key(name)) is not None:
            kind = "pipeline"
        else:
            pipelines = joinstate.inspect.stored_names(store)
            raise CliError(f"no join or pipeline {name!r} in {path} (joins: "
                           f"{', '.join(store.joins()) or 'none'}; pipelines: "
                           f"{', '.join(pipelines) or 'none'})")
        if not yes:
            raise CliError(f"drop deletes {kind} {name!r} and all of its state in {path} "
                           "irreversibly; add --yes to confirm")
        if kind == "join":
            store.drop_join(name)
        else:
            store.drop_pipeline(name)
    click.echo(f"dropped {kind} {name} from {path}")
    return EXIT_OK

