"""A bug or an unforeseen failure in the pipeline or the evaluate stage (specdec_pipeline.errors.unexpected_error_line):
one ``ERROR: `` line on stderr - the line the Ansible roles show - and the traceback in the run's log. On the GPU
machine an evaluate-stage NameError once ended as "the evaluation exited with status 1" and nothing else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))

from specdec_pipeline import evaluate  # noqa: E402
from specdec_pipeline.errors import unexpected_error_line  # noqa: E402


def _boom(*_args, **_kwargs):
    return {}["undefined_name"]  # the bug under test


def test_the_evaluate_stage_turns_a_bug_into_one_line_and_logs_the_traceback(tmp_path, monkeypatch, capsys):
    config = tmp_path / "evaluate.json"
    config.write_text(json.dumps({"run_dir": str(tmp_path / "run")}))
    monkeypatch.setattr(evaluate, "load_config", lambda path: json.loads(Path(path).read_text()))
    monkeypatch.setattr(evaluate, "run", _boom)
    assert evaluate.main([str(config), "run"]) == 1
    err = capsys.readouterr().err
    log = tmp_path / "run" / "logs" / "evaluate.log"
    assert err == f"ERROR: unexpected KeyError: 'undefined_name'; the traceback is in {log}.\n"
    assert "Traceback (most recent call last)" in log.read_text() and "_boom" in log.read_text()


def test_a_log_that_cannot_be_written_leaves_the_traceback_on_stderr(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = ""
    try:
        _boom()
    except KeyError as exc:
        line = unexpected_error_line(exc, lambda: blocker / "logs" / "x.log")
    assert line.endswith("the traceback is in the output above.")
    assert "Traceback (most recent call last)" in capsys.readouterr().err
