# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Apply, assert and revert exact-text source patches (data format: patch_sets/README.md).

A patch set is one unit: every file of the set is located, read, decided and checked first (path inside its
package, UTF-8 text, anchors, patched text compiles, file and directory writable, file system not read-only),
and nothing is written when any file fails.  The writes then go through patch_txn: temp files, optional
backups, a write-ahead journal, one atomic rename per file; a journal left by a killed run is finished
before anything else, and our temp files left by a kill are removed.  Need is decided by the conditions
module against the installed code.
"""

from __future__ import annotations

import difflib
import errno
import os

from ansible_collections.specdec.eagle3.plugins.module_utils import conditions as cond_mod
from ansible_collections.specdec.eagle3.plugins.module_utils import compat
from ansible_collections.specdec.eagle3.plugins.module_utils import patch_txn
from ansible_collections.specdec.eagle3.plugins.module_utils import safe_paths
from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import ProbeError

# The way forward named by every refusal of a release this engine's patch sets cannot handle (README "Tracks").
WAY_FORWARD = ("The way forward for this vLLM: the current track (specdec_track: current) - vLLM 0.25 or newer with "
               "speculators 0.9.0 and hs-connectors 0.9.0, which need no source patches; its venv and work "
               "directory are set beside this track's (see inventory/local-current and inventory/kimi-current).")


class PatchError(Exception):
    pass


def validate_patches(patches, origin):
    """Check the data format; raise PatchError naming the patch and what is expected."""
    if not isinstance(patches, list) or not patches:
        raise PatchError("%s: 'patches' must be a non-empty list of patch specs (see patch_sets/README.md)" % origin)
    seen = set()
    for idx, patch in enumerate(patches):
        where = "%s: patch #%d" % (origin, idx + 1)
        if not isinstance(patch, dict):
            raise PatchError("%s must be a mapping" % where)
        for key in ("id", "distribution", "file", "hunks"):
            if not patch.get(key):
                raise PatchError("%s (%s) has no '%s'; expected keys: id, description, distribution, file, when, "
                                 "hunks[before, after], calls" % (where, patch.get("id", "?"), key))
        where = "%s: patch '%s'" % (origin, patch["id"])
        if patch["id"] in seen:
            raise PatchError("%s: duplicate id" % where)
        seen.add(patch["id"])
        if not isinstance(patch["file"], str) or os.path.isabs(patch["file"]) or "\\" in patch["file"]:
            raise PatchError("%s: 'file' is %r; expected a path relative to the import root with / separators, "
                             "e.g. speculators/utils/loading.py" % (where, patch["file"]))
        if not isinstance(patch["hunks"], list):
            raise PatchError("%s: 'hunks' must be a list of {before, after}" % where)
        for hidx, hunk in enumerate(patch["hunks"]):
            if not isinstance(hunk, dict) or not isinstance(hunk.get("before"), str) or \
                    not isinstance(hunk.get("after"), str) or not hunk["before"] or hunk["before"] == hunk["after"]:
                raise PatchError("%s hunk %d: needs non-empty string 'before' and a different string 'after'"
                                 % (where, hidx + 1))
            formerly = hunk.get("formerly", [])
            if not isinstance(formerly, list) or not all(
                    isinstance(old, str) and old and old not in (hunk["before"], hunk["after"]) for old in formerly):
                raise PatchError("%s hunk %d: 'formerly' is %r; expected a list of the texts earlier versions of "
                                 "this hunk wrote in place of 'before', each non-empty and different from 'before' "
                                 "and 'after'" % (where, hidx + 1, formerly))
        for cidx, cond in enumerate(patch.get("when") or []):
            msg = cond_mod.validate(cond, "%s condition %d" % (where, cidx + 1))
            if msg:
                raise PatchError(msg)


def _closest(text, anchor, limit=3):
    """The lines of ``text`` most like the anchor's first meaningful line, with 1-based line numbers."""
    lines = text.splitlines()
    probe = next((line for line in anchor.splitlines() if line.strip()), anchor).strip()
    scored = []
    for num, line in enumerate(lines, 1):
        if line.strip():
            ratio = difflib.SequenceMatcher(None, probe, line.strip()).ratio()
            scored.append((ratio, num, line))
    scored.sort(key=lambda x: -x[0])
    return ["line %d: %s" % (num, line.strip()) for ratio, num, line in scored[:limit] if ratio > 0.4]


