"""The shipped production inventories (inventory/kimi, inventory/kimi-current) as a user meets them.

Two hosts stand in for the Kimi-K2.5 machine:
- this machine through a local connection (preflight only; fast): every refusal of a mistake the inventories once
  made is one line, and the shipped values pass once the host has its interpreters;
- a Debian 12 container (the project's debootstrapped ``specdec/debian:bookworm``; skipped with one line when Docker
  or the image is absent) through preflight and the stack stage in check mode, with the GPU facts a real host's
  nvidia-smi would give supplied as variables: nothing is installed or downloaded (NVIDIA's repository is never
  reached: check mode renders its files), and the test asserts what that host would hit.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HOST = "kimi-k25"
# The Kimi-K2.5 checkpoint as far as preflight looks (nested text_config, tokenizer and weight files, empty:
# preflight lists them and never loads them).
KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64}}
KIMI_FILES = ("tokenizer_config.json", "tiktoken.model", "model-00001-of-00064.safetensors")
# What nvidia-smi and modinfo report on the production host (8x RTX PRO 6000 Blackwell, R580), given as the
# variables the roles take instead of reading them, so the container needs no GPU.
GPU_FACTS = {"cuda_toolkit_driver_version": "580.82.07", "nvidia_driver_compute_capabilities": ["12.0"],
             "gpu_verify_require_gpu": False, "gpu_verify_nccl": False,
             # No NVIDIA device on the test machine or in the container (test_validate.py runs that check).
             "nvidia_driver_require_device": False, "specdec_check_published": False}

# The /root cases need /root as Debian leaves it (0700); a container whose /root is a mounted cache (the 2.21
# controller's) has another mode, and the pipeline user may pass through it there.
ROOT_HOME_0700 = pytest.mark.skipif(not os.path.isdir("/root") or (os.stat("/root").st_mode & 0o777) != 0o700,
                                    reason="/root is not mode 0700 here, so the pipeline user may pass through it")


def group_vars(inventory, name):
    return yaml.safe_load((ROOT / "inventory" / inventory / "group_vars" / "eagle3_hosts" / f"{name}.yml").read_text())


def playbook(inventory, extra, *args, playbook_path="validate.yml"):
    """ansible-playbook with the json callback: (exit status, [(play, task, result)] for the one host)."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(ROOT / "inventory" / inventory),
           str(ROOT / "playbooks" / playbook_path), "-e", json.dumps(extra), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1200)
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"ansible-playbook printed no json (status {proc.returncode}): {proc.stderr[-2000:]}")
    # Task names without their role's prefix ("specdec.eagle3.preflight : Refuse ..." -> "Refuse ...").
    rows = [(play["play"]["name"], task["task"]["name"].split(" : ", 1)[-1], res)
            for play in out["plays"] for task in play["tasks"] for host, res in task["hosts"].items() if host == HOST]
    return proc.returncode, rows


REPORT = "Report every problem found, one line each"


def failures(rows):
    """One entry per problem: the validate play reports every problem of the host in its last task (one line each;
    the checks before it fail without stopping the play); a failure of a later stage is its task's messages."""
    for _play, task, res in rows:
        if task == REPORT and res.get("failed"):
            return [(REPORT, [line]) for line in res["msg"].splitlines()[1:]]
    out = []
    for _play, task, res in rows:
        if res.get("failed"):
            items = [i.get("msg", "") for i in res.get("results", [])
                     if i.get("failed") or "exception" in i or i.get("evaluated_to") is False]
            out.append((task, items or [res.get("msg", "")]))
    return out


def one_line(rows, expected):
    failed = failures(rows)
    assert len(failed) == 1 and len(failed[0][1]) == 1, failed
    task, (msg,) = failed[0]
    assert "\n" not in msg.strip(), msg
    assert task == REPORT or msg.startswith(f"{HOST}: "), msg  # the report's header names the host once
    for words in expected:
        assert words in msg, msg
    return msg


def chosen_cuda(rows):
    picks = [res["ansible_facts"]["cuda_toolkit_effective_version"] for _play, task, res in rows
             if task == "Work out the toolkit version from the vLLM version" and "ansible_facts" in res]
    assert picks, "no CUDA toolkit was chosen"
    return picks


