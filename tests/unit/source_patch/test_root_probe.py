"""Root never runs a venv's interpreter that another account can change.

source_patch and vllm_compat read a venv by running its interpreter (``python -I -c <probe>``). ``-I`` still runs
the ``.pth`` files of site-packages, so a venv whose site-packages (or interpreter, bin/, pyvenv.cfg, or a directory
above them) another account can change would run that account's code as root. As root the modules check all of it
before anything runs and refuse in one line naming the path, its owner and mode and the fix.

The other account is real: a child process with an unused uid plants the ``.pth`` file; its code would create a
marker file, which must not appear.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import EnvError, inspect

ROOT = Path(__file__).resolve().parents[3]
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the rules for root runs need a root test run")
PTH = "import os; os.close(os.open(%r, os.O_WRONLY | os.O_CREAT, 0o644))\n"
INTRO = "python %s: this run is root and %s "
OUTRO = (": another account could change what the interpreter runs at start-up (a .pth file in site-packages runs "
         "as root), so it was not run. %s, then run again.")


def _unused_uid():
    uid = 1002
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


UID = _unused_uid()


@pytest.fixture
def base():
    """A directory other accounts can pass through (pytest's own base directory is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="specdec-probe-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _venv(parent):
    venv = parent / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv, next((venv / "lib").glob("python3*/site-packages"))


def _as(uid, fn):
    """Run fn() in a forked child that has dropped to UID (a real second account, no passwd entry needed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            fn()
            code = 0
        finally:
            os._exit(code)
    dummy, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child as uid %d failed" % uid


def _module(module, python, args=""):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m", "specdec.eagle3." + module,
           "-a", "python=%s %s" % (python, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), check=False)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


MODULES = [("vllm_compat", ""), ("source_patch", "patch_set=auto")]


@ROOT_ONLY
@pytest.mark.parametrize("module,args", MODULES, ids=[m for m, _a in MODULES])
def test_a_pth_file_planted_by_another_account_does_not_run_as_root(base, module, args):
    venv, site = _venv(base)
    marker = base / "ran-as-root"
    os.chown(site, UID, UID)
    _as(UID, lambda: (site / "zz.pth").write_text(PTH % str(marker)))
    python = venv / "bin" / "python"
    out = _module(module, python, args)
    assert not marker.exists(), "the planted .pth file ran as uid %d" % marker.stat().st_uid
    assert out["failed"] is True
    assert out["msg"] == (INTRO % (python, site) + "is owned by uid %d, not root (mode 755)" % UID
                          + OUTRO % ("Make root own it (chown root %s)" % site))


@ROOT_ONLY
@pytest.mark.parametrize("module,args,expected", [
    ("vllm_compat", "", "distribution 'speculators' is not installed in the environment of"),
    ("source_patch", "patch_set=auto", "no shipped patch set matches the installed speculators not installed"),
], ids=["vllm_compat", "source_patch"])
def test_a_root_owned_venv_is_still_run(base, module, args, expected):
    # root's own .pth file runs (the marker proves the interpreter ran); the module goes on to its own answer.
    venv, site = _venv(base)
    marker = base / "ran"
    (site / "zz.pth").write_text(PTH % str(marker))
    out = _module(module, venv / "bin" / "python", args)
    assert marker.exists()
    assert out["failed"] is True and expected in out["msg"], out["msg"]


def _runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _lchown(path):
    os.lchown(path, UID, UID)


# (what to change, the path it names, its issue, the fix): each one refused before the interpreter runs.
CHANGES = {
    "interpreter-link": (lambda v, s, b: _lchown(v / "bin" / "python"), "{venv}/bin/python",
                         "is a symbolic link owned by uid %d, not root" % UID, "Make root own it (chown -h root {path})"),
    "bin-group-writable": (lambda v, s, b: (v / "bin").chmod(0o775), "{venv}/bin",
                           "is writable by its group (mode 775), owner uid 0 (root)",
                           "Make it writable by its owner only (chmod go-w {path})"),
    "bin-sticky-others-writable": (lambda v, s, b: (v / "bin").chmod(0o1777), "{venv}/bin",
                                   "is writable by others (mode 1777), owner uid 0 (root)",
                                   "Make it writable by its owner only (chmod go-w {path})"),
    "pyvenv-cfg": (lambda v, s, b: _lchown(v / "pyvenv.cfg"), "{venv}/pyvenv.cfg",
                   "is owned by uid %d, not root (mode 644)" % UID, "Make root own it (chown root {path})"),
    "lib-owner": (lambda v, s, b: _lchown(v / "lib"), "{venv}/lib",
                  "is owned by uid %d, not root (mode 755)" % UID, "Make root own it (chown root {path})"),
    "pth-file-owner": (lambda v, s, b: ((s / "a.pth").write_text("\n"), _lchown(s / "a.pth")), "{site}/a.pth",
                       "is owned by uid %d, not root (mode 644)" % UID, "Make root own it (chown root {path})"),
    "sitecustomize": (lambda v, s, b: ((s / "sitecustomize.py").write_text("\n"), (s / "sitecustomize.py").chmod(0o666)),
                      "{site}/sitecustomize.py", "is writable by others (mode 666), owner uid 0 (root)",
                      "Make it writable by its owner only (chmod go-w {path})"),
    "parent-others-writable": (lambda v, s, b: b.chmod(0o777), "{base}",
                               "is writable by others (mode 777), owner uid 0 (root)",
                               "Make it writable by its owner only (chmod go-w {path})"),
    "parent-owner": (lambda v, s, b: _lchown(b), "{base}", "is owned by uid %d, not root (mode 755)" % UID,
                     "Make root own it (chown root {path})"),
}


@ROOT_ONLY
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_root_refuses_what_another_account_can_change_before_running_anything(base, change):
    venv, site = _venv(base)
    marker = base / "ran"
    (site / "zz.pth").write_text(PTH % str(marker))
    act, where, issue, fix = CHANGES[change]
    act(venv, site, base)
    path = where.format(venv=venv, site=site, base=base)
    python = venv / "bin" / "python"
    with pytest.raises(EnvError) as info:
        inspect(str(python), {"vllm"}, {"vllm"}, _runner)
    assert str(info.value) == INTRO % (python, path) + issue + OUTRO % fix.format(path=path)
    assert not marker.exists()


@ROOT_ONLY
def test_an_interpreter_that_another_account_can_replace_is_not_run(base):
    # bin/python links to an interpreter copied into a directory of another account.
    venv, site = _venv(base)
    marker = base / "ran"
    (site / "zz.pth").write_text(PTH % str(marker))
    theirs = base / "theirs"
    theirs.mkdir()
    real = Path(os.path.realpath(sys.executable))
    shutil.copy2(real, theirs / real.name)
    os.chown(theirs, UID, UID)
    link = venv / "bin" / "python"
    link.unlink()
    link.symlink_to(theirs / real.name)
    with pytest.raises(EnvError) as info:
        inspect(str(link), {"vllm"}, {"vllm"}, _runner)
    assert str(info.value) == (INTRO % (link, theirs) + "is owned by uid %d, not root (mode 755)" % UID
                               + OUTRO % ("Make root own it (chown root %s)" % theirs))
    assert not marker.exists()


@ROOT_ONLY
def test_a_venv_below_a_sticky_directory_of_root_is_run(base):
    # /tmp-like: others may create entries there but not rename or remove root's; the venv below is root's.
    sticky = base / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    venv, site = _venv(sticky)
    marker = base / "ran"
    (site / "zz.pth").write_text(PTH % str(marker))
    env = inspect(str(venv / "bin" / "python"), {"vllm"}, {"vllm"}, _runner)
    assert marker.exists() and env.info["prefix"] == str(venv)