def hunk_state(text, hunk):
    """'applied', 'pending' (before found once), 'outdated' (the text an earlier version of the hunk wrote,
    listed in its 'formerly', found once) or 'drifted' for one hunk."""
    before, after = hunk["before"], hunk["after"]
    n_after = text.count(after)
    if n_after == 1 and text.count(before) == after.count(before):
        return "applied"
    if text.count(before) == 1 and (n_after == 0 or after.count(before) > 0):
        return "pending"
    if former_text(text, hunk) is not None:
        return "outdated"
    return "drifted"


def former_text(text, hunk):
    """The entry of the hunk's 'formerly' that is in TEXT in place of 'before' (once), else None."""
    for old in hunk.get("formerly") or ():
        if text.count(old) == 1 and text.count(hunk["before"]) == old.count(hunk["before"]) and \
                text.count(hunk["after"]) == old.count(hunk["after"]):
            return old
    return None


class _Target(object):
    """One file of the set: where it is, where it really is (symlinks resolved), the directory it is imported
    from, its package directory (the venv's real site-packages joined with the top-level name; the import root
    for a top-level module)."""

    def __init__(self, path, patch, purelib):
        self.path = path
        self.rel = patch["file"]
        self.dist = patch["distribution"]
        self.patches = []
        self.real = os.path.realpath(path)
        self.base = path[:len(path) - len(self.rel)].rstrip(os.sep) if path.endswith(self.rel) else \
            os.path.dirname(path)
        self.purelib = purelib
        self.root = os.path.join(purelib, self.rel.split("/")[0]) if "/" in self.rel else purelib
        self.problem = None
        self.where = self.rel
        self.original = None
        self.stat = None

    def label(self):
        if os.path.islink(self.path):
            return "%s (%s, a symbolic link to %s)" % (self.rel, self.path, self.real)
        if self.real != os.path.abspath(self.path):
            return "%s (%s, which resolves to %s)" % (self.rel, self.path, self.real)
        return "%s (%s)" % (self.rel, self.path)


def _purelib(env):
    """The real path of the venv's site-packages (sysconfig purelib of its interpreter), resolved once."""
    purelib = (getattr(env, "info", None) or {}).get("purelib")
    if not purelib or not os.path.isdir(purelib):
        raise PatchError("the interpreter %s reports no site-packages directory (sysconfig purelib: %r): the patch "
                         "engine writes only below a venv's site-packages; point 'python' at the venv's interpreter"
                         % (getattr(env, "python", "?"), purelib))
    return os.path.realpath(purelib)


def _reinstall_hint(target, env):
    version = env.version(target.dist)
    return "reinstall %s %s (pip install --force-reinstall --no-deps %s==%s)" % (target.dist, version, target.dist,
                                                                                 version)


def _root_problem(target, env, st):
    """For a root run, why this file must not be read or written: it has other names (hard links), or a directory
    on its way another account can change; None otherwise (and always for another user)."""
    if os.geteuid() != 0:
        return None
    issues, fixes = [], []
    if st.st_nlink > 1:
        issues.append("%s has %d hard links (another name of the same file may lie outside the venv)"
                      % (target.real, st.st_nlink))
        fixes.append("reinstall %s %s so the file is its own (pip install --force-reinstall --no-deps %s==%s; uv "
                     "with UV_LINK_MODE=copy)" % ((target.dist, env.version(target.dist)) * 2))
    # the directory of the file and, for a link, the directory of the link
    for directory in sorted(set([os.path.dirname(target.real), os.path.realpath(os.path.dirname(target.path))])):
        exposure = safe_paths.exposure(directory, target.purelib)
        if exposure and "the directory %s %s" % exposure[:2] not in issues:
            issues.append("the directory %s %s" % exposure[:2])
            fixes.append(exposure[2] + " or run the task as the venv's owner (become_user)")
    if not issues:
        return None
    fix = "; ".join(fixes)
    return ("%s: this run is root and %s: another account could swap or alias what root reads and writes there, "
            "so the file is neither read nor patched. %s, then run again"
            % (target.where, ", and ".join(issues), fix[0].upper() + fix[1:]))


