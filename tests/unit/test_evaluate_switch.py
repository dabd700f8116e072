"""specdec_evaluate switches the evaluate stage: off, the stage is one skipped line and installs nothing;
on, the eagle3_evaluate role runs. Real ansible-playbook runs of playbooks/evaluate.yml (local connection),
with the work directory and the venv in a temporary folder so nothing of a real run is touched."""

import json
import subprocess
import sys

import playbook_json
import pytest


def evaluate_play(inventory, tmp_path, *raw, **extra):
    extra = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "specdec_prefix": str(tmp_path), "specdec_venv_path": str(tmp_path / "venv"),
             "specdec_work_dir": str(tmp_path / "work"), **extra}
    rc, out = playbook_json.run("evaluate.yml", inventory, extra, raw)
    # Not counted: fact gathering, and the check of the shared profile against its declaration (the specdec role's
    # argument spec, first in every play).
    tasks = [(t["task"]["name"], next(iter(t["hosts"].values()))) for p in out["plays"] for t in p["tasks"]
             if t["task"]["name"] != "Gathering Facts"
             and "Validating arguments against arg spec" not in t["task"]["name"]]
    return rc, tasks


def test_the_default_profile_skips_the_stage_in_one_line(tmp_path):
    rc, tasks = evaluate_play("local", tmp_path)
    assert rc == 0
    assert len(tasks) == 1, [task[0] for task in tasks]
    assert tasks[0][1].get("skipped") is True
    assert not (tmp_path / "eval-env").exists()


@pytest.mark.parametrize("value", ["false", "no", "False"])
def test_the_switch_given_as_key_value_text_acts_as_a_boolean(tmp_path, value):
    rc, tasks = evaluate_play("kimi", tmp_path, f"specdec_evaluate={value}")
    assert rc == 0
    assert [res.get("skipped") for _name, res in tasks] == [True]


def test_switched_on_the_role_runs(tmp_path):
    rc, tasks = evaluate_play("local", tmp_path, "specdec_evaluate=true")
    assert rc != 0
    failed = [res.get("msg", "") for _name, res in tasks if res.get("failed")]
    assert len(failed) == 1 and "run the pipeline stage first" in failed[0], failed


def test_a_given_venv_without_vllm_fails_in_one_line(tmp_path):
    # The current track's way: evaluate with the track's own venv, install nothing.
    runs = tmp_path / "work" / "runs"
    runs.mkdir(parents=True)
    (runs / "tiny-current.json").write_text(json.dumps({"target": {"path": str(tmp_path)}, "run_dir": str(runs)}))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    rc, tasks = evaluate_play("local-current", tmp_path)
    assert rc != 0
    failed = [res.get("msg", "") for _name, res in tasks if res.get("failed")]
    assert len(failed) == 1, failed
    assert f"eagle3_evaluate_install is false but {venv}/bin/python does not import vllm" in failed[0]
    assert "\n" not in failed[0].strip()
    assert not list(venv.glob("lib/python*/site-packages/vllm"))
