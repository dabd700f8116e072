"""Root creates the code directory and creates or hands over the work directory only below directories no other
account can change (roles/eagle3_pipeline/tasks/dirs.yml, the rule in plugins/module_utils/safe_paths.py).

The pipeline user owns a directory above the work directory (a prefix in its home, a team directory) and replaces
the directory in between by a link to a directory of root's: root must neither hand root's `work/` to that user nor
remove root's `pipeline/`. The other account is real (a child process with its uid makes the link); the task file
runs through ansible-playbook on localhost.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from playbook_json import run_tasks

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="root hands the work directory over")
USER = "nobody"  # the pipeline user the file module hands the work directory to


def _unused_uid():
    uid = 1002
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


UID = _unused_uid()


def _as_other(fn):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(UID)
            os.setuid(UID)
            fn()
            code = 0
        finally:
            os._exit(code)
    dummy, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child as uid %d failed" % UID


@pytest.fixture
def base():
    path = Path(tempfile.mkdtemp(prefix="specdec-dirs-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _dirs(tmp_path, code_dir, work_dir):
    rc, results = run_tasks(tmp_path, [{"name": "Dirs", "ansible.builtin.include_role": {
        "name": "specdec.eagle3.eagle3_pipeline", "tasks_from": "dirs"}}], play_vars={
        "eagle3_pipeline_code_dir": str(code_dir), "eagle3_pipeline_work_dir": str(work_dir),
        "eagle3_pipeline_venv_path": str(tmp_path / "venv"), "eagle3_pipeline_user": USER,
        "__eagle3_pipeline_become": True})
    # a failed loop item: `failed` (ansible-core 2.19), or only its message and `exception` (2.21)
    failed = {name: [r.get("msg") for r in res.get("results", []) if r.get("failed") or "exception" in r]
              or [res.get("msg")]
              for name, res in results.items() if res.get("failed")}
    return rc, failed


REFUSE = "Refuse a code or work directory below a directory another account can change"


@ROOT_ONLY
@pytest.mark.parametrize("which", ["work", "code"])
def test_a_link_below_a_directory_of_the_pipeline_user_is_refused(base, tmp_path, which):
    # root's directory the link leads to: a work/ only root may enter, and a pipeline/ that is root's but writable
    # by others (which the role would remove as "not root's" and install again).
    theirs_root = base / "rootdir"
    (theirs_root / "work").mkdir(parents=True)
    (theirs_root / "work").chmod(0o700)
    (theirs_root / "pipeline").mkdir()
    (theirs_root / "pipeline" / "data").write_text("root's\n")
    (theirs_root / "pipeline").chmod(0o777)
    team = base / "team"
    team.mkdir()
    os.chown(team, UID, UID)
    _as_other(lambda: (team / "eagle3").symlink_to(theirs_root))
    safe = base / "opt"  # root's own place for the other directory
    code_dir = team / "eagle3" / "pipeline" if which == "code" else safe / "pipeline"
    work_dir = team / "eagle3" / "work" if which == "work" else safe / "work"
    label = ("eagle3_pipeline_code_dir (specdec_code_dir) is %s" % code_dir if which == "code"
             else "eagle3_pipeline_work_dir (specdec_work_dir) is %s" % work_dir)
    rc, failed = _dirs(tmp_path, code_dir, work_dir)
    assert rc != 0
    expected = (f"{label}, and this run is root: {team} is owned by uid {UID}, not root (mode 755), so another "
                "account could swap what root creates, hands over or removes there for a link. Make root own it "
                f"(chown root {team}), then run again.")
    assert failed == {REFUSE: [expected]}, failed
    st = (theirs_root / "work").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    assert (theirs_root / "pipeline" / "data").read_text() == "root's\n"


@ROOT_ONLY
def test_a_parent_writable_by_others_is_refused_even_with_the_sticky_bit_where_root_creates(base, tmp_path):
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    rc, failed = _dirs(tmp_path, base / "opt" / "pipeline", shared / "work")
    assert rc != 0
    expected = (f"eagle3_pipeline_work_dir (specdec_work_dir) is {shared / 'work'}, and this run is root: {shared} is "
                "writable by others (mode 1777), owner uid 0 (root), and root would create an entry there that another "
                "account can create first, so another account could swap what root creates, hands over or removes "
                "there for a link. Create the path below it first as root, or choose a path below directories only "
                "root can write to, then run again.")
    assert failed == {REFUSE: [expected]}, failed
    assert not (shared / "work").exists()


@ROOT_ONLY
def test_directories_below_root_s_own_and_a_sticky_directory_pass(base, tmp_path):
    # /tmp-like: a root-owned directory that root created below a sticky one is fine; the work directory is handed
    # to the pipeline user, the code directory is root's.
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "specdec").mkdir()
    rc, failed = _dirs(tmp_path, shared / "specdec" / "pipeline", shared / "specdec" / "work")
    work = (shared / "specdec" / "work").stat()
    assert work.st_uid == pwd.getpwnam(USER).pw_uid
    assert (shared / "specdec" / "pipeline").stat().st_uid == 0
    # the tasks after the handover run as the pipeline user (become), which a test machine may not offer (no sudo)
    assert rc == 0 or set(failed) == {"Look at runs/ as the pipeline user"}, failed