# ------------------------------------------------------------------------------------------ the inventories' values
def test_kimi_current_matches_the_toolkit_to_the_tracks_vllm_without_restating_it():
    # The toolkit role reads cuda_toolkit_vllm_version (default: the patched track's vllm_version); the inventory
    # points it at the current track's pin instead of writing a CUDA or vLLM version a second time.
    assert group_vars("kimi-current", "gpu")["cuda_toolkit_vllm_version"] == "{{ current_stack_vllm_version }}"
    assert group_vars("kimi-current", "stack")["current_stack_vllm_version"] == "0.34.0"
    assert "cu129 -> 12.9" not in (ROOT / "inventory/kimi-current/group_vars/eagle3_hosts/gpu.yml").read_text()


def test_kimi_current_chooses_the_draft_attention_instead_of_relying_on_auto():
    # speculators 0.9 builds the draft's attention from the verifier's text_config (head_dim, else hidden / heads:
    # 7168 / 64 = 112), never MLA's 192; `auto` hangs on which config code supplies head_dim, so the inventory names
    # the implementation that trains at any head size.
    assert group_vars("kimi-current", "pipeline")["eagle3_pipeline_draft_attn_impl"] == "sdpa"


def test_kimi_current_trains_at_speculators_0_9_s_own_learning_rate():
    # speculators 0.9 (train/config/schema.py): optimizer muon, lr 1e-3, muon_lr defaults to lr. The pipeline passes
    # --lr and no --optimizer, so the inventory's value is Muon's rate.
    assert group_vars("kimi-current", "pipeline")["eagle3_pipeline_lr"] == pytest.approx(1e-3)


# ------------------------------------------------------------------------------------ this machine, local connection
def open_dir():
    """A directory others may enter (pytest's tmp_path lies below a 0700 directory the pipeline user cannot pass)."""
    d = Path(tempfile.mkdtemp(prefix="specdec-kimi-", dir="/tmp"))
    d.chmod(0o755)
    return d


@pytest.fixture(scope="module")
def model_dir():
    base = open_dir()
    d = base / "Kimi-K2.5"
    d.mkdir(mode=0o755)
    (d / "config.json").write_text(json.dumps(KIMI_CONFIG))
    for name in KIMI_FILES:
        (d / name).write_text("")
    yield d
    shutil.rmtree(base)


def local(model_dir, **extra):
    base = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "eagle3_pipeline_target_path": str(model_dir), "eagle3_pipeline_max_samples": 2,
            # Interpreters this machine has (the shipped python3.12 is refused where it does not run, below).
            "ml_venv_python": sys.executable, "eagle3_evaluate_python": sys.executable,
            "nvidia_driver_require_device": False, "specdec_check_published": False}
    return dict(base, **extra)


def runs(python):
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, check=False).returncode == 0
    except OSError:
        return False


@pytest.mark.parametrize("inventory", ["kimi", "kimi-current"])
def test_the_shipped_values_pass_preflight_and_choose_the_tracks_cuda(inventory, model_dir):
    rc, rows = playbook(inventory, local(model_dir))
    assert (rc, failures(rows)) == (0, [])
    # vLLM 0.16 nightly (cu129 torch) -> CUDA 12.9; vLLM 0.34.0 (torch 2.14.0, cu130) -> CUDA 13.0.
    assert chosen_cuda(rows) == [{"kimi": "12.9", "kimi-current": "13.0"}[inventory]]


def test_old_kimi_current_cuda_is_refused(model_dir):
    # Without the inventory's line the toolkit matched the patched track's default vLLM (0.16.0): CUDA 12.9.
    _rc, rows = playbook("kimi-current", local(model_dir, cuda_toolkit_vllm_version="0.16.0"))
    one_line(rows, ["cuda_toolkit_vllm_version is '0.16.0', so the stack stage would install CUDA 12.9",
                    "the current track installs vLLM 0.34.0, whose torch is built for CUDA 13.0",
                    "Set cuda_toolkit_vllm_version to the track's vLLM version (current_stack_vllm_version"])


def test_an_explicit_toolkit_older_than_the_torch_is_refused(model_dir):
    _rc, rows = playbook("kimi-current", local(model_dir, cuda_toolkit_version="12.8"))
    one_line(rows, ["cuda_toolkit_version '12.8'", "would install CUDA 12.8", "cuda_toolkit_version to 13.0"])


