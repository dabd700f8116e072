# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Crash-safe writes of several files as one unit, for the patch engine.

A commit goes: every new text to a temp file ``.<name>.XXXXXXXX.tmp`` beside its target (written and
fsynced) -> optional backups -> a write-ahead journal ``.specdec-patch-journal.json`` in the package
directory (the planned files with the sha256 of their old and new text and the new text itself, written to a
temp file, fsynced and renamed) -> one rename per file, each followed by an fsync of its directory -> the
journal removed.  A run killed anywhere leaves every file either old or new; when a journal is left behind,
the next run finishes it (roll forward) before it decides anything, and removes our temp files that a kill
left next to the targets.

Files are opened with O_NOFOLLOW (a link put in place of a file is refused, never followed); a staged file gets
its mode and owner through its open descriptor and is checked to be still the file this run created.  A
journal is used only when it is a regular file owned by the user of this run.  For root runs, a directory another
account could use to swap or alias what root reads and writes is named by ``safe_paths.exposure``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
import time

from ansible_collections.specdec.eagle3.plugins.module_utils import safe_paths

JOURNAL_NAME = ".specdec-patch-journal.json"
JOURNAL_FORMAT = 1
# tempfile.mkstemp's random part: 8 characters of [a-z0-9_]
_RANDOM = r"[a-z0-9_]{8}"


class TxnError(Exception):
    pass


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def temp_pattern(basename):
    """The names of the temp files this module creates for a target called ``basename``."""
    return re.compile(r"^\.%s\.%s\.tmp$" % (re.escape(basename), _RANDOM))


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_dirs(dirs, exclusive, timeout=120):
    """flock every directory (sorted, so two runs never wait on each other crosswise); returns the fds."""
    fds = []
    try:
        for path in sorted(set(dirs)):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            fds.append(fd)
            deadline = time.time() + timeout
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                    break
                except (IOError, OSError):
                    if time.time() > deadline:
                        raise TxnError("another patch run holds the lock on %s for over %d s; wait for it to "
                                       "finish (nothing was written)" % (path, timeout))
                    time.sleep(0.2)
    except Exception:
        unlock(fds)
        raise
    return fds


def unlock(fds):
    for fd in fds:
        os.close(fd)


