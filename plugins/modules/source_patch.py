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
  - All hunks of all files of a set apply together or none do (nothing is written when any file drifted);
    writes are atomic (temp file, compile check, optional backup, rename) and keep owner and mode.
  - Patch sets ship as data under C(patch_sets/) of the collection; the action plugin reads them on the controller.
author:
  - specdec.eagle3 contributors
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
    description: Keep a timestamped copy of each file before it is changed.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports what would change; writes nothing.
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
      description: One of C(applied), C(already_applied), C(not_needed), C(reverted), C(drifted).
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
  description: Backup files written.
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
    out["patch_set"] = name if not params["patches"] else ""
    diff = out.pop("diff")
    if module._diff:
        out["diff"] = diff
    if out.pop("failed", False):
        module.fail_json(**out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
