#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: checked_copy
short_description: Copy a file into a directory of root's only when its sha256 is the pinned one, without leaking it
version_added: 0.1.0
description:
  - Copies O(src) on the managed host - a file another account may control, such as a user-given wheel - to
    O(dest) when the sha256 of the copied bytes is O(sha256), so that what is used later is a file that only root
    can change and whose content was checked.
  - O(src) is opened once without following a symbolic link in its place (a link, a FIFO or a device is refused
    with one line) and streamed into a new temp file C(.<name>.XXXXXXXX.tmp) beside O(dest), created with mode
    C(0600), so that no other account can read what root copied before it is checked (a link to a root-only file
    leaks nothing).
  - On a match the temp file gets O(mode) through its descriptor, is fsynced and renamed over O(dest) (atomic);
    on a mismatch it is removed, nothing else changes and the task fails with one line naming both hashes.
  - A run as root refuses a directory of O(dest) that another account can change (it or a directory above it is
    owned by another user or writable by group or others), naming the path, its owner and mode and the fix.
author:
  - specdec developers (!UNKNOWN)
options:
  src:
    description: Absolute path of the file to copy, on the managed host. Not followed when it is a symbolic link.
    type: path
    required: true
  dest:
    description: Absolute path of the copy; its directory must exist.
    type: path
    required: true
  sha256:
    description: The pinned sha256 of O(src) (64 hex digits, case does not matter).
    type: str
    required: true
  mode:
    description: Mode of the copy once its sha256 matched, as an octal string.
    type: str
    default: "0644"
attributes:
  check_mode:
    support: full
    description: Hashes O(src) (refusing a link or a mismatch as a real run does) and writes nothing.
  diff_mode:
    support: none
    description: The files are binary; no diff is shown.
  idempotent:
    support: full
    description:
      - A O(dest) that already holds the pinned bytes with O(mode) is left alone (C(changed=false)); O(src) is still
        hashed and must match.
notes:
  - O_NOFOLLOW guards the last component of O(src); what matters is that only the pinned bytes are ever published.
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Copy the local wheel into root's download directory when its sha256 is the pinned one
  specdec.eagle3.checked_copy:
    src: /home/alice/vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl
    dest: /opt/specdec/cache/wheels/vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl
    sha256: f066b2a2f8597a4a3ada8fbbfd122b59086864b2260ca42dc81bf9fb57af0c42
"""

RETURN = r"""
sha256:
  description: The sha256 of the bytes read from O(src).
  returned: when O(src) could be read, also on a mismatch
  type: str
  sample: f066b2a2f8597a4a3ada8fbbfd122b59086864b2260ca42dc81bf9fb57af0c42
dest:
  description: The path of the copy.
  returned: success
  type: str
reason:
  description:
    - On failure, what is wrong with O(src) as the end of a sentence that starts with its path, e.g. C(has sha256 ...),
      C(does not exist), C(is a symbolic link, which root does not follow ...).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.checked_copy import CopyError, copy


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            sha256=dict(type="str", required=True),
            mode=dict(type="str", default="0644"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        mode = int(params["mode"], 8)
        if not 0 <= mode <= 0o7777:
            raise ValueError(params["mode"])
    except ValueError:
        module.fail_json(msg="mode is '%s'; expected an octal mode such as 0644" % params["mode"],
                         reason="cannot be copied: mode '%s' is not an octal mode" % params["mode"])
    try:
        result = copy(params["src"], params["dest"], params["sha256"], mode, module.check_mode)
    except CopyError as exc:
        extra = {"sha256": exc.sha256} if exc.sha256 else {}
        module.fail_json(msg=str(exc), reason=exc.reason, **extra)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
