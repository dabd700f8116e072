"""A host without network: the ml_venv role's wheelhouse (specdec_wheelhouse) and inherited site-packages
(specdec_venv_inherit_site_packages), through the real role with ansible-playbook on localhost.

The wheelhouse holds tiny real wheels built here (tinywheel) and the real wheel of the pinned uv, which pip installs
from it with --require-hashes. pip's configuration, PIP_INDEX_URL, PIP_FIND_LINKS and UV_INDEX_URL name an index
that holds only a newer version of the probe package (and no uv): what is installed must come from the wheelhouse
only. Each broken wheelhouse is refused in one line before anything
exists under the prefix, in check mode too.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from playbook_json import report, run, run_tasks  # noqa: E402 - tests/unit is not a package
from tinywheel import UV_VERSION, file_index, uv_wheel, wheel  # noqa: E402 - tests/unit/stack is not a package

PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
PKG = "specdec-probe-pkg"  # a name no public index carries
INSTALL = "Install the probe package"
REFUSE = "Refuse a wheelhouse that is missing, changeable by another account or differs from its SHA256SUMS"


def sums(folder: Path) -> None:
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in sorted(folder.glob("*.whl"))]
    (folder / "SHA256SUMS").write_text("".join(lines))


@pytest.fixture()
def wheelhouse(tmp_path, monkeypatch):
    """TMP/wheelhouse: uv's wheel and PKG 1.0, with SHA256SUMS; an index with only PKG 2.0 named by pip's and uv's
    settings."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    source = uv_wheel()
    try:
        os.link(source, folder / source.name)
    except OSError:
        shutil.copyfile(source, folder / source.name)
    wheel(folder, PKG, "1.0")
    sums(folder)
    newer = file_index(tmp_path / "index", PKG, ["2.0"])
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nextra-index-url = {newer}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("UV_INDEX_URL", newer)
    # Neither holds uv: pip installs it from the wheelhouse or not at all.
    monkeypatch.setenv("PIP_INDEX_URL", newer)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    return folder


def play(tmp_path: Path, *args: str, **variables) -> tuple[int, dict]:
    """The role's main tasks with the wheelhouse, then PKG through the uv_pip module as the stack's roles install."""
    prefix = tmp_path / "prefix"
    return run_tasks(tmp_path, [
        {"name": "Create the venv", "ansible.builtin.include_role": {"name": "specdec.eagle3.ml_venv"}},
        {"name": INSTALL, "specdec.eagle3.uv_pip": {
            "uv": "{{ ml_venv_uv_bin }}", "python": "{{ ml_venv_python_bin }}",
            "args": "{{ ml_venv_source_args + ['" + variables.pop("requirement", PKG) + "'] }}"},
         "environment": "{{ ml_venv_install_env }}", "when": "not ansible_check_mode"},
    ], *args, play_vars={
        "specdec_prefix": str(prefix), "specdec_venv_path": str(prefix / "venv"), "specdec_python_version": PYVER,
        "specdec_extra_ca_bundle": "", "ml_venv_python": sys.executable, "ml_venv_seed": False,
        "specdec_wheelhouse": str(tmp_path / "wheelhouse"), **variables})


def venv_run(tmp_path: Path, code: str) -> str:
    python = tmp_path / "prefix" / "venv" / "bin" / "python"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def changed(results: dict) -> list:
    return sorted(name for name, res in results.items() if res.get("changed"))


def refused(tmp_path: Path, *args: str) -> str:
    """The role's one-line refusal; nothing may exist under the prefix."""
    rc, results = play(tmp_path, *args)
    assert rc != 0, results
    res = results[REFUSE]
    assert res.get("failed") is True, results
    assert "\n" not in res["msg"]
    assert not (tmp_path / "prefix").exists()
    return res["msg"]


