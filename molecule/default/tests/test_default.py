"""The stack play leaves a uv-built venv with the pinned vLLM and speculators, and records what it installed."""

import json

VENV = "/opt/specdec/ml-env"


def _version(host, dist):
    cmd = host.run(f"{VENV}/bin/python -c \"import importlib.metadata as m; print(m.version('{dist}'))\"")
    assert cmd.rc == 0, cmd.stderr
    return cmd.stdout.strip()


def test_uv_is_the_pinned_release(host):
    out = host.check_output("/opt/specdec/tools/uv/bin/uv --version")
    assert out.split()[1] == "0.13.9"


def test_venv_uses_the_container_python(host):
    py = host.check_output(f"{VENV}/bin/python -c \"import sys; print('%d.%d' % sys.version_info[:2])\"")
    assert py == host.check_output("/usr/bin/python3 -c \"import sys; print('%d.%d' % sys.version_info[:2])\"")


def test_vllm_record_matches_the_venv(host):
    record = json.loads(host.file(f"{VENV}/specdec-vllm.json").content_string)
    assert record["pin"]["mode"] == "wheel"
    assert record["pin"]["sha256"] == "f066b2a2f8597a4a3ada8fbbfd122b59086864b2260ca42dc81bf9fb57af0c42"
    assert record["version"] == _version(host, "vllm") == "0.16.0"
    assert host.file(f"{VENV}/lib").exists


def test_speculators_is_installed_without_deepspeed_or_a_second_vllm(host):
    assert _version(host, "speculators") == "0.3.0"
    record = json.loads(host.file(f"{VENV}/specdec-speculators.json").content_string)
    assert record["version"] == "0.3.0"
    # the vllm role installed the local wheel from its checked, root-owned copy
    wheel = "vllm @ file:///opt/specdec/cache/wheels/vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert record["protected"] == [wheel]
    constraints = host.file(f"{VENV}/specdec-constraints.txt").content_string
    assert wheel in constraints.splitlines()
    freeze = host.check_output(f"/opt/specdec/tools/uv/bin/uv pip freeze --python {VENV}/bin/python")
    assert "deepspeed" not in freeze and "speculators==0.3.0" in freeze.splitlines()
