#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: uv_pip
short_description: Install into or remove from a Python venv with uv, failing in one line that names what to set
version_added: "0.2.0"
description:
  - Runs C(uv pip install) or C(uv pip uninstall) against the venv of O(python) with the given arguments, reading
    O(stdin) as standard input (a constraints or requirements file given as C(/dev/stdin)).
  - Reports a change when uv says it installed or removed packages. In check mode it asks uv for a dry run
    (C(--dry-run)) and reports what uv says it would change; nothing is installed or removed.
  - When uv fails, the message is one line naming the venv, the package and version range uv could not satisfy (or the
    file whose sha256 did not match, or the source it could not reach), the indexes it consulted in uv's order of
    priority with the index strategy, the find-links folders, and what to set
    (C(ml_venv_index_strategy), C(ml_venv_find_links) or pip's C(extra-index-url)). Offline with no index and
    find-links (the ml_venv role's C(specdec_wheelhouse)), it names the requirement the wheelhouse has no wheel for
    and C(specdec_wheelhouse). uv's own output is returned in RV(stderr).
  - The indexes, find-links folders and strategy are read from O(args) and from the C(UV_*) variables of the task's
    environment, as uv reads them.
author:
  - specdec developers (!UNKNOWN)
options:
  uv:
    description: The uv executable (absolute path).
    type: path
    required: true
  python:
    description: The interpreter of the venv to change (absolute path), passed to uv as C(--python).
    type: path
    required: true
  state:
    description: V(present) runs C(uv pip install), V(absent) runs C(uv pip uninstall).
    type: str
    choices: [present, absent]
    default: present
  args:
    description:
      - Arguments after C(uv pip install --python PYTHON) (requirements, C(-r FILE), C(--no-deps), index options, ...)
        or after C(uv pip uninstall --python PYTHON) (package names; one that is not installed is skipped).
    type: list
    elements: str
    required: true
  stdin:
    description: Text given to uv on standard input (for an argument C(/dev/stdin)). Empty gives none.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: uv is asked for a dry run; the result's C(changed) says whether it would install or remove anything.
  diff_mode:
    support: none
    description: uv's dry-run report is returned in RV(stderr); no diff is produced.
  idempotent:
    support: full
    description: uv changes nothing when the venv already holds what is asked for, and the module then reports no change.
notes:
  - The collection's roles pass the environment of the ml_venv role (C(ml_venv_install_env)) through the task's
    C(environment), so every call uses the same cache, certificates and index strategy.
seealso:
  - name: The ml_venv role
    description: Installs uv and decides the index strategy every uv call of the stack uses.
    link: https://example.invalid/specdec/eagle3/README.md
"""

EXAMPLES = r"""
- name: Install speculators' requirements under the venv's constraints
  specdec.eagle3.uv_pip:
    uv: /opt/specdec/tools/uv/bin/uv
    python: /opt/specdec/ml-env/bin/python
    args: [--constraint, /dev/stdin, "transformers>=4.57,<5", "datasets>=4,<5"]
    stdin: "torch==2.13.0\n"
  environment: "{{ ml_venv_install_env }}"

- name: Remove packages that break an import
  specdec.eagle3.uv_pip:
    uv: /opt/specdec/tools/uv/bin/uv
    python: /opt/specdec/ml-env/bin/python
    state: absent
    args: [torchvision, torchaudio]
"""

RETURN = r"""
cmd:
  description: The uv command that ran.
  returned: always
  type: list
  elements: str
  sample: [/opt/specdec/tools/uv/bin/uv, pip, install, --python, /opt/specdec/ml-env/bin/python, six]
stdout:
  description: uv's standard output.
  returned: always
  type: str
stderr:
  description: uv's standard error (its report of what it resolved, installed or removed, or why it failed).
  returned: always
  type: str
uv_rc:
  description: uv's exit status.
  returned: always
  type: int
  sample: 0
sources:
  description: What uv consulted, as one clause (indexes in uv's order with the strategy; find-links folders).
  returned: always
  type: str
  sample: "indexes file:///srv/mirror/simple, https://pypi.org/simple (unsafe-best-match)"
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.uv_report import changed, failure_line, sources_of


def main():
    module = AnsibleModule(
        argument_spec=dict(
            uv=dict(type="path", required=True),
            python=dict(type="path", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            args=dict(type="list", elements="str", required=True),
            stdin=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    verb = "install" if p["state"] == "present" else "uninstall"
    cmd = [p["uv"], "pip", verb, "--python", p["python"]] + (["--dry-run"] if module.check_mode else []) + p["args"]
    sources = sources_of(p["args"], os.environ)
    rc, out, err = module.run_command(cmd, data=p["stdin"] or None, binary_data=True)
    result = dict(cmd=cmd, stdout=out, stderr=err, uv_rc=rc, sources=sources.describe(), changed=False)
    if rc != 0:
        target = os.path.dirname(os.path.dirname(p["python"]))
        module.fail_json(msg=failure_line(err, target, sources), **result)
    result["changed"] = changed(err)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
