"""The validate play (playbooks/validate.yml): every problem of an inventory in one report, one line each, before
anything changes - run for real with ansible-playbook on this machine (a local connection), which has no GPU.

test_preflight.py and test_kimi_inventories.py hold the single refusals; here they come together, as a new user
meets them: the Kimi sample on a host without a GPU, Python 3.12 or the model, plus misspelt, misplaced and
out-of-range settings, an unpublished pin and a broken dataset.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import playbook_json
import pytest

ROOT = playbook_json.ROOT
STOP = "Stop before connecting while the connection settings are placeholders"
HERE = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def validate(inventory, extra):
    """(exit status, the report's lines, every task name that ran, the json output)."""
    rc, out = playbook_json.run("validate.yml", inventory, extra)
    names = [task["task"]["name"].split(" : ", 1)[-1] for play in out["plays"] for task in play["tasks"]]
    return rc, playbook_json.report(out), names, out


def test_a_kimi_inventory_on_a_host_without_a_gpu_gets_every_problem_at_once(open_tmp):
    if subprocess.run(["sh", "-c", "python3.12 -c ''"], capture_output=True, check=False).returncode == 0:
        pytest.skip("python3.12 runs on this machine: the interpreter refusal this test expects does not happen")
    work = open_tmp / "work"
    dataset = open_tmp / "conversations.jsonl"
    dataset.write_bytes(b'{"conversations": [{"from": "human", "value": "hi"}]}\n{"conversations": [}\n\xff\n')
    rc, lines, names, _out = validate("kimi", dict(
        HERE, specdec_work_dir=str(work), eagle3_pipeline_dataset=str(dataset),
        # misspelt, misplaced, out of range, unknown to the role, not published
        eagle3_pipeline_epoch=5, eagle3_pipline_seq_length=1024, specdec_profle="kimi",
        eagle3_pipeline_hs_storage="fp8", eagle3_pipeline_epochs=-1, eagle3_pipeline_max_samples=-5,
        eagle3_evaluate_top_p=1.5, eagle3_evaluate_consistency_min_ratio="half", speculators_version="0.5.0",
        vllm_install_mode="release", vllm_version="0.99.1"))
    assert rc != 0
    header, problems = lines[0], lines[1:]
    assert header == f"kimi-k25: {len(problems)} problem(s); nothing was changed:", lines
    expected = [
        "eagle3_pipeline_epoch is not a setting of specdec.eagle3; did you mean eagle3_pipeline_epochs?",
        "eagle3_pipline_seq_length is not a setting of specdec.eagle3; did you mean eagle3_pipeline_seq_length?",
        "specdec_profle is not a setting of specdec.eagle3; did you mean specdec_profile?",
        "eagle3_pipeline_hs_storage is a setting of the current track, but specdec_track is patched: remove it (or set "
        "specdec_track: current)",
        "eagle3_pipeline_epochs is -1; expected a value in [1, inf) (role eagle3_pipeline)",
        "eagle3_pipeline_max_samples is -5; expected a value in [0, inf) (role eagle3_pipeline)",
        "eagle3_evaluate_top_p is 1.5; expected a value in (0, 1] (role eagle3_evaluate)",
        "eagle3_evaluate_consistency_min_ratio is 'half'; expected null (off) or a number in (0, 1] (role eagle3_evaluate)",
        "value of speculators_version must be one of: 0.3.0, 0.4.0, 0.4.0.1, got: 0.5.0 (role speculators)",
        "specdec_python_version is 3.12, but python3.12 does not run on this host",
        "eagle3_evaluate_python is python3.12, but python3.12 does not run on this host",
        "specdec_install_driver is true but the host has no NVIDIA GPU on its PCI bus",
        "vllm_version is 0.99.1, but vllm 0.99.1 is published on none of",
        "eagle3_pipeline_target_path is '/data/models/Kimi-K2.5'; expected an existing model directory on the host",
        f"eagle3_pipeline_dataset is '{dataset}', which is not UTF-8 text (byte ",
    ]
    for want in expected:
        assert [p for p in problems if p.startswith(want)], f"missing: {want}\n" + "\n".join(problems)
    assert all("\n" not in p and p.strip() == p for p in problems)
    assert len(problems) == len(expected), "\n".join(problems)
    # Nothing changed: no stage after validate ran, the work directory was not created.
    assert not work.exists()
    assert "Install the profile's torch into the venv" not in names


def test_a_broken_dataset_gets_one_line_per_problem(open_tmp):
    dataset = open_tmp / "conversations.jsonl"
    dataset.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n{"conversations": [}\n'
                       '{"messages": "text"}\n')
    extra = dict(HERE, ml_venv_python=sys.executable, eagle3_evaluate_python=sys.executable,
                 nvidia_driver_require_device=False, specdec_check_published=False,
                 eagle3_pipeline_target_path=str(_model(open_tmp)), eagle3_pipeline_max_samples=2,
                 specdec_work_dir=str(open_tmp / "work"), eagle3_pipeline_dataset=str(dataset))
    rc, lines, _names, _out = validate("kimi-current", extra)
    assert rc != 0
    assert lines[1:] == [
        f"{dataset}:2: not valid JSON (Expecting value); fix the line.",
        f"{dataset}:3: expected a 'conversations' (or 'messages') list of {{from/role, value/content}} turns; fix or "
        "drop this record."], lines
    empty = open_tmp / "empty"
    empty.mkdir(mode=0o755)
    for source, says in ((str(empty), "a directory without data files"), (str(open_tmp / "typo.jsonl"), "which does not exist"),
                         ("./data/convs.txt", "a local path but not a .json or .jsonl file")):
        rc, lines, _names, _out = validate("kimi-current", dict(extra, eagle3_pipeline_dataset=source))
        assert rc != 0 and len(lines) == 2 and says in lines[1], lines


def _model(base):
    model = base / "Kimi-K2.5"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {
        "num_hidden_layers": 61, "hidden_size": 7168}}))
    for name in ("tokenizer_config.json", "tiktoken.model", "model-00001-of-00064.safetensors"):
        (model / name).write_text("")
    return model


