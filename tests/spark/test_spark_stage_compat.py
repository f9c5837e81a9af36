"""SparkPipeline state written by the one-job-per-stage layout is refused, with the remedy.

Before the distributed plan, a pipeline's state directory held one store per operator
stage (``q4/join13`` ...), described by a format-1 manifest.  Its stores are laid out
otherwise than the stages of a :class:`planner.distribute.DistributedPlan`, so no
operation may read them: ``tests/data/pipeline_specs.json`` keeps q4's format-1 manifest
spec as that code wrote it, and re-attaching to it must fail before anything is opened,
naming the format and what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_io.errors import ManifestError
from spark_io.manifest import PipelineManifest, pipeline_manifest_path

DATA = json.loads((Path(__file__).parents[1] / "data" / "pipeline_specs.json").read_text())


def test_a_format_1_state_dir_is_refused_with_its_remedy(tmp_path: Path) -> None:
    old = json.loads(DATA["spark_stages"]["q4/manifest"])
    assert "operators" in old  # the one-store-per-operator-stage spec
    path = pipeline_manifest_path(tmp_path, "q4")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "kind": "pipeline", **old, "shards": 2}))
    with pytest.raises(ManifestError, match=r"format 1 ran one Spark job per stage.*"
                                            r"use a new state_dir"):
        PipelineManifest.read(tmp_path, "q4")
