"""The repository keyring goes in place only with the pinned fingerprint (plugins/modules/openpgp_keyring.py and
roles/nvidia_driver/tasks/repository.yml).

Keyrings are real OpenPGP keys made by gpg in a temporary home; gpg --show-keys gives the fingerprints the module
must agree with. The module file runs as Ansible runs it on a host (its arguments as JSON on stdin), the downloads
come from file:// URLs; the role runs through ansible-playbook on localhost in check mode.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODULE = ROOT / "plugins" / "modules" / "openpgp_keyring.py"
NVIDIA_3BF863CC = "EB693B3035CD5710E231E123A4B469963BF863CC"
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from playbook_json import run_tasks  # noqa: E402 - tests/unit is not a package
pytestmark = pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg to make the test keys")


def gpg(home, *args):
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--no-tty", *args], capture_output=True,
                          check=True).stdout


def show_keys(path):
    """The primary-key fingerprints of a keyring file as gpg --show-keys lists them (an empty gpg home)."""
    with tempfile.TemporaryDirectory() as home:
        out = subprocess.run(["gpg", "--homedir", home, "--batch", "--no-tty", "--with-colons", "--show-keys",
                              str(path)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    return [lines[i + 1].split(":")[9] for i, line in enumerate(lines) if line.startswith("pub:")]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two keys (ed25519 and RSA, both version 4): binary and armored exports of each."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    out = {}
    for name, algo in (("good", "ed25519"), ("other", "rsa2048")):
        gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>", algo, "sign", "never")
        binary = home / f"{name}.gpg"
        binary.write_bytes(gpg(home, "--export", f"{name}@example.invalid"))
        armored = home / f"{name}.asc"
        armored.write_bytes(gpg(home, "--armor", "--export", f"{name}@example.invalid"))
        [fpr] = show_keys(binary)
        out[name] = {"gpg": binary, "asc": armored, "fpr": fpr}
    return out


def one_line(res, *words):
    msg = res["msg"]
    return res.get("failed") and "\n" not in msg and all(str(w) in msg for w in words)


def module(path, url, fingerprints, check=False):
    """Run the module file directly (as Ansible would on the host) and return its JSON result."""
    args = {"ANSIBLE_MODULE_ARGS": {"path": str(path), "url": url, "fingerprints": fingerprints,
                                    "name": "the test key", "_ansible_check_mode": check}}
    proc = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(args), capture_output=True, text=True,
                          check=False, cwd=path.parent)
    return json.loads(proc.stdout)


def test_the_module_downloads_keeps_and_refuses_by_fingerprint(tmp_path, keys):
    good, other = keys["good"], keys["other"]
    d = {name: tmp_path / f"{name}.gpg" for name in ("binary", "armored", "rsa", "wrong", "kept", "refused", "junk")}
    shutil.copy(good["gpg"], d["kept"])
    shutil.copy(other["gpg"], d["refused"])
    d["junk"].write_text("not a key\n")
    res = {
        "binary": module(d["binary"], f"file://{good['gpg']}", [good["fpr"]]),
        "armored": module(d["armored"], f"file://{good['asc']}", [good["fpr"]]),
        "rsa": module(d["rsa"], f"file://{other['asc']}", [other["fpr"]]),
        "wrong": module(d["wrong"], f"file://{other['gpg']}", [good["fpr"]]),
        "kept": module(d["kept"], "file:///nonexistent", [good["fpr"].lower()]),
        "refused": module(d["refused"], f"file://{good['gpg']}", [good["fpr"]]),
        "refused in check mode": module(d["refused"], f"file://{good['gpg']}", [good["fpr"]], check=True),
        "junk": module(d["junk"], "", [good["fpr"]]),
    }
    # Downloads: stored binary whatever was downloaded, 0644, and gpg reads the same key from the file.
    for name, key in (("binary", good), ("armored", good), ("rsa", other)):
        assert res[name]["changed"] and res[name]["fingerprints"] == [key["fpr"]], res[name]
        assert d[name].read_bytes() == key["gpg"].read_bytes()
        assert show_keys(d[name]) == [key["fpr"]]
        assert oct(d[name].stat().st_mode & 0o777) == "0o644"
    # A download with another key: one line naming both keys, nothing written.
    assert one_line(res["wrong"], other["fpr"], good["fpr"], "nothing was written"), res["wrong"]
    assert not d["wrong"].exists() and list(tmp_path.glob(".specdec-keyring-*")) == []
    # An existing file: kept when its key is pinned, refused (and left as it was) when not.
    assert not res["kept"].get("failed") and not res["kept"]["changed"], res["kept"]
    assert one_line(res["refused"], d["refused"], other["fpr"], good["fpr"], "nothing was changed"), res["refused"]
    assert one_line(res["refused in check mode"], d["refused"], other["fpr"], "nothing was changed")
    assert d["refused"].read_bytes() == other["gpg"].read_bytes()
    assert one_line(res["junk"], d["junk"], "is not an OpenPGP keyring"), res["junk"]


def test_the_driver_role_refuses_a_keyring_that_is_not_nvidias(tmp_path, keys):
    """The driver role's repository tasks (check mode) refuse a key at the keyring path that is not NVIDIA's (the
    old role kept any file there and pointed apt at it)."""
    dest = tmp_path / "cuda-archive-keyring.gpg"
    shutil.copy(keys["other"]["gpg"], dest)
    tasks = [{"name": "facts", "ansible.builtin.setup": {"gather_subset": ["min"]}},
             {"name": "role", "ansible.builtin.include_role": {
                 "name": "specdec.eagle3.nvidia_driver", "tasks_from": "repository"}}]
    rc, res = run_tasks(tmp_path, tasks, "--check", "-e", json.dumps({"nvidia_driver_keyring_path": str(dest)}))
    assert rc != 0
    [failed] = [r for r in res.values() if r.get("failed")]
    pinned = NVIDIA_3BF863CC if "bookworm" in Path("/etc/os-release").read_text() else ""
    assert one_line(failed, dest, keys["other"]["fpr"], pinned, "nothing was changed"), failed
    assert dest.read_bytes() == keys["other"]["gpg"].read_bytes()