def _locate(target, env):
    """Find what stops this file before anything is read or written: a package that is not a real directory of
    the venv's site-packages, a path outside the package, a missing file, something that is not a regular file,
    and for a root run a file with hard links or a directory on its way another account can change."""
    first = target.patches[0]
    where = target.where = "file '%s' of %s %s (patch '%s')" % (target.rel, target.dist, env.version(target.dist),
                                                                first["id"])
    if os.path.realpath(target.base) != target.purelib:
        target.problem = ("%s: the package is imported from %s, outside the venv's site-packages %s: patches are "
                          "written only to what is installed in the venv itself; %s into the venv (not as an "
                          "editable or .pth install), then run again"
                          % (where, target.base, target.purelib, _reinstall_hint(target, env)))
    elif os.path.islink(target.root):
        target.problem = ("%s: the package directory %s is a symbolic link to %s: patches are written only inside "
                          "the venv's site-packages %s; %s so that it is a real directory there, then run again"
                          % (where, target.root, os.path.realpath(target.root), target.purelib,
                             _reinstall_hint(target, env)))
    elif not (target.real + os.sep).startswith(target.root + os.sep) or target.real == target.root:
        link = " through a symbolic link" if os.path.realpath(target.path) != os.path.abspath(target.path) else ""
        target.problem = ("%s resolves%s to %s, outside the package directory %s: a patch may only change files "
                          "inside the package it names; fix the file path of the patch"
                          % (where, link, target.real, target.root))
    elif not os.path.exists(target.real):
        target.problem = ("%s: %s does not exist: the installed release has a different layout; use the patch set "
                          "for that release" % (where, target.path))
    elif not os.path.isfile(target.real):
        target.problem = "%s: %s is not a regular file; %s" % (where, target.real, _reinstall_hint(target, env))
    else:
        target.problem = _root_problem(target, env, os.lstat(target.real))


def _read(target, env, overlay):
    if target.real in overlay:
        target.original = overlay[target.real].decode("utf-8")
        return
    try:
        data, target.stat = patch_txn.read_regular(target.real)  # O_NOFOLLOW: a link swapped in is not followed
    except (OSError, patch_txn.TxnError) as exc:
        if getattr(exc, "errno", None) == errno.ELOOP or isinstance(exc, patch_txn.TxnError):
            target.problem = ("%s: %s was replaced while this run checked it (now %s): another account can change "
                              "its directory; make it writable by the venv's owner only, then run again"
                              % (target.where, target.real, "a symbolic link" if os.path.islink(target.real)
                                 else "not a regular file"))
        else:
            target.problem = "%s cannot be read: %s; run the task as the venv's owner (become)" % (
                target.label(), exc.strerror)
        return
    target.problem = _root_problem(target, env, target.stat)
    if target.problem:
        return
    try:
        target.original = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        target.problem = (
            "%s is not valid UTF-8 text (byte 0x%02x at line %d, byte offset %d): the patch set expects the UTF-8 "
            "source of %s %s. The installed file is damaged or was replaced; %s, then run again"
            % (target.label(), data[exc.start], data[:exc.start].count(b"\n") + 1, exc.start, target.dist,
               env.version(target.dist), _reinstall_hint(target, env)))


def _why_drifted(text):
    if not text.strip():
        return "the file is empty (%d bytes), so no anchor can be found: the installed copy is damaged" % len(text)
    if "\r\n" in text:
        return ("the file has Windows line endings (CRLF detected) while the release and the anchors use LF: "
                "convert it back (sed -i 's/\\r$//' FILE)")
    return None


