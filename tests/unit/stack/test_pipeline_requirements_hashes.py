"""The pipeline's own requirements (requirements-pipeline.txt) are installed in pip's hash-checking mode.

Every requirement is an exact pin with sha256 hashes; the eagle3_pipeline role, scripts/pipeline-venv and
tests/vllm_cpu/venv.py install the file with --require-hashes in a pip call of its own; and a real install into a
scratch venv holding only what the stack provides (numpy, packaging) succeeds and is complete (pillow too: a fresh
host's vLLM did not bring it), while one without numpy is refused before anything is installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
REQS = FILES / "requirements-pipeline.txt"
CHECK = FILES / "requirements_check.py"
# What the file leaves to the stack (its header says so): a pin here would replace the stack's version.
FROM_STACK = ["numpy", "packaging"]


def requirements(text):
    """[(name, version, [sha256, ...])] of a requirements text, continuation lines joined."""
    out = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert m, f"{REQS.name}: {line!r} is not `name==version --hash=sha256:<64 hex> ...`"
        out.append((m.group(1), m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3))))
    return out


def test_every_requirement_is_pinned_with_hashes():
    reqs = requirements(REQS.read_text())
    names = [req[0].lower() for req in reqs]
    assert {"sentencepiece", "protobuf", "matplotlib", "pillow"} <= set(names)
    assert len(names) == len(set(names)), f"{REQS.name}: a package is listed twice"
    assert not set(names) & set(FROM_STACK), f"{REQS.name} pins what the stack provides: {set(names) & set(FROM_STACK)}"


def _install_task():
    found = [t for f in sorted((ROOT / "roles" / "eagle3_pipeline" / "tasks").rglob("*.yml"))
             for t in yaml.safe_load(f.read_text()) or []
             if t.get("name") == "Install the pipeline's own packages into the ML venv"]
    assert len(found) == 1, "the eagle3_pipeline role has no single task installing requirements-pipeline.txt"
    return found[0]["ansible.builtin.command"]["argv"]


def test_the_role_installs_the_file_alone_with_require_hashes():
    argv = _install_task()
    assert isinstance(argv, list), f"the install's argv is computed ({argv!r}): --require-hashes must always be there"
    assert "--require-hashes" in argv
    assert argv.count("-r") == 1 and argv[argv.index("-r") + 1].endswith("/requirements-pipeline.txt")
    assert argv[-1] == argv[argv.index("-r") + 1], f"the hash-checked call installs something else too: {argv}"


def test_the_test_venvs_install_the_file_in_a_hash_checked_call_of_its_own():
    script = (ROOT / "scripts" / "pipeline-venv").read_text()
    installs = [x for x in script.splitlines() if x.startswith('"${pip[@]}"')]
    hashed = [x for x in installs if '"$reqs2"' in x]
    assert hashed == ['"${pip[@]}" --require-hashes -r "$reqs2"'], installs
    vllm_venv = (ROOT / "tests" / "vllm_cpu" / "venv.py").read_text()
    # Installed with uv or pip: either way the file alone, in hash-checking mode (uv's also without resolving: the
    # file lists every package it adds).
    assert "install + [*hashed, \"-r\", str(REQS[1])]" in vllm_venv
    assert 'hashed = ["--require-hashes", "--no-deps"]' in vllm_venv and 'hashed = ["--require-hashes"]' in vllm_venv
    assert vllm_venv.count("REQS[1]") == 1 and 'for a in ("-r", str(p))' not in vllm_venv


def test_the_installed_check_reads_hashed_requirements(tmp_path):
    """requirements_check.py (the role's "already installed?" test) sees each pin, not the hash lines."""
    empty = tmp_path / "empty"
    venv.create(empty, with_pip=False)
    run = subprocess.run([str(empty / "bin" / "python"), str(CHECK), REQS.read_text()],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 1
    want = "; ".join(f"{req[0]} missing (want {req[1]})" for req in requirements(REQS.read_text()))
    assert run.stdout.strip() == want


def _pip(python, *args):
    return subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def stack_venv(tmp_path_factory):
    """A scratch venv of this Python holding what the stack provides (unhashed, as the stack installs it)."""
    path = tmp_path_factory.mktemp("stack")
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    run = _pip(python, *FROM_STACK)
    if run.returncode:
        pytest.skip(f"no package index reachable for the real install: {run.stderr.strip().splitlines()[-1:]}")
    return python


def test_a_real_hash_checked_install_is_complete(stack_venv):
    run = _pip(stack_venv, "--require-hashes", "-r", str(REQS))
    assert run.returncode == 0, run.stderr
    check = subprocess.run([str(stack_venv), "-m", "pip", "check"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout
    ok = subprocess.run([str(stack_venv), str(CHECK), REQS.read_text()], capture_output=True, text=True, check=False)
    assert (ok.returncode, ok.stdout.strip()) == (0, "ok")
    subprocess.run([str(stack_venv), "-c", "import matplotlib.pyplot, sentencepiece, google.protobuf"], check=True)


def test_a_package_not_listed_is_refused_before_anything_is_installed(tmp_path):
    path = tmp_path / "nonumpy"
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    if _pip(python, "packaging").returncode:
        pytest.skip("no package index reachable for the real install")
    run = _pip(python, "--require-hashes", "-r", str(REQS))
    assert run.returncode != 0 and "numpy" in run.stderr and "--require-hashes" in run.stderr, run.stderr
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=False)
    assert not re.search(r"(?im)^(matplotlib|sentencepiece|protobuf|pillow)==", listed.stdout), listed.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
