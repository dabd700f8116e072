# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: problems
short_description: The one-line messages of the checks that failed, from their registered results
version_added: "0.2.0"
description:
  - Takes the registered results of check tasks (an C(assert), a C(fail), a looped check whose items each fail or
    pass, or a module that returns C(problems)) and returns the message of each failure, one line each, in order,
    without repeats.
  - Skipped and passed results give nothing. A failed result without a message gives the task's module error text.
  - The validate play runs its checks so that a failure does not stop the host (C(ignore_errors)); its last task
    reports what this filter returns, all at once.
positional: _input
options:
  _input:
    description: The registered results (a list; a single result is taken as a list of one).
    type: raw
    required: true
author:
  - specdec developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Report every problem the checks found
  ansible.builtin.fail:
    msg: "{{ found | join('\n') }}"
  vars:
    found: "{{ [settings_check, python_check] | specdec.eagle3.problems }}"
  when: found | length > 0
"""

RETURN = r"""
_value:
  description: One line per problem.
  type: list
  elements: str
"""


def _lines(result):
    if not isinstance(result, dict):
        return []
    out = [str(p) for p in result.get("problems") or []]
    if result.get("results") and isinstance(result["results"], list):
        for item in result["results"]:
            out += _lines(item)
        return out
    if result.get("failed"):
        msg = result.get("msg") or result.get("module_stderr") or "failed without a message"
        if result.get("argument_errors"):
            return out + [" ".join(str(e).split()) for e in result["argument_errors"]]
        out.append(" ".join(str(msg).split()))
    return out


def problems(results):
    """One line per failed check among RESULTS (registered task results), in order, each once."""
    lines = []
    for result in results if isinstance(results, list) else [results]:
        for line in _lines(result):
            if line not in lines:
                lines.append(line)
    return lines


class FilterModule:
    def filters(self):
        return {"problems": problems}
