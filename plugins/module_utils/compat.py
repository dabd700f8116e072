# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Static compatibility of a client package's calls with an installed provider package (e.g. speculators
against vLLM): every name the client imports from the provider must exist there, and every call to those
names must bind to the provider's signature.  Built on ast_probe; nothing is imported.
"""

from __future__ import annotations

import ast
import os

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import ProbeError


class Finding(object):
    __slots__ = ("symbol", "site", "state", "why")

    def __init__(self, symbol, site, state, why):
        self.symbol = symbol
        self.site = site
        self.state = state  # ok | broken | unknown
        self.why = why

    def as_dict(self):
        return {"symbol": self.symbol, "site": self.site, "state": self.state, "why": self.why}


def _module_name(root, path):
    rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return rel[:-9] if rel.endswith(".__init__") else rel


def _absolute(module, is_pkg, level, target):
    if not level:
        return target
    pkg = module if is_pkg else module.rpartition(".")[0]
    for _level in range(level - 1):
        pkg = pkg.rpartition(".")[0]
    return pkg + ("." + target if target else "")


def check_file(tree, path, module, provider, label=None):
    """Findings for one client file: imports from ``provider`` and calls to the imported names."""
    label = label or path
    with open(path, "rb") as handle:
        source = ast.parse(handle.read(), filename=path)
    findings = []
    bound = {}  # local name -> (target, Found)
    is_pkg = os.path.basename(path) == "__init__.py"
    for node in ast.walk(source):
        if isinstance(node, ast.ImportFrom):
            src = _absolute(module, is_pkg, node.level, node.module or "")
            if src != provider and not src.startswith(provider + "."):
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                symbol = "%s:%s" % (src, alias.name)
                site = "%s:%d" % (label, node.lineno)
                try:
                    found = tree.resolve(symbol)
                except ProbeError as exc:
                    findings.append(Finding(symbol, site, "broken", "import fails: %s" % exc))
                    continue
                bound[alias.asname or alias.name] = (symbol, found)
                findings.append(Finding(symbol, site, "ok", "import resolves to %s" % found.where))
    for node in ast.walk(source):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name, attr = None, None
        if isinstance(func, ast.Name):
            name = func.id
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in bound:
            name, attr = func.value.id, func.attr
        if name not in bound:
            continue
        symbol, found = bound[name]
        site = "%s:%d" % (label, node.lineno)
        try:
            target = tree.member(found, attr) if attr else found
            sig = tree.call_signature(target)
        except ProbeError as exc:
            findings.append(Finding(symbol + ("." + attr if attr else ""), site, "broken", str(exc)))
            continue
        shown = symbol + ("." + attr if attr else "") + "(...)"
        if sig is None:
            findings.append(Finding(shown, site, "unknown", "signature not readable statically"))
            continue
        if attr and isinstance(found.node, ast.ClassDef) and sig.params and sig.params[0].name in ("cls", "self"):
            sig.params = sig.params[1:]
        n_pos = sum(1 for a in node.args if not isinstance(a, ast.Starred))
        star_args = any(isinstance(a, ast.Starred) for a in node.args)
        keywords = [k.arg for k in node.keywords if k.arg is not None]
        star_kwargs = any(k.arg is None for k in node.keywords)
        problems = sig.bind(n_pos, keywords, star_args, star_kwargs)
        if problems:
            findings.append(Finding(shown, site, "broken", "; ".join(problems) + " (signature at %s)" % sig.origin))
        else:
            findings.append(Finding(shown, site, "ok", "binds to %s" % sig.origin))
    return findings


def check_package(tree, client_dir, provider, subdirs=None, label_root=None):
    """Check every .py file under ``client_dir`` (or only its ``subdirs``)."""
    root = os.path.dirname(client_dir.rstrip(os.sep))
    label_root = label_root or root
    dirs = [os.path.join(client_dir, s) for s in subdirs] if subdirs else [client_dir]
    findings = []
    for top in dirs:
        if os.path.isfile(top):
            findings.extend(check_file(tree, top, _module_name(root, top), provider, os.path.relpath(top, label_root)))
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for fname in sorted(filenames):
                if not fname.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fname)
                findings.extend(check_file(tree, path, _module_name(root, path), provider,
                                           os.path.relpath(path, label_root)))
    return findings


def summary(findings):
    broken = [f for f in findings if f.state == "broken"]
    ok = [f for f in findings if f.state == "ok"]
    unknown = [f for f in findings if f.state == "unknown"]
    if broken:
        return "%d broken, %d ok, %d not statically checkable: %s" % (
            len(broken), len(ok), len(unknown), "; ".join("%s at %s" % (f.symbol, f.site) for f in broken))
    return "clean: %d imports/calls bind, %d not statically checkable" % (len(ok), len(unknown))
