"""spark_io for a PySpark user: fail early, in one line, and leave nothing behind.

* executors whose Python lacks joinstate: one :class:`spark_io.ExecutorEnvironmentError`
  before any job, naming ``PYSPARK_PYTHON`` and both interpreters;
* Spark's join-type aliases are accepted and normalised; every bad argument is refused
  on the driver, naming it, before a manifest or directory is written;
* library errors raised in a task come back as the same class, Spark's trace kept aside;
* a failed operation leaves no empty output directory; ``keep_outputs`` bounds them.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from sparkdata import (
    CUSTOMER,
    OUT_COLS,
    SALES,
    add,
    apply_to,
    changes_df,
    customer,
    customers,
    df,
    sales,
    spark_join,
    zset,
)

import joinstate
import joinstate.errors
import population
import population.errors
import spark_io
import spark_io.errors
from joinstate.graph import JoinNode
from spark_io.errors import translate_task_error

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark



def make_job(spark: SparkSession, state: Path, how: str, left: Counter, right: Counter,
             **kw: object) -> spark_io.SparkJoin:
    return spark_io.SparkJoin(
        spark, kw.pop("name", "customer_sales"),  # type: ignore[arg-type]
        left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
        left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how=how,
        state_dir=state, shards=kw.pop("shards", 2), **kw,  # type: ignore[arg-type]
    )


# ---- 1. executors without joinstate ---------------------------------------------------------

def _python_without_joinstate(tmp_path: Path) -> str:
    """A Python of the driver's minor version that cannot import joinstate (from tmp_path)."""
    want = "{}.{}".format(*sys.version_info[:2])
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if not Path(cand).exists():
            continue
        done = subprocess.run(
            [cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2]); import joinstate"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60)
        if done.returncode != 0 and done.stdout.strip() == want:
            return cand
    venv = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    return str(venv / "bin" / "python")


BROKEN_EXECUTORS = """
import json, sys, time
from pathlib import Path
import spark_io

state = Path(sys.argv[2])
t0 = time.monotonic()
spark = spark_io.local_session("no-joinstate", cores=1,
                               conf={"spark.pyspark.python": sys.argv[1]})
left = spark.createDataFrame([(1, "a")], "k long, v string")
right = spark.createDataFrame([(1, 2.0)], "k long, x double")
try:
    spark_io.SparkJoin(spark, "j", left=left, right=right, left_key="k", right_key="k",
                       state_dir=state, shards=2)
    result = {"raised": None}
except Exception as exc:
    result = {"raised": type(exc).__name__, "message": str(exc),
              "is_sparkio": isinstance(exc, spark_io.SparkIOError)}
result["seconds"] = time.monotonic() - t0
result["state_exists"] = state.exists()


import joinstate

graph = joinstate.Graph().output(
    "all", joinstate.source("s", __import__("pyarrow").schema([("k", "int64")])))

try:
    spark_io.SparkPipeline(spark, graph, state.with_name("pipeline-state"))
    result["pipeline"] = None
except Exception as exc:
    result["pipeline"] = type(exc).__name__
    result["pipeline_message"] = str(exc)
result["pipeline_state_exists"] = state.with_name("pipeline-state").exists()
print("RESULT " + json.dumps(result))
spark.stop()
"""


@pytest.mark.slow  # starts a second Spark (its own JVM) in a subprocess: ~12 s
def test_executors_without_joinstate_fail_before_any_job(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    python = _python_without_joinstate(tmp_path)
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_EXECUTORS)
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    env["PYSPARK_PYTHON"] = python  # what a PATH without the venv amounts to
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script), python, str(tmp_path / "state")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, done.stdout + done.stderr
    result = json.loads(lines[0][len("RESULT "):])
    assert result["raised"] == "ExecutorEnvironmentError", result
    assert result["is_sparkio"]
    message = result["message"]
    first = message.splitlines()[0]
    assert first.startswith("ModuleNotFoundError: No module named"), message  # reason first
    assert "\n" not in message and "Traceback" not in message
    for needle in ("PYSPARK_PYTHON", "spark.pyspark.python", python, sys.executable):
        assert needle in message, (needle, message)
    assert not result["state_exists"]  # checked before the manifest is written
    assert result["pipeline"] == "ExecutorEnvironmentError", result  # SparkPipeline too
    assert result["pipeline_message"].startswith("ModuleNotFoundError: No module named")
    assert "PYSPARK_PYTHON" in result["pipeline_message"]
    assert not result["pipeline_state_exists"]
    assert took < 60, took


