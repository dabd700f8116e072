#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: safe_path
short_description: Refuse a path root would act on that another account can change
version_added: 0.1.0
description:
  - For a run as root, walks O(path) from C(/) down with C(lstat) (links are not followed) and fails with one line
    naming the first directory another account can change - owned by a user other than root, writable by its group
    or by others, or a symbolic link - with its owner and mode and the fix (C(chown root), C(chmod go-w)).
  - A root-owned directory writable by others with the sticky bit (C(/tmp)) is accepted where the entry below it
    already exists and is root's (nobody else may rename or remove it there); it is refused where root would create
    the entry below it (another account could create it first) and where that entry is another user's.
  - O(check) says how much of O(path) is judged besides the directories above it.
  - Runs of other users change nothing and always pass; they can only change what they may write anyway.
author:
  - specdec developers (!UNKNOWN)
extends_documentation_fragment:
  - specdec.eagle3.read_only
options:
  path:
    description: Absolute path that root creates, hands over, removes or runs (it need not exist yet).
    type: path
    required: true
  label:
    description: What names O(path) in the message, e.g. V(specdec_work_dir).
    type: str
    default: path
  check:
    description:
      - V(parents) judges only the directories above O(path) - for a path root creates, hands over to another user or
        removes (O(path) itself may be anything, its owner only decides whether a sticky parent is fine).
      - V(path) also judges O(path) itself when it exists (a directory of root's).
      - V(venv) judges O(path) like V(path) and, when C(<path>/bin/python) exists, everything that interpreter runs
        when it starts, as M(specdec.eagle3.source_patch) does before it runs a venv's interpreter (the interpreter
        and each link to it, C(bin/), C(pyvenv.cfg), site-packages with its C(.pth) files; links followed and checked).
    type: str
    choices: [parents, path, venv]
    default: path
seealso:
  - module: specdec.eagle3.source_patch
"""

EXAMPLES = r"""
- name: Refuse a work directory below a directory another account can change
  specdec.eagle3.safe_path:
    path: /data/eagle3
    label: specdec_work_dir
    check: parents

- name: Refuse a venv that another account can change
  specdec.eagle3.safe_path:
    path: /opt/specdec/ml-env
    label: specdec_venv_path
    check: venv
"""

RETURN = r"""
exists:
  description: Whether O(path) exists (as an entry; a dangling link counts).
  returned: success
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import startup_exposure
from ansible_collections.specdec.eagle3.plugins.module_utils.safe_paths import exposure

RISK = {
    "parents": "swap what root creates, hands over or removes there for a link",
    "path": "swap what root creates, writes or removes there",
    "venv": "change what root runs from this venv",
}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            label=dict(type="str", default="path"),
            check=dict(type="str", default="path", choices=["parents", "path", "venv"]),
        ),
        supports_check_mode=True,
    )
    path, label, check = module.params["path"], module.params["label"], module.params["check"]
    if not os.path.isabs(path):
        module.fail_json(msg="%s is '%s'; expected an absolute path" % (label, path))
    try:
        found = exposure(path, own=check != "parents")
        python = os.path.join(path, "bin", "python")
        if not found and check == "venv" and os.path.lexists(python):
            found = startup_exposure(python)
    except OSError as exc:
        module.fail_json(msg="%s is %s, which cannot be checked: %s: %s" % (label, path, exc.filename, exc.strerror))
    if found:
        module.fail_json(msg="%s is %s, and this run is root: %s %s, so another account could %s. %s, then run again."
                         % (label, path, found[0], found[1], RISK[check], found[2][0].upper() + found[2][1:]))
    module.exit_json(changed=False, exists=os.path.lexists(path))


if __name__ == "__main__":
    main()
