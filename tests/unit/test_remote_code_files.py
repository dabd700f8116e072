"""Which *.py files of a target run with trust_remote_code on (specdec_pipeline.remote_code.files_that_run): every
config file transformers reads an auto_map from counts - here the video processor's - and each named file's relative
imports; a refusal names the switch of the stage that asks."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))
sys.dont_write_bytecode = True  # the role copies files/ to the host: no __pycache__ there

from specdec_pipeline import remote_code  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_video_processor_named_by_its_config_is_listed(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": "MyVideoProcessor", "auto_map": {"AutoVideoProcessor": "video_proc.MyVideoProcessor"}}))
    (tmp_path / "video_proc.py").write_text("from .frames import sample\n\nclass MyVideoProcessor:\n    pass\n")
    (tmp_path / "frames.py").write_text("def sample():\n    return 0\n")
    (tmp_path / "unused.py").write_text("raise SystemExit('never imported')\n")
    assert "video_preprocessor_config.json" in remote_code.AUTO_MAP_FILES
    assert remote_code.files_that_run(str(tmp_path)) == {"frames.py": sha(tmp_path / "frames.py"),
                                                         "video_proc.py": sha(tmp_path / "video_proc.py")}


def test_a_refusal_names_the_switch_of_the_stage_that_asks(tmp_path):
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({
        "auto_map": {"AutoVideoProcessor": "someone/evil--video_proc.MyVideoProcessor"}}))
    with pytest.raises(PipelineError) as err:
        remote_code.files_that_run(str(tmp_path), "eagle3_evaluate_trust_remote_code")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{tmp_path}/video_preprocessor_config.json: auto_map AutoVideoProcessor is "
                          "'someone/evil--video_proc.MyVideoProcessor', code of another repository (someone/evil)")
    assert msg.endswith("or set eagle3_evaluate_trust_remote_code: false.")