def test_a_good_wheelhouse_installs_offline_and_the_image_site_packages_are_seen(tmp_path, wheelhouse):
    image = tmp_path / "image" / "site-packages"
    image.mkdir(parents=True)
    (image / "specdec_image_probe.py").write_text("VALUE = 'from the image'\n")
    # Check mode (with diff) passes the checks and creates nothing.
    rc, results = play(tmp_path, "--check", "--diff", "-e", '{"specdec_venv_inherit_site_packages": ["%s"]}' % image)
    assert rc == 0, results
    assert not (tmp_path / "prefix").exists()
    rc, results = play(tmp_path, "-e", '{"specdec_venv_inherit_site_packages": ["%s"]}' % image)
    assert rc == 0, results
    res = results[INSTALL]
    assert res["changed"] is True
    assert res["cmd"][-4:] == ["--offline", "--no-index", f"--find-links={wheelhouse}", PKG]
    # The wheelhouse's 1.0, not the 2.0 that pip's settings and UV_INDEX_URL name.
    assert venv_run(tmp_path, "import specdec_probe_pkg as p; print(p.VALUE)") == "1.0"
    assert (tmp_path / "prefix" / "tools" / "uv" / "bin" / "uv").exists()
    assert "Read the host's pip settings (find-links, indexes, constraints, cert) for uv" not in changed(results)
    # The image's module imports, and the venv's own site-packages come first.
    assert venv_run(tmp_path, "import specdec_image_probe as p; print(p.VALUE)") == "from the image"
    order = venv_run(tmp_path, "import sys; print('\\n'.join(sys.path))").splitlines()
    own = next(i for i, p in enumerate(order) if p.startswith(str(tmp_path / "prefix" / "venv")))
    assert own < order.index(str(image))
    # Again: nothing changes.
    rc, again = play(tmp_path, "-e", '{"specdec_venv_inherit_site_packages": ["%s"]}' % image)
    assert rc == 0, again
    assert changed(again) == []
    # The list emptied: the .pth file goes, and with it the image's module.
    rc, emptied = play(tmp_path)
    assert rc == 0 and changed(emptied) == ["Remove the inherited site-packages the inventory no longer lists",
                                            "Remove the overrides of site-packages the inventory no longer lists"]
    probe = subprocess.run([str(tmp_path / "prefix" / "venv" / "bin" / "python"), "-c", "import specdec_image_probe"],
                           capture_output=True, check=False)
    assert probe.returncode != 0


def test_a_requirement_an_inherited_site_packages_provides_is_left_to_it(tmp_path, wheelhouse):
    # The image holds specdec-image-dep (as an image holds torch); the wheelhouse has a package that requires it and
    # no wheel of it. With the image inherited, uv leaves the requirement to the image's copy.
    image = tmp_path / "image" / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                    "--target", str(image), str(wheel(tmp_path / "image-wheels", "specdec-image-dep", "3.0"))],
                   check=True, capture_output=True)
    wheel(wheelhouse, "specdec-probe-needs", "1.0", requires=("specdec-image-dep>=2",))
    sums(wheelhouse)
    inherit = '{"specdec_venv_inherit_site_packages": ["%s"]}' % image
    rc, results = play(tmp_path, "-e", inherit, requirement="specdec-probe-needs")
    assert rc == 0, results
    assert results[INSTALL]["changed"] is True
    assert venv_run(tmp_path, "import specdec_probe_needs as p, specdec_image_dep as d; print(p.VALUE, d.__file__)") \
        == f"1.0 {image / 'specdec_image_dep' / '__init__.py'}"
    overrides = tmp_path / "prefix" / "venv" / "specdec-inherited-overrides.txt"
    assert 'specdec-image-dep ; sys_platform == "never"' in overrides.read_text().splitlines()
    rc, again = play(tmp_path, "-e", inherit, requirement="specdec-probe-needs")
    assert rc == 0 and changed(again) == [], again
    # The list emptied: the overrides go with the .pth file.
    rc, emptied = play(tmp_path, requirement=PKG)
    assert rc == 0, emptied
    assert not overrides.exists()


def test_a_requirement_the_wheelhouse_lacks_is_one_line(tmp_path, wheelhouse):
    rc, results = play(tmp_path, requirement="specdec-probe-absent>=1")
    assert rc != 0
    msg = results[INSTALL]["msg"]
    venv = tmp_path / "prefix" / "venv"
    assert msg == (
        f"the wheelhouse {wheelhouse} (specdec_wheelhouse) has no wheel for specdec-probe-absent, which installing into "
        f"{venv} needs (specdec-probe-absent was not found in the provided package locations and you require "
        f"specdec-probe-absent>=1); nothing was installed. Add a wheel of specdec-probe-absent for this host's Python "
        f"and platform to {wheelhouse} with its line in SHA256SUMS, then run again.")
    assert venv_run(tmp_path, "import importlib.util as u; print(u.find_spec('specdec_probe_absent'))") == "None"


def test_a_tampered_wheel_is_refused_in_one_line(tmp_path, wheelhouse):
    probe = wheelhouse / f"{PKG.replace('-', '_')}-1.0-py3-none-any.whl"
    listed = hashlib.sha256(probe.read_bytes()).hexdigest()
    with probe.open("ab") as handle:
        handle.write(b"tampered")
    actual = hashlib.sha256(probe.read_bytes()).hexdigest()
    want = (f"localhost: wheel {probe.name} in {wheelhouse} does not match its sha256 in {wheelhouse}/SHA256SUMS "
            f"(listed {listed}, the file has {actual}; specdec_wheelhouse): replace it with the file that was listed, "
            f"or fix the line if this file is the one you trust.")
    assert refused(tmp_path) == want
    assert refused(tmp_path, "--check") == want


def test_a_listed_wheel_that_is_missing_is_refused(tmp_path, wheelhouse):
    probe = wheelhouse / f"{PKG.replace('-', '_')}-1.0-py3-none-any.whl"
    probe.unlink()
    assert refused(tmp_path) == (
        f"localhost: {wheelhouse}/SHA256SUMS lists {probe.name}, which is missing from {wheelhouse} "
        f"(specdec_wheelhouse): put that file there or remove its line.")


