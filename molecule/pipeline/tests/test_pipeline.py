"""The pipeline ran in the container as the user the role created, and left a valid export and report."""

import json
from pathlib import Path

import yaml

RUN = "/opt/specdec/work/runs/molecule"


def test_pipeline_user_exists_and_owns_the_run(host):
    user = host.user("specdec")
    assert user.exists and user.shell == "/usr/sbin/nologin"
    assert host.file(RUN).user == "specdec"
    assert host.file(f"{RUN}/export/model.safetensors").user == "specdec"


def test_every_step_finished_with_a_manifest(host):
    for step in ("prepare", "extract", "vocab", "train", "export"):
        man = json.loads(host.file(f"{RUN}/manifests/{step}.json").content_string)
        assert man["step"] == step and man["outputs"]
    summary = json.loads(host.file(f"{RUN}/summary.json").content_string)
    assert summary["stopped"] == ""


def test_export_carries_vllm_layer_ids_and_vocab_maps(host):
    conf = json.loads(host.file(f"{RUN}/export/config.json").content_string)
    assert conf["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    cmd = host.run("/opt/specdec/ml-env/bin/python -c \"from safetensors import safe_open; "
                   "f = safe_open('%s/export/model.safetensors', 'pt'); print(sorted(f.keys()))\"" % RUN)
    assert cmd.rc == 0 and "'d2t'" in cmd.stdout and "'t2d'" in cmd.stdout


def test_report_has_plots(host):
    report = host.file(f"{RUN}/report/report.md")
    assert report.exists and "loss.png" in report.content_string
    assert host.file(f"{RUN}/report/loss.png").size > 1000


def test_training_ran_on_the_patched_speculators(host):
    """prepare.yml ran the patch stage: the t* training patches are in the venv the role trained with, and the
    checkpoint keeps the verifier's frozen norm and lm head out (speculators' _keys_to_ignore_on_save)."""
    root = Path(__file__).resolve().parents[3]
    patches = [p for p in yaml.safe_load((root / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
               if p["id"].startswith("t")]
    assert patches
    site = host.check_output("/opt/specdec/ml-env/bin/python -c \"import sysconfig; "
                             "print(sysconfig.get_paths()['purelib'])\"")
    for patch in patches:
        text = host.file(f"{site}/{patch['file']}").content_string
        for hunk in patch["hunks"]:
            assert hunk["after"] in text, patch["id"]
    cmd = host.run("/opt/specdec/ml-env/bin/python -c \"from safetensors import safe_open; "
                   "f = safe_open('%s/export/model.safetensors', 'pt'); print(sorted(f.keys()))\"" % RUN)
    assert cmd.rc == 0 and "fc.weight" in cmd.stdout
    assert "verifier_norm" not in cmd.stdout and "verifier_lm_head" not in cmd.stdout
