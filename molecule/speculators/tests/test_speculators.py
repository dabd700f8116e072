"""speculators 0.3.0 imports with its real dependencies while torch and vLLM stay where they were."""

import json

VENV = "/opt/specdec/ml-env"


def _freeze(host):
    out = host.check_output(f"/opt/specdec/tools/uv/bin/uv pip freeze --python {VENV}/bin/python")
    pairs = (line.replace(" @ ", "==", 1).split("==", 1) for line in out.splitlines() if "==" in line or " @ " in line)
    return {name.strip(): version.strip() for name, version in pairs}


def test_protected_versions_did_not_move(host):
    freeze = _freeze(host)
    assert freeze["torch"] == "2.13.0+cpu"
    # The vllm role installs a local wheel from its checked, root-owned copy in the download directory.
    assert freeze["vllm"] == "file:///opt/specdec/cache/wheels/vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert freeze["transformers"].startswith("4.")
    assert freeze["speculators"] == "0.3.0"


def test_never_imported_dependencies_are_absent(host):
    freeze = _freeze(host)
    for name in ("deepspeed", "accelerate"):
        assert name not in freeze


def test_datasets_is_4x(host):
    assert _freeze(host)["datasets"].startswith("4.")


def test_speculators_eagle3_modules_import(host):
    cmd = host.run(f"{VENV}/bin/python -c 'import speculators.models.eagle3, speculators.train.trainer; print(speculators.__file__)'")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.startswith(VENV)


def test_record_and_constraints(host):
    record = json.loads(host.file(f"{VENV}/specdec-speculators.json").content_string)
    freeze = _freeze(host)
    assert record["version"] == "0.3.0"
    assert sorted(record["protected"]) == sorted(
        f"{n} @ {freeze[n]}" if freeze[n].startswith("file:") else f"{n}=={freeze[n]}" for n in ("torch", "transformers", "vllm"))
    lines = [line for line in host.file(f"{VENV}/specdec-constraints.txt").content_string.splitlines()
             if not line.startswith("#")]
    assert sorted(lines) == sorted(record["protected"])