def test_check_executors_reports_and_caches(spark: SparkSession) -> None:
    info = spark_io.check_executors(spark)
    assert info["joinstate"]["version"] == joinstate.__version__
    assert {"population", "spark_io", "python", "version"} <= set(info)
    assert spark_io.check_executors(spark) is info  # cached per session


# ---- 2. arguments checked on the driver -------------------------------------------------------

def test_join_type_aliases_are_normalised(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(21)
    left, right = Counter(customers(rng, 10)), Counter(sales(rng, 10, 5))
    state = tmp_path / "state"
    aliases = dict(spark_io.JOIN_TYPES)
    aliases.update({"OUTER": "full", "LeftOuter": "left", "Left_Anti": "left_anti"})
    for i, (alias, expected) in enumerate(sorted(aliases.items())):
        job = make_job(spark, state, alias, left, right, name=f"j{i}")
        assert job.how == expected, alias
        stored = json.loads((state / "_spark" / f"j{i}.json").read_text())
        assert stored["how"] == expected
    # Another spelling of the same join type re-attaches to the same spec.
    assert make_job(spark, state, "outer", left, right, name="full").how == "full"
    assert make_job(spark, state, "FULL_OUTER", left, right, name="full").how == "full"
    with pytest.raises(joinstate.JoinSpecMismatchError, match="how"):
        make_job(spark, state, "leftouter", left, right, name="full")


def test_outer_alias_runs_a_full_join(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(22)
    left, right = Counter(customers(rng, 30)), Counter(sales(rng, 120, 40))
    job = make_job(spark, tmp_path / "state", "outer", left, right)
    total = zset(job.populate(), OUT_COLS)
    assert total == spark_join(spark, left, right, "full")
    changes = [(customer(rng, 5, "-new"), 1), (customer(rng, 77, "-new"), 1)]
    total = add(total, zset(job.apply("left", changes_df(spark, changes, CUSTOMER)),
                            OUT_COLS))
    assert total == spark_join(spark, apply_to(left, changes), right, "full")


def test_bad_arguments_are_refused_before_anything_is_written(spark: SparkSession,
                                                             tmp_path: Path) -> None:
    rng = random.Random(23)
    left, right = Counter(customers(rng, 10)), Counter(sales(rng, 10, 5))
    fresh = tmp_path / "never"
    bad_join = [
        ({"how": "outer_join"}, joinstate.SchemaMismatchError,
         r"how='outer_join'.*full_outer.*left_anti"),
        ({"how": None}, joinstate.SchemaMismatchError, r"how=None"),
        ({"shards": 0}, joinstate.SchemaMismatchError, r"shards=0"),
        ({"shards": "4"}, joinstate.SchemaMismatchError, r"shards='4'"),
        ({"suffixes": ("_x", "_x")}, joinstate.SchemaMismatchError, r"suffixes="),
        ({"keep_outputs": 0}, joinstate.SchemaMismatchError, r"keep_outputs=0"),
        ({"name": "a/b"}, joinstate.SchemaMismatchError, r"'a/b'"),
        ({"left_key": ["nope"]}, joinstate.SchemaMismatchError, r"left_key.*'nope'"),
        ({"left_key": []}, joinstate.SchemaMismatchError, r"left_key=\[\]"),
        ({"left_unique_key": ["zz"]}, joinstate.SchemaMismatchError, r"left_unique_key"),
        ({"options": {"probe": "scan"}}, joinstate.SchemaMismatchError, r"options="),
        ({"state_dir": "s3://bucket/x"}, joinstate.SchemaMismatchError, r"state_dir="),
    ]
    for kw, cls, match in bad_join:
        how = kw.pop("how", "inner")
        base = {"left": df(spark, left, CUSTOMER), "right": df(spark, right, SALES),
                "left_key": ["c_customer_sk"], "right_key": ["ss_customer_sk"],
                "state_dir": fresh, "shards": 2, "name": "j"}
        base.update(kw)
        name = base.pop("name")
        with pytest.raises(cls, match=match):
            spark_io.SparkJoin(spark, name, how=how, **base)  # type: ignore[arg-type]
        assert not fresh.exists(), kw
    with pytest.raises(joinstate.SchemaMismatchError, match="SparkSession"):
        spark_io.SparkJoin("spark", "j", left=df(spark, left, CUSTOMER),  # type: ignore[arg-type]
                           right=df(spark, right, SALES), left_key="c_customer_sk",
                           right_key="ss_customer_sk", state_dir=fresh)
    assert not fresh.exists()

    state = tmp_path / "state"
    job = make_job(spark, state, "inner", left, right)
    outputs = state / "_spark" / "outputs"
    manifest = (state / "_spark" / "customer_sales.json").read_text()
    for kw, match in [({"strategy": "fast"}, r"strategy='fast'.*symmetric.*auto"),
                      ({"strategy": None}, r"strategy=None"),
                      ({"small_side": "big"}, r"small_side='big'")]:
        with pytest.raises(population.PopulationError, match=match):
            job.populate(**kw)  # type: ignore[arg-type]
    with pytest.raises(joinstate.SchemaMismatchError, match="resume='yes'"):
        job.populate(resume="yes")  # type: ignore[arg-type]
    changes = changes_df(spark, [(customer(rng, 1), 1)], CUSTOMER)
    for kw, match in [({"side": "middle"}, r"side='middle'"),
                      ({"op_id": "a/b"}, r"op_id='a/b'"),
                      ({"op_id": ""}, r"op_id=''"),
                      ({"changes": [1, 2]}, r"changes must be a pyspark")]:
        call = {"side": "left", "changes": changes, **kw}
        with pytest.raises(joinstate.SchemaMismatchError, match=match):
            job.apply(call.pop("side"), call.pop("changes"), **call)  # type: ignore[arg-type]
    for kw, match in [({"side": "up"}, r"side='up'"), ({"retain": 0}, r"retain=0"),
                      ({"sink_id": "a:b"}, r"sink_id='a:b'"),
                      ({"output_path": 3}, r"output_path=3")]:
        call = {"side": "right", "output_path": tmp_path / "out", **kw}
        with pytest.raises(joinstate.SchemaMismatchError, match=match):
            job.foreach_batch_sink(call.pop("side"), call.pop("output_path"),  # type: ignore[arg-type]
                                   **call)
    assert not outputs.exists()
    assert not (tmp_path / "out").exists()
    assert (state / "_spark" / "customer_sales.json").read_text() == manifest  # untouched


# ---- 3. task errors come back as the library's classes -----------------------------------------

def _public_error_classes() -> list[type[BaseException]]:
    out: dict[type[BaseException], None] = {}
    for module in (joinstate.errors, population.errors, spark_io.errors):
        for name in module.__all__:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, joinstate.JoinStateError):
                out[cls] = None
    return list(out)


@pytest.mark.parametrize("cls", _public_error_classes(), ids=lambda c: c.__name__)
def test_every_library_error_is_translated(cls: type[BaseException]) -> None:
    spark_text = (
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "/x/spark_io/_worker.py", line 1, in __call__\n'
        "    raise Something\n"
        "ValueError: an earlier cause\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        f"{cls.__module__}.{cls.__qualname__}: shard 3: what went wrong\n\n"
        "JVM stacktrace:\norg.apache.spark.SparkException: Job aborted\n"
    )
    original = RuntimeError(spark_text)
    err = translate_task_error(original)
    assert type(err) is cls
    assert str(err).startswith("shard 3: what went wrong")
    assert err.spark_error is original  # type: ignore[union-attr]
    assert translate_task_error(RuntimeError("java.lang.OutOfMemoryError: x")) is None


def test_task_error_reaches_the_driver_as_its_class_and_leaves_no_output(
        spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(24)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 60, 25))
    job = make_job(spark, tmp_path / "state", "inner", left, right, keep_outputs=3)
    job.populate()
    outputs = job.outputs_dir
    before = sorted(p.name for p in outputs.iterdir())
    ghost = [(customer(rng, 5, "-never-inserted"), -1)]  # retracts a row that is not there
    with pytest.raises(joinstate.OverRetractionError) as info:
        job.apply("left", changes_df(spark, ghost, CUSTOMER), op_id="bad-op")
    err = info.value
    assert "(raised in a Spark task)" in str(err)
    assert "Traceback" not in str(err) and "JVM" not in str(err)
    assert err.__cause__ is None and err.__suppress_context__
    # The task reported the error instead of failing: no Spark failure, no stack at all.
    assert err.spark_error is None  # type: ignore[attr-defined]
    assert any("op_id='bad-op'" in note for note in getattr(err, "__notes__", []))
    assert sorted(p.name for p in outputs.iterdir()) == before  # no empty directory left
    assert not (outputs / "bad-op").exists()

    # ---- 4. retention: at most keep_outputs=3 directories, the newest ones ---------------
    for i in range(4):
        changes = [(customer(rng, 1 + i, "-r"), 1)]
        out = job.apply("left", changes_df(spark, changes, CUSTOMER), op_id=f"ok-{i}")
    assert sorted(p.name for p in outputs.iterdir()) == ["ok-1", "ok-2", "ok-3"]
    assert job.last_report is not None
    assert out.count() == job.last_report.rows_out  # the one just returned is intact

    unlimited = spark_io.SparkJoin.open(spark, "customer_sales", tmp_path / "state",
                                        keep_outputs=None)
    for i in range(4, 6):
        unlimited.apply("left", changes_df(spark, [(customer(rng, 100 + i, "-r"), 1)],
                                           CUSTOMER), op_id=f"ok-{i}")
    assert sorted(p.name for p in outputs.iterdir()) == [f"ok-{i}" for i in range(1, 6)]


