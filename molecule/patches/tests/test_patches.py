"""After converge (speculators 0.3.0 + vLLM 0.16.0): every patch the pair needs is in the installed files, the
files compile under the venv's interpreter, and owner and mode are kept. Expectations come from the patch set
and the unit-test table of the same release pair, not from copies here."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
VENV = "/opt/specdec/ml-env"
PATCHES = yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
PAIR = next(c for c in yaml.safe_load((ROOT / "tests" / "unit" / "source_patch" / "cases.yml").read_text())["pairs"]
            if c["id"] == "spec030-vllm0160")


def _site(host):
    return host.check_output(f"{VENV}/bin/python -c \"import sysconfig; print(sysconfig.get_paths()['purelib'])\"")


def test_installed_versions(host):
    out = host.check_output(f"{VENV}/bin/python -c \"import importlib.metadata as m; "
                            f"print(m.version('speculators'), m.version('vllm'))\"")
    assert out == "0.3.0 0.16.0"


@pytest.mark.parametrize("patch", PATCHES, ids=[p["id"] for p in PATCHES])
def test_patch_text_matches_the_need(host, patch):
    text = host.file(f"{_site(host)}/{patch['file']}").content_string
    needed = PAIR["expect"][patch["id"][:3]] == "A"
    for hunk in patch["hunks"]:
        if needed:
            assert hunk["after"] in text and text.count(hunk["before"]) == (1 if hunk["before"] in hunk["after"] else 0)
        else:
            assert hunk["before"] in text


def test_patched_files_compile_in_the_container(host):
    site = _site(host)
    for rel in sorted({p["file"] for p in PATCHES}):
        host.run_expect([0], f"{VENV}/bin/python -m py_compile {site}/{rel}")
        f = host.file(f"{site}/{rel}")
        assert f.user == "root" and f.mode == 0o644


def test_no_temp_or_backup_files_left(host):
    out = host.check_output(f"find {_site(host)}/speculators -name '*.tmp' -o -name '*~'")
    assert out == ""
