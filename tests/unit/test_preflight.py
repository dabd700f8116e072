"""The preflight stage refuses bad inventories before anything changes, with one message naming the fix.

Runs the real validate play (playbooks/validate.yml) against the shipped Kimi-K2.5 sample inventory with
overrides; the host is reached through a local connection so no SSH is needed.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import playbook_json
import pytest

from tests.support.optin import opt_in
# The interpreters the venvs are built from: this machine's (preflight refuses a python3.12 that does not run).
LOCAL = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
         "ml_venv_python": sys.executable, "eagle3_evaluate_python": sys.executable,
         # No NVIDIA GPU on a test machine (the driver role's own check is tested in test_validate.py), and the
         # package indexes are asked once there, not by every case here.
         "nvidia_driver_require_device": False, "specdec_check_published": False}


# The /root cases need /root as Debian leaves it (0700); a container whose /root is a mounted cache (the 2.21
# controller's) has another mode, and the pipeline user may pass through it there.
ROOT_HOME_0700 = pytest.mark.skipif(not os.path.isdir("/root") or (os.stat("/root").st_mode & 0o777) != 0o700,
                                    reason="/root is not mode 0700 here, so the pipeline user may pass through it")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A directory shaped like the Kimi-K2.5 checkpoint as far as preflight looks: nested text_config,
    tokenizer and weight files (empty: preflight lists them, it never loads them). Outside pytest's 0700 base
    directory: the pipeline user must be able to reach it."""
    d = Path(tempfile.mkdtemp(prefix="specdec-preflight-", dir="/tmp"))
    d.chmod(0o755)
    (d / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {
        "num_hidden_layers": 61, "hidden_size": 7168}}))
    for name in ("tokenizer_config.json", "tiktoken.model", "model-00001-of-00064.safetensors"):
        (d / name).write_text("")
    yield d
    shutil.rmtree(d)


@pytest.fixture(autouse=True)
def _target(model_dir, monkeypatch):
    monkeypatch.setitem(LOCAL, "eagle3_pipeline_target_path", str(model_dir))


# Small enough for any test machine's disk; the disk test raises it.
LOCAL["eagle3_pipeline_max_samples"] = 2


REPORT = "Report every problem found, one line each"
STOP = "Stop before connecting while the connection settings are placeholders"


def _item_failed(item):
    """Whether one result of a looped task failed. ansible-core 2.21's json output no longer carries `failed`
    in per-item results; a failed item still carries its `exception` (and an assert its `evaluated_to: false`)."""
    if "failed" in item:
        return bool(item["failed"])
    return "exception" in item or item.get("evaluated_to") is False


def preflight(*raw, inventory="kimi", **extra):
    """Run the validate play; (exit status, its problem lines). The play reports every problem of the host in its last
    task, one line each; a placeholder in the connection settings stops it before it connects; any other failure
    (one that stopped the play elsewhere) is returned as that task's message."""
    rc, out = playbook_json.run("validate.yml", inventory, extra, raw)
    report, stops, other = [], [], []
    for play in out["plays"]:
        for task in play["tasks"]:
            name = task["task"]["name"].split(" : ", 1)[-1]
            for res in task["hosts"].values():
                if not res.get("failed"):
                    continue
                if name == REPORT:
                    report += res["msg"].splitlines()[1:]
                elif name == STOP:
                    stops.append(res["msg"])
                else:  # a looped task carries the per-item messages in its results
                    items = [i.get("msg", "") for i in res.get("results", []) if _item_failed(i)]
                    other.append(" ".join(items) if items else res.get("msg", ""))
    return rc, report or stops or (other[-1:] if rc else [])


def _parts(extra):
    """One case's override as (its -e key=value texts, its values): a dict, a text, or a tuple of those."""
    parts = extra if isinstance(extra, tuple) else (extra,)
    return [x for x in parts if isinstance(x, str)], {k: v for x in parts if isinstance(x, dict) for k, v in x.items()}


def _names(extra):
    texts, values = _parts(extra)
    return [x.split("=", 1)[0] for x in texts] + list(values)


