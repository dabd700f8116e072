# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Apply, assert and revert exact-text source patches (data format: patch_sets/README.md).

Every hunk of every needed patch applies together or none does: all files are read and checked first,
and nothing is written when any of them drifted.  A write goes temp file in the same directory -> compile ->
optional backup -> atomic rename, keeping owner and mode, under a lock on the directory.  Need is decided by
the conditions module against the installed code.
"""

from __future__ import annotations

import difflib
import fcntl
import os
import shutil
import tempfile
import time

from ansible_collections.specdec.eagle3.plugins.module_utils import conditions as cond_mod
from ansible_collections.specdec.eagle3.plugins.module_utils import compat
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
        if not isinstance(patch["hunks"], list):
            raise PatchError("%s: 'hunks' must be a list of {before, after}" % where)
        for hidx, hunk in enumerate(patch["hunks"]):
            if not isinstance(hunk, dict) or not isinstance(hunk.get("before"), str) or \
                    not isinstance(hunk.get("after"), str) or not hunk["before"] or hunk["before"] == hunk["after"]:
                raise PatchError("%s hunk %d: needs non-empty string 'before' and a different string 'after'"
                                 % (where, hidx + 1))
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
    """'applied', 'pending' (before found once) or 'drifted' for one hunk."""
    before, after = hunk["before"], hunk["after"]
    n_after = text.count(after)
    if n_after == 1 and text.count(before) == after.count(before):
        return "applied"
    if text.count(before) == 1 and (n_after == 0 or after.count(before) > 0):
        return "pending"
    return "drifted"


class Result(dict):
    pass


def _lock_dir(path):
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    deadline = time.time() + 120
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except (IOError, OSError):
            if time.time() > deadline:
                os.close(fd)
                raise PatchError("%s: another run holds the patch lock on %s for over 120 s"
                                 % (path, os.path.dirname(path)))
            time.sleep(0.2)


def atomic_write(path, new_text, backup):
    """temp file in the same dir -> compile -> optional backup -> rename; owner and mode kept."""
    st = os.stat(path)
    try:
        compile(new_text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PatchError("%s: the patched text does not compile (%s, line %s); nothing was written"
                         % (path, exc.msg, exc.lineno))
    if not os.access(os.path.dirname(path) or ".", os.W_OK) or not os.access(path, os.W_OK):
        raise PatchError("%s is not writable by this user (mode %o, owner uid %d): run the task as the venv's "
                         "owner (become) or fix the permissions; nothing was written"
                         % (path, st.st_mode & 0o7777, st.st_uid))
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=os.path.dirname(path))
    backup_file = None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(new_text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except OSError:
            pass
        with open(tmp, "rb") as handle:
            compile(handle.read(), path, "exec", dont_inherit=True)
        if backup:
            backup_file = "%s.%s~" % (path, time.strftime("%Y-%m-%d@%H:%M:%S"))
            shutil.copy2(path, backup_file)
        os.rename(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return backup_file


def run(patches, env, tree, state, check_mode=False, diff_mode=False, backup=False, origin="patches"):
    """Bring every patch to ``state``.  Returns dict(results, changed, diff, backups, failed, msg)."""
    validate_patches(patches, origin)
    versions = env.versions()
    vtext = ", ".join("%s %s" % kv for kv in sorted(versions.items())) or "no distributions found"
    results, diffs, backups = [], [], []
    by_file = {}
    for patch in patches:
        path = env.file_of(patch["distribution"], patch["file"])
        by_file.setdefault(path, []).append(patch)
    failures = []
    writes = []
    lockfds = {}  # directory -> fd: one lock per directory, held until every write is done
    try:
        _check_files(by_file, env, tree, state, check_mode, vtext, results, failures, writes, lockfds)
        for path, original, text in writes:
            if diff_mode:
                diffs.append({"before_header": path, "after_header": path, "before": original, "after": text})
            if failures:
                continue
            if not check_mode:
                b = atomic_write(path, text, backup)
                if b:
                    backups.append(b)
    finally:
        for fd in lockfds.values():
            os.close(fd)
    if failures:
        for entry in results:
            if entry["state"] in ("applied", "reverted") and entry.get("written", True):
                entry["written"] = False
                entry["reason"] = "not written: another patched file of this set drifted; " + entry["reason"]
    changed = any(r["state"] in ("applied", "reverted") and r.get("written", True) for r in results)
    return _finish(patches, env, tree, state, results, changed, diffs, backups, versions, vtext, failures)


def _check_files(by_file, env, tree, state, check_mode, vtext, results, failures, writes, lockfds):
    """Decide every patch of every file; queue (path, original, new text) writes; collect drift failures."""
    for path, plist in by_file.items():
        if not os.path.isfile(path):
            raise PatchError("%s (file '%s' of %s %s, patch '%s') does not exist: the installed release has a "
                             "different layout; use the patch set for that release"
                             % (path, plist[0]["file"], plist[0]["distribution"],
                                env.version(plist[0]["distribution"]), plist[0]["id"]))
        if not check_mode and state in ("present", "absent") and os.path.dirname(path) not in lockfds:
            lockfds[os.path.dirname(path)] = _lock_dir(path)
        with open(path, "rb") as handle:
            original = handle.read().decode("utf-8")
        text = original
        file_results = []
        drift = []
        for patch in plist:
            states = [hunk_state(text, h) for h in patch["hunks"]]
            base = {"id": patch["id"], "file": path, "description": patch.get("description", "")}
            if state == "absent":
                if all(s == "applied" for s in states):
                    for hunk in patch["hunks"]:
                        text = text.replace(hunk["after"], hunk["before"], 1)
                    file_results.append(dict(base, state="reverted", reason="patched text restored"))
                elif all(s == "pending" for s in states):
                    file_results.append(dict(base, state="not_needed", reason="not applied"))
                else:
                    drift.append((patch, states))
                continue
            try:
                needed, reasons = cond_mod.evaluate_all(patch.get("when"), tree, env)
            except ProbeError as exc:
                raise PatchError(
                    ("patch '%s' (%s, %s): its condition cannot be evaluated against the installed code: %s. "
                     "Installed: %s. The upstream API moved; this patch set does not support this release -- "
                     "pin a supported vLLM or add a patch set for it. "
                     % (patch["id"], patch["file"], patch["distribution"], exc, vtext)) + WAY_FORWARD)
            reason = "; ".join(reasons)
            if not needed:
                file_results.append(dict(base, state="not_needed", reason=reason,
                                         text_applied=all(s == "applied" for s in states)))
                continue
            if all(s == "applied" for s in states):
                file_results.append(dict(base, state="already_applied", reason=reason))
            elif all(s in ("pending", "applied") for s in states):
                if state == "asserted":
                    file_results.append(dict(base, state="drifted", reason="needed but not applied: " + reason,
                                             pending=True))
                    continue
                for hunk, hstate in zip(patch["hunks"], states):
                    if hstate == "pending":
                        text = text.replace(hunk["before"], hunk["after"], 1)
                file_results.append(dict(base, state="applied", reason=reason))
            else:
                drift.append((patch, states))
        if drift:
            msgs = []
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
                results.append({"id": patch["id"], "file": path, "state": "drifted",
                                "reason": "anchor not found and patched text absent"})
            failures.append(
                "\n".join(msgs) + "\nNothing was written to %s. The installed file differs from the release "
                "this patch set was written for: reinstall that release, or use/add a patch set that matches "
                "the installed one." % path)
            for entry in file_results:
                if entry["state"] == "applied":
                    entry["written"] = False
                    entry["reason"] = "not written: another patch of this file drifted; " + entry["reason"]
            results.extend(file_results)
            continue
        results.extend(file_results)
        if text != original:
            writes.append((path, original, text))


def _finish(patches, env, tree, state, results, changed, diffs, backups, versions, vtext, failures):
    out = {"results": results, "changed": changed, "diff": diffs, "backups": backups, "versions": versions}
    if failures:
        out["failed"] = True
        out["msg"] = "\n\n".join(failures) + "\n\nNo file of this patch set was written."
        return out
    if state == "asserted":
        pending = [r for r in results if r["state"] == "drifted"]
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
