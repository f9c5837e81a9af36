"""Running the ``joinstate`` command in-process for tests, and its one-line errors.

Every user error of the command is one line starting ``error:`` with no traceback and
a distinct exit status; the tests of each command check that the same way.
"""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner, Result

from bench.cli import cli

__all__ = ["assert_one_line_error", "run"]


def run(*args: Any, env: dict[str, str | None] | None = None) -> Result:
    """``joinstate ARGS...`` (each argument str()-ed) with ``env`` added to the environment."""
    return CliRunner(env=env).invoke(cli, [str(a) for a in args])


def assert_one_line_error(result: Result, code: int, *needles: str) -> str:
    """Assert a one-line ``error:`` message, exit status ``code``, holding every needle."""
    out = result.output.strip()
    assert result.exit_code == code, out
    assert "\n" not in out, out
    assert out.startswith("error: "), out
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, out
    return out