def each_problem_once(cases, inventory="kimi", one_line_each=True, **base):
    """CASES ((overrides, expected line part), ...) refused in one run: the validate play reports every problem of a
    host at once, so independent bad values share a run (each run costs about 14 s of CPU on a slow CI machine).
    An override is a dict of values, a `-e key=value` text, or a tuple of those. Each expected part must be in
    exactly one of the report's lines, and the report must hold nothing else."""
    overrides, raw = dict(base), []
    for extra, dummy in cases:
        texts, values = _parts(extra)
        taken = set(overrides) - set(base) | {r.split("=", 1)[0] for r in raw}
        assert not set(_names(extra)) & taken, f"{extra} overlaps another case"
        raw += texts
        overrides.update(values)
    rc, failures = preflight(*raw, inventory=inventory, **overrides)
    assert rc != 0
    assert len(failures) == len(cases), failures
    for dummy, expected in cases:
        assert sum(expected in line for line in failures) == 1, (expected, failures)
    assert not one_line_each or not any("\n" in line.strip() for line in failures), failures


def cases_id(cases):
    return "+".join(k for extra, dummy in cases for k in _names(extra))


def evaluate_user_refused(user):
    return (f"eagle3_evaluate_user is '{user}', but the pipeline runs as 'specdec' (eagle3_pipeline_user), whose run "
            "directory the evaluate stage reads and writes: it must run as that user too. Remove eagle3_evaluate_user "
            "from the inventory (it defaults to eagle3_pipeline_user) or set it to 'specdec'.")


# With the tiny target off (the switch given as -e key=value text), a missing target path is refused.
MISSING_TARGET = "eagle3_pipeline_target_path is '/nonexistent/model'; expected an existing model directory"


@opt_in("SPECDEC_UNIT_ALL", "CI runs these validate plays for real (README command 1 on inventory/local, the "
                            "local_vllm and current checks)")
@pytest.mark.parametrize("inventory", ["local", "local-vllm", "local-current"])
def test_the_shipped_local_profiles_pass_as_they_are(inventory):
    # The profiles name this CI machine's Python 3.11; elsewhere (the 2.21 controller's trixie has 3.13) the
    # interpreter that runs the tests stands in for it - preflight refuses one the host does not have.
    rc, failures = preflight(inventory=inventory, ansible_python_interpreter=sys.executable,
                             ml_venv_python=sys.executable, eagle3_evaluate_python=sys.executable)
    assert (rc, failures) == (0, [])


# The Kimi samples passing once their placeholders are set: tests/unit/test_kimi_inventories.py (its own CI check).


def test_connection_placeholders_stop_the_play_in_one_line():
    overrides = dict(LOCAL)
    overrides.pop("ansible_host")
    rc, failures = preflight(**overrides)
    assert rc != 0
    assert len(failures) == 1, failures
    assert "set ansible_host in the inventory" in failures[0], failures[0]


@pytest.mark.parametrize("cases", [
    pytest.param([({"specdec_venv_path": "/root/ml-env"},
                   "which cannot pass through /root (mode 0700, root:root) on the way to the ML venv"),
                  ({"specdec_prefix": "/root"},
                   "which cannot pass through /root (mode 0700, root:root) on the way to the pipeline code")],
                 marks=ROOT_HOME_0700),
    [({"specdec_work_dir": "data/eagle3"}, "specdec_work_dir must be an absolute path"),
     ({"specdec_gpu_count": 0}, "specdec_require_gpu is true but specdec_gpu_count is 0"),
     ({"specdec_gpu_compute_capability": "sm120"}, "specdec_gpu_compute_capability must look like 12.0"),
     ({"specdec_extra_ca_bundle": "ca.pem"}, "specdec_extra_ca_bundle must be empty or an absolute path")],
    # The evaluate stage works in the pipeline user's run directory: as root (or a third account) it would act through
    # whatever that user put there.
    [({"specdec_require_gpu": False}, "specdec_install_driver is true while specdec_require_gpu is false"),
     ({"eagle3_evaluate_user": ""}, evaluate_user_refused(""))],
    # Checked against the track's one declaration (the specdec role's argument spec: its choices).
    [({"specdec_track": "newest"}, "value of specdec_track must be one of: patched, current, got: newest")],
], ids=cases_id)
def test_a_bad_inventory_fails_with_one_message(cases):
    # One message each; the argument-spec refusal of specdec_track comes under ansible's own header line.
    each_problem_once(cases, one_line_each="specdec_track" not in cases_id(cases), **LOCAL)


