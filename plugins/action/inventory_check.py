# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""specdec.eagle3.inventory_check: every setting an inventory gives one host, checked on the controller against
what the collection's roles declare (plugins/plugin_utils/spec_rules.py); nothing on the host is touched or
contacted."""

from __future__ import annotations

import importlib.util
import json
import os

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.specdec.eagle3.plugins.plugin_utils.spec_rules import (
    Declarations,
    inventory_problems,
    placeholders,
)

ROLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")
# Connection settings: a placeholder in one of them would make every later check fail to connect.
CONNECTION = ("ansible_host", "ansible_user", "ansible_port", "ansible_connection", "ansible_python_interpreter",
              "ansible_ssh_private_key_file", "ansible_become_user", "ansible_become_password")
# The pipeline's rule for a user's server arguments, one home (loaded by path: it imports nothing of its package).
SERVER_ARGS_RULE = os.path.join(ROLES_DIR, "eagle3_pipeline", "files", "specdec_pipeline", "server_args.py")
# The evaluate stage's server arguments, checked here before anything is installed (the pipeline's own
# eagle3_pipeline_server_args reach the same rule through the pipeline's configuration check).
EVALUATE_SERVER_ARGS = "eagle3_evaluate_server_args"
# Ansible's own variables (not the inventory's settings).
MAGIC = frozenset(("hostvars", "groups", "group_names", "inventory_hostname", "inventory_hostname_short", "inventory_dir",
                   "inventory_file", "omit", "play_hosts", "playbook_dir", "role_name", "role_names", "role_path",
                   "environment", "vars"))


def _server_args_rule():
    spec = importlib.util.spec_from_file_location("specdec_server_args", SERVER_ARGS_RULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def server_args_problem(values):
    """One line when eagle3_evaluate_server_args sets what the collection sets itself (server_args.owned_arg)."""
    args = values.get(EVALUATE_SERVER_ARGS)
    args = [args] if isinstance(args, str) else args
    if not isinstance(args, list):  # its argument spec (a list) has its own line
        return None
    owned = _server_args_rule().owned_arg(args)
    if owned is None:
        return None
    return ("%s is %s; %r sets where the server listens or its key, which the collection sets itself (--host, "
            "--port, --uds and --api-key, abbreviated or not: loopback only, a free port, a fresh key per server) - "
            "remove it." % (EVALUATE_SERVER_ARGS, json.dumps(args), owned))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("track",))

    def _template(self, raw):
        """The templated value, or None where it needs what is not known yet (facts before gathering)."""
        try:
            return self._templar.template(raw)
        except (AnsibleError, TypeError, ValueError):  # checked again where the role runs, with its facts
            return None

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        decl = Declarations(ROLES_DIR)
        names = [n for n in task_vars if n not in MAGIC and (not n.startswith(("ansible_", "_")) or n in CONNECTION)]
        raw = {n: task_vars[n] for n in names}
        unset = placeholders(raw)
        values = {}
        for name in names:
            if name in decl.settings and name not in unset:
                value = self._template(raw[name])
                if value is not None:
                    values[name] = value
        track = self._task.args.get("track", values.get("specdec_track"))
        track = self._template(track) if track is not None else None
        problems = inventory_problems([n for n in names if n not in CONNECTION], values, unset, decl,
                                      track if isinstance(track, str) else None)
        owned = server_args_problem(values)
        if owned:
            problems.append(owned)
        result.update(changed=False, problems=problems, connection_unset=[n for n in unset if n in CONNECTION])
        return result
