# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: exit_status
short_description: How a command ended, in words, with a signal named rather than numbered
version_added: "0.1.0"
description:
  - Turns the exit status of a command (the C(rc) of a command, shell or async task) into a phrase.
  - A status of -N (a child killed by signal N) or 128+N (a shell whose child was killed by signal N) becomes
    C(was killed by SIGILL (signal 4; its shell reported status 132)) followed by what that signal usually means,
    e.g. for C(SIGILL) that the CPU lacks an instruction the program uses.
  - Any other status becomes C(exited with status N).
positional: _input
options:
  _input:
    description: The exit status.
    type: raw
    required: true
author:
  - specdec developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fail with how the run ended
  ansible.builtin.fail:
    msg: "the run {{ job.rc | specdec.eagle3.exit_status }}"
"""

RETURN = r"""
_value:
  description: The phrase, starting with C(exited with status) or C(was killed by).
  type: str
"""

from ansible_collections.specdec.eagle3.plugins.module_utils.exit_status import exit_text


class FilterModule:
    def filters(self):
        return {"exit_status": exit_text}