def test_an_inventory_without_a_track_is_refused_in_one_line(tmp_path):
    inventory = tmp_path / "local"
    shutil.copytree(playbook_json.ROOT / "inventory" / "local", inventory)
    profile = inventory / "group_vars" / "eagle3_hosts" / "profile.yml"
    profile.write_text("".join(line for line in profile.read_text().splitlines(True)
                               if not line.startswith("specdec_track:")))
    rc, failures = preflight(inventory=str(inventory), ansible_python_interpreter=sys.executable,
                             specdec_prefix=str(tmp_path / "prefix"))
    assert rc != 0
    assert len(failures) == 1, failures
    assert "specdec_track is not set; set it in the inventory (group_vars/eagle3_hosts/profile.yml)" in failures[0]


@pytest.mark.parametrize("cases", [
    [({"eagle3_pipeline_seq_length": 0}, "eagle3_pipeline_seq_length is 0; expected a value in [1, inf)"),
     ({"eagle3_pipeline_layer_ids": [2, 30, 58, 61]},
      "extract.layer_ids [2, 30, 58, 61]: expected at least 2 layer indices in 0..60"),
     ({"eagle3_evaluate_user": "root"}, evaluate_user_refused("root"))],
    [({"eagle3_pipeline_seq_length": -5}, "eagle3_pipeline_seq_length is -5; expected a value in [1, inf)"),
     ({"eagle3_pipeline_layer_ids": [7]}, "extract.layer_ids [7]: expected at least 2 layer indices in 0..60"),
     ({"eagle3_evaluate_user": "alice"}, evaluate_user_refused("alice"))],
    [({"eagle3_pipeline_target_path": "/nonexistent/Kimi-K2.5"},
      "eagle3_pipeline_target_path is '/nonexistent/Kimi-K2.5'; expected an existing model directory")],
    [({"eagle3_pipeline_target_path": "models/kimi"},
      "eagle3_pipeline_target_path is 'models/kimi'; expected the absolute path")],
    [({"eagle3_pipeline_max_samples": 10**9}, "the work directory's filesystem")],
], ids=cases_id)
def test_a_bad_pipeline_setting_fails_with_one_line(cases):
    each_problem_once(cases, **LOCAL)


@pytest.mark.parametrize(("storage", "refused"), [("bf16", True), ("fp8", False)])
def test_the_disk_check_counts_the_bytes_the_chosen_storage_writes(storage, refused):
    # Kimi-K2.5's hidden size (7168), 4 capture ids, 1024 tokens per sample: bf16 writes 2 bytes a value, fp8 one.
    # Enough samples that bf16 needs about 1.5 x the work directory's free space and fp8 about 0.75 x.
    work = Path(tempfile.gettempdir())
    per_sample_bf16 = 1024 * (4 * 7168 * 2 + 8) * 1.1  # the pipeline's estimate (disk.py) and margin
    samples = int(1.5 * shutil.disk_usage(work).free / per_sample_bf16) + 1
    rc, failures = preflight(inventory="kimi-current", **dict(
        LOCAL, specdec_work_dir=str(work / "specdec-disk-check"), eagle3_pipeline_seq_length=1024,
        eagle3_pipeline_max_samples=samples, eagle3_pipeline_hs_storage=storage))
    assert (rc != 0) == refused, failures
    assert bool(failures) == refused and (not refused or "the work directory's filesystem" in failures[0]), failures