def test_an_unlisted_wheel_is_refused(tmp_path, wheelhouse):
    extra = wheel(wheelhouse, "specdec-probe-extra", "1.0")
    assert refused(tmp_path) == (
        f"localhost: wheel {extra.name} in {wheelhouse} is not listed in {wheelhouse}/SHA256SUMS (specdec_wheelhouse): "
        f"add its line (cd {wheelhouse} && sha256sum {extra.name} >> SHA256SUMS) once you trust it, or remove the "
        f"wheel.")


def test_inherited_site_packages_must_be_absolute_existing_directories(tmp_path, wheelhouse):
    rc, results = play(tmp_path, "-e", '{"specdec_venv_inherit_site_packages": ["relative/site", "%s"]}'
                       % (tmp_path / "absent"))
    assert rc != 0
    res = results["Refuse an inherited site-packages that is not an absolute path of an existing directory"]
    lines = [item["msg"] for item in res["results"] if item.get("failed")]
    assert [re.sub(r";.*", "", line) for line in lines] == [
        "localhost: specdec_venv_inherit_site_packages lists 'relative/site', which is not an absolute path",
        f"localhost: specdec_venv_inherit_site_packages lists '{tmp_path / 'absent'}', which is not an existing "
        "directory on this host"]
    assert not (tmp_path / "prefix").exists()


def test_a_seed_the_wheelhouse_lacks_is_one_line(tmp_path, wheelhouse):
    rc, results = play(tmp_path, "-e", '{"ml_venv_seed": true}')
    assert rc != 0
    msg = results["Refuse a venv that uv could not create"]["msg"]
    assert re.fullmatch(
        rf"localhost: uv could not create the venv {re.escape(str(tmp_path / 'prefix' / 'venv'))}: the wheelhouse "
        rf"{re.escape(str(wheelhouse))} \(specdec_wheelhouse\) has no wheel for (pip|setuptools|wheel), which --seed "
        r"installs; add it with its line in SHA256SUMS, or set ml_venv_seed to false\.", msg), msg


def test_the_validate_play_reports_the_offline_settings_with_every_other_problem(tmp_path):
    """The validate stage runs the same checks before anything changes, and looks for the pins in the wheelhouse."""
    folder = tmp_path / "wheelhouse"
    wheel(folder, PKG, "1.0")
    sums(folder)
    extra = wheel(folder, "specdec-probe-extra", "1.0")
    rc, out = run("validate.yml", "local-current", {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ml_venv_python": sys.executable,
        "eagle3_evaluate_python": sys.executable, "specdec_wheelhouse": str(folder),
        "specdec_venv_inherit_site_packages": ["relative/site"]})
    assert rc != 0
    lines = report(out)[1:]
    assert f"wheel {extra.name} in {folder} is not listed in {folder}/SHA256SUMS (specdec_wheelhouse): add its line " \
           f"(cd {folder} && sha256sum {extra.name} >> SHA256SUMS) once you trust it, or remove the wheel." in lines
    assert [line for line in lines if line.startswith(
        "specdec_venv_inherit_site_packages lists 'relative/site', which is not an absolute path;")], lines
    # The pins are looked for in the wheelhouse only, not in this machine's pip sources.
    assert [line for line in lines if line.startswith("current_stack_speculators_version is ")
            and f" is published on none of {folder} (" in line], lines


def test_a_wheelhouse_another_account_can_change_is_refused(tmp_path, wheelhouse):
    if os.geteuid() != 0:
        pytest.skip("the rule applies to root runs only")
    wheelhouse.chmod(0o777)
    assert refused(tmp_path) == (
        f"localhost: specdec_wheelhouse is {wheelhouse}, and this run is root: {wheelhouse} is writable by others "
        f"(mode 777), owner uid 0 (root), so another account could change what root installs. Make it writable by its "
        f"owner only (chmod go-w {wheelhouse}), then run again.")


def test_a_wheelhouse_without_uv_is_one_line(tmp_path, wheelhouse):
    for found in wheelhouse.glob("uv-*.whl"):
        found.unlink()
    sums(wheelhouse)
    rc, results = play(tmp_path)
    assert rc != 0
    msg = results["Refuse a uv wheel that does not match the pinned sha256"]["msg"]
    assert "\n" not in msg
    assert msg.startswith(
        f"localhost: pip could not install uv=={UV_VERSION} into {tmp_path / 'prefix' / 'tools' / 'uv'} from the "
        f"wheelhouse {wheelhouse} (specdec_wheelhouse): it has no uv {UV_VERSION} wheel for this host with one of the "
        f"sha256 in ml_venv_uv_sha256; add it (pip download uv=={UV_VERSION} --no-deps on a machine with network) with "
        "its line in SHA256SUMS"), msg
    assert not (tmp_path / "prefix" / "venv").exists()
