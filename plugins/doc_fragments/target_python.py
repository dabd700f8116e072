# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared documentation of the option naming the venv interpreter that a module inspects."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  python:
    description:
      - Absolute path of the target venv's Python interpreter.
      - The module runs that interpreter only to read distribution metadata and package locations; it never
        imports the inspected packages.
      - Starting it runs the C(.pth) files of its site-packages and C(sitecustomize) (also with C(-I)). A run as root
        therefore first checks that no other account can change any of that - the interpreter and every link on the
        way to it, C(bin/), C(pyvenv.cfg), the directories the interpreter and its standard library are found from,
        the venv's site-packages directories (also through the C(lib64) link) with their C(.pth) files and
        C(sitecustomize), and every directory above them (owned by root, not writable by group or others; above the
        venv a root-owned sticky directory such as C(/tmp) is fine) - and otherwise fails with one line naming the
        path, its owner and mode and the fix (C(chown root), C(chmod go-w)), without running anything.
    type: path
    required: true
"""
