"""`validate`: every problem the run would refuse, one line each, exit 2, nothing written; and the track seam: a run
loads only its own track's step modules, and a disk-full message uses that track's estimate.

On the tiny target (8 decoder layers, hidden 64) with the pipeline venv."""

import json
import os
import subprocess
import sys

from conftest import FILES, pipeline, write_config


def validate(cfg):
    proc = pipeline(cfg, "validate", check=False)
    errors = [line[len("ERROR: "):] for line in proc.stderr.splitlines() if line.startswith("ERROR: ")]
    return proc, errors


def test_a_valid_run_passes_and_nothing_is_written(tmp_path, tiny_target):
    cfg = write_config(tmp_path / "run.json", tmp_path / "run", tiny_target)
    proc, errors = validate(cfg)
    assert proc.returncode == 0 and errors == [], proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ok": True, "problems": [], "track": "patched"}
    assert not (tmp_path / "run").exists()


def test_every_problem_is_one_line(tmp_path, tiny_target):
    cfg = write_config(tmp_path / "run.json", tmp_path / "run", tiny_target,
                       extract={"layer_ids": [2, 4, 8], "dtype": "float8"})
    proc, errors = validate(cfg)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 2, proc.stderr
    assert errors[0].startswith("extract.layer_ids [2, 4, 8]: expected at least 2 layer indices in 0..7")
    assert errors[1].startswith("extract.dtype 'float8': expected one of")
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_the_layer_id_rule_is_the_running_tracks(tmp_path, tiny_target):
    # [2, 4, 5, 7]: the patched track's default for 8 layers (layer outputs); on the current track the last vLLM
    # capture id must be 8, the final layer's output.
    ids = {"layer_ids": [2, 4, 5, 7]}
    patched, _errors = validate(write_config(tmp_path / "p.json", tmp_path / "p", tiny_target, extract=ids))
    assert patched.returncode == 0, patched.stderr[-3000:]
    proc, errors = validate(write_config(tmp_path / "c.json", tmp_path / "c", tiny_target, extract=ids,
                                         track="current"))
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("extract.layer_ids [2, 4, 5, 7]: on the current track expected") and "ending with 8" in errors[0]


def test_the_disk_estimate_is_the_running_tracks(tmp_path, tiny_target):
    # 24 samples x at most 256 tokens; 4 capture ids x hidden 64: 512 B/token as bf16 on the patched track,
    # 4 x 64 + 4 + 8 = 268 B/token as fp8 on the current one
    over = {"extract": {"disk_margin": 1e12}}
    proc, errors = validate(write_config(tmp_path / "p.json", tmp_path / "p", tiny_target, **over))
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "24 samples (max_samples) x at most 256 tokens, 512 B/token on the patched track" in errors[0]
    proc, errors = validate(write_config(tmp_path / "c.json", tmp_path / "c", tiny_target, track="current",
                                         current={"hs_storage": "fp8"}, **over))
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "268 B/token on the current track" in errors[0] and "eagle3_pipeline_work_dir" in errors[0]


def test_a_target_without_weights_is_named(tmp_path, tiny_target):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_target / "config.json").read_text())
    proc, errors = validate(write_config(tmp_path / "run.json", tmp_path / "run", bare))
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "missing: a tokenizer, weights (*.safetensors or *.bin)" in errors[0]


SEAM = """
import json, sys
from specdec_pipeline import tracks
cfg = tracks.load(sys.argv[1])
for step in ("prepare", "extract", "vocab", "train", "export"):
    tracks.step_module(cfg, step)
print(json.dumps({"need": tracks.space_needed(cfg, "extract"),
                  "other": sorted(m for m in sys.modules if m.startswith("specdec_pipeline.tracks.")
                                  and not m.startswith(f"specdec_pipeline.tracks.{cfg['track']}"))}))
"""


def test_a_run_loads_only_its_tracks_modules_and_estimate(tmp_path, tiny_target):
    cfg = write_config(tmp_path / "run.json", tmp_path / "run", tiny_target)
    pipeline(cfg, "run", "--until", "prepare")
    samples = [json.loads(x) for x in (tmp_path / "run" / "prepare" / "samples.jsonl").read_text().splitlines()]
    tokens = sum(len(s["input_ids"]) for s in samples)
    env = dict(os.environ, PYTHONPATH=str(FILES))
    out = {}
    for track, storage in (("patched", "bf16"), ("current", "fp8")):
        raw = json.loads(cfg.read_text())
        raw.update(track=track, current={"hs_storage": storage})
        path = tmp_path / f"{track}.json"
        path.write_text(json.dumps(raw))
        proc = subprocess.run([sys.executable, "-c", SEAM, str(path)], env=env, text=True, capture_output=True,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[track] = json.loads(proc.stdout)
    # the registry's light package and its declarations (rules.py) only
    assert out["patched"]["other"] == ["specdec_pipeline.tracks.current", "specdec_pipeline.tracks.current.rules"]
    assert out["current"]["other"] == ["specdec_pipeline.tracks.patched", "specdec_pipeline.tracks.patched.rules"]
    assert out["patched"]["need"] == int(tokens * 4 * 64 * 2 * 1.1)
    assert out["current"]["need"] == int(tokens * (4 * 64 + 4 + 8) * 1.1)  # not the patched track's figure
