#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: wheelhouse
short_description: Check a directory of wheels against its SHA256SUMS before anything is installed from it
version_added: 0.1.0
description:
  - Checks the wheelhouse O(path) on the managed host, the only source of every pip and uv install of the stack on a
    host without network (the ml_venv role's C(specdec_wheelhouse)), and fails with one line naming the file or the
    digest, O(label) and what to do at the first problem.
  - O(path) must be an absolute path of an existing directory holding C(SHA256SUMS) in C(sha256sum)'s format
    (C(<64 hex digits>  <file name>) per line). Every C(*.whl) in the directory must be listed there, every listed
    file must be present, and the sha256 of each must be the listed one.
  - A run as root also refuses a directory, a C(SHA256SUMS) or a wheel that another account can change (owned by
    another user, writable by group or others, or a symbolic link), by the collection's rule for what root installs
    (the M(specdec.eagle3.safe_path) module's).
author:
  - specdec developers (!UNKNOWN)
extends_documentation_fragment:
  - specdec.eagle3.read_only
options:
  path:
    description: Absolute path of the wheelhouse on the managed host.
    type: path
    required: true
  label:
    description: The setting that names O(path), for the message.
    type: str
    default: specdec_wheelhouse
notes:
  - Every wheel is read in full at every run (a CUDA build of torch is several GB).
seealso:
  - module: specdec.eagle3.safe_path
"""

EXAMPLES = r"""
- name: Check the wheelhouse before anything is installed from it
  specdec.eagle3.wheelhouse:
    path: /srv/wheelhouse
    label: specdec_wheelhouse
"""

RETURN = r"""
wheels:
  description: The wheels of the wheelhouse, each checked against its sha256.
  returned: success
  type: list
  elements: str
  sample: [uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl]
"""

import hashlib
import os
import re
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.safe_paths import exposure

SUMS = "SHA256SUMS"
LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


class Refusal(Exception):
    """The one line that says what is wrong with the wheelhouse and what to do."""


def read_sums(folder, label):
    """{file name: sha256} from FOLDER/SHA256SUMS."""
    sums_path = os.path.join(folder, SUMS)
    if not os.path.isfile(sums_path):
        raise Refusal("%s has no %s (%s): write it there with `cd %s && sha256sum *.whl > %s`, after checking the "
                      "wheels, then run again" % (folder, SUMS, label, folder, SUMS))
    listed = {}
    with open(sums_path, "r", encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.rstrip("\n")
            if not line.strip():
                continue
            found = LINE.match(line)
            if not found or "/" in found.group(2):
                raise Refusal("line %d of %s is %r, not `<sha256>  <file name>` for a file of %s (%s): write it with "
                              "sha256sum in that directory" % (number, sums_path, line[:120], folder, label))
            listed[found.group(2)] = found.group(1).lower()
    return listed


def sha256_of(path):
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def exposed(path, label, folder):
    """Refuse PATH when another account can change it (root runs only)."""
    found = exposure(path)
    if found:
        raise Refusal("%s is %s, and this run is root: %s %s, so another account could change what root installs. "
                      "%s, then run again" % (label, folder, found[0], found[1], found[2][0].upper() + found[2][1:]))


def check(folder, label):
    """The names of the wheels of FOLDER, each checked; raises Refusal at the first problem."""
    if not os.path.isabs(folder):
        raise Refusal("%s is '%s'; expected the absolute path of a directory of wheels with their %s, or '' for none"
                      % (label, folder, SUMS))
    if not os.path.isdir(folder):
        raise Refusal("%s is %s, which is not an existing directory: put the wheels and their %s there, or set %s "
                      "to '' to install from the package indexes" % (label, folder, SUMS, label))
    exposed(folder, label, folder)
    listed = read_sums(folder, label)
    sums_path = os.path.join(folder, SUMS)
    exposed(sums_path, label, folder)
    wheels = sorted(name for name in os.listdir(folder) if name.endswith(".whl"))
    unlisted = [name for name in wheels if name not in listed]
    if unlisted:
        raise Refusal("wheel %s in %s is not listed in %s (%s%s): add its line (cd %s && sha256sum %s >> %s) once "
                      "you trust it, or remove the wheel" % (unlisted[0], folder, sums_path, label,
                                                             "; %d more unlisted" % (len(unlisted) - 1)
                                                             if len(unlisted) > 1 else "", folder, unlisted[0], SUMS))
    missing = sorted(name for name in listed if not os.path.lexists(os.path.join(folder, name)))
    if missing:
        raise Refusal("%s lists %s, which is missing from %s (%s%s): put that file there or remove its line"
                      % (sums_path, missing[0], folder, label,
                         "; %d more missing" % (len(missing) - 1) if len(missing) > 1 else ""))
    for name in sorted(listed):
        path = os.path.join(folder, name)
        exposed(path, label, folder)
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise Refusal("%s in %s is not a regular file (%s): put the file itself there" % (name, folder, label))
        actual = sha256_of(path)
        if actual != listed[name]:
            raise Refusal("wheel %s in %s does not match its sha256 in %s (listed %s, the file has %s; %s): replace "
                          "it with the file that was listed, or fix the line if this file is the one you trust"
                          % (name, folder, sums_path, listed[name], actual, label))
    return wheels


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            label=dict(type="str", default="specdec_wheelhouse"),
        ),
        supports_check_mode=True,
    )
    try:
        wheels = check(module.params["path"], module.params["label"])
    except Refusal as exc:
        module.fail_json(msg=str(exc) + ".")
    except OSError as exc:
        module.fail_json(msg="%s is %s, which cannot be read: %s: %s" % (module.params["label"], module.params["path"],
                                                                         exc.filename, exc.strerror))
    module.exit_json(changed=False, wheels=wheels)


if __name__ == "__main__":
    main()
