"""The progress line of one poll (roles/eagle3_pipeline/files/progress_line.py): rounded, and done only when
the async job's results file holds its final result."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "eagle3_pipeline" / "files" / "progress_line.py"


def poll(tmp_path, progress, job):
    (tmp_path / "p.json").write_text(json.dumps(progress))
    (tmp_path / "job").write_text(json.dumps(job))
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "p.json"), str(tmp_path / "job")],
                         capture_output=True, text=True, check=True).stdout
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
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.json"), str(tmp_path / "none")],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"progress": "starting", "finished": False}
