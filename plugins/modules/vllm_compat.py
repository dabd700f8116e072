#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_compat
short_description: Check statically that an installed client package (speculators) still binds to the installed vLLM
version_added: 0.1.0
description:
  - Reads the client package's source installed in another Python environment (O(python)) with C(ast), collects
    every name it imports from the provider package (vLLM) and every call to those names, and checks each against
    the provider's installed source.
  - An imported name must exist at that import path (directly or through a re-export); a call must bind to the
    provider's signature (no unknown keyword, every required parameter supplied, positional count fits);
    constructor calls of dataclasses and pydantic configs must supply the required fields, C(InitVar)s included.
  - Imports nothing from either package and writes nothing; a run takes about a second, where finding the same
    breaks by loading the model costs one load per break.
author:
  - specdec developers (!UNKNOWN)
extends_documentation_fragment:
  - specdec.eagle3.read_only
  - specdec.eagle3.target_python
options:
  client:
    description: Distribution (and top-level package) whose calls are checked.
    type: str
    default: speculators
  provider:
    description: Distribution (and top-level package) the calls must bind to.
    type: str
    default: vllm
  paths:
    description:
      - Subdirectories or C(.py) files of the client package to scan, relative to the package directory
        (e.g. V(data_generation), V(train)). Empty scans the whole package.
    type: list
    elements: str
    default: []
  report_only:
    description: Return the table without failing when something is broken.
    type: bool
    default: false
notes:
  - The probes are shared with M(specdec.eagle3.source_patch) (one AST engine).
  - A call whose target signature cannot be read statically is listed with state C(unknown) and does not fail.
seealso:
  - module: specdec.eagle3.source_patch
"""

EXAMPLES = r"""
- name: Report what in speculators no longer binds to the installed vLLM
  specdec.eagle3.vllm_compat:
    python: /root/ml-env/bin/python
    report_only: true
  register: compat_before

- name: Refuse to go on while speculators' data generation does not bind to the installed vLLM
  specdec.eagle3.vllm_compat:
    python: /root/ml-env/bin/python
    paths: [data_generation, train]
"""

RETURN = r"""
findings:
  description: One row per import from, and per call into, the provider package.
  returned: always
  type: list
  elements: dict
  contains:
    symbol:
      description: Imported name as C(module:name), with C((...)) for a call.
      type: str
      sample: vllm.config:SchedulerConfig(...)
    site:
      description: Call or import site as C(file:line), the file relative to the client's import root.
      type: str
      sample: speculators/data_generation/vllm_hidden_states_generator.py:194
    state:
      description: C(ok), C(broken) or C(unknown) (not statically checkable).
      type: str
    why:
      description: Where the name resolved or the signature was read, or what does not bind.
      type: str
      sample: missing required 'is_encoder_decoder' (signature at .../vllm/config/scheduler.py:26)
broken:
  description: The rows whose state is C(broken).
  returned: always
  type: list
  elements: dict
summary:
  description: One line, C(clean ...) or the count and list of broken symbols and sites.
  returned: always
  type: str
versions:
  description: Installed versions of the client and the provider.
  returned: always
  type: dict
  sample: {speculators: 0.3.0, vllm: 0.16.0}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils import compat
from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import ProbeError, SourceTree
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import EnvError, inspect


def package_dir(env, dist):
    """Directory of an installed distribution's top-level package, or one clear error."""
    if env.version(dist) is None:
        raise EnvError("distribution '%s' is not installed in the environment of %s (Python %s): install it in "
                       "that venv, or point 'python' at the venv that has it"
                       % (dist, env.python, env.info.get("python")))
    path = (env.info.get("packages") or {}).get(dist)
    if not path or not os.path.isdir(path):
        raise EnvError("%s %s is installed in %s but its package directory '%s' was not found: reinstall it"
                       % (dist, env.version(dist), env.python, dist))
    return path


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            client=dict(type="str", default="speculators"),
            provider=dict(type="str", default="vllm"),
            paths=dict(type="list", elements="str", default=[]),
            report_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    client, provider = params["client"], params["provider"]

    def runner(argv):
        return module.run_command(argv)

    try:
        env = inspect(params["python"], {client, provider}, {client, provider}, runner)
        client_dir = package_dir(env, client)
        package_dir(env, provider)
        for rel in params["paths"]:
            if not os.path.exists(os.path.join(client_dir, rel)):
                raise EnvError("paths: '%s' is not in %s %s (%s); expected subdirectories or .py files of that "
                               "package, e.g. %s" % (rel, client, env.version(client), client_dir,
                                                     ", ".join(sorted(e for e in os.listdir(client_dir)
                                                                      if not e.startswith("_")))))
        findings = compat.check_package(SourceTree(env.roots), client_dir, provider, params["paths"] or None)
    except (EnvError, ProbeError, SyntaxError, OSError) as exc:
        module.fail_json(msg=str(exc), findings=[], broken=[])
    rows = [f.as_dict() for f in findings]
    broken = [r for r in rows if r["state"] == "broken"]
    versions = {client: env.version(client), provider: env.version(provider)}
    line = "%s %s vs %s %s: %s" % (client, versions[client], provider, versions[provider], compat.summary(findings))
    result = dict(changed=False, findings=rows, broken=broken, summary=line, versions=versions)
    if broken and not params["report_only"]:
        module.fail_json(msg="%s -- the installed %s does not bind to the installed %s. Apply the patch set "
                             "(specdec.eagle3.source_patches), pin %s to a release that works, or install a %s "
                             "release written for it" % (line, client, provider, provider, client), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