def test_failed_population_without_output_leaves_no_directory(spark: SparkSession,
                                                              tmp_path: Path) -> None:
    """A first job that fails before any output: the directory goes, the manifest says
    interrupted, and resume=True recreates it."""
    rng = random.Random(25)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 50, 25))
    job = make_job(spark, tmp_path / "state", "inner", left, right)
    # A shard holding rows no population put there makes the first task fail at once.
    import pyarrow as pa

    from spark_io.manifest import shard_path
    with joinstate.StateStore(shard_path(job.state_dir, 0)) as store:
        store_join = job.manifest.join(store)
        store_join.push("left", pa.Table.from_pylist(
            [{"c_customer_sk": None, "c_name": "x", "c_birth": None, "c_balance": None,
              "c_flag": None, "c_seen": None, "c_score": None}],
            schema=job.manifest.left.schema))
    with pytest.raises(spark_io.PopulationStateError):
        job.populate()
    assert list(job.outputs_dir.iterdir()) == []


# ---- 5. import spark_io without pyspark ---------------------------------------------------

HIDE_PYSPARK = """
import sys

class HidePySpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HidePySpark())
"""


def test_import_without_pyspark_says_what_to_install(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_PYSPARK)
    env = {**__import__("os").environ, "PYTHONPATH": str(site)}
    probe = textwrap.dedent("""
        try:
            import spark_io
        except ImportError as exc:
            print(type(exc).__name__, exc.name)
            print(exc)
        import joinstate, population  # the core still imports
        print("core ok")
    """)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "SparkNotInstalledError pyspark"
    assert "pip install 'joinstate[spark]'" in lines[1]
    assert lines[-1] == "core ok"

    plain = subprocess.run([sys.executable, "-c", "import spark_io"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1
    last = plain.stderr.strip().splitlines()[-1]
    assert last.startswith("spark_io.errors.SparkNotInstalledError:")
    assert "pip install 'joinstate[spark]'" in last
    assert len(plain.stderr.splitlines()) < 12  # one short trace, no chained one


# ---- 6. checkpoint arguments, checked before anything is written ---------------------------

def test_checkpoint_arguments_are_refused_before_anything_is_written(
        spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(26)
    left, right = Counter(customers(rng, 10)), Counter(sales(rng, 10, 5))
    fresh = tmp_path / "never"
    bad = [
        ({"checkpoint_uri": "foo://bucket/x"}, r"checkpoint_uri.*foo://bucket/x"),
        ({"checkpoint_uri": ""}, r"checkpoint_uri=''"),
        ({"checkpoint_uri": 7}, r"checkpoint_uri=7"),
        ({"local_dir": tmp_path / "local"}, r"local_dir=.*needs checkpoint_uri"),
        ({"checkpoint_uri": tmp_path / "ck", "local_dir": "s3://b/x"}, r"local_dir='s3://b/x'"),
        ({"checkpoint_uri": tmp_path / "ck", "keep_checkpoints": 0}, r"keep_checkpoints=0"),
    ]
    for kw, match in bad:
        with pytest.raises(joinstate.OptionsError, match=match):
            make_job(spark, fresh, "inner", left, right, **kw)
        with pytest.raises(joinstate.OptionsError, match=match):
            spark_io.SparkPipeline(spark, _pipeline_definition("inner"), fresh, **kw)
        assert not fresh.exists(), kw
        assert not (tmp_path / "ck").exists() and not (tmp_path / "local").exists()

    state = tmp_path / "state"
    make_job(spark, state, "inner", left, right, checkpoint_uri=tmp_path / "ck")
    manifest = (state / "_spark" / "customer_sales.json").read_text()
    with pytest.raises(joinstate.JoinSpecMismatchError, match="checkpoint_uri"):
        make_job(spark, state, "inner", left, right, checkpoint_uri=tmp_path / "other")
    with pytest.raises(joinstate.JoinSpecMismatchError, match="checkpoint_uri"):
        make_job(spark, state, "inner", left, right)  # re-attached without checkpoints
    # A checkpointed state directory holds one join: shard stores are shared by the
    # joins of a directory, and restoring one would discard the other's writes.
    with pytest.raises(joinstate.OptionsError, match=r"customer_sales\.json.*one join"):
        make_job(spark, state, "inner", left, right, name="another")
    with pytest.raises(joinstate.OptionsError, match=r"customer_sales\.json"):
        spark_io.SparkPipeline(spark, _pipeline_definition("inner"), state,
                               checkpoint_uri=tmp_path / "ck2")
    assert (state / "_spark" / "customer_sales.json").read_text() == manifest
    assert sorted(p.name for p in (state / "_spark").iterdir()) == ["customer_sales.json"]
    job = spark_io.SparkJoin.open(spark, "customer_sales", state)
    assert job.checkpoint_uri == str(tmp_path / "ck")  # from the manifest
    with pytest.raises(joinstate.OptionsError, match="keep_checkpoints=-1"):
        spark_io.SparkJoin.open(spark, "customer_sales", state, keep_checkpoints=-1)


# ---- 7. SparkPipeline: Spark's join types, its arguments, its outputs ----------------------

PL = pa.schema([("k", pa.int64()), ("v", pa.string())])
PR = pa.schema([("rk", pa.int32()), ("x", pa.float64())])


def _pipeline_definition(how: str) -> joinstate.Graph:
    left = joinstate.source("l", PL)
    right = joinstate.source("r", PR, unique_key="rk")
    return joinstate.Graph().output("joined", left.join(right, on=("k", "rk"), how=how))


def test_pipeline_takes_spark_join_types(spark: SparkSession, tmp_path: Path) -> None:
    for alias, expected in sorted(spark_io.JOIN_TYPES.items()):
        for spelled in (alias, alias.upper()):
            graph = _pipeline_definition(spelled)
            joins = [n for n in graph.nodes if isinstance(n, JoinNode)]
            assert [n.how for n in joins] == [expected], spelled
    sp = spark_io.SparkPipeline(spark, _pipeline_definition("leftouter"), tmp_path / "a")
    stored = json.loads((tmp_path / "a" / "_spark" / "pipeline-pipeline.json").read_text())
    assert '"how": "left"' in json.dumps(stored["graph"])
    # Another spelling of the same definition re-attaches.
    assert spark_io.SparkPipeline(spark, _pipeline_definition("LEFT_OUTER"), tmp_path / "a"
                                  ).stages == sp.stages
    with pytest.raises(joinstate.SchemaMismatchError, match=r"how='sideways'.*leftouter"):
        spark_io.SparkPipeline(spark, _pipeline_definition("sideways"), tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_pipeline_arguments_are_refused_before_anything_is_written(
        spark: SparkSession, tmp_path: Path) -> None:
    fresh = tmp_path / "never"
    good = _pipeline_definition("inner")

    def materialized() -> joinstate.Graph:
        return joinstate.Graph().output("m", joinstate.source("l", PL), materialize=True)

    def broken() -> joinstate.Graph:
        return joinstate.Graph().output("o", joinstate.source("l", PL).join(
            joinstate.source("r", PR), on=("k", "nope")))

    bad: list[tuple[dict[str, Any], type[BaseException], str]] = [
        ({"shards": 0}, joinstate.SchemaMismatchError, r"shards=0"),
        ({"keep_outputs": 0}, joinstate.SchemaMismatchError, r"keep_outputs=0"),
        ({"name": "a/b"}, joinstate.SchemaMismatchError, r"'a/b'"),
        ({"options": {"probe": "scan"}}, joinstate.SchemaMismatchError, r"options="),
        ({"state_dir": "hdfs://nn/x"}, joinstate.SchemaMismatchError, r"state_dir="),
        ({"definition": "q4"}, joinstate.SchemaMismatchError,
         r"graph must be a joinstate\.Graph"),
        ({"definition": lambda p: None}, joinstate.SchemaMismatchError,
         r"a definition function is no longer called: pass the graph it built"),
        ({"definition": broken}, joinstate.SchemaMismatchError, r"no column 'nope'"),
    ]
    for kw, cls, match in bad:
        call: dict[str, Any] = {"definition": good, "state_dir": fresh, **kw}
        with pytest.raises(cls, match=match):
            graph = call.pop("definition")
            if graph is broken:  # building the graph is part of the call
                graph = graph()
            spark_io.SparkPipeline(spark, graph, call.pop("state_dir"), **call)
        assert not fresh.exists(), kw
    # A materialized output is no refusal: SparkPipeline.read returns its contents.
    assert spark_io.SparkPipeline(spark, materialized(), tmp_path / "m").outputs == ("m",)
    sp = spark_io.SparkPipeline(spark, good, tmp_path / "state")
    l_frame = spark.createDataFrame([(1, "a")], "k long, v string")
    for call, cls, match in [
            (lambda: sp.populate({}), joinstate.SchemaMismatchError, "non-empty dict"),
            (lambda: sp.populate({"nope": l_frame}), joinstate.SchemaMismatchError,
             "no source 'nope'"),
            (lambda: sp.populate({"l": l_frame}, resume="yes"), joinstate.SchemaMismatchError,
             "resume='yes'"),
            (lambda: sp.populate({"l": l_frame}, order=["r"]), joinstate.SchemaMismatchError,
             "order="),
            (lambda: sp.apply("l", [1]), joinstate.SchemaMismatchError, "pyspark"),
            (lambda: sp.apply("l", l_frame, op_id="a/b"), joinstate.SchemaMismatchError,
             "op_id='a/b'"),
            (lambda: sp.foreach_batch_sink("l", tmp_path / "out", retain=0),
             joinstate.SchemaMismatchError, "retain=0")]:
        with pytest.raises(cls, match=match):
            call()
    assert not sp.outputs_dir.exists() and not (tmp_path / "out").exists()


def test_pipeline_failed_operations_leave_no_output_and_outputs_are_retained(
        spark: SparkSession, tmp_path: Path) -> None:
    sp = spark_io.SparkPipeline(spark, _pipeline_definition("inner"), tmp_path / "state",
                                keep_outputs=2)
    lf = spark.createDataFrame([(1, "a"), (2, "b")], "k long, v string")
    rf = spark.createDataFrame([(1, 1.5)], "rk int, x double")
    ghost = spark.createDataFrame([(1, 2.5, -1)], "rk int, x double, _weight long")
    # A population whose first push fails in a task: no empty output directory stays.
    with pytest.raises(joinstate.OverRetractionError, match=r"\(raised in a Spark task\)"):
        sp.populate({"r": ghost, "l": lf})
    assert not sp.outputs_dir.exists() or list(sp.outputs_dir.iterdir()) == []
    sp.populate({"r": rf, "l": lf}, resume=True)
    done = sorted(p.name for p in sp.outputs_dir.iterdir())
    with pytest.raises(joinstate.OverRetractionError) as err:
        sp.apply("r", ghost, op_id="ghost")
    message = str(err.value)
    assert "(raised in a Spark task)" in message
    assert not message.startswith(("An exception", "Traceback", "org.apache", "[PYTHON"))
    assert "Traceback" not in message and err.value.__cause__ is None
    assert any("op_id='ghost'" in n for n in getattr(err.value, "__notes__", []))
    assert sorted(p.name for p in sp.outputs_dir.iterdir()) == done
    for i in range(3):
        sp.apply("l", spark.createDataFrame([(10 + i, "n")], "k long, v string"),
                 op_id=f"ok-{i}")
    assert sorted(p.name for p in sp.outputs_dir.iterdir()) == ["ok-1", "ok-2"]


# ---- 8. errors raised by the population driver inside a task ---------------------------------

def test_population_error_in_a_task_reaches_the_driver_as_its_class(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_io._worker import PopulateTask

    rng = random.Random(27)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 40, 25))
    job = make_job(spark, tmp_path / "state", "inner", left, right)
    run_job = spark_io.SparkJoin._run_job  # noqa: SLF001 (the test wraps the job runner)

    def refusing(self: spark_io.SparkJoin, df: Any, task: Any, side: str) -> Any:
        if not isinstance(task, PopulateTask):
            return run_job(self, df, task, side)

        def refuses(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            import population.errors

            for _ in batches:
                raise population.errors.PopulationInterruptedError(
                    "left side: the input no longer matches what was loaded (batch 3)")
            yield from ()

        return run_job(self, df, refuses, side)

    monkeypatch.setattr(spark_io.SparkJoin, "_run_job", refusing)
    with pytest.raises(population.errors.PopulationInterruptedError) as err:
        job.populate()
    message = str(err.value)
    assert message.startswith("left side: the input no longer matches what was loaded")
    assert "(raised in a Spark task)" in message
    assert "Traceback" not in message and "JVM" not in message
    assert err.value.spark_error is not None  # type: ignore[attr-defined]
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert isinstance(err.value, population.PopulationError)
