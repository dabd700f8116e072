"""The real import chain: vllm with its dependencies and speculators' vLLM hidden-states generator module."""

import json

VENV = "/opt/specdec/ml-env"


def test_vllm_imports_with_its_pinned_torch(host):
    cmd = host.run(f"{VENV}/bin/python -c 'import vllm, torch; print(vllm.__version__, torch.__version__)'")
    assert cmd.rc == 0, cmd.stderr
    vllm_version, torch_version = cmd.stdout.split()
    assert vllm_version == "0.16.0"
    assert torch_version.startswith("2.9.1")


def test_speculators_generator_module_imports(host):
    cmd = host.run(f"{VENV}/bin/python -c 'import speculators.data_generation.vllm_hidden_states_generator as g; print(g.__file__)'")
    assert cmd.rc == 0, cmd.stderr


def test_speculators_left_vllm_pins_alone(host):
    record = json.loads(host.file(f"{VENV}/specdec-speculators.json").content_string)
    assert "vllm==0.16.0" in record["protected"]
    assert any(line.startswith("torch==2.9.1") for line in record["protected"])
