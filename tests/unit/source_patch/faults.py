"""Fault injection for the patch engine: SIGKILL at the k-th rename/fsync, a read-only bind mount, file states.

Used by tests/unit/source_patch/test_faults.py and benchmarks/faults_patch_engine.py.  Every run happens in a
forked child, so a kill or a private mount namespace never touches the calling process.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
for _p in (str(ROOT / "collections"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import yaml  # noqa: E402

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import PatchError, run  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect  # noqa: E402
from tests.support.upstream import fetch  # noqa: E402

CLONE_NEWNS = 0x00020000
JOURNAL_NAME = ".specdec-patch-journal.json"  # written by plugins/module_utils/patch_txn.py
TEMP_RE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def load_set(name):
    return yaml.safe_load((ROOT / "patch_sets" / (name + ".yml")).read_text())["patches"]


class Layout(object):
    """A venv with the real speculators wheel and the real vLLM sdist sources, plus a pristine copy of
    speculators to reset from; vLLM's parsed sources are cached across runs (they are never patched)."""

    def __init__(self, base, spec_version="0.3.0", vllm_version="0.16.0"):
        base = Path(base)
        venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        self.site = next((venv / "lib").glob("python3*/site-packages"))
        with zipfile.ZipFile(fetch("speculators", spec_version, "wheel")) as whl:
            whl.extractall(self.site)
        prefix = "vllm-%s/" % vllm_version
        with tarfile.open(fetch("vllm", vllm_version, "sdist")) as tar:
            members = [m for m in tar.getmembers()
                       if m.name.startswith(prefix + "vllm/") and (m.isfile() or m.isdir())]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(self.site, members=members)
        dist_info = self.site / ("vllm-%s.dist-info" % vllm_version)
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s\n" % vllm_version)
        (dist_info / "top_level.txt").write_text("vllm\n")
        self.python = str(venv / "bin" / "python")
        self.pkg = self.site / "speculators"
        self.pristine = base / "pristine-speculators"
        shutil.copytree(self.pkg, self.pristine, symlinks=True)
        self.env = inspect(self.python, {"speculators", "vllm"}, {"speculators", "vllm"}, runner)
        self._vllm_ast = {}

    def reset(self):
        shutil.rmtree(self.pkg)
        shutil.copytree(self.pristine, self.pkg, symlinks=True)

    def tree(self):
        return _VllmCachedTree(self.env.roots, self._vllm_ast)

    def run(self, patches, state="present", **kw):
        return run(patches, self.env, self.tree(), state, **kw)

    def files(self, patches):
        return sorted(set(str(self.site / p["file"]) for p in patches))

    def snapshot(self):
        return {str(p): p.read_bytes() for p in sorted(self.pkg.rglob("*")) if p.is_file()}

    def leftovers(self):
        """Our temp files and journals anywhere under the package."""
        return sorted(str(p) for p in self.pkg.rglob(".*")
                      if TEMP_RE.match(p.name) or p.name == JOURNAL_NAME)


class _VllmCachedTree(SourceTree):
    def __init__(self, roots, cache):
        super().__init__(roots)
        self._shared = cache

    def parse(self, path):
        if os.sep + "vllm" + os.sep not in path:
            return super().parse(path)
        if path not in self._shared:
            self._shared[path] = super().parse(path)
        return self._shared[path]


def in_child(fn, kill_at=0, ro_dirs=(), kill_after=None):
    """Run ``fn()`` in a forked child.  kill_at=k: SIGKILL itself just before its k-th os.rename/os.replace/
    os.fsync.  kill_after=s: the parent SIGKILLs it after s seconds.  ro_dirs: bind-mounted read-only in a
    private mount namespace first (needs root).
    Returns (killed, result or None, number of rename/fsync calls made)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        code = 0
        try:
            calls = [0]
            for name in ("rename", "replace", "fsync"):
                real = getattr(os, name)

                def counted(*args, _real=real, **kwargs):
                    calls[0] += 1
                    if calls[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return _real(*args, **kwargs)
                setattr(os, name, counted)
            if ro_dirs:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.unshare(CLONE_NEWNS) != 0:
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
                subprocess.run(["mount", "--make-rprivate", "/"], check=True)
                for directory in ro_dirs:
                    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
                    subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
            try:
                result = {"out": fn()}
            except PatchError as exc:
                result = {"raised": str(exc)}
            result["calls"] = calls[0]
            payload = json.dumps(result, default=str).encode()
        except BaseException:
            payload = json.dumps({"crashed": traceback.format_exc()}).encode()
            code = 3
        try:
            with os.fdopen(wfd, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(code)
    os.close(wfd)
    if kill_after is not None:
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)  # a finished child is a zombie until waited for: this does nothing then
    with os.fdopen(rfd, "rb") as pipe:
        data = pipe.read()
    dummy, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True, None, None
    result = json.loads(data.decode())
    if "crashed" in result:
        raise AssertionError("the child crashed:\n" + result["crashed"])
    return False, result, result["calls"]


def can_mount_read_only(directory):
    """Whether this process may bind-mount read-only in a private namespace (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    probe = Path(directory) / ".ro-probe"
    probe.mkdir(exist_ok=True)
    try:
        dummy, result, dummy = in_child(lambda: os.access(str(probe), os.W_OK), ro_dirs=[probe])
        return result is not None and result.get("out") is False
    except (AssertionError, OSError):
        return False
    finally:
        probe.rmdir()


def classify(layout, paths, original, patched):
    """Per file: 'original', 'patched' or 'other'."""
    out = {}
    for path in paths:
        data = Path(path).read_bytes()
        out[path] = "original" if data == original[path] else "patched" if data == patched[path] else "other"
    return out
