"""SparkPipeline state made before the graph was its own object re-attaches.

``tests/data/pipeline_specs.json`` holds, for TPC-DS q4 cut into stages (2 shards), the
Spark manifest's spec and every stage store's stored definition as the code before the
renovation wrote them; the stages built from the graph now must store the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import joinstate
import spark_io.pipeline as sp
from bench import q4
from joinstate.names import pipeline_spec_key
from spark_io.stages import plan_stages

DATA = json.loads((Path(__file__).parents[1] / "data" / "pipeline_specs.json").read_text())


def test_q4_stages_store_what_they_stored(tmp_path: Path) -> None:
    want = DATA["spark_stages"]
    graph = q4.define_q4()
    plan = plan_stages(graph, "q4")
    spec = sp._spec("q4", 2, graph, plan)  # noqa: SLF001 - the manifest's, without a session
    assert json.dumps(spec, sort_keys=True) == want["q4/manifest"]
    assert sorted(f"q4/{s.label}" for s in plan.stages) == sorted(
        k for k in want if k != "q4/manifest")
    with joinstate.StateStore(tmp_path / "s") as store:
        for stage in plan.stages:
            name = f"q4_{stage.label}"
            stage.build(store, name).compile()
            assert store.meta_get(pipeline_spec_key(name)) == want[f"q4/{stage.label}"].encode()