def test_current_track_capture_ids_must_end_with_the_final_layer_in_preflight():
    # The pipeline's own rule (tracks/current/rules.py), applied before the stack stage: 60 is inside the target's
    # 0..61, but the current track trains on the final layer's output, id 61. (A run of its own: the disk estimate
    # needs valid capture ids, so a refused one hides the disk check.)
    rc, failures = preflight(inventory="kimi-current", **dict(LOCAL, eagle3_pipeline_layer_ids=[2, 30, 58, 60]))
    assert rc != 0
    assert failures == ["extract.layer_ids [2, 30, 58, 60]: on the current track expected increasing vLLM "
                        "capture ids in 0..61 ending with 61 (the final layer of " + str(LOCAL["eagle3_pipeline_target_path"])
                        + ", 61 layers), e.g. [2, 30, 58, 61]; fix eagle3_pipeline_layer_ids."], failures


def test_the_disk_check_uses_the_pipelines_margin():
    # Between the pipeline's margin (1.1, disk.py) and the 1.2 the preflight once used: refused only by a 1.2.
    work = Path(tempfile.gettempdir())
    per_sample = 1024 * (4 * 7168 * 2 + 8)
    samples = int(shutil.disk_usage(work).free / (per_sample * 1.15))
    rc, failures = preflight(inventory="kimi-current", **dict(
        LOCAL, specdec_work_dir=str(work / "specdec-disk-check"), eagle3_pipeline_seq_length=1024,
        eagle3_pipeline_max_samples=samples, eagle3_pipeline_hs_storage="bf16"))
    assert (rc, failures) == (0, [])


def test_a_target_without_tokenizer_and_weights_is_refused():
    tmp_path = Path(tempfile.mkdtemp(prefix="specdec-preflight-", dir="/tmp"))  # a path the pipeline user can reach
    tmp_path.chmod(0o755)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 61, "hidden_size": 64}))
    rc, failures = preflight(**dict(LOCAL, eagle3_pipeline_target_path=str(tmp_path)))
    assert rc != 0
    assert failures == [f"eagle3_pipeline_target_path is '{tmp_path}'; expected config.json, a tokenizer "
                        "and weights (*.safetensors or *.bin) in it; missing: a tokenizer, weights."], failures
    shutil.rmtree(tmp_path)


def test_layer_ids_given_as_key_value_text_get_one_line():
    # In the same run, the tiny target's switch given as the text "no" acts as false: the missing target is refused.
    rc, failures = preflight("eagle3_pipeline_layer_ids=[2,300]", "eagle3_pipeline_build_tiny_target=no",
                             **dict(LOCAL, eagle3_pipeline_target_path="/nonexistent/model"))
    assert rc != 0
    assert len(failures) == 2, failures
    assert [f for f in failures if f.startswith(MISSING_TARGET)], failures
    text = [f for f in failures if "eagle3_pipeline_layer_ids is the text '[2,300]'" in f]
    assert len(text) == 1 and "argument_spec" not in text[0], failures


