# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of specdec.eagle3.source_patch: resolve patch_set names to the data files shipped
under the collection's patch_sets/ directory and pass their content to the module."""

from __future__ import annotations

import os

import yaml

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

PATCH_SETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "patch_sets")
SUPPORTED_FORMATS = (1,)


def load_set(path):
    try:
        with open(path, "rb") as handle:
            data = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as exc:
        raise AnsibleActionFail("patch set %s cannot be read: %s" % (path, exc))
    if not isinstance(data, dict) or data.get("format") not in SUPPORTED_FORMATS:
        raise AnsibleActionFail("patch set %s: expected a mapping with 'format: 1', 'name', 'selects', 'patches' "
                                "(see patch_sets/README.md)" % path)
    if data.get("name") != os.path.basename(path)[:-4]:
        raise AnsibleActionFail("patch set %s: 'name' is %r but must equal the file name without .yml"
                                % (path, data.get("name")))
    return data


def available(directory=PATCH_SETS_DIR):
    return sorted(f[:-4] for f in os.listdir(directory) if f.endswith(".yml"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("python", "patch_set", "patches", "state", "backup"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        name = args.get("patch_set")
        if name:
            names = available()
            if name == "auto":
                args["patch_sets"] = [load_set(os.path.join(PATCH_SETS_DIR, n + ".yml")) for n in names]
            elif name in names:
                args["patch_sets"] = [load_set(os.path.join(PATCH_SETS_DIR, name + ".yml"))]
            else:
                raise AnsibleActionFail("patch_set '%s' is not shipped with specdec.eagle3 (%s has: %s, or 'auto')"
                                        % (name, PATCH_SETS_DIR, ", ".join(names)))
        result.update(self._execute_module(module_name="specdec.eagle3.source_patch", module_args=args,
                                           task_vars=task_vars))
        return result
