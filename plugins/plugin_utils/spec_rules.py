# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's settings as its roles declare them, and what is wrong with an inventory's values.

Every setting is declared once, in its role's ``meta/argument_specs.yml`` (type, choices, default, description).
Two facts more live in the description, written for the reader and read here:
- a range, as the sentence ``Range [1, inf).`` (interval notation: ``[`` and ``]`` include the bound, ``(`` and
  ``)`` exclude it, ``inf`` has no bound);
- a setting only one track reads starts its description with ``Current track - `` (or ``Patched track - ``).
A number that null turns off and that has a default is declared ``type: raw`` with its range: Ansible's ``float``
refuses null once the spec names a default, so the range check here also refuses anything but null or a number.
``inventory_problems`` checks the values an inventory sets against all of it and returns one line per problem.
"""

from __future__ import annotations

import difflib
import glob
import math
import os
import re

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

RANGE = re.compile(r"Range ([\[(])\s*(-inf|-?[0-9][0-9.e+-]*)\s*,\s*(inf|-?[0-9][0-9.e+-]*)\s*([\])])")
TRACK = re.compile(r"^([A-Za-z]+) track - ")
PLACEHOLDER = "SET-ME"


def _bound(value):
    return "inf" if value == math.inf else "-inf" if value == -math.inf else "%g" % value


def _number_like(value):
    """A number, or text that reads as one (-e key=value passes text)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        return math.isfinite(float(value)) if isinstance(value, str) else False
    except ValueError:
        return False


def _description(spec):
    desc = spec.get("description") or ""
    return " ".join(desc) if isinstance(desc, list) else str(desc)


class Setting:
    """One declared setting: its role, argument spec and what its description declares."""

    def __init__(self, role, name, spec):
        self.role = role
        self.name = name
        self.spec = spec
        desc = " ".join(_description(spec).split())
        found = RANGE.search(desc)
        self.range = None
        if found:
            low, high = found.group(2), found.group(3)
            self.range = (found.group(1), -math.inf if low == "-inf" else float(low),
                          math.inf if high == "inf" else float(high), found.group(4))
        track = TRACK.match(desc)
        self.track = track.group(1).lower() if track else None

    def nullable_number(self):
        """A number that null turns off: declared ``type: raw`` with a range (Ansible's ``float`` refuses null once
        the spec has a default)."""
        return self.spec.get("type") == "raw" and self.range is not None

    def range_text(self):
        opening, low, high, closing = self.range
        return "%s%s, %s%s" % (opening, _bound(low), _bound(high), closing)

    def out_of_range(self, value):
        """Whether VALUE (a number, or each number of a list) lies outside the declared range."""
        if self.range is None:
            return False
        opening, low, high, closing = self.range
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool):
                continue
            try:
                number = float(item)
            except (TypeError, ValueError):
                continue
            if number < low or number > high or (opening == "(" and number == low) or (closing == ")" and number == high):
                return True
        return False


class Declarations:
    """Every role's settings (all entry points), and the names the roles use internally (vars files, facts)."""

    def __init__(self, roles_dir):
        self.settings = {}
        self.internal = set()
        self.prefixes = {"specdec_"}
        for specs_file in sorted(glob.glob(os.path.join(roles_dir, "*", "meta", "argument_specs.yml"))):
            role = specs_file.split(os.sep)[-3]
            self.prefixes.add(role + "_")
            with open(specs_file, "rb") as handle:
                data = yaml.safe_load(handle) or {}
            for entry in (data.get("argument_specs") or {}).values():
                for name, spec in (entry.get("options") or {}).items():
                    self.settings.setdefault(name, Setting(role, name, spec))
        for vars_file in glob.glob(os.path.join(roles_dir, "*", "vars", "**", "*.yml"), recursive=True):
            with open(vars_file, "rb") as handle:
                data = yaml.safe_load(handle) or {}
            if isinstance(data, dict):
                self.internal.update(data)
        # Facts the roles set or register at run time are theirs, not the inventory's.
        for tasks_file in glob.glob(os.path.join(roles_dir, "*", "tasks", "**", "*.yml"), recursive=True):
            with open(tasks_file, "r", encoding="utf-8") as handle:
                text = handle.read()
            self.internal.update(re.findall(r"^\s*register:\s*([A-Za-z_][A-Za-z0-9_]*)", text, re.MULTILINE))
            for block in re.findall(r"set_fact:\n((?:\s{4,}.*\n)+)", text):
                self.internal.update(re.findall(r"^\s{4,6}([A-Za-z_][A-Za-z0-9_]*):", block, re.MULTILINE))

    def nearest(self, name):
        close = difflib.get_close_matches(name, list(self.settings), n=1, cutoff=0.8)
        return close[0] if close else None

    def is_ours(self, name):
        return name.startswith(tuple(self.prefixes))