@pytest.mark.parametrize("cases", [
    # YAML reads an unquoted 3.10 as the number 3.1; -e JSON keeps the number the same way.
    [({"specdec_python_version": 3.1}, "specdec_python_version is the number 3.1, not text"),
     ({"eagle3_pipeline_run_name": "a/../../b"}, "eagle3_pipeline_run_name is 'a/../../b'; expected one name"),
     ({"eagle3_pipeline_gpu_memory_utilization": 80},
      "eagle3_pipeline_gpu_memory_utilization is 80.0; expected a value in (0, 1]"),
     ({"eagle3_pipeline_server_args": ["--host", "0.0.0.0"]},
      "current.server_args (eagle3_pipeline_server_args) contains '--host'"),
     ({"eagle3_evaluate_server_args": ["--api-key", "k"]}, "eagle3_evaluate_server_args is [\"--api-key\", \"k\"]")],
    [({"specdec_python_version": 3.12}, "specdec_python_version is the number 3.12, not text"),
     ({"eagle3_pipeline_gpu_memory_utilization": 0},
      "eagle3_pipeline_gpu_memory_utilization is 0.0; expected a value in (0, 1]"),
     ({"eagle3_pipeline_server_args": ["--enforce-eager", "--port=9000"]},
      "current.server_args (eagle3_pipeline_server_args) contains '--port=9000'"),
     # vLLM takes unique abbreviations: the rule (specdec_pipeline/server_args.py) is the one the stage applies.
     ({"eagle3_evaluate_server_args": ["--max-model-len", "512", "--ho=0.0.0.0"]},
      "eagle3_evaluate_server_args is [\"--max-model-len\", \"512\", \"--ho=0.0.0.0\"]; '--ho=0.0.0.0' sets where"),
     # The validate entry point has the role's argument spec: a wrong type is refused in preflight.
     ({"eagle3_pipeline_epochs": "many"}, "eagle3_pipeline_epochs")],
    # The tiny target's switch given as -e key=value text acts as a boolean: off, the missing target path is refused.
    [({"specdec_profile": "kimi k2.5"}, "specdec_profile is 'kimi k2.5'; expected one name"),
     (("eagle3_pipeline_build_tiny_target=False", {"eagle3_pipeline_target_path": "/nonexistent/model"}),
      MISSING_TARGET)],
    [({"specdec_profile": "../../etc"}, "specdec_profile is '../../etc'; expected one name"),
     (("eagle3_pipeline_build_tiny_target=false", {"eagle3_pipeline_target_path": "/nonexistent/model"}),
      MISSING_TARGET)],
], ids=cases_id)
def test_low_level_bad_input_gets_one_line_in_preflight(cases):
    each_problem_once(cases, **LOCAL)


def test_harmless_server_args_the_pipeline_user_and_the_tiny_target_switched_on_as_text_pass():
    # With the tiny target on (the switch's text "true"), the target path is not checked.
    rc, failures = preflight("eagle3_pipeline_build_tiny_target=true", **dict(
        LOCAL, eagle3_pipeline_server_args=["--enforce-eager", "--hostname-ish"], eagle3_pipeline_gpu_memory_utilization=1.0,
        eagle3_evaluate_user="specdec", eagle3_pipeline_target_path="/nonexistent/model"))
    assert (rc, failures) == (0, [])


def _unused_uid():
    import pwd
    uid = 1002
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


@pytest.fixture
def foreign_dir():
    """A directory of another account (an unused uid) below one of root's that other accounts can pass through."""
    import os
    base = Path(tempfile.mkdtemp(prefix="specdec-preflight-", dir="/tmp"))
    base.chmod(0o755)
    theirs = base / "theirs"
    theirs.mkdir()
    uid = _unused_uid()
    os.chown(theirs, uid, uid)
    yield base, theirs, uid
    shutil.rmtree(base)


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the ownership rules apply to root runs")
def test_a_venv_below_a_directory_of_another_account_is_refused_in_one_line(foreign_dir):
    base, theirs, uid = foreign_dir
    each_problem_once([({var: str(theirs / name)},
                        f"{var} is {theirs / name}, and this run is root: {theirs} is owned by uid {uid}, not root (mode "
                        f"755), so another account could change what root runs from this venv. Make root own it (chown "
                        f"root {theirs}), then run again.")
                       for var, name in (("specdec_venv_path", "ml-env"), ("eagle3_evaluate_venv_path", "eval-env"))],
                      **LOCAL)


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the ownership rules apply to root runs")
def test_an_existing_venv_whose_site_packages_another_account_owns_is_refused_in_one_line(foreign_dir):
    import os
    import subprocess
    base, dummy, uid = foreign_dir
    venv = base / "ml-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    os.chown(site, uid, uid)
    rc, failures = preflight(**dict(LOCAL, specdec_venv_path=str(venv)))
    assert rc != 0
    assert failures == [
        f"specdec_venv_path is {venv}, and this run is root: {site} is owned by uid {uid}, not root (mode 755), so "
        f"another account could change what root runs from this venv. Make root own it (chown root {site}), then run "
        "again."], failures
