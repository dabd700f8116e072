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
    type: path
    required: true
"""
