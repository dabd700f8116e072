"""The pipeline's command line for the tests: `python -m specdec_pipeline ARGS` with the role's code first on
PYTHONPATH - one runner for the pipeline, evaluate, current-track and GPU tests.

    proc = pipeline_cli.run(cfg, "run", "--until", "extract", check=True)
    proc = pipeline_cli.run(cfg, "run", python=VENV_PY, env=pipeline_cli.environment(PYTHONUNBUFFERED="1"))
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"  # the folder holding specdec_pipeline, as the role ships it


def environment(before=(), after=(), drop=(), keep_pythonpath=False, **extra):
    """os.environ for a pipeline process: PYTHONPATH is BEFORE, the role's files/, AFTER (then the caller's own
    PYTHONPATH when KEEP_PYTHONPATH); the variables named in DROP removed; EXTRA set (values as text)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    kept = [os.environ["PYTHONPATH"]] if keep_pythonpath and os.environ.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([*map(str, before), str(FILES), *map(str, after), *kept])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def command(*args, python=sys.executable):
    """The argv of PYTHON -m specdec_pipeline ARGS (for a process the test starts itself, e.g. to kill it)."""
    return [str(python), "-m", "specdec_pipeline", *map(str, args)]


def run(*args, python=sys.executable, env=None, check=False, tail=4000, **kw):
    """PYTHON -m specdec_pipeline ARGS under ENV (default: environment()), as text, its output captured unless KW
    routes it (stdout=/stderr=). With CHECK a non-zero exit is an AssertionError naming the exit and the last TAIL
    characters of stderr."""
    if not {"stdout", "stderr", "capture_output"} & set(kw):
        kw["capture_output"] = True
    proc = subprocess.run(command(*args, python=python), env=environment() if env is None else env, text=True,
                          check=False, **kw)
    if check and proc.returncode != 0:
        if str(FILES) not in sys.path:
            sys.path.insert(0, str(FILES))
        from specdec_pipeline.errors import exit_text  # noqa: PLC0415 - the package under test

        raise AssertionError(f"pipeline {args} {exit_text(proc.returncode)}:\n{(proc.stderr or '')[-tail:]}")
    return proc
