#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Read the NVIDIA GPUs of a host from nvidia-smi and check them against expectations
version_added: "0.1.0"
description:
  - Runs C(nvidia-smi --query-gpu=index,name,compute_cap,driver_version,persistence_mode,memory.total --format=csv,noheader)
    and, when asked, C(modinfo nvidia), and compares what it finds with the expected count, compute capability,
    names, minimum driver version, persistence mode and open kernel modules.
  - Fails with one sentence per mismatch. When C(nvidia-smi) is absent it fails with one sentence if
    O(require_gpu=true) and returns RV(present=false) otherwise.
  - The parsing and the checks live in the C(gpu_inventory) module_utils file, which C(roles/gpu_verify/files/gpu_check.py)
    also runs without Ansible.
  - Reads only; it never changes the host.
author:
  - specdec developers (!UNKNOWN)
options:
  require_gpu:
    description: Whether a host without C(nvidia-smi) fails (V(true)) or is reported with RV(present=false) (V(false)).
    type: bool
    default: true
  expect_count:
    description: Number of GPUs that must be listed. Omit to accept any number.
    type: int
  expect_compute_capability:
    description: Compute capability every GPU must report, e.g. V(12.0). Omit to accept any.
    type: str
  expect_names:
    description: Substrings of which every GPU name must contain one, e.g. V(RTX PRO 6000). Empty accepts any name.
    type: list
    elements: str
    default: []
  min_driver_version:
    description: Oldest acceptable driver version, e.g. V(580.65.06). Empty accepts any.
    type: str
    default: ""
  require_persistence:
    description: Whether every GPU must have persistence mode enabled.
    type: bool
    default: false
  require_open_modules:
    description: Whether the installed C(nvidia) kernel module must carry the open modules' license C(Dual MIT/GPL).
    type: bool
    default: false
  nvidia_smi:
    description: The C(nvidia-smi) executable, a name looked up on E(PATH) or an absolute path.
    type: str
    default: nvidia-smi
attributes:
  check_mode:
    support: full
    description: The module only reads, so it runs unchanged in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    description: Reading never changes the host; the result's C(changed) is always false.
notes:
  - C(compute_cap) exists in C(nvidia-smi) from driver 510 on; older drivers are reported as unreadable.
seealso:
  - name: The gpu_verify role
    description: Uses this module for the GPU preflight of the stack play.
    link: https://example.invalid/specdec/eagle3/README.md
"""

EXAMPLES = r"""
- name: Check for eight RTX PRO 6000 Blackwell GPUs on open modules
  specdec.eagle3.gpu_facts:
    expect_count: 8
    expect_compute_capability: "12.0"
    expect_names: [RTX PRO 6000]
    min_driver_version: "580.65.06"
    require_persistence: true
    require_open_modules: true
  register: gpus

- name: Read the driver version where a GPU is optional
  specdec.eagle3.gpu_facts:
    require_gpu: false
  register: maybe_gpus
"""

RETURN = r"""
present:
  description: Whether C(nvidia-smi) was found and ran.
  returned: always
  type: bool
  sample: true
gpus:
  description: One entry per GPU, in C(nvidia-smi) order.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA RTX PRO 6000 Blackwell Server Edition
      compute_capability: "12.0"
      driver_version: "580.82.07"
      persistence_mode: true
      memory_total_mib: 97887
driver_version:
  description: The driver version of the first GPU, empty without GPUs.
  returned: always
  type: str
  sample: "580.82.07"
compute_capabilities:
  description: The distinct compute capabilities found, sorted.
  returned: always
  type: list
  elements: str
  sample: ["12.0"]
module_license:
  description: License of the C(nvidia) kernel module when O(require_open_modules) is set and modinfo finds it, else null.
  returned: always
  type: str
  sample: Dual MIT/GPL
problems:
  description: One sentence per mismatch (the module fails when it is not empty).
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.specdec.eagle3.plugins.module_utils.gpu_inventory import (
    GpuInventoryError,
    as_dicts,
    check_inventory,
    query_gpus,
    query_module_license,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            require_gpu=dict(type="bool", default=True),
            expect_count=dict(type="int"),
            expect_compute_capability=dict(type="str"),
            expect_names=dict(type="list", elements="str", default=[]),
            min_driver_version=dict(type="str", default=""),
            require_persistence=dict(type="bool", default=False),
            require_open_modules=dict(type="bool", default=False),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        """The runner gpu_inventory's query functions call: argv -> (rc, stdout, stderr)."""
        return module.run_command(argv)

    result = dict(changed=False, present=False, gpus=[], driver_version="", compute_capabilities=[],
                  module_license=None, problems=[])
    try:
        gpus = query_gpus(run, p["nvidia_smi"])
    except FileNotFoundError:
        if p["require_gpu"]:
            module.fail_json(msg=f"No NVIDIA GPU can be checked: {p['nvidia_smi']} is not installed on this host; "
                                 "install the NVIDIA driver, or set specdec_require_gpu to false for a host without GPUs.",
                             **result)
        module.exit_json(**result)
    except GpuInventoryError as exc:
        module.fail_json(msg=str(exc), **result)

    result.update(present=True, gpus=as_dicts(gpus), driver_version=gpus[0].driver_version if gpus else "",
                  compute_capabilities=sorted({g.compute_capability for g in gpus}))
    license_ = None
    if p["require_open_modules"]:
        license_ = query_module_license(run)
        result["module_license"] = license_
        if license_ is None:
            license_ = ""
    try:
        problems = check_inventory(gpus, expect_count=p["expect_count"], expect_cc=p["expect_compute_capability"],
                                   expect_names=p["expect_names"], min_driver=p["min_driver_version"] or None,
                                   require_persistence=p["require_persistence"], module_license=license_)
    except GpuInventoryError as exc:
        module.fail_json(msg=str(exc), **result)
    result["problems"] = problems
    if problems:
        module.fail_json(msg=" ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
