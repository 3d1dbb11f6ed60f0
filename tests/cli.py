"""The one way tests run `profkit ...`: its console entry point (`profkit.cli:main`, so error lines and exit codes
are exactly a user's), in this process by default (no interpreter start-up per call), or in a child process
where a test needs one: another environment (fake vllm/nsys on PATH), signals, or a time limit."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def profkit(*args: object, env: dict[str, str] | None = None, timeout: float | None = None,
            child: bool = False) -> Result:
    """Run `profkit ARGS`. A child process when `env` or `timeout` is given or `child` is set; else in-process."""
    argv = [str(a) for a in args]
    if child or env is not None or timeout is not None:
        r = subprocess.run([sys.executable, "-m", "profkit.cli", *argv], capture_output=True, text=True,
                           env=env, timeout=timeout or 300, stdin=subprocess.DEVNULL)
        return Result(r.returncode, r.stdout, r.stderr)
    from profkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["profkit", *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved
    return Result(code, out.getvalue(), err.getvalue())


def one_error_line(result: Result, needle: str = "", progress: bool = False) -> str:
    """Bad input: exactly one `profkit: error:` line holding `needle`, a non-zero exit that is no internal error,
    and no traceback; nothing else on stderr unless `progress` (capture and tune say what they run). Returns the
    line."""
    assert result.returncode not in (0, 70), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if progress:
        lines = [line for line in lines if line.startswith("profkit: error:")]
    assert len(lines) == 1 and lines[0].startswith("profkit: error: "), result.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
