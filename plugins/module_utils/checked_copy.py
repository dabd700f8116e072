# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Copy a file that another account may control into a directory of root's, only when its sha256 is the pinned one.

The source is opened once without following a link in its place (O_NOFOLLOW; a FIFO or device is refused) and
streamed into a new temp file ``.<name>.XXXXXXXX.tmp`` beside the destination, created with mode 0600, so that no
other account can read what root copied before it is checked. The sha256 of the bytes written decides: on a match
the temp file gets its final mode through its descriptor, is fsynced and renamed over the destination (atomic);
otherwise it is removed and nothing else changes. A destination that already holds the pinned bytes is left alone
(the source is still hashed, and must match). Check mode hashes the source and writes nothing.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tempfile

from ansible_collections.specdec.eagle3.plugins.module_utils import patch_txn
from ansible_collections.specdec.eagle3.plugins.module_utils.safe_paths import exposure

CHUNK = 1 << 20
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class CopyError(Exception):
    """REASON completes "SRC ..." for one line (e.g. "has sha256 ..."); SHA256 is set when the source was read."""

    def __init__(self, msg, reason, sha256=None):
        super().__init__(msg)
        self.reason = reason
        self.sha256 = sha256


def _open_source(src):
    try:
        return patch_txn.open_regular(src)
    except patch_txn.TxnError:
        reason = "is not a regular file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            reason = "is a symbolic link, which root does not follow (give the path of the file itself)"
        elif exc.errno == errno.ENOENT:
            reason = "does not exist"
        else:
            reason = "cannot be read (%s)" % (exc.strerror or exc)
    raise CopyError("%s %s; nothing was copied" % (src, reason), reason)


def _digest(fd, out=None):
    """sha256 of what is read from FD (from its start), written to OUT as well when given."""
    os.lseek(fd, 0, os.SEEK_SET)
    digest = hashlib.sha256()
    while True:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            return digest.hexdigest()
        digest.update(chunk)
        if out is not None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]


def _in_place(dest, sha256, mode):
    """Whether DEST is already a regular file (not a link) of this user with MODE and the pinned bytes."""
    try:
        fd, st = patch_txn.open_regular(dest)
    except (OSError, patch_txn.TxnError):
        return False
    try:
        return st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == mode and _digest(fd) == sha256
    finally:
        os.close(fd)


def copy(src, dest, sha256, mode=0o644, check_mode=False):
    """Copy SRC to DEST when its sha256 is SHA256 (see the module docstring). Returns dict(changed, sha256, dest);
    CopyError (one line) otherwise."""
    sha256 = (sha256 or "").strip().lower()
    if not SHA256_RE.match(sha256):
        raise CopyError("sha256 is '%s'; expected 64 hex digits (sha256sum FILE)" % sha256,
                        "cannot be checked: the pinned sha256 '%s' is not 64 hex digits" % sha256)
    directory = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(directory):
        raise CopyError("the directory of dest %s does not exist; create it first" % dest,
                        "cannot be copied: the directory %s does not exist" % directory)
    found = exposure(directory, directory)
    if found:
        raise CopyError("dest %s: this run is root and %s %s: another account could swap the copy; %s, then run "
                        "again" % ((dest,) + found), "cannot be copied safely: %s %s (%s)" % found)
    fd, dummy = _open_source(src)
    tmp = None
    try:
        in_place = _in_place(dest, sha256, mode)
        if check_mode or in_place:
            got = _digest(fd)
            if got != sha256:
                raise CopyError("%s has sha256 %s, expected %s; nothing was copied" % (src, got, sha256),
                                "has sha256 %s" % got, got)
            return {"changed": not in_place, "sha256": got, "dest": dest}
        out, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(dest), suffix=".tmp", dir=directory)
        try:
            os.fchmod(out, 0o600)
            got = _digest(fd, out)
            if got != sha256:
                raise CopyError("%s has sha256 %s, expected %s; nothing was copied" % (src, got, sha256),
                                "has sha256 %s" % got, got)
            os.fchmod(out, mode)
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, dest)
        tmp = None
        patch_txn.fsync_dir(directory)
        return {"changed": True, "sha256": got, "dest": dest}
    except OSError as exc:
        what = exc.filename or dest
        raise CopyError("cannot copy %s to %s: %s: %s; nothing was copied" % (src, dest, what, exc.strerror or exc),
                        "cannot be copied to %s (%s)" % (dest, exc.strerror or exc))
    finally:
        os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