def test_placeholders_in_the_connection_stop_before_connecting():
    rc, out = playbook_json.run("validate.yml", "kimi", {})
    assert rc != 0
    tasks = [t["task"]["name"] for p in out["plays"] for t in p["tasks"]]
    assert STOP in tasks and "Read the managed host's Python and OS facts" not in tasks, tasks
    failed = [r for p in out["plays"] for t in p["tasks"] if t["task"]["name"] == STOP for r in t["hosts"].values()]
    assert failed[0]["msg"].startswith("kimi-k25: set ansible_host in the inventory"), failed


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client here: the host cannot be tried")
def test_an_unreachable_host_is_one_line():
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(ROOT / "inventory/kimi"),
                           str(ROOT / "playbooks/validate.yml"), "-e", "ansible_host=unreachable-host.invalid"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode != 0
    said = [line for line in proc.stdout.splitlines() if "UNREACHABLE" in line]
    assert len(said) == 1 and said[0].startswith("UNREACHABLE - kimi-k25: "), proc.stdout
    assert "unreachable-host.invalid" in said[0] and "check ansible_host" in said[0]
    assert "{" not in proc.stdout.split("PLAY RECAP")[0], proc.stdout


def test_a_setting_of_the_other_track_is_one_line():
    rc, lines, _names, _out = validate("local-current", dict(
        HERE, ml_venv_python=sys.executable, eagle3_evaluate_python=sys.executable, specdec_check_published=False,
        eagle3_pipeline_extract_backend="vllm"))
    assert rc != 0
    assert lines[1:] == ["eagle3_pipeline_extract_backend is a setting of the patched track, but specdec_track is "
                         "current: remove it (or set specdec_track: patched)"], lines


@pytest.mark.parametrize("ids", [[30, 2, 4, 7], [2, 2, 4, 7]])
def test_capture_ids_out_of_order_or_repeated_are_one_line_on_the_patched_track(ids):
    # The tiny target (8 layers) is built later, so the local profile's ids are checked by the pipeline's rule on
    # the Kimi sample's stand-in model instead.
    base = Path(tempfile.mkdtemp(prefix="specdec-validate-", dir="/tmp"))
    base.chmod(0o755)
    try:
        rc, lines, _names, _out = validate("kimi", dict(
            HERE, ml_venv_python=sys.executable, eagle3_evaluate_python=sys.executable, nvidia_driver_require_device=False,
            specdec_check_published=False, eagle3_pipeline_target_path=str(_model(base)), eagle3_pipeline_max_samples=2,
            specdec_work_dir=str(base / "work"), eagle3_pipeline_layer_ids=ids))
    finally:
        shutil.rmtree(base)
    assert rc != 0
    assert lines[1:] == [f"extract.layer_ids {ids}: expected at least 2 layer indices in 0..60, increasing and each once "
                         f"(the last is the training target), for {base}/Kimi-K2.5 (61 layers); fix "
                         "eagle3_pipeline_layer_ids."], lines