def run(patches, env, tree, state, check_mode=False, diff_mode=False, backup=False, origin="patches"):
    """Bring every patch to ``state``.  Returns dict(results, changed, diff, backups, recovered,
    removed_temp_files, versions) plus failed and msg on failure."""
    validate_patches(patches, origin)
    purelib = _purelib(env)
    targets = {}
    for patch in patches:
        path = env.file_of(patch["distribution"], patch["file"])
        targets.setdefault(path, _Target(path, patch, purelib)).patches.append(patch)
    targets = list(targets.values())
    for target in targets:
        _locate(target, env)
    writing = state in ("present", "absent") and not check_mode
    roots = sorted(set(t.root for t in targets if not t.problem and os.path.isdir(t.root)))
    try:
        fds = patch_txn.lock_dirs(roots, exclusive=writing)
    except (OSError, patch_txn.TxnError) as exc:
        raise PatchError(str(exc))
    try:
        return _run_locked(patches, env, tree, state, check_mode, diff_mode, backup, targets, roots, writing)
    finally:
        patch_txn.unlock(fds)


def _recover(roots, state, writing, diff_mode, out, notes, failures):
    """Finish what a killed run left: returns {real path: planned bytes} to plan from in check mode."""
    overlay = {}
    for root in roots:
        journal = patch_txn.Journal(root)
        if not journal.exists():
            continue
        try:
            todo = patch_txn.pending(journal)
        except patch_txn.TxnError as exc:
            raise PatchError(str(exc))
        paths = [path for path, dummy, dummy in todo]
        if state == "asserted":
            if todo:
                failures.append("an interrupted patch run left this set half-written: %s %s not yet at the text "
                                "planned in its journal %s; run state=present to complete it"
                                % (", ".join(paths), "is" if len(paths) == 1 else "are", journal.path))
            continue
        for path, cur, new in todo:
            overlay[path] = new
            if diff_mode:
                out["diff"].append({"before_header": path, "after_header": path + " (interrupted run completed)",
                                    "before": cur.decode("utf-8", "replace"), "after": new.decode("utf-8")})
        out["recovered"].extend(paths)
        out["changed"] = True
        if writing:
            try:
                patch_txn.finish(journal, todo)
            except OSError as exc:
                raise PatchError("cannot complete the interrupted patch run recorded in %s (%s: %s); the journal is "
                                 "kept and the next run tries again" % (journal.path, exc.filename, exc.strerror))
            notes.append("An interrupted earlier run was completed first from its journal %s (%s)."
                         % (journal.path, ", ".join(paths) or "its files were already written; journal removed"))
        else:
            notes.append("An interrupted earlier run would be completed first from its journal %s (%s)."
                         % (journal.path, ", ".join(paths) or "its files are already written"))
    return overlay


