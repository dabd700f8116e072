"""The patch engine under kills, read-only and unwritable members, bad paths, symlinks, damaged files and
backup-name collisions - on the real speculators 0.3.0 wheel x the real vLLM 0.16.0 sources."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from faults import JOURNAL_NAME, Layout, can_mount_read_only, classify, fetch, in_child, inspect, load_set, runner

from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import PatchError, run
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import EnvError

SET = load_set("speculators_0_3_0")
GEN = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"
CORE = "speculators/models/eagle3/core.py"
LOADING = "speculators/utils/loading.py"


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    lay = Layout(tmp_path_factory.mktemp("faults"))
    files = lay.files(SET)
    lay.original = {f: Path(f).read_bytes() for f in files}
    out = lay.run(SET)
    assert not out.get("failed"), out.get("msg")
    lay.patched = {f: Path(f).read_bytes() for f in files}
    assert all(lay.patched[f] != lay.original[f] for f in files) and len(files) == 4
    return lay


@pytest.fixture
def lay(layout):
    layout.reset()
    yield layout
    layout.reset()


def _msg(out):
    return out.get("msg") or ""


# -- all or nothing, every problem of every file found before the first write --------------------------------

def test_every_problem_of_every_file_is_reported_and_nothing_is_written(lay):
    site = lay.site
    (site / GEN).write_bytes(b"\xff\xfe" + lay.original[str(site / GEN)])           # not UTF-8
    (site / WORKER).write_bytes(lay.original[str(site / WORKER)].replace(b"\n", b"\r\n"))  # CRLF
    (site / LOADING).write_bytes(b"")                                                # empty
    before = lay.snapshot()
    out = lay.run(SET)
    assert out["failed"] is True and out["changed"] is False
    assert lay.snapshot() == before
    msg = _msg(out)
    assert "vllm_hidden_states_generator.py" in msg and "is not valid UTF-8 text (byte 0xff at line 1" in msg
    assert "reinstall speculators 0.3.0 (pip install --force-reinstall --no-deps speculators==0.3.0)" in msg
    assert "custom_worker.py" in msg and "CRLF detected" in msg
    assert "loading.py" in msg and "the file is empty (0 bytes)" in msg
    assert "codec can't decode" not in msg
    assert msg.rstrip().endswith("No file of this patch set was written.")
    # core.py alone was fine: its patches are decided but reported as not written
    core = [r for r in out["results"] if r["file"].endswith("core.py")]
    assert core and all(r.get("written") is False for r in core)


def _with_immutable(path):
    if os.geteuid() != 0 or not shutil.which("chattr"):
        pytest.skip("needs root and chattr to make a file unwritable for root")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode != 0:
        pytest.skip("the file system of %s has no immutable attribute" % path)


def test_unwritable_last_member_stops_the_set_in_check_mode_and_real_run(lay):
    target = lay.site / LOADING  # the 4th file of the set
    _with_immutable(target)
    try:
        before = lay.snapshot()
        for check in (True, False):
            out = lay.run(SET, check_mode=check)
            assert out.get("failed") is True, "check_mode=%s: %s" % (check, out)
            assert "loading.py" in _msg(out) and "immutable" in _msg(out)
            assert lay.snapshot() == before and not lay.leftovers()
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)


def test_read_only_file_system_member_is_named_as_such_and_nothing_is_written(lay):
    ro_dir = lay.site / "speculators/utils"  # holds loading.py, the 4th file of the set
    if not can_mount_read_only(lay.site):
        pytest.skip("needs root with CAP_SYS_ADMIN for a read-only bind mount in a private mount namespace")
    before = lay.snapshot()
    for check in (True, False):
        killed, result, dummy = in_child(lambda c=check: lay.run(SET, check_mode=c), ro_dirs=[ro_dir])
        out = result["out"]
        assert out.get("failed") is True and out["changed"] is False, "check_mode=%s: %s" % (check, out)
        msg = _msg(out)
        assert "loading.py" in msg and "read-only file system" in msg
        assert "mode 6" not in msg and "owner uid" not in msg  # not a permissions story
        assert lay.snapshot() == before and not lay.leftovers()


# -- paths ----------------------------------------------------------------------------------------------------

def test_path_that_escapes_the_package_is_refused(lay):
    victim = lay.site.parent / "elsewhere" / "victim.py"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text("x = 1\n")
    patch = {"id": "x01", "distribution": "speculators", "file": "speculators/../../elsewhere/victim.py",
             "hunks": [{"before": "x = 1\n", "after": "x = 2\n"}]}
    out = lay.run(SET + [patch])
    assert out["failed"] is True and victim.read_text() == "x = 1\n"
    assert "resolves to %s, outside the package directory %s" % (victim, lay.pkg) in _msg(out)
    for check in (True, False):
        assert lay.run([patch], check_mode=check)["failed"] is True
    assert victim.read_text() == "x = 1\n"


def test_symlinked_target_is_patched_in_place_and_restored(lay):
    link = lay.site / CORE
    real = lay.pkg / "models" / "eagle3" / "core_real.py"
    link.rename(real)
    link.symlink_to("core_real.py")
    out = lay.run(SET)
    assert not out.get("failed"), _msg(out)
    assert link.is_symlink() and os.readlink(link) == "core_real.py"
    assert real.read_bytes() == lay.patched[str(link)]
    again = lay.run(SET)
    assert again["changed"] is False
    assert not lay.run(SET, state="asserted").get("failed")
    back = lay.run(SET, state="absent")
    assert back["changed"] is True and link.is_symlink() and real.read_bytes() == lay.original[str(link)]
    assert not lay.leftovers()


def test_symlink_out_of_the_package_is_refused(lay, tmp_path):
    link = lay.site / CORE
    outside = tmp_path / "core.py"
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(outside)
    before = lay.snapshot()
    out = lay.run(SET)
    assert out["failed"] is True
    assert "through a symbolic link to %s, outside the package directory" % outside in _msg(out)
    assert outside.read_bytes() == lay.original[str(link)] and lay.snapshot() == before


# -- backups --------------------------------------------------------------------------------------------------

def test_backups_never_overwrite_each_other(lay, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda *a: "2026-01-01@00:00:00")  # every run in the same second
    first = lay.run(SET, backup=True)
    second = lay.run(SET, state="absent", backup=True)
    third = lay.run(SET, backup=True)
    paths = first["backups"] + second["backups"] + third["backups"]
    assert len(paths) == 12 and len(set(paths)) == 12
    for out, want in ((first, lay.original), (second, lay.patched), (third, lay.original)):
        for backup in out["backups"]:
            src = next(f for f in want if backup.startswith(f + "."))
            assert Path(backup).read_bytes() == want[src], backup


# -- kills and leftovers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["present", "absent"])
def test_kill_at_every_rename_and_fsync(lay, state):
    files = sorted(lay.original)
    start, goal = (lay.original, lay.patched) if state == "present" else (lay.patched, lay.original)

    def prepare():
        lay.reset()
        for f in files:
            Path(f).write_bytes(start[f])

    prepare()
    killed, result, steps = in_child(lambda: lay.run(SET, state=state))
    assert not killed and not result["out"].get("failed") and steps >= 2 * len(files)
    for k in range(1, steps + 1):
        prepare()
        killed, dummy, dummy = in_child(lambda: lay.run(SET, state=state), kill_at=k)
        assert killed, "step %d of %d" % (k, steps)
        kinds = classify(lay, files, lay.original, lay.patched)
        assert "other" not in kinds.values(), (k, kinds)
        mixed = len(set(kinds.values())) > 1
        asserted = lay.run(SET, state="asserted")
        if mixed or any(v != "patched" for v in kinds.values()):
            assert asserted.get("failed") is True, (k, kinds)
        again = lay.run(SET, state=state)
        assert not again.get("failed"), (k, _msg(again))
        assert all(Path(f).read_bytes() == goal[f] for f in files), (k, kinds)
        assert not lay.leftovers(), (k, lay.leftovers())
        if state == "present":
            assert not lay.run(SET, state="asserted").get("failed"), k


def test_left_temp_files_are_removed_and_only_ours(lay):
    gen = lay.site / GEN
    ours = [gen.parent / (".%s.%s.tmp" % (gen.name, s)) for s in ("abcd1234", "zz_9y8x7")]
    theirs = [gen.parent / (".%s.tmp" % gen.name), gen.parent / ".other.py.abcd1234.tmp",
              gen.parent / (".%s.abcd12345.tmp" % gen.name)]
    for p in ours + theirs:
        p.write_text("junk")
    checked = lay.run(SET, check_mode=True)
    assert sorted(checked["removed_temp_files"]) == sorted(map(str, ours)) and all(p.exists() for p in ours)
    out = lay.run(SET)
    assert not out.get("failed") and sorted(out["removed_temp_files"]) == sorted(map(str, ours))
    assert not any(p.exists() for p in ours) and all(p.exists() for p in theirs)


def test_journal_left_by_a_kill_is_reported_by_asserted_and_check_mode(lay):
    steps = in_child(lambda: lay.run(SET))[2]
    lay.reset()
    # kill at the second rename of a target: the journal is written, one file is replaced
    journal = lay.pkg / JOURNAL_NAME
    for k in range(1, steps + 1):
        lay.reset()
        in_child(lambda: lay.run(SET), kill_at=k)
        kinds = classify(lay, sorted(lay.original), lay.original, lay.patched)
        if journal.exists() and len(set(kinds.values())) > 1:
            break
    else:
        pytest.fail("no kill step left a journal and a mixed set")
    out = lay.run(SET, state="asserted")
    assert out["failed"] is True and "interrupted patch run left this set half-written" in _msg(out)
    assert str(journal) in _msg(out)
    before = lay.snapshot()
    checked = lay.run(SET, check_mode=True, diff_mode=True)
    assert lay.snapshot() == before and checked["changed"] is True and checked["recovered"]
    assert not checked.get("failed"), _msg(checked)
    done = lay.run(SET)
    assert done["recovered"] == checked["recovered"] and not journal.exists()
    assert not lay.run(SET, state="asserted").get("failed")


def test_journal_over_a_changed_file_is_refused(lay):
    steps = in_child(lambda: lay.run(SET))[2]
    journal = lay.pkg / JOURNAL_NAME
    for k in range(1, steps + 1):
        lay.reset()
        in_child(lambda: lay.run(SET), kill_at=k)
        kinds = classify(lay, sorted(lay.original), lay.original, lay.patched)
        if journal.exists() and "original" in kinds.values():
            break
    victim = next(f for f, v in kinds.items() if v == "original")
    Path(victim).write_text("# edited by hand\n")
    out_err = None
    try:
        lay.run(SET)
    except Exception as exc:  # PatchError
        out_err = str(exc)
    assert out_err and victim in out_err and "changed after an interrupted patch run" in out_err
    assert Path(victim).read_text() == "# edited by hand\n"


# -- a package directory another account can write --------------------------------------------------------------
# The engine runs as root on a venv whose files another account may be able to change.  It patches only below the
# venv's real site-packages, never through a linked package directory, sets mode and owner on the open staged
# file, trusts only a journal this user wrote, and as root refuses hard-linked files and directories another
# account can change.  Each test below fails on the engine before these rules.

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the rules for root runs need a root test run")


def _outcome(fn):
    """(failed, message) of one engine run: a failed result or a PatchError are both a refusal."""
    try:
        out = fn()
    except PatchError as exc:
        return True, str(exc), {}
    return bool(out.get("failed")), _msg(out), out


def test_symlinked_package_directory_is_refused(lay, tmp_path):
    outside = tmp_path / "speculators"
    shutil.move(str(lay.pkg), str(outside))
    lay.pkg.symlink_to(outside)
    try:
        before = {str(p): p.read_bytes() for p in outside.rglob("*") if p.is_file()}
        for check in (True, False):
            failed, msg, dummy = _outcome(lambda c=check: lay.run(SET, check_mode=c))
            assert failed, "check_mode=%s: the linked package directory was accepted" % check
            assert "%s is a symbolic link to %s" % (lay.pkg, outside) in msg, msg
            after = {str(p): p.read_bytes() for p in outside.rglob("*") if p.is_file()}
            assert after == before  # nothing written outside the venv: no patch, no temp file, no journal
    finally:
        lay.pkg.unlink()
        shutil.move(str(outside), str(lay.pkg))


def test_package_imported_from_outside_the_venv_is_refused(lay, tmp_path):
    # speculators moved out of site-packages and put back on sys.path by a .pth file: the import finds it there
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.move(str(lay.pkg), str(other / "speculators"))
    pth = lay.site / "zz-elsewhere.pth"
    pth.write_text("%s\n" % other)
    try:
        env = inspect(lay.python, {"speculators", "vllm"}, {"speculators", "vllm"}, runner)
        before = {str(p): p.read_bytes() for p in other.rglob("*") if p.is_file()}
        for check in (True, False):
            failed, msg, dummy = _outcome(lambda c=check: run(SET, env, lay.tree(), "present", check_mode=c))
            assert failed, "check_mode=%s: a package outside the venv's site-packages was patched" % check
            assert "outside the venv's site-packages %s" % lay.site in msg, msg
        assert {str(p): p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    finally:
        pth.unlink()
        shutil.move(str(other / "speculators"), str(lay.pkg))


def test_a_staged_file_swapped_for_a_link_never_changes_the_link_target(lay, tmp_path, monkeypatch):
    # Another account replaces the staged temp file with a link to a victim file while the engine writes it (the
    # test plays that account from inside os.fsync of the staged file).  Mode and owner must land on the staged
    # file the engine opened, never on the victim; the swap is detected and nothing is replaced.
    core = lay.site / CORE
    os.chown(core, NOBODY, NOBODY)  # the owner the staged file gets, so a chown through the link would show
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    pattern = re.compile(r"^\.core\.py\.[a-z0-9_]{8}\.tmp$")
    real_fsync = os.fsync
    swapped = []

    def fsync(fd):
        path = os.readlink("/proc/self/fd/%d" % fd)
        if pattern.match(os.path.basename(path)) and not swapped:
            os.unlink(path)
            os.symlink(str(victim), path)
            swapped.append(path)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    failed, msg, out = _outcome(lambda: lay.run(SET))
    monkeypatch.undo()
    assert swapped, "the engine never fsynced a staged core.py"
    st = victim.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, victim.read_text()) == (0o600, 0, "root's file\n")
    assert not core.is_symlink() and core.read_bytes() == lay.original[str(core)]
    assert failed and "was replaced while this run wrote it" in msg, msg
    assert not os.path.lexists(swapped[0]) and not lay.leftovers()


@ROOT_ONLY
def test_hard_linked_target_is_refused_as_root_and_its_text_never_shown(lay, tmp_path):
    gen = lay.site / GEN
    secret = tmp_path / "secret.py"  # a root-only file elsewhere on the same file system, e.g. a key file
    lines = [next(line for line in h["before"].splitlines() if line.strip()).strip()
             for p in SET if p["file"] == GEN for h in p["hunks"]]
    secret.write_text("".join("%s  # TOKEN=s3cr3t-C0FFEE\n" % line for line in lines))
    secret.chmod(0o600)
    gen.unlink()
    os.link(secret, gen)
    for check in (True, False):
        failed, msg, out = _outcome(lambda c=check: lay.run(SET, check_mode=c, diff_mode=True))
        assert failed, "check_mode=%s" % check
        assert "s3cr3t" not in msg and "s3cr3t" not in json.dumps(out, default=str)
        assert "%s has 2 hard links" % gen in msg, msg
    assert "s3cr3t" in secret.read_text() and os.stat(gen).st_ino == os.stat(secret).st_ino


def _journal_doc(path, old, new):
    return {"format": 1, "written_by": "specdec.eagle3.source_patch", "state": "present",
            "created": "2026-01-01T00:00:00+0000",
            "files": [{"path": str(path), "sha256_before": hashlib.sha256(old).hexdigest(),
                       "sha256_after": hashlib.sha256(new).hexdigest(), "after": new.decode("utf-8")}]}


@ROOT_ONLY
@pytest.mark.parametrize("kind", ["symlink", "other_owner"])
def test_journal_this_user_did_not_write_is_refused(lay, tmp_path, kind):
    # A planted journal asks the next run to "complete" a write of code the planter chose.
    gen = lay.site / GEN
    old = gen.read_bytes()
    doc = _journal_doc(gen, old, old + b"\nimport os  # injected\n")
    journal = lay.pkg / JOURNAL_NAME
    planted = tmp_path / "planted.json" if kind == "symlink" else journal
    planted.write_text(json.dumps(doc))
    os.chown(planted, NOBODY, NOBODY)
    if kind == "symlink":
        journal.symlink_to(planted)
    for check in (True, False):
        failed, msg, dummy = _outcome(lambda c=check: lay.run(SET, check_mode=c))
        assert failed, "check_mode=%s: the planted journal was used" % check
        assert b"injected" not in gen.read_bytes()
        assert str(journal) in msg
        assert ("is a symbolic link" if kind == "symlink" else "is owned by uid %d" % NOBODY) in msg, msg


@ROOT_ONLY
@pytest.mark.parametrize("where,change,needle", [
    ("speculators/utils", "mode:0o777", "is writable by others (mode 777)"),
    ("speculators", "mode:0o775", "is writable by its group (mode 775)"),
    ("speculators/models", "owner", "is owned by uid %d" % NOBODY),
    ("", "mode:0o777", "is writable by others (mode 777)"),  # site-packages itself
])
def test_root_refuses_a_directory_another_account_can_change(lay, where, change, needle):
    directory = lay.site / where if where else lay.site
    st = directory.stat()
    if change == "owner":
        os.chown(directory, NOBODY, NOBODY)
    else:
        directory.chmod(int(change.split(":")[1], 8))
    try:
        before = lay.snapshot()
        for check in (True, False):
            out = lay.run(SET, check_mode=check)
            msg = _msg(out)
            assert out.get("failed") is True, "check_mode=%s: the run was not refused" % check
            assert "this run is root and the directory %s %s" % (directory, needle) in msg, msg
            assert ("chmod go-w %s" % directory if change != "owner" else "chown root %s" % directory) in msg
            assert lay.snapshot() == before and not lay.leftovers()
    finally:
        os.chown(directory, st.st_uid, st.st_gid)
        directory.chmod(stat.S_IMODE(st.st_mode))


NONROOT_RUN = r"""
import json, subprocess, sys
sys.path[:0] = [sys.argv[1] + "/collections", sys.argv[1]]
from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect

def runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr

env = inspect(sys.argv[2], {"speculators"}, {"speculators"}, runner)
print(json.dumps(run(json.loads(sys.argv[3]), env, SourceTree(env.roots), "present")))
"""


def _as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@ROOT_ONLY
def test_rules_for_root_do_not_refuse_the_venv_owner(tmp_path):
    # A venv owned by nobody with a hard-linked file: root is refused (it does not even run the venv's interpreter,
    # whose site-packages nobody can change); nobody, who owns it, patches it.
    patches = [p for p in SET if p["file"] == GEN and not p.get("when")]
    assert patches  # p01: no condition, so no vLLM is needed here
    base = Path(tempfile.mkdtemp(prefix="specdec-nonroot-", dir="/tmp"))
    try:
        base.chmod(0o755)
        venv = base / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        with zipfile.ZipFile(fetch("speculators", "0.3.0", "wheel")) as whl:
            whl.extractall(site)
        gen = site / GEN
        os.link(gen, str(gen) + ".orig")
        for dirpath, dirnames, filenames in os.walk(venv):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                os.lchown(name, NOBODY, NOBODY)
        original = gen.read_bytes()
        with pytest.raises(EnvError) as as_root:
            inspect(str(venv / "bin" / "python"), {"speculators"}, {"speculators"}, runner)
        assert "this run is root and %s is owned by uid %d (nobody)" % (venv, NOBODY) in str(as_root.value)
        assert gen.read_bytes() == original
        # the system interpreter: nobody may not be able to reach the one running the tests
        proc = subprocess.run(["/usr/bin/python3", "-c", NONROOT_RUN, str(Path(__file__).resolve().parents[3]),
                               str(venv / "bin" / "python"), json.dumps(patches)],
                              preexec_fn=_as_nobody, capture_output=True, text=True, check=False,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(base)})
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not out.get("failed"), out.get("msg")
        assert {r["state"] for r in out["results"]} == {"applied"} and gen.read_bytes() != original
        st = gen.stat()
        assert (st.st_uid, st.st_nlink) == (NOBODY, 1)
    finally:
        shutil.rmtree(base)