@pytest.mark.parametrize("inventory", ["kimi", "kimi-current"])
def test_the_shipped_interpreter_is_refused_where_it_does_not_run(inventory, model_dir):
    if runs("python3.12"):
        pytest.skip("python3.12 runs on this machine; the container test proves the refusal on Debian 12")
    extra = local(model_dir)
    del extra["ml_venv_python"], extra["eagle3_evaluate_python"]
    _rc, rows = playbook(inventory, extra)
    failed = failures(rows)
    # kimi builds the ML venv and its own evaluation venv from python3.12; kimi-current evaluates in its ML venv.
    expected = ["specdec_python_version is 3.12, but python3.12 does not run on this host"]
    if inventory == "kimi":
        expected.append("eagle3_evaluate_python is python3.12, but python3.12 does not run on this host")
    assert [(task, lines[0].split(" (")[0]) for task, lines in failed] == [(REPORT, e) for e in expected], failed
    assert all("Install it first" in lines[0] for _task, lines in failed)


@ROOT_HOME_0700
def test_the_old_kimi_prefix_is_refused(model_dir):
    _rc, rows = playbook("kimi", local(model_dir, specdec_prefix="/root"))
    one_line(rows, ["specdec_prefix is /root, but the pipeline runs as 'specdec'",
                    "cannot pass through /root (mode 0700, root:root) on the way to the pipeline code"])


@pytest.fixture
def closed_dir():
    """A root-owned directory others cannot enter (mode 0750), like a home directory."""
    base = open_dir()
    d = base / "home"
    d.mkdir()
    d.chmod(0o750)
    yield d
    shutil.rmtree(base)


