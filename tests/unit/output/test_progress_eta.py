"""The ETA of a long step (specdec_pipeline/progress.py): counted from the first unit done, so that what comes
before it - a vLLM server's start, compilation - does not make it absurd. On the GPU, regenerate's first line said
"ETA 17h16m" for a step that took 2 minutes, and the evaluate stage's "ETA 13h05m" for one of 7 minutes."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "roles" / "eagle3_pipeline" / "files"))

from specdec_pipeline import progress  # noqa: E402


def test_the_eta_starts_at_the_second_unit_and_runs_at_the_pace_after_the_first(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    path = tmp_path / "progress.json"
    prog = progress.Progress(path, "regenerate", 100, unit="conversations", interval=0)
    seen = []
    for t, done in ((10, 0), (80, 1), (81, 11), (91, 51)):  # 80 s of server start, then 10 a second, then 4
        clock[0] = 1000.0 + t
        prog.update(done=done)
        seen.append(json.loads(path.read_text())["eta_s"])
    assert seen == [None, None, round(89 / 10, 1), round(49 * 11 / 50, 1)]


def test_a_resumed_step_counts_from_its_first_new_unit(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    prog = progress.Progress(tmp_path / "p.json", "extract", 10, interval=0)
    prog.resume_from(6)
    for t, done in ((30, 6), (40, 7), (42, 8)):
        clock[0] = t
        prog.update(done=done)
    assert json.loads((tmp_path / "p.json").read_text())["eta_s"] == 4.0  # 2 left at 1 per 2 s
