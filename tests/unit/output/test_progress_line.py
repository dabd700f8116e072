"""The progress line of one poll (specdec_pipeline/progress_line.py): rounded, and done only when
the async job's results file holds its final result."""

import json
import os
import subprocess
import sys
from pathlib import Path

CODE = Path(__file__).resolve().parents[3] / "roles" / "eagle3_pipeline" / "files"
ENV = {**os.environ, "PYTHONPATH": str(CODE)}
CMD = [sys.executable, "-m", "specdec_pipeline.progress_line"]  # as both roles poll


def poll(tmp_path, progress, job):
    """As in a run: the job wrapper writes its results file first, the job its progress file after."""
    (tmp_path / "job").write_text(json.dumps(job))
    (tmp_path / "p.json").write_text(json.dumps(progress))
    past = (tmp_path / "job").stat().st_mtime_ns
    os.utime(tmp_path / "p.json", ns=(past + 1_000_000, past + 1_000_000))
    out = subprocess.run([*CMD, str(tmp_path / "p.json"), str(tmp_path / "job")],
                         capture_output=True, text=True, check=True, env=ENV).stdout
    return json.loads(out)


def test_training_progress_is_rounded(tmp_path):
    got = poll(tmp_path, {"step": "train", "state": "running", "done": 12, "total": 40, "unit": "batches", "epoch": 1,
                          "loss": 2.3456789012345678, "tokens_per_s": None, "eta_s": 75.3}, {"started": 1, "finished": 0})
    assert got == {"progress": "train: 12/40 batches, epoch 1, loss 2.346, ETA 1m15s", "finished": False}


def test_extraction_progress_and_the_end_of_the_job(tmp_path):
    got = poll(tmp_path, {"step": "extract", "done": 12, "total": 48, "unit": "samples", "tokens_per_s": 1234.56,
                          "eta_s": 3.2}, {"rc": 0, "stdout": "{}"})
    assert got == {"progress": "extract: 12/48 samples, 1,235 tokens/s, ETA 3s", "finished": True}


def test_no_progress_file_yet(tmp_path):
    out = subprocess.run([*CMD, str(tmp_path / "none.json"), str(tmp_path / "none")],
                         capture_output=True, text=True, check=True, env=ENV).stdout
    assert json.loads(out) == {"progress": "starting", "finished": False}


def test_evaluate_progress_names_the_variant_and_what_it_waits_for(tmp_path):
    # What the evaluate stage writes while a server starts: the message shows while running, not once finished.
    p = {"step": "evaluate control", "state": "running", "done": 32, "total": 96, "unit": "requests",
         "tokens_per_s": 0.0, "eta_s": 130, "message": "starting vLLM"}
    assert poll(tmp_path, p, {"started": 1})["progress"] == \
        "evaluate control: 32/96 requests, starting vLLM, ETA 2m10s"
    assert poll(tmp_path, dict(p, state="finished"), {"rc": 0})["progress"] == "evaluate control: 32/96 requests"


def test_before_anything_is_counted_the_line_says_what_the_step_does(tmp_path):
    p = {"step": "evaluate", "state": "running", "done": 0, "total": 0, "unit": "requests",
         "message": "loading the prompt sets"}
    assert poll(tmp_path, p, {"started": 1}) == {"progress": "evaluate: loading the prompt sets", "finished": False}


def test_a_progress_file_older_than_the_running_job_is_the_previous_runs(tmp_path):
    """A re-run of the evaluate stage that measured nothing first showed the last run's "evaluate ngram: 579/579"."""
    old = {"step": "evaluate ngram", "state": "finished", "done": 579, "total": 579, "unit": "requests"}
    (tmp_path / "p.json").write_text(json.dumps(old))
    (tmp_path / "job").write_text(json.dumps({"started": 1, "finished": 0}))
    os.utime(tmp_path / "p.json", ns=(1_000_000_000, 1_000_000_000))  # written long before the job started
    out = subprocess.run([*CMD, str(tmp_path / "p.json"), str(tmp_path / "job")],
                         capture_output=True, text=True, check=True, env=ENV).stdout
    assert json.loads(out) == {"progress": "starting", "finished": False}
    # Once the job has ended, its last progress line is shown whatever the times (the results file is written last).
    (tmp_path / "job").write_text(json.dumps({"rc": 0}))
    os.utime(tmp_path / "p.json", ns=(1_000_000_000, 1_000_000_000))
    out = subprocess.run([*CMD, str(tmp_path / "p.json"), str(tmp_path / "job")],
                         capture_output=True, text=True, check=True, env=ENV).stdout
    assert json.loads(out) == {"progress": "evaluate ngram: 579/579 requests", "finished": True}
