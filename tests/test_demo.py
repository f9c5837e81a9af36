"""The main job (``./dev demo``) at a small size: it must keep running and agree with DuckDB.

``run_demo`` returns non-zero when the integrated output differs from DuckDB's join of
the final inputs or the state does not survive a reopen, so this is a differential test
of population + live changes end to end, not a smoke test.

Also: every console script ``pyproject.toml`` declares resolves to a callable, and the
installed metadata declares the same scripts (a stale install would run old targets).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]


def declared_scripts() -> dict[str, str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    scripts = project.get("scripts", {})
    assert isinstance(scripts, dict)
    return scripts


def test_demo_matches_duckdb(tmp_path: Path) -> None:
    assert run_demo(tmp_path / "state", 2_000, 30_000, 4_096, progress=False) == 0


@pytest.mark.parametrize("name", sorted(declared_scripts()))
def test_console_script_resolves_to_a_callable(name: str) -> None:
    target = declared_scripts()[name]
    entry = importlib.metadata.EntryPoint(name=name, value=target, group="console_scripts")
    assert callable(entry.load()), f"{name} = {target!r} is not callable"


def test_installed_console_scripts_match_pyproject() -> None:
    dist = importlib.metadata.distribution("joinstate")
    installed = {ep.name: ep.value for ep in dist.entry_points
                 if ep.group == "console_scripts"}
    assert installed == declared_scripts(), "re-install: pip install -e '.[spark,bench,dev]'"


def test_demo_console_script_runs() -> None:
    script = Path(sys.executable).parent / "joinstate-demo"
    if not script.exists():
        pytest.skip(f"{script} is not installed (not running from the project's venv)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "--customers" in done.stdout
