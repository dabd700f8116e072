#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: published
short_description: Check that the pinned package versions are published where the host will install them from
version_added: "0.2.0"
description:
  - Asks each package source of the host - the indexes and find-links folders of its pip settings (C(pip config
    list), PyPI when it has none or no pip), plus O(extra_sources) - which versions of each pinned package it
    publishes (PEP 691 JSON or PEP 503 HTML pages, over https or C(file://); file names in a find-links folder).
  - Returns one line per pin that no source publishes, naming the variable, the version and the newest versions there,
    in RV(problems); a source that cannot be read (no network) gives a note in RV(notes) and its pins are not judged.
  - Reads only; it installs and changes nothing. It fails only with O(fail_on_problems=true).
author:
  - specdec developers (!UNKNOWN)
options:
  pins:
    description: The pins to look for.
    type: list
    elements: dict
    required: true
    suboptions:
      variable:
        description: The inventory variable that sets the version (named in the problem line).
        type: str
        required: true
      name:
        description: The distribution name, e.g. V(vllm).
        type: str
        required: true
      version:
        description: The exact version.
        type: str
        required: true
  extra_sources:
    description: Indexes or folders the collection adds for these installs (e.g. a nightly vLLM index).
    type: list
    elements: str
    default: []
  only_sources:
    description:
      - The only sources to ask (e.g. the wheelhouse of a host without network, C(specdec_wheelhouse)); the host's pip
        settings and O(extra_sources) are then not consulted. Empty to ask those.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds to wait for each index.
    type: int
    default: 20
  fail_on_problems:
    description: Fail with the problem lines instead of returning them.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    description: Reading never changes the host.
seealso:
  - name: The validate play
    description: Runs this check for each track's pins before anything is installed.
    link: https://example.invalid/specdec/eagle3/README.md
"""

EXAMPLES = r"""
- name: Check that vLLM and speculators are published at the pinned versions
  specdec.eagle3.published:
    pins:
      - {variable: vllm_version, name: vllm, version: "0.16.0"}
      - {variable: speculators_version, name: speculators, version: "0.3.0"}
  register: pins_check
"""

RETURN = r"""
problems:
  description: One line per pinned version no source publishes.
  returned: always
  type: list
  elements: str
  sample: ["vllm_version is 0.99.1, but vllm 0.99.1 is published on none of https://pypi.org/simple (the newest there:
           0.32.0, 0.33.0, 0.34.0); set vllm_version to a published version."]
notes:
  description: Sources that could not be read, whose pins were therefore not judged.
  returned: always
  type: list
  elements: str
sources:
  description: The indexes and folders asked, in order.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.index_query import pip_sources, unpublished


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pins=dict(type="list", elements="dict", required=True, options=dict(
                variable=dict(type="str", required=True), name=dict(type="str", required=True),
                version=dict(type="str", required=True))),
            extra_sources=dict(type="list", elements="str", default=[]),
            only_sources=dict(type="list", elements="str", default=[]),
            timeout=dict(type="int", default=20),
            fail_on_problems=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    if module.params["only_sources"]:
        sources = list(dict.fromkeys(module.params["only_sources"]))
    else:
        indexes, links = pip_sources(module.run_command)
        sources = list(dict.fromkeys(module.params["extra_sources"] + indexes + links))
    pins = [(p["variable"], p["name"], p["version"]) for p in module.params["pins"]]
    problems, notes = unpublished(pins, sources, module.params["timeout"])
    result = dict(changed=False, problems=problems, notes=notes, sources=sources)
    if problems and module.params["fail_on_problems"]:
        module.fail_json(msg=" ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