def _run_locked(patches, env, tree, state, check_mode, diff_mode, backup, targets, roots, writing):
    versions = env.versions()
    vtext = ", ".join("%s %s" % kv for kv in sorted(versions.items())) or "no distributions found"
    out = {"results": [], "changed": False, "diff": [], "backups": [], "versions": versions, "recovered": [],
           "removed_temp_files": []}
    failures, notes = [], []
    overlay = _recover(roots, state, writing, diff_mode, out, notes, failures)
    if state != "asserted":
        temps = patch_txn.stale_temps([t.real for t in targets if not t.problem] +
                                      [os.path.join(root, patch_txn.JOURNAL_NAME) for root in roots])
        for tmp in temps:
            if writing:
                try:
                    os.unlink(tmp)
                except OSError as exc:
                    failures.append("cannot remove the temp file %s that an interrupted run left: %s"
                                    % (tmp, exc.strerror))
                    continue
            out["removed_temp_files"].append(tmp)
            out["changed"] = True
        if temps:
            notes.append("%s %d temp file(s) left by an interrupted run: %s."
                         % ("Removed" if writing else "Would remove", len(out["removed_temp_files"]),
                            ", ".join(out["removed_temp_files"])))
    writes = []
    for target in targets:
        if not target.problem:
            _read(target, env, overlay)
        if target.problem:
            failures.append(target.problem)
            out["results"].extend({"id": p["id"], "file": target.path, "state": "blocked", "reason": target.problem,
                                   "description": p.get("description", "")} for p in target.patches)
            continue
        file_results, text = _decide(target, env, tree, state, vtext, failures)
        out["results"].extend(file_results)
        if text is None or text == target.original:
            continue
        problem = _compile_problem(target, text)
        if not problem:
            problem = patch_txn.write_problem(target.real, target.label())
        if problem:
            failures.append(problem)
            for entry in file_results:
                if entry["state"] in ("applied", "reverted"):
                    entry.update(state="blocked", reason=problem)
            continue
        writes.append({"target": target, "real": target.real, "label": target.path, "stat": target.stat,
                       "old": target.original.encode("utf-8"), "new": text.encode("utf-8")})
        if diff_mode:
            out["diff"].append({"before_header": target.path, "after_header": target.path,
                                "before": target.original, "after": text})
    journal = patch_txn.Journal(writes[0]["target"].root) if writes else None
    if writes and not failures:
        problem = patch_txn.write_problem(journal.root, "the patch journal %s" % journal.path)
        if problem:
            failures.append(problem)
    if failures:
        for entry in out["results"]:
            if entry["state"] in ("applied", "reverted") and entry.get("written") is not False:
                entry["written"] = False
                entry["reason"] = "not written: another file of this set cannot be patched; " + entry["reason"]
        out["failed"] = True
        out["msg"] = "\n\n".join(notes + failures)
        if state != "asserted":
            out["msg"] += "\n\nNo file of this patch set was written%s." % (
                " beyond completing the interrupted run named above" if out["recovered"] and writing else "")
        return out
    if writes:
        out["changed"] = True
        if writing:
            try:
                out["backups"] = patch_txn.commit(writes, journal, state, backup)
            except patch_txn.TxnError as exc:
                out["failed"] = True
                out["msg"] = "\n\n".join(notes + [str(exc)])
                return out
            except OSError as exc:
                out["failed"] = True
                out["msg"] = "\n\n".join(notes + ["writing the patch set failed at %s: %s; the journal %s, if "
                                                  "present, lets the next run complete it"
                                                  % (exc.filename, exc.strerror, journal.path)])
                return out
    return _finish(patches, env, tree, state, out, vtext)


