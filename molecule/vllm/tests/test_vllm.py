"""After a pin change from the local wheel to the PyPI release, the record and the venv agree on vLLM 0.16.0."""

import json

VENV = "/opt/specdec/ml-env"


def test_record_names_the_release_pin(host):
    record = json.loads(host.file(f"{VENV}/specdec-vllm.json").content_string)
    assert record["pin"] == {
        "mode": "release", "version": "0.16.0", "commit": "", "variant": "", "wheel": "", "sha256": "",
        "no_deps": True, "torch_backend": "", "index_url": "",
    }
    assert record["kernels_downloaded"] is False


def test_venv_reports_the_recorded_version(host):
    out = host.check_output(f"{VENV}/bin/python -c \"import importlib.metadata as m; print(m.version('vllm'))\"")
    assert out == "0.16.0"


def test_requirement_file_is_the_release_pin(host):
    assert host.file("/opt/specdec/cache/wheels/specdec-vllm-requirement.txt").content_string == "vllm==0.16.0\n"


def test_vllm_sources_are_real(host):
    # A --no-deps install still carries every source file the patch stage reads.
    site = host.check_output(f"{VENV}/bin/python -c \"import sysconfig; print(sysconfig.get_paths()['purelib'])\"")
    assert host.file(f"{site}/vllm/v1/core/kv_cache_utils.py").contains("def get_kv_cache_config_from_groups")
