"""Atomic file writes, staged directories swapped in whole, hashing, disk space and disk-full errors."""

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from specdec_pipeline.errors import PipelineError


def sha256_file(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(dest, validate=None):
    """Yield a temporary path beside DEST; on success validate it and rename it over DEST.

    On any error the temporary file is removed and DEST is left as it was.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if validate is not None:
            validate(tmp)
        os.replace(tmp, dest)
    except OSError as exc:
        if not exc.filename:  # a failed write names no file: name the one being written
            exc.filename = str(dest)
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(dest, data, validate=None):
    """Write DATA (bytes) to DEST through atomic_path; the file's bytes depend only on DATA."""
    with atomic_path(dest, validate=validate) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def write_json(dest, obj):
    with atomic_path(dest, validate=lambda p: json.loads(Path(p).read_text())) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path, default=None, fix="delete it and re-run the pipeline (the step that wrote it runs again)"):
    """Parsed JSON of PATH, DEFAULT when it does not exist; invalid content is one PipelineError naming it."""
    try:
        text = Path(path).read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise PipelineError(f"{path}: not valid JSON ({exc}; {len(text)} bytes) - the file is damaged; {fix}.") from None


# --- staged directories -----------------------------------------------------------------------------------
# A step that replaces a whole output directory builds the new one in <dir>.new and swaps it in only when it is
# complete: <dir> -> <dir>.old, <dir>.new -> <dir>, then <dir>.old is removed. recover_swap() finishes or undoes a
# swap a kill interrupted, so the finished outputs exist under <dir> or <dir>.old at every moment.

def staging_dir(final):
    final = Path(final)
    return final.with_name(final.name + ".new")


def old_dir(final):
    final = Path(final)
    return final.with_name(final.name + ".old")


def swap_in(staging, final):
    """Replace directory FINAL by the complete directory STAGING (two renames; the old one is removed last)."""
    staging, final, old = Path(staging), Path(final), old_dir(final)
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)


def recover_swap(final):
    """Finish a swap_in a kill interrupted: the staging dir is complete once <dir> was moved aside."""
    final, staging, old = Path(final), staging_dir(final), old_dir(final)
    if not old.exists():
        return
    if not final.exists():
        os.rename(staging if staging.exists() else old, final)
        fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)


def plan_step_dir(final, identity, state_name="state.json", resume=True,
                  fix="delete it (the step then starts over in that directory)"):
    """Where a step that replaces the directory FINAL builds, decided by reading only: (work, discard).

    WORK is FINAL itself when FINAL does not exist or holds a build of the same IDENTITY (config and inputs, in
    WORK/STATE_NAME) - the step resumes there; otherwise FINAL.new, and the finished FINAL stays untouched until
    swap_in() replaces it by the complete new build. DISCARD is True when WORK exists but must be emptied first
    (a build with other settings, or any build when RESUME is False: a trainer that cannot continue).
    Nothing is changed here: the caller checks everything else first, then calls open_step_dir().
    """
    final, new = Path(final), staging_dir(final)
    if resume and (not final.exists() or read_json(final / state_name, fix=fix) == identity):
        return final, False
    if not new.exists():
        return new, False
    return new, not (resume and read_json(new / state_name, fix=fix) == identity)


def open_step_dir(step, work, discard, identity, state_name="state.json"):
    """Make WORK (from plan_step_dir) ready to write: emptied when DISCARD, created, its identity recorded."""
    work = Path(work)
    if discard:  # the pipeline's logger (progress.log; progress imports this module)
        logging.getLogger("specdec_pipeline").info("%s: removing %s, an unfinished build with other settings", step, work)
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / state_name, identity)


def dir_size(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_size
    return total


# --- disk space -------------------------------------------------------------------------------------------

def human(n):
    """Bytes in binary units: 512 B, 1.5 KiB, 3.2 MiB, 1.1 TiB."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def free_bytes(path):
    """Free bytes (for this user) on the filesystem holding PATH or its nearest existing parent."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


FIX_SPACE = "free space there or point eagle3_pipeline_work_dir at a larger filesystem"


def check_space(step, path, need, detail="", fix=FIX_SPACE, reclaim=0):
    """Raise one PipelineError when the filesystem of PATH has less than NEED bytes free (counting RECLAIM bytes
    that the step removes before it writes, e.g. an unfinished build with other settings)."""
    free = free_bytes(path)
    if need > free + reclaim:
        freed = f" (+ {human(reclaim)} of the unfinished build it replaces)" if reclaim else ""
        raise PipelineError(f"{step}: not enough disk space for {path}: needs about {human(need)}"
                            f"{f' ({detail})' if detail else ''}, {human(free)} free{freed}; {fix}.")
    return free


def is_disk_full(exc):
    """True for ENOSPC/EDQUOT anywhere in EXC's chain, and torch's zip writer failing (what a full disk gives)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        if "inline_container" in text and "Reader" not in text:  # torch's zip writer: short write, "unexpected pos"
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(step, path, need=None):
    """The one-line PipelineError for a write that failed because the filesystem of PATH is full."""
    free = free_bytes(path)
    needs = f"needs about {human(need)}, " if need else ""
    return PipelineError(f"{step}: the disk is full - writing {path} failed (no space left on device): {needs}"
                         f"{human(free)} free; {FIX_SPACE}, then re-run.")