def _compile_problem(target, text):
    try:
        compile(text, target.path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return ("%s: the patched text does not compile (%s, line %s); the patch set does not fit this file"
                % (target.label(), exc.msg, exc.lineno))
    return None


def _decide(target, env, tree, state, vtext, failures):
    """Decide every patch of one file; returns (results, new text or None when the file drifted)."""
    original = target.original
    path = target.path
    text = original
    file_results = []
    drift = []
    for patch in target.patches:
        states = [hunk_state(text, h) for h in patch["hunks"]]
        base = {"id": patch["id"], "file": path, "description": patch.get("description", "")}
        if state == "absent":
            # An outdated hunk holds what an earlier version of the patch wrote; that version may have had fewer
            # hunks, so beside outdated ones pending hunks are fine (the earlier version never wrote them).
            outdated = "outdated" in states
            if all(s == "applied" for s in states) or (outdated and (
                    set(states) <= {"applied", "outdated"} or set(states) <= {"pending", "outdated"})):
                for hunk, hstate in zip(patch["hunks"], states):
                    if hstate == "applied":
                        text = text.replace(hunk["after"], hunk["before"], 1)
                    elif hstate == "outdated":
                        text = text.replace(former_text(text, hunk), hunk["before"], 1)
                file_results.append(dict(base, state="reverted", reason="patched text restored" + (
                    " (the text an earlier version of this patch wrote)" if outdated else "")))
            elif all(s == "pending" for s in states):
                file_results.append(dict(base, state="not_needed", reason="not applied"))
            else:
                drift.append((patch, states))
            continue
        try:
            needed, reasons = cond_mod.evaluate_all(patch.get("when"), tree, env)
        except ProbeError as exc:
            raise PatchError(
                "patch '%s' (%s, %s): its condition cannot be evaluated against the installed code: %s. "
                "Installed: %s. The upstream API moved; this patch set does not support this release -- "
                "pin a supported vLLM or add a patch set for it. %s" % (
                    patch["id"], patch["file"], patch["distribution"], exc, vtext, WAY_FORWARD))
        reason = "; ".join(reasons)
        if not needed:
            file_results.append(dict(base, state="not_needed", reason=reason,
                                     text_applied=all(s == "applied" for s in states)))
            continue
        outdated = "outdated" in states
        if all(s == "applied" for s in states):
            file_results.append(dict(base, state="already_applied", reason=reason))
        elif all(s in ("pending", "applied", "outdated") for s in states):
            if state == "asserted":
                why = ("applied in the text of an earlier version of this patch, needed in its current text: "
                       if outdated else "needed but not applied: ")
                file_results.append(dict(base, state="drifted", reason=why + reason, pending=True))
                continue
            for hunk, hstate in zip(patch["hunks"], states):
                if hstate == "pending":
                    text = text.replace(hunk["before"], hunk["after"], 1)
                elif hstate == "outdated":
                    text = text.replace(former_text(text, hunk), hunk["after"], 1)
            entry = dict(base, state="applied", reason=reason)
            if outdated:
                entry.update(updated=True, reason="updated from the text an earlier version of this patch wrote; "
                             + reason)
            file_results.append(entry)
        else:
            drift.append((patch, states))
    if not drift:
        return file_results, text
    msgs = []
    why = _why_drifted(original)
    for patch, states in drift:
        for hunk, hstate in zip(patch["hunks"], states):
            if hstate != "drifted":
                continue
            nb = original.count(hunk["before"])
            msgs.append(
                "file %s; installed %s; patch '%s': expected anchor (found %d times, need exactly once):"
                "\n%s\nclosest lines found:\n  %s" % (
                    path, vtext, patch["id"], nb, hunk["before"].rstrip("\n"),
                    "\n  ".join(_closest(original, hunk["before"])) or "(none similar)"))
        file_results.append({"id": patch["id"], "file": path, "state": "drifted",
                             "reason": "anchor not found and patched text absent" + ("; " + why if why else "")})
    if why:
        msgs.insert(0, "file %s: %s." % (path, why))
    failures.append(
        "\n".join(msgs) + "\nNothing was written to %s. The installed file differs from the release this patch "
        "set was written for: %s, or use/add a patch set that matches the installed one."
        % (path, _reinstall_hint(target, env)))
    for entry in file_results:
        if entry["state"] == "applied":
            entry["written"] = False
            entry["reason"] = "not written: another patch of this file drifted; " + entry["reason"]
    return file_results, None


def _finish(patches, env, tree, state, out, vtext):
    if state == "asserted":
        pending = [r for r in out["results"] if r["state"] == "drifted"]
        calls = assert_calls(patches, env, tree)
        out["calls"] = [f.as_dict() for f in calls]
        broken = [f for f in calls if f.state == "broken"]
        if pending or broken:
            out["failed"] = True
            parts = []
            if pending:
                parts.append("needed patches not applied: %s (run with state=present)"
                             % ", ".join(r["id"] for r in pending))
            if broken:
                parts.append("patched calls that do not bind to the installed API (%s): %s" % (
                    vtext, "; ".join("%s at %s: %s" % (f.symbol, f.site, f.why) for f in broken)))
            out["msg"] = "; ".join(parts)
    return out


def assert_calls(patches, env, tree):
    """Statically bind every call of the patched files to the installed provider API (e.g. vLLM)."""
    findings = []
    done = set()
    for patch in patches:
        path = env.file_of(patch["distribution"], patch["file"])
        if path in done:
            continue
        done.add(path)
        module = patch["file"][:-3].replace("/", ".")
        for provider in sorted(set(c.split(".")[0] for p in patches for c in p.get("calls", [])) or ["vllm"]):
            findings.extend(compat.check_file(tree, path, module, provider, patch["file"]))
    return findings
