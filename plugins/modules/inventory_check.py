#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: inventory_check
short_description: Check every setting an inventory gives a host against what the collection's roles declare
version_added: "0.2.0"
description:
  - Runs on the controller only (an action plugin); it neither contacts nor changes the host, so it can run before
    facts are gathered.
  - Returns one line per problem in RV(problems), never fails by itself; the validate play reports every problem of
    a host at once.
  - "Checks: settings still holding the samples' C(SET-ME) placeholder; variables with a prefix of the collection's roles
    (C(specdec_), C(eagle3_pipeline_), C(vllm_), ...) or one letter or two from a declared setting that no role declares,
    with the nearest declared name; settings of another track than C(specdec_track) (a description that starts with
    C(Current track -) or C(Patched track -)); each value against its role's argument spec (type, choices, element type)
    and the range its description declares (C(Range [1, inf\\).), interval notation)."
  - A value that cannot be templated yet (it needs facts) is left to the role that uses it.
author:
  - specdec developers (!UNKNOWN)
options:
  track:
    description: The track to check track-specific settings against. Defaults to the host's C(specdec_track).
    type: str
attributes:
  check_mode:
    support: full
    description: Reads variables only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    description: Reading never changes anything; the result's C(changed) is always false.
  action:
    support: full
    description: Runs on the controller as an action plugin; no module is sent to the host.
notes:
  - The declarations are read from the collection's own C(roles/*/meta/argument_specs.yml); the names the roles use
    internally (their C(vars/) files, registered results and facts) are not reported as unknown.
seealso:
  - name: The preflight role
    description: Runs this check first in the validate play, before facts are gathered.
    link: https://example.invalid/specdec/eagle3/README.md
"""

EXAMPLES = r"""
- name: Check the inventory's settings before anything connects to the host
  specdec.eagle3.inventory_check:
  register: settings_check
"""

RETURN = r"""
problems:
  description: One line per problem, empty when the settings are all right.
  returned: always
  type: list
  elements: str
  sample: ["eagle3_pipeline_epoch is not a setting of specdec.eagle3; did you mean eagle3_pipeline_epochs?"]
connection_unset:
  description: Connection settings (C(ansible_host), C(ansible_user), ...) that still hold C(SET-ME).
  returned: always
  type: list
  elements: str
  sample: [ansible_host]
"""
