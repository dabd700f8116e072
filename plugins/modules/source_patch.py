#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: source_patch
short_description: Apply, assert or revert source patches of an installed Python package, decided from the installed API
version_added: 0.1.0
description:
  - Locates the files of distributions installed in another Python environment (O(python)) through that
    interpreter's distribution metadata, without importing the packages.
  - Decides for each patch whether it is needed by probing the installed code with C(ast) (parameters,
    init fields, attributes) and distribution versions, then applies, asserts or reverts exact-text hunks.
  - A patch set is one unit. Every file of the set is located, read and decided before anything is written,
    and every problem of every file is reported together - a path that resolves outside its package, a missing
    file, a file that is not UTF-8, drift (with the reason when the file is empty or has CRLF line endings), a
    patched text that does not compile, a file or directory this user cannot write, a read-only file system.
    When there is any, no file of the set is written (an interrupted earlier run is still completed first, see
    below). Check mode runs the same checks.
  - Writes are atomic and crash-safe. The new texts go to temp files C(.<name>.XXXXXXXX.tmp) beside their targets
    (fsynced), then optional backups, then a write-ahead journal C(.specdec-patch-journal.json) in the package
    directory (e.g. C(site-packages/speculators/)) naming every planned file with the sha256 of its old and new
    text, then one rename per file, then the journal is removed. Owner and mode are kept.
  - A run killed in the middle leaves every file either original or fully patched. The next run with
    O(state=present) or O(state=absent) first completes the interrupted run from its journal (roll forward), then
    removes the temp files of this pattern that kills left beside the set's files, then does its own work.
    O(state=asserted) fails while a journal names a file that is not yet written.
  - Files are patched only inside the venv's own site-packages (the real path of its interpreter's sysconfig
    purelib). A package imported from anywhere else (an editable or C(.pth) install) and a package directory that
    is a symbolic link are refused. A target that is a symbolic link is patched in place at the file it points to
    and the link is kept, as long as that file lies inside the package directory; a link (or C(..) in
    O(patches)' C(file)) that leads outside it is refused. Files are opened without following a link put in
    their place, and a staged file gets its mode and owner through its open descriptor.
  - A run as root also refuses a target with more than one hard link and a target below a directory another
    account can change (owned by a user other than root, or writable by its group or others; above
    site-packages a root-owned sticky directory such as C(/tmp) is fine), with one line naming the path and the
    fix (C(chmod go-w), C(chown root), or run the task as the venv's owner). Such a file is not read, so no
    message shows its text. These rules do not apply to other users, who can only change what they may write.
  - The journal of an interrupted run is used only when it is a regular file (not a link) owned by the user of
    this run; otherwise the run fails naming it and writes nothing.
  - Patch sets ship as data under C(patch_sets/) of the collection; the action plugin reads them on the controller.
author:
  - specdec developers (!UNKNOWN)
extends_documentation_fragment:
  - specdec.eagle3.target_python
options:
  patch_set:
    description:
      - Name of a patch set shipped with the collection (file C(patch_sets/<name>.yml)), e.g. V(speculators_0_3_0).
      - V(auto) picks the set whose C(selects) range matches the installed distribution version.
    type: str
  patches:
    description: Patch specs in the data format of C(patch_sets/README.md), instead of O(patch_set).
    type: list
    elements: dict
  patch_sets:
    description: Candidate sets for O(patch_set=auto); filled in by the action plugin, do not set.
    type: list
    elements: dict
  state:
    description:
      - V(present) applies needed patches; V(asserted) writes nothing and fails unless every needed patch is
        applied and the patched calls bind to the installed API; V(absent) restores the original text.
    type: str
    choices: [present, asserted, absent]
    default: present
  backup:
    description:
      - Keep a copy of each file before it is changed, named C(<file>.<YYYY-mm-dd@HH:MM:SS>~) beside the file
        (beside the file a symbolic link points to), or C(<file>.<stamp>.<n>~) when that name is taken. An
        existing backup is never overwritten.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description:
      - Writes nothing. Runs every check of the real run (including write access and read-only file systems)
        and fails where the real run would fail; otherwise reports what would change, including an interrupted
        run it would complete and temp files it would remove.
  diff_mode:
    support: full
    description: Returns the unified diff of each file that changes.
  idempotent:
    support: full
    description: A second run finds every needed patch C(already_applied) and changes nothing.
notes:
  - The probes and their arguments are documented in C(patch_sets/README.md).
"""

EXAMPLES = r"""
- name: Apply the speculators 0.3.0 patch set
  specdec.eagle3.source_patch:
    python: /root/ml-env/bin/python
    patch_set: speculators_0_3_0

- name: Prove the patches hold and the patched calls bind to the installed vLLM
  specdec.eagle3.source_patch:
    python: /root/ml-env/bin/python
    patch_set: auto
    state: asserted

- name: Restore the original files
  specdec.eagle3.source_patch:
    python: /root/ml-env/bin/python
    patch_set: speculators_0_3_0
    state: absent
"""

RETURN = r"""
results:
  description: One entry per patch.
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: Patch id.
      type: str
    state:
      description:
        - One of C(applied), C(already_applied), C(not_needed), C(reverted), C(drifted), C(blocked).
        - C(blocked) means the file cannot be read or written (the reason says why, e.g. outside the package, missing,
          not UTF-8, not writable, read-only file system, patched text does not compile).
      type: str
    file:
      description: Absolute path of the patched file.
      type: str
    reason:
      description: Why (the probe results that decided the need).
      type: str
patch_set:
  description: Name of the patch set used (empty when O(patches) was given).
  returned: always
  type: str
versions:
  description: Installed versions of the distributions the patches concern.
  returned: always
  type: dict
calls:
  description: With O(state=asserted), the static binding of every call from the patched files into the provider package.
  returned: when state is asserted
  type: list
  elements: dict
backups:
  description: Backup files written, each holding the text the file had just before this run changed it.
  returned: always
  type: list
  elements: str
recovered:
  description: Files that an interrupted earlier run had not yet written and this run completed from its journal
    (in check mode, would complete).
  returned: always
  type: list
  elements: str
removed_temp_files:
  description: Temp files of an interrupted run removed by this run (in check mode, that would be removed).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import PatchError, run
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import EnvError, inspect
from ansible_collections.specdec.eagle3.plugins.module_utils.versions import VersionError, matches


def select_set(sets, env):
    known = []
    for entry in sets:
        sel = entry.get("selects") or {}
        version = env.version(sel.get("distribution", ""))
        known.append("%s (%s %s)" % (entry["name"], sel.get("distribution"), sel.get("versions")))
        if version is not None and matches(version, sel.get("versions", "")):
            return entry
    dists = sorted(set((e.get("selects") or {}).get("distribution", "?") for e in sets))
    found = ", ".join("%s %s" % (d, env.version(d) or "not installed") for d in dists)
    raise PatchError("no shipped patch set matches the installed %s (interpreter %s). Known sets: %s. Name a set "
                     "with patch_set, pass patches, or install a supported release"
                     % (found, env.python, "; ".join(known)))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            patch_set=dict(type="str"),
            patches=dict(type="list", elements="dict"),
            patch_sets=dict(type="list", elements="dict"),
            state=dict(type="str", default="present", choices=["present", "asserted", "absent"]),
            backup=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("patch_set", "patches")],
        required_one_of=[("patch_set", "patches")],
        supports_check_mode=True,
    )
    params = module.params

    def runner(argv):
        return module.run_command(argv)

    try:
        name = params["patch_set"] or ""
        candidates = params["patch_sets"] or []
        dists = set(["vllm"])
        for entry in candidates:
            dists.add((entry.get("selects") or {}).get("distribution", ""))
            for p in entry.get("patches") or []:
                dists.add(p.get("distribution", ""))
        for p in params["patches"] or []:
            if isinstance(p, dict):
                dists.add(p.get("distribution", ""))
        dists.discard("")
        env = inspect(params["python"], dists, dists, runner)
        if params["patches"]:
            patches, origin = params["patches"], "patches"
        else:
            if not candidates:
                module.fail_json(msg="patch_set '%s' was not resolved to data: call the module through its action "
                                     "plugin (specdec.eagle3.source_patch), or pass patches" % name)
            chosen = select_set(candidates, env) if name == "auto" else candidates[0]
            patches, name, origin = chosen["patches"], chosen["name"], "patch set '%s'" % chosen["name"]
        tree = SourceTree(env.roots)
        out = run(patches, env, tree, params["state"], check_mode=module.check_mode, diff_mode=module._diff,
                  backup=params["backup"], origin=origin)
    except (PatchError, EnvError, VersionError) as exc:
        module.fail_json(msg=str(exc), results=[])
    except OSError as exc:
        module.fail_json(msg="source_patch: %s: %s" % (exc.filename or "file operation", exc.strerror or exc),
                         results=[])
    out["patch_set"] = name if not params["patches"] else ""
    diff = out.pop("diff")
    if module._diff:
        out["diff"] = diff
    if out.pop("failed", False):
        module.fail_json(**out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