def unknown_names(names, decl):
    """Names with one of the collection's prefixes (or one letter or two from a declared name) that no role declares."""
    problems = []
    for name in sorted(names):
        if name in decl.settings or name in decl.internal or name.startswith(("_", "ansible_")):
            continue
        near = decl.nearest(name)
        if decl.is_ours(name) or (near and difflib.SequenceMatcher(None, name, near).ratio() >= 0.9):
            hint = f"; did you mean {near}?" if near else "; see the roles' meta/argument_specs.yml for the settings"
            problems.append(f"{name} is not a setting of specdec.eagle3{hint}")
    return problems


def misplaced(values, decl, track):
    """Settings of another track that the inventory sets."""
    problems = []
    for name in sorted(values):
        setting = decl.settings.get(name)
        if setting and setting.track and track and setting.track != track:
            problems.append(f"{name} is a setting of the {setting.track} track, but specdec_track is {track}: remove it "
                            f"(or set specdec_track: {setting.track})")
    return problems


def invalid_values(values, decl):
    """Each value checked against its role's argument spec (type, choices, elements) and declared range."""
    problems = []
    by_role = {}
    for name, value in values.items():
        setting = decl.settings.get(name)
        if setting:
            by_role.setdefault(setting.role, {})[name] = value
    for role in sorted(by_role):
        given = dict(by_role[role])
        for name in sorted(given):
            kind = decl.settings[name].spec.get("type")
            if kind in ("list", "dict") and isinstance(given[name], str):
                example = "[2, 30, 58, 61]" if kind == "list" else '{"key": "value"}'
                problems.append(f"{name} is the text {given.pop(name)!r} (-e key=value passes text); expected a {kind}: "
                                f"pass it as JSON, e.g. -e '{{\"{name}\": {example}}}'")
        spec = {name: {k: v for k, v in decl.settings[name].spec.items() if k not in ("default", "required")}
                for name in given}
        result = ArgumentSpecValidator(spec).validate(dict(given))
        bad = set()
        for error in result.errors:
            text = " ".join(str(error).split())
            named = [n for n in given if re.search(r"\b%s\b" % re.escape(n), text)]
            bad.update(named)
            problems.append(f"{text} (role {role})" if named else f"{role}: {text}")
        for name in sorted(given):
            setting = decl.settings[name]
            value = result.validated_parameters.get(name, given[name])
            if name in bad:
                continue
            if setting.nullable_number() and value is not None and not _number_like(value):
                problems.append(f"{name} is {value!r}; expected null (off) or a number in {setting.range_text()} "
                                f"(role {role})")
            elif setting.out_of_range(value):
                problems.append(f"{name} is {value!r}; expected a value in {setting.range_text()} (role {role})")
    return problems


def placeholders(values):
    """Settings still holding the samples' SET-ME placeholder (also inside lists and mappings)."""
    def holds(value):
        if isinstance(value, str):
            return value == PLACEHOLDER
        if isinstance(value, dict):
            return any(holds(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(holds(v) for v in value)
        return False
    return sorted(name for name, value in values.items() if holds(value))


def inventory_problems(names, values, unset, decl, track):
    """All problems of one host's inventory, one line each: NAMES are every variable it sets, VALUES the templated
    values of the declared settings among them, UNSET those that still hold SET-ME."""
    problems = []
    if unset:
        problems.append(f"set {', '.join(sorted(unset))} in the inventory (the sample leaves them as SET-ME; see the "
                        "comments in its hosts.yml and group_vars)")
    problems += unknown_names(names, decl)
    problems += misplaced(values, decl, track)
    problems += invalid_values({k: v for k, v in values.items() if k not in unset}, decl)
    return problems