def test_a_prefix_the_new_pipeline_user_cannot_reach_is_refused(model_dir, closed_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root: the refusal is about a directory only root can enter")
    _rc, rows = playbook("kimi", local(model_dir, specdec_prefix=str(closed_dir / "specdec")))
    one_line(rows, [f"specdec_prefix is {closed_dir}/specdec, but the pipeline runs as 'specdec'",
                    f"cannot pass through {closed_dir} (mode 0750, root:root) on the way to the pipeline code",
                    f"chmod o+x {closed_dir}"])


def _target_in(closed_dir):
    """A Kimi-K2.5 directory (config and empty weight files) below CLOSED_DIR; needs root, as the refusals do."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the refusal is about a directory only root can read")
    target = closed_dir / "Kimi-K2.5"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(KIMI_CONFIG))
    for name in KIMI_FILES:
        (target / name).write_text("")
    return target


# One inventory per refusal (preflight's path checks are the same on both tracks; each play took 60-120 s of CI's
# 2 cores): the target's closed parent on kimi-current, the closed target itself on kimi.
def test_a_target_below_a_directory_the_new_pipeline_user_cannot_enter_is_refused(closed_dir):
    target = _target_in(closed_dir)
    _rc, rows = playbook("kimi-current", local(target))
    one_line(rows, [f"eagle3_pipeline_target_path is {target}",
                    f"cannot pass through {closed_dir} (mode 0750, root:root) on the way to the target model"])


def test_a_target_the_new_pipeline_user_cannot_read_is_refused_although_root_can(closed_dir):
    target = _target_in(closed_dir)
    closed_dir.chmod(0o755)
    target.chmod(0o700)
    _rc, rows = playbook("kimi", local(target))
    one_line(rows, [f"cannot read {target} (mode 0700, root:root) on the way to the target model", "chmod o+rx"])


# --------------------------------------------------------------------------------- a Debian 12 host in a container
IMAGE = "specdec/debian:bookworm"


@pytest.fixture(scope="module")
def standin():
    """A fresh container of this test's own (removed at the end) with the model directory at the inventories' path."""
    if shutil.which("docker") is None or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True,
                                                        check=False).returncode != 0:
        pytest.skip(f"no Docker engine or no {IMAGE} image (scripts/docker-up builds it)")
    name = f"kimi-standin-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "run", "-d", "--name", name, "--hostname", HOST, IMAGE, "sleep", "infinity"],
                   check=True, capture_output=True)
    try:
        files = " ".join(KIMI_FILES)
        subprocess.run(["docker", "exec", name, "sh", "-c",
                        f"mkdir -p /data/models/Kimi-K2.5 && cd /data/models/Kimi-K2.5 && touch {files} && "
                        f"printf '%s' '{json.dumps(KIMI_CONFIG)}' > config.json"], check=True)
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def on(standin, **extra):
    return dict({"ansible_host": standin, "ansible_connection": "community.docker.docker",
                 "ansible_python_interpreter": "/usr/bin/python3"}, **GPU_FACTS, **extra)


def sh(standin, script):
    subprocess.run(["docker", "exec", standin, "sh", "-c", script], check=True, capture_output=True)


def test_debian_12_refuses_the_shipped_python_3_12_before_installing_anything(standin):
    # inventory/kimi: both of its interpreters are refused (kimi-current's one is the same check; 45-90 s each).
    rc, rows = playbook("kimi", on(standin), "--check", "--tags", "stack", playbook_path="site.yml")
    assert rc != 0
    failed = failures(rows)
    assert failed and all(task == REPORT for task, _lines in failed), failed
    assert all("python3.12 does not run on this host (Debian 12" in lines[0] for _task, lines in failed), failed
    # Refused in the validate play: no task of the stack stage ran.
    assert not [task for play, task, _res in rows if play == "Install the GPU and Python stack"]


@pytest.mark.parametrize("inventory", ["kimi", "kimi-current"])
def test_the_standin_host_through_preflight_and_the_stack_stage_in_check_mode(standin, inventory):
    # Debian 12's interpreter in place of python3.12 (what a user of this release sets), everything else as shipped.
    rc, rows = playbook(inventory, on(standin, ml_venv_python="/usr/bin/python3.11",
                                      eagle3_evaluate_python="/usr/bin/python3.11"),
                        "--check", "--diff", "--tags", "stack", playbook_path="site.yml")
    stack = [(task, res) for play, task, res in rows if play == "Install the GPU and Python stack"]
    failed = failures(rows)
    cuda = {"kimi": "12.9", "kimi-current": "13.0"}[inventory]
    assert set(chosen_cuda(rows)) == {cuda}
    messages = [res.get("msg", "") for _task, res in stack]
    assert any(f"Check mode: cuda-toolkit-{cuda.replace('.', '-')} would be installed" in m for m in messages), messages
    pins = [res for task, res in stack if task == "Pin the driver packages to branch 580"]
    assert pins and "Pin: version 580.*" in pins[0]["diff"][0]["after"]
    assert (rc, failed) == (0, [])
    if inventory == "kimi-current":
        # Check mode installed neither uv nor the venv: current_stack reports its install instead of asking a uv
        # that is not there for a dry run.
        assert any(m.startswith("Check mode: vllm==0.34.0, speculators==0.9.0 and hs-connectors==0.9.0 would be "
                                "installed into /opt/specdec/current-env") for m in messages), messages
        assert not [res for task, res in stack
                    if task == "Install vLLM, speculators and hs-connectors without their dependencies"
                    and not res.get("skipped")]


def test_an_existing_pipeline_user_is_asked_itself(standin):
    """With the user present, the path checks run as that user (become_user), not from mode bits."""
    sh(standin, "id specdec >/dev/null 2>&1 || useradd --system --create-home specdec; "
                "chown root:root /data/models/Kimi-K2.5 && chmod 0700 /data/models/Kimi-K2.5")
    try:
        extra = on(standin, ml_venv_python="/usr/bin/python3.11", eagle3_pipeline_max_samples=2)
        _rc, rows = playbook("kimi-current", extra)
        one_line(rows, ["eagle3_pipeline_target_path is /data/models/Kimi-K2.5, but the pipeline runs as 'specdec' "
                        "(an existing user)", "cannot read /data/models/Kimi-K2.5 (mode 0700, root:root)"])
        # The same mode, but the user's group may read: only asking the user itself sees that it can.
        sh(standin, "chgrp specdec /data/models/Kimi-K2.5 && chmod 0750 /data/models/Kimi-K2.5")
        rc, rows = playbook("kimi-current", extra)
        assert (rc, failures(rows)) == (0, [])
    finally:
        sh(standin, "chown root:root /data/models/Kimi-K2.5 && chmod 0755 /data/models/Kimi-K2.5 && userdel specdec")


def test_the_modes_the_checks_read_are_the_real_ones(closed_dir):
    # Guard for the local tests above: they rely on a 0750 directory being closed to others.
    assert not closed_dir.stat().st_mode & stat.S_IXOTH
