"""A user-given local wheel is copied into root's download directory without leaking what root can read
(plugins/modules/checked_copy.py and the vllm role's "Copy the local wheel ..." block of tasks/install.yml).

The other account is real: a child process with an unused uid makes the wheel path a link to a root-only file, and
another child with that uid reads every file of the download directory it can while root's run goes on; it must
never see the secret. The role's block runs through ansible-playbook on localhost; the module's own runs cover the
match, the re-run and check mode.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from playbook_json import run_tasks  # noqa: E402 - tests/unit is not a package

WHEEL = "vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl"
SECRET = b"TOKEN=s3cr3t-C0FFEE\n"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="root copies the wheel; the other account needs setuid")


def _unused_uid():
    uid = 1002
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


UID = _unused_uid()


def _drop():
    os.setgroups([])
    os.setgid(UID)
    os.setuid(UID)


def _as_other(fn):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _drop()
            fn()
            code = 0
        finally:
            os._exit(code)
    dummy, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child as uid %d failed" % UID


class Reader:
    """A child as the other account that reads every file of DIRECTORY it can, until stopped; what it read."""

    def __init__(self, directory, stop):
        self.stop = stop
        rfd, wfd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(rfd)
            seen = b""
            try:
                _drop()
                while not os.path.exists(stop):
                    try:
                        names = os.listdir(directory)
                    except OSError:
                        names = []
                    for name in names:
                        try:
                            with open(os.path.join(directory, name), "rb") as handle:
                                data = handle.read(4096)
                        except OSError:
                            continue
                        if SECRET in data and SECRET not in seen:
                            seen += data
            finally:
                os.write(wfd, seen)
                os._exit(0)
        os.close(wfd)
        self.rfd = rfd

    def result(self):
        Path(self.stop).touch()
        with os.fdopen(self.rfd, "rb") as pipe:
            data = pipe.read()
        os.waitpid(self.pid, 0)
        return data


@pytest.fixture
def base():
    """Directories the other account can pass through (pytest's base directory is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="specdec-wheel-", dir="/tmp"))
    path.chmod(0o755)
    (path / "theirs").mkdir()
    os.chown(path / "theirs", UID, UID)
    (path / "downloads").mkdir()
    yield path
    shutil.rmtree(path)


def _role(base, tmp_path, wheel, sha256, *args):
    """The vllm role's tasks/install.yml with a local-wheel pin: (exit status, {task: result})."""
    pin = {"mode": "wheel", "version": "0.16.0", "wheel": str(wheel), "sha256": sha256, "commit": "", "variant": "",
           "no_deps": True, "torch_backend": "", "index_url": ""}
    return run_tasks(tmp_path, [{"name": "Install", "ansible.builtin.include_role": {
        "name": "specdec.eagle3.vllm", "tasks_from": "install"}}], *args, play_vars={
        "specdec_prefix": str(base / "prefix"), "specdec_venv_path": str(base / "prefix" / "venv"),
        "vllm_download_dir": str(base / "downloads"), "vllm_pin_wanted": pin})


def _failure(results):
    """The one failure the run shows (the copy's own failure is registered and ignored; the next task refuses)."""
    failed = [res for res in results.values() if res.get("failed") and res.get("action") != "specdec.eagle3.checked_copy"]
    assert len(failed) == 1, results
    return failed[0]["msg"]


@ROOT_ONLY
def test_a_wheel_linked_to_a_root_only_file_is_refused_and_nothing_is_readable(base, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    wheel = base / "theirs" / WHEEL
    _as_other(lambda: os.symlink(secret, wheel))
    reader = Reader(str(base / "downloads"), str(base / "stop"))
    time.sleep(0.2)
    rc, results = _role(base, tmp_path, wheel, hashlib.sha256(SECRET).hexdigest())
    leaked = reader.result()
    assert leaked == b"", "the other account read the root-only file through root's copy: %r" % leaked
    assert rc != 0
    msg = _failure(results)
    assert msg == (f"localhost: vllm_wheel {wheel} (vLLM 0.16.0) is a symbolic link, which root does not follow (give "
                   f"the path of the file itself), expected vllm_wheel_sha256 {hashlib.sha256(SECRET).hexdigest()}. "
                   "Nothing was installed. Check that the file is the wheel you meant and set vllm_wheel_sha256 to "
                   "its sha256 (sha256sum FILE)."), msg
    assert os.listdir(base / "downloads") == [] and secret.read_bytes() == SECRET


@ROOT_ONLY
def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_left(base, tmp_path):
    wheel = base / "theirs" / WHEEL
    _as_other(lambda: wheel.write_bytes(b"not the pinned wheel\n"))
    pinned = hashlib.sha256(b"the pinned wheel\n").hexdigest()
    for check in ([], ["--check"]):
        rc, results = _role(base, tmp_path, wheel, pinned, *check)
        assert rc != 0
        assert _failure(results) == (
            f"localhost: vllm_wheel {wheel} (vLLM 0.16.0) has sha256 "
            f"{hashlib.sha256(b'not the pinned wheel' + bytes([10])).hexdigest()}, expected vllm_wheel_sha256 "
            f"{pinned}. Nothing was installed. Check that the file is the wheel you meant and set vllm_wheel_sha256 "
            "to its sha256 (sha256sum FILE).")
        assert os.listdir(base / "downloads") == [], check


def _module(tmp_path, src, dest, sha256, *args):
    rc, results = run_tasks(tmp_path, [{"name": "Copy", "specdec.eagle3.checked_copy": {
        "src": str(src), "dest": str(dest), "sha256": sha256}}], *args)
    return rc, results["Copy"]


def test_a_matching_file_is_copied_once_with_its_mode_and_check_mode_writes_nothing(tmp_path):
    src = tmp_path / "src.whl"
    src.write_bytes(b"the pinned wheel\n" * 1000)
    src.chmod(0o600)
    pinned = hashlib.sha256(src.read_bytes()).hexdigest()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    dest = downloads / WHEEL
    rc, res = _module(tmp_path, src, dest, pinned.upper(), "--check")
    assert rc == 0 and res["changed"] is True and res["sha256"] == pinned and os.listdir(downloads) == []
    rc, res = _module(tmp_path, src, dest, pinned)
    assert rc == 0 and res["changed"] is True and res["sha256"] == pinned
    st = dest.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()
    assert dest.read_bytes() == src.read_bytes() and os.listdir(downloads) == [WHEEL]
    inode = st.st_ino
    for args in ([], ["--check"]):
        rc, res = _module(tmp_path, src, dest, pinned, *args)
        assert rc == 0 and res["changed"] is False, args
    assert dest.lstat().st_ino == inode
    # the source changed: refused, and the checked copy stays as it was
    src.write_bytes(b"something else\n")
    rc, res = _module(tmp_path, src, dest, pinned)
    assert rc != 0 and res["reason"] == "has sha256 %s" % hashlib.sha256(b"something else\n").hexdigest()
    assert dest.lstat().st_ino == inode and os.listdir(downloads) == [WHEEL]


@pytest.mark.parametrize("kind", ["missing", "fifo", "directory"])
def test_what_is_not_a_regular_file_is_refused_in_one_line(tmp_path, kind):
    src = tmp_path / "src.whl"
    if kind == "fifo":
        os.mkfifo(src)
    elif kind == "directory":
        src.mkdir()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    rc, res = _module(tmp_path, src, downloads / WHEEL, "0" * 64)
    assert rc != 0 and res["reason"] == ("does not exist" if kind == "missing" else "is not a regular file")
    assert res["msg"] == "%s %s; nothing was copied" % (src, res["reason"])
    assert os.listdir(downloads) == []


@ROOT_ONLY
def test_a_download_directory_another_account_can_change_is_refused(base, tmp_path):
    src = tmp_path / "src.whl"
    src.write_bytes(b"wheel\n")
    downloads = base / "theirs"  # owned by the other account
    rc, res = _module(tmp_path, src, downloads / WHEEL, hashlib.sha256(b"wheel\n").hexdigest())
    assert rc != 0
    assert res["msg"] == (f"dest {downloads / WHEEL}: this run is root and {downloads} is owned by uid {UID}, not root "
                          f"(mode 755): another account could swap the copy; make root own it (chown root {downloads}), "
                          "then run again")
    assert os.listdir(downloads) == []