def open_regular(path):
    """Open ``path`` for reading without following a symbolic link in its place (O_NOFOLLOW: OSError ELOOP) and
    without waiting on a FIFO; returns (fd, its fstat).  TxnError when it is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TxnError("%s is not a regular file" % path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path):
    """The bytes and the stat of the regular file ``path``, read through one O_NOFOLLOW descriptor."""
    fd, st = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        return handle.read(), st


def _describe_owner(path):
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return " (mode %o, owner uid %d, this run uid %d)" % (stat.S_IMODE(st.st_mode), st.st_uid, os.geteuid())


def read_only_fs(path):
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def write_problem(path, label):
    """Why ``path`` (a file, or a directory that gets new entries) cannot be written, or None.

    Changes nothing, so check mode and the real run find the same problems.  ``label`` names the file for
    the message, e.g. "speculators/utils/loading.py (/venv/.../loading.py)".
    """
    is_dir = os.path.isdir(path)
    directory = path if is_dir else os.path.dirname(path)
    if read_only_fs(directory):
        return ("%s cannot be written: its file system is mounted read-only (read-only file system at %s). "
                "Remount it read-write or install the venv on a writable file system, then run again"
                % (label, directory))
    if not os.access(directory, os.W_OK | os.X_OK):
        return ("%s cannot be written: its directory %s is not writable by this user%s, and the temp file and "
                "the rename need it. Run the task as the venv's owner (become) or fix the permissions, then run "
                "again"
                % (label, directory, _describe_owner(directory)))
    if not is_dir and not os.access(path, os.W_OK):
        if os.geteuid() == 0:
            return ("%s cannot be written although this run is root: the file is probably immutable or "
                    "append-only (see lsattr; chattr -i/-a clears it), then run again" % label)
        return ("%s is not writable by this user%s. Run the task as the venv's owner (become) or fix the "
                "permissions, then run again" % (label, _describe_owner(path)))
    return None


def _os_error(what, path, exc):
    if exc.errno == errno.EROFS:
        return "%s %s: read-only file system" % (what, path)
    if exc.errno == errno.ENOSPC:
        return "%s %s: no space left on the device" % (what, path)
    return "%s %s: %s" % (what, path, exc.strerror or exc)


def _fill(fd, path, data, mode, owner=None):
    """Write ``data`` through the open ``fd`` of the new file ``path``, give it ``owner`` (uid, gid; where this
    user may) and ``mode`` through that descriptor, fsync it and check that ``path`` still names it; on any
    failure (or a kill signal raised as an exception) the partial file is removed."""
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if owner is not None:
                try:
                    os.fchown(handle.fileno(), owner[0], owner[1])
                except OSError:
                    pass
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
            mine = os.fstat(handle.fileno())
            try:
                now = os.lstat(path)
            except OSError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                raise TxnError("%s was replaced while this run wrote it: another account can write %s; make that "
                               "directory writable by the venv's owner only, then run again"
                               % (path, os.path.dirname(path)))
    except BaseException:
        _unlink_quiet(path)
        raise


def stage(real_path, data, st):
    """Write ``data`` to a new temp file beside ``real_path`` with the mode and owner of ``st``; returns its
    path."""
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(real_path), suffix=".tmp",
                               dir=os.path.dirname(real_path))
    _fill(fd, tmp, data, stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))
    return tmp


def _unlink_quiet(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_backup(real_path, data, st):
    """Copy ``data`` (the file's current bytes) to a backup name that no other file has; returns its path.

    Names: ``<file>.<YYYY-mm-dd@HH:MM:SS>~``, then ``<file>.<stamp>.1~``, ``.2~`` ... when taken; created
    with O_EXCL, so an existing backup is never overwritten.
    """
    stamp = time.strftime("%Y-%m-%d@%H:%M:%S")
    for n in range(10000):
        name = "%s.%s%s~" % (real_path, stamp, "" if n == 0 else ".%d" % n)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                continue
            raise
        _fill(fd, name, data, stat.S_IMODE(st.st_mode))
        return name
    raise TxnError("%s: 10000 backups named %s already exist; remove old backups" % (real_path, stamp))


class Journal(object):
    """The write-ahead journal of one package directory."""

    def __init__(self, root):
        self.root = root
        self.path = os.path.join(root, JOURNAL_NAME)

    def exists(self):
        return os.path.lexists(self.path)

    def write(self, state, entries):
        doc = {"format": JOURNAL_FORMAT, "written_by": "specdec.eagle3.source_patch", "state": state,
               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "files": [{"path": e["real"], "sha256_before": sha256(e["old"]), "sha256_after": sha256(e["new"]),
                          "after": e["new"].decode("utf-8")} for e in entries]}
        data = json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")
        # owned by this run's user, the only owner load() trusts
        fd, tmp = tempfile.mkstemp(prefix=".%s." % JOURNAL_NAME, suffix=".tmp", dir=self.root)
        _fill(fd, tmp, data, 0o644)
        try:
            os.rename(tmp, self.path)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        fsync_dir(self.root)

    def load(self):
        """The journal's file entries; TxnError naming the journal when it cannot be used.

        Completing a journal writes the text it holds, so only a regular file that this run's user owns is read
        (not a link, not a file another account planted, as root not a file with other names)."""
        try:
            fd, st = open_regular(self.path)
        except TxnError:
            raise self._untrusted("is not a regular file")
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._untrusted("is a symbolic link to %s" % os.path.realpath(self.path))
            raise self._unusable(exc)
        if st.st_uid != os.geteuid() or (os.geteuid() == 0 and st.st_nlink > 1):
            os.close(fd)
            raise self._untrusted("is owned by uid %d (%s)" % (st.st_uid, safe_paths.user_name(st.st_uid))
                                  if st.st_uid != os.geteuid() else "has %d hard links" % st.st_nlink)
        try:
            with os.fdopen(fd, "rb") as handle:
                doc = json.loads(handle.read().decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != JOURNAL_FORMAT or \
                    not isinstance(doc.get("files"), list):
                raise ValueError("not a format-%d journal" % JOURNAL_FORMAT)
            real_root = os.path.realpath(self.root)
            for entry in doc["files"]:
                if not isinstance(entry, dict):
                    raise ValueError("a file entry is not a mapping")
                for key in ("path", "sha256_before", "sha256_after", "after"):
                    if not isinstance(entry.get(key), str):
                        raise ValueError("a file entry has no '%s'" % key)
                if os.path.realpath(entry["path"]) != entry["path"] or \
                        not entry["path"].startswith(real_root + os.sep):
                    raise ValueError("it lists %s, not a file inside %s (links resolved)"
                                     % (entry["path"], self.root))
            return doc
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise self._unusable(exc)

    def _unusable(self, exc):
        return TxnError("the patch journal %s left by an interrupted run cannot be used (%s). The files it covered "
                        "may be half patched: reinstall the distribution (pip install --force-reinstall --no-deps), "
                        "delete the journal, then run again" % (self.path, exc))

    def _untrusted(self, why):
        return TxnError("the patch journal %s %s, and a journal is used only when it is a regular file of this "
                        "run's user (uid %d): nothing was read from it or written. Delete it (rm %s) and run again; "
                        "if an interrupted run of its owner left it, run the task as that user first"
                        % (self.path, why, os.geteuid(), self.path))

    def remove(self):
        os.unlink(self.path)
        fsync_dir(self.root)


def pending(journal):
    """Files of a journal that are not yet at their planned text: list of (path, current bytes, new bytes).

    TxnError when a file is neither at its old nor at its new text (changed by someone since the kill)."""
    doc = journal.load()
    todo = []
    for entry in doc["files"]:
        path = entry["path"]
        new = entry["after"].encode("utf-8")
        if sha256(new) != entry["sha256_after"]:
            raise TxnError("the patch journal %s is damaged (the text recorded for %s does not match its sha256); "
                           "reinstall the distribution, delete the journal, then run again" % (journal.path, path))
        exposure = safe_paths.exposure(os.path.dirname(path), journal.root)
        if exposure:
            raise TxnError("the patch journal %s lists %s, and this run is root and the directory %s %s: %s, then "
                           "run again" % ((journal.path, path) + exposure))
        try:
            cur, st = read_regular(path)
        except (OSError, TxnError) as exc:
            raise TxnError("the patch journal %s lists %s, which cannot be read (%s); reinstall the distribution, "
                           "delete the journal, then run again"
                           % (journal.path, path, getattr(exc, "strerror", None) or exc))
        if os.geteuid() == 0 and st.st_nlink > 1:
            raise TxnError("the patch journal %s lists %s, which has %d hard links and this run is root; reinstall "
                           "the distribution, delete the journal, then run again" % (journal.path, path, st.st_nlink))
        digest = sha256(cur)
        if digest == entry["sha256_after"]:
            continue
        if digest != entry["sha256_before"]:
            raise TxnError("%s changed after an interrupted patch run: it is neither the text before nor the text "
                           "after that run (journal %s). Reinstall the distribution (pip install --force-reinstall "
                           "--no-deps), delete the journal, then run again" % (path, journal.path))
        todo.append((path, cur, new))
    return todo


def finish(journal, todo):
    """Roll an interrupted commit forward: write every pending file, then remove the journal."""
    for path, dummy, new in todo:
        fd, st = open_regular(path)
        os.close(fd)
        tmp = stage(path, new, st)
        try:
            os.rename(tmp, path)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        fsync_dir(os.path.dirname(path))
    journal.remove()


def stale_temps(targets):
    """Our temp files beside ``targets`` (real paths) and journal temps in the package dirs; sorted paths."""
    by_dir = {}
    for path in targets:
        by_dir.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
    found = []
    for directory, names in by_dir.items():
        patterns = [temp_pattern(n) for n in names]
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        for entry in entries:
            if entry.startswith(".") and entry.endswith(".tmp") and any(p.match(entry) for p in patterns):
                full = os.path.join(directory, entry)
                if stat.S_ISREG(os.lstat(full).st_mode):
                    found.append(full)
    return sorted(set(found))


def commit(entries, journal, state, backup):
    """Write every entry (dict real, old, new, label) as one unit; returns the backup paths.

    TxnError with a true account of what was written when something fails."""
    staged, backups = [], []
    try:
        for entry in entries:
            st = os.lstat(entry["real"])
            seen = entry.get("stat")  # as read by the engine
            if not stat.S_ISREG(st.st_mode) or (seen is not None and
                                                (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino)):
                raise TxnError("%s was replaced while this run read it" % entry["real"])
            staged.append(stage(entry["real"], entry["new"], st))
        if backup:
            for entry in entries:
                backups.append(write_backup(entry["real"], entry["old"], os.stat(entry["real"])))
        journal.write(state, entries)
    except (OSError, TxnError) as exc:
        for path in staged + backups + ([journal.path] if journal.exists() else []):
            _unlink_quiet(path)
        what = getattr(exc, "filename", None) or journal.root
        detail = _os_error("cannot write", what, exc) if isinstance(exc, OSError) else str(exc)
        raise TxnError("%s; no file of this patch set was changed (the temp files and backups of this run were "
                       "removed)" % detail)
    done = []
    for entry, tmp in zip(entries, staged):
        try:
            os.rename(tmp, entry["real"])
            fsync_dir(os.path.dirname(entry["real"]))
        except OSError as exc:
            for rest in staged[len(done):]:
                _unlink_quiet(rest)
            raise TxnError("%s after %d of %d files were replaced (%s). The journal %s records the whole plan: the "
                           "next run with state=present or state=absent completes it first"
                           % (_os_error("cannot replace", entry["real"], exc), len(done), len(entries),
                              ", ".join(done) or "none", journal.path))
        done.append(entry["label"])
    journal.remove()
    return backups
