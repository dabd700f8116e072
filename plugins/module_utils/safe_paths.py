# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether another account can change a path that root reads, writes, runs or creates: the one rule.

``exposure(path)`` walks PATH from ``/`` down with ``lstat`` (no link is followed unless asked, and then every link
and every entry of its target is checked too) and names the first entry another account can change:

- an entry owned by another user (a link included: root's links only);
- a directory or file writable by its group or by others;
- with ``follow=False``, a symbolic link.

A directory writable by others with the sticky bit (``/tmp``) is accepted only where root goes through it to an
entry that already exists and is root's (checked in turn): there nobody else may rename or remove it. It is refused
where root would create the next entry (another account can create it first), for PATH itself, and at or below
``inner`` (where new entries count, e.g. a venv, whose site-packages runs every ``.pth`` file in it).

The rule applies to root runs only; another user can change only what it may write anyway.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_LINKS = 40


def user_name(uid):
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "uid %d" % uid


def owner_text(uid):
    """``uid 0 (root)``, or ``uid 1002`` when no account has that uid."""
    name = user_name(uid)
    return "uid %d" % uid if name == "uid %d" % uid else "uid %d (%s)" % (uid, name)


def _within(path, inner):
    return inner is not None and (path == inner or path.startswith(inner.rstrip(os.sep) + os.sep))


def _mine(st):
    return st.st_uid in (0, os.geteuid())


def _owner_issue(path, st):
    return (path, "is owned by %s, not root (mode %o)" % (owner_text(st.st_uid), stat.S_IMODE(st.st_mode)),
            "make root own it (chown root %s)" % path)


def _writable(path, st, inner, final, child=None, judged=True):
    """The issue of a directory or file writable by its group or others, or None. CHILD: the lstat of the entry
    root goes to next (None: missing, root would create it); JUDGED: whether that entry is checked in turn."""
    mode = stat.S_IMODE(st.st_mode)
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    who = "others" if mode & stat.S_IWOTH else "its group"
    issue = "is writable by %s (mode %o), owner %s" % (who, mode, owner_text(st.st_uid))
    if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX and not final and not _within(path, inner):
        if child is None:
            return (path, issue + ", and root would create an entry there that another account can create first",
                    "create the path below it first as root, or choose a path below directories only root can "
                    "write to")
        if _mine(child) or judged:  # a foreign entry below is named when it is judged
            return None
        return (path, issue + ", and the entry below it is owned by %s, who may rename or remove it"
                % owner_text(child.st_uid), "choose a path below directories only root can write to")
    return (path, issue, "make it writable by its owner only (chmod go-w %s)" % path)


def exposure(path, inner=None, follow=False, own=True):
    """For a root run: the first entry on the way from / to PATH that another account can change, as
    (path, issue, fix) - e.g. ('/srv/venv', 'is owned by uid 1002, not root (mode 755)', 'make root own it (chown
    root /srv/venv)'); None when there is none, or this run is not root.

    A missing entry ends the walk (root creates it: only the directory it would be created in counts). FOLLOW:
    follow links, checking each link and the way to its target; else a link is itself the finding. INNER: the
    sticky-bit exemption ends there. OWN=False: PATH itself is not judged (root creates, hands over or removes it),
    only the directories above it; its own owner still decides whether a sticky parent is fine."""
    if os.geteuid() != 0:
        return None
    inner = os.path.realpath(inner) if inner else None
    # split as given, not normalized: the kernel resolves '..' after a link from the link's target
    pending = [part for part in os.path.join(os.getcwd(), path).split(os.sep) if part]
    current = os.sep
    st = os.lstat(current)
    if not _mine(st):
        return _owner_issue(current, st)
    if not pending:
        return _writable(current, st, inner, True) if own else None
    links = 0
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            st = os.lstat(current)
            continue
        entry = os.path.join(current, name)
        try:
            child = os.lstat(entry)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            child = None
        problem = _writable(current, st, inner, False, child, judged=bool(pending) or own)
        if problem or child is None or (not pending and not own):
            return problem
        if stat.S_ISLNK(child.st_mode):
            target = os.readlink(entry)
            if not _mine(child):
                return (entry, "is a symbolic link owned by %s, not root" % owner_text(child.st_uid),
                        "make root own it (chown -h root %s)" % entry)
            if not follow:
                return (entry, "is a symbolic link to %s" % target,
                        "use the real path (%s) or replace the link by that directory" % os.path.realpath(entry))
            links += 1
            if links > MAX_LINKS:
                return (entry, "is one of more than %d symbolic links in a row" % MAX_LINKS, "use the real path")
            pending[:0] = [part for part in target.split(os.sep) if part]
            if os.path.isabs(target):
                current = os.sep
                st = os.lstat(current)
            continue
        if not _mine(child):
            return _owner_issue(entry, child)
        if not pending:
            return _writable(entry, child, inner, True)
        current, st = entry, child
    return None
