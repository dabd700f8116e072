# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Static probes of installed Python packages, read with ``ast`` (nothing is imported).

A ``SourceTree`` is a list of import roots (a venv's site-packages).  It resolves a dotted module to its
file, finds a name in it (following ``from x import y`` re-exports and class bases) and reads call
signatures: a function's / method's parameters, or a class's constructor (an explicit ``__init__``, or the
init fields of a dataclass / pydantic dataclass, including ``InitVar`` fields and inherited fields).

Targets are written ``package.module:Name`` or ``package.module:Class.attribute``.
"""

from __future__ import annotations

import ast
import os

# Class decorators whose class gets a generated __init__ from its annotated fields.  ``config`` is vLLM's
# wrapper around pydantic's dataclass; ``dataclass`` covers both stdlib and pydantic dataclasses.
DATACLASS_DECORATORS = frozenset(("dataclass", "config", "dataclasses.dataclass"))
# Base classes whose subclasses get a keyword-only __init__ from their annotated fields.
FIELD_MODEL_BASES = frozenset(("BaseModel", "BaseSettings"))
# Base classes whose subclasses get an __init__ taking their annotated fields in order (msgspec).
FIELD_STRUCT_BASES = frozenset(("Struct",))
# Calls that, as a field's value, describe the field rather than give its default.
FIELD_SPECIFIERS = frozenset(("field", "Field", "PydanticField"))

MAX_HOPS = 25


class ProbeError(Exception):
    """A target cannot be resolved in the installed sources."""


class Param(object):
    __slots__ = ("name", "kind", "has_default", "default")

    # kinds: posonly, normal, kwonly, varargs, varkw
    def __init__(self, name, kind, has_default=False, default=None):
        self.name = name
        self.kind = kind
        self.has_default = has_default
        self.default = default

    def as_dict(self):
        return {"name": self.name, "kind": self.kind, "has_default": self.has_default}


class Signature(object):
    """Parameters a call must bind to (``self`` already dropped for methods and constructors)."""

    def __init__(self, params, origin):
        self.params = params
        self.origin = origin  # "file:line" of the definition

    def names(self):
        return [p.name for p in self.params if p.kind in ("posonly", "normal", "kwonly")]

    def get(self, name):
        for p in self.params:
            if p.name == name and p.kind in ("normal", "kwonly", "posonly"):
                return p
        return None

    def has_varkw(self):
        return any(p.kind == "varkw" for p in self.params)

    def has_varargs(self):
        return any(p.kind == "varargs" for p in self.params)

    def required(self):
        return [p.name for p in self.params if p.kind in ("posonly", "normal", "kwonly") and not p.has_default]

    def bind(self, n_positional, keywords, has_star_args=False, has_star_kwargs=False):
        """Return a list of problems binding a call with these arguments (empty when it binds)."""
        problems = []
        positional = [p for p in self.params if p.kind in ("posonly", "normal")]
        if n_positional > len(positional) and not self.has_varargs():
            problems.append("takes at most %d positional arguments, call passes %d" % (len(positional), n_positional))
        filled = set(p.name for p in positional[:n_positional])
        for kw in keywords:
            p = self.get(kw)
            if p is None or p.kind == "posonly":
                if not self.has_varkw():
                    problems.append("unknown keyword '%s'" % kw)
            elif kw in filled:
                problems.append("'%s' given positionally and by keyword" % kw)
            else:
                filled.add(kw)
        if not (has_star_args or has_star_kwargs):
            missing = [n for n in self.required() if n not in filled]
            if missing:
                problems.append("missing required %s" % ", ".join("'%s'" % m for m in missing))
        return problems


class Found(object):
    """A definition found in the tree: the ast node, the module it lives in and its file."""

    __slots__ = ("node", "module", "path")

    def __init__(self, node, module, path):
        self.node = node
        self.module = module
        self.path = path

    @property
    def where(self):
        return "%s:%s" % (self.path, getattr(self.node, "lineno", 0))


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return base + "." + node.attr if base else None
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return None


def _is_overload(node):
    return any(_dotted(d) in ("overload", "typing.overload") for d in getattr(node, "decorator_list", []))


def _walk_defs(body):
    """Top-level statements of a body, descending into if/try/with blocks (as Python would run them)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _walk_defs(stmt.body)
            yield from _walk_defs(stmt.orelse)
        elif isinstance(stmt, ast.Try) or stmt.__class__.__name__ == "TryStar":
            for block in (stmt.body, stmt.orelse, stmt.finalbody):
                yield from _walk_defs(block)
            for handler in stmt.handlers:
                yield from _walk_defs(handler.body)
        elif isinstance(stmt, ast.With):
            yield from _walk_defs(stmt.body)
        else:
            yield stmt


class SourceTree(object):
    """Installed sources under one or more import roots, parsed on demand and cached."""

    def __init__(self, roots):
        self.roots = [r for r in roots if r and os.path.isdir(r)]
        self._ast = {}
        self._files = {}

    # -- modules ---------------------------------------------------------------------------------
    def module_file(self, module):
        if module in self._files:
            return self._files[module]
        parts = module.split(".")
        found = None
        for root in self.roots:
            base = os.path.join(root, *parts)
            for cand in (base + ".py", os.path.join(base, "__init__.py")):
                if os.path.isfile(cand):
                    found = cand
                    break
            if found:
                break
        self._files[module] = found
        return found

    def is_package(self, module):
        path = self.module_file(module)
        return bool(path) and os.path.basename(path) == "__init__.py"

    def parse(self, path):
        tree = self._ast.get(path)
        if tree is None:
            with open(path, "rb") as handle:
                tree = ast.parse(handle.read(), filename=path)
            self._ast[path] = tree
        return tree

    def module_ast(self, module):
        path = self.module_file(module)
        if path is None:
            raise ProbeError("module '%s' is not installed (searched %s)" % (module, ", ".join(self.roots) or "nothing"))
        return self.parse(path), path

    # -- names -----------------------------------------------------------------------------------
    def _absolute(self, module, level, target):
        if not level:
            return target
        pkg = module if self.is_package(module) else module.rpartition(".")[0]
        for _level in range(level - 1):
            pkg = pkg.rpartition(".")[0]
        return pkg + ("." + target if target else "")

    def find(self, module, name, _hops=0):
        """Find ``name`` defined in (or re-exported by) ``module``.  Raises ProbeError if absent."""
        if _hops > MAX_HOPS:
            raise ProbeError("too many re-exports resolving %s:%s" % (module, name))
        tree, path = self.module_ast(module)
        hit = None
        for stmt in _walk_defs(tree.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
                if not _is_overload(stmt):
                    hit = ("def", stmt)
            elif isinstance(stmt, ast.Assign):
                if any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                    hit = ("assign", stmt)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                hit = ("assign", stmt)
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        hit = ("from", stmt, alias)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname == name:
                        hit = ("import", stmt, alias)
        if hit is None:
            for stmt in _walk_defs(tree.body):
                if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
                    src = self._absolute(module, stmt.level, stmt.module or "")
                    if self.module_file(src) is None:
                        continue
                    try:
                        return self.find(src, name, _hops + 1)
                    except ProbeError:
                        continue
            # a submodule of a package is reachable as an attribute once imported
            sub = module + "." + name
            if self.module_file(sub):
                tree2, path2 = self.module_ast(sub)
                return Found(tree2, sub, path2)
            raise ProbeError("'%s' is not defined in %s (%s)" % (name, module, path))
        if hit[0] == "from":
            stmt, alias = hit[1], hit[2]
            src = self._absolute(module, stmt.level, stmt.module or "")
            if self.module_file(src) is None:
                raise ProbeError("%s imports %s from '%s', which is not installed" % (path, alias.name, src))
            return self.find(src, alias.name, _hops + 1)
        if hit[0] == "import":
            target = hit[2].name
            tree2, path2 = self.module_ast(target)
            return Found(tree2, target, path2)
        if hit[0] == "assign":
            value = hit[1].value
            ref = _dotted(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
            if ref and ref != name:
                try:
                    return self.resolve_in_module(module, ref, _hops + 1)
                except ProbeError:
                    pass
        return Found(hit[1], module, path)

    def resolve_in_module(self, module, dotted, _hops=0):
        """Resolve a dotted expression (``Name`` or ``Name.attr``) as seen from ``module``."""
        head, _dot, rest = dotted.partition(".")
        found = self.find(module, head, _hops)
        return self.member(found, rest) if rest else found

    def member(self, found, attr_path):
        for attr in attr_path.split("."):
            node = found.node
            if isinstance(node, ast.Module):
                found = self.find(found.module, attr)
            elif isinstance(node, ast.ClassDef):
                found = self.class_member(found, attr)
            else:
                raise ProbeError("%s is not a class or module; cannot look up '%s'" % (found.where, attr))
        return found

    def class_member(self, cls, attr, _seen=None):
        seen = _seen or set()
        key = (cls.path, cls.node.lineno)
        if key in seen:
            raise ProbeError("cyclic bases at %s" % cls.where)
        seen.add(key)
        hit = None
        for stmt in _walk_defs(cls.node.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == attr:
                if not _is_overload(stmt):
                    hit = stmt
            elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
                hit = stmt
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
                hit = stmt
        if hit is not None:
            return Found(hit, cls.module, cls.path)
        for base in self.bases(cls):
            try:
                return self.class_member(base, attr, seen)
            except ProbeError:
                continue
        raise ProbeError("class %s (%s) has no attribute '%s'" % (cls.node.name, cls.where, attr))

    def _base_classes(self, cls):
        """(name, class hit or None) for each base of a class that is not object/Generic/Protocol."""
        for base in cls.node.bases:
            ref = _dotted(base)
            if not ref or ref in ("object", "Generic", "Protocol", "typing.Generic", "typing.Protocol"):
                continue
            try:
                hit = self.resolve_in_module(cls.module, ref)
            except ProbeError:
                hit = None
            yield ref, (hit if hit is not None and isinstance(hit.node, ast.ClassDef) else None)

    def bases(self, cls):
        """Resolvable base classes of a class (unresolvable ones, e.g. from uninstalled packages, skipped)."""
        return [hit for _ref, hit in self._base_classes(cls) if hit is not None]

    def unresolved_bases(self, cls):
        """Names of the bases that do not resolve to a class in the installed sources."""
        return [ref for ref, hit in self._base_classes(cls) if hit is None]

    def resolve(self, target):
        """Resolve ``pkg.module:Name.attr``."""
        module, sep, path = target.partition(":")
        if not sep or not path:
            raise ProbeError("target '%s' must look like package.module:Name or package.module:Class.attr" % target)
        head, _dot, rest = path.partition(".")
        found = self.find(module, head)
        return self.member(found, rest) if rest else found

    # -- signatures ------------------------------------------------------------------------------
    def function_signature(self, found, drop_self=None):
        node = found.node
        args = node.args
        params = []
        positional = list(getattr(args, "posonlyargs", [])) + list(args.args)
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        n_posonly = len(getattr(args, "posonlyargs", []))
        for idx, (arg, default) in enumerate(zip(positional, defaults)):
            kind = "posonly" if idx < n_posonly else "normal"
            params.append(Param(arg.arg, kind, default is not None, default))
        if args.vararg:
            params.append(Param(args.vararg.arg, "varargs"))
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            params.append(Param(arg.arg, "kwonly", default is not None, default))
        if args.kwarg:
            params.append(Param(args.kwarg.arg, "varkw"))
        if drop_self is None:
            decos = [_dotted(d) for d in node.decorator_list]
            drop_self = found.node is not None and "staticmethod" not in decos and self._is_method(found)
        if drop_self and params and params[0].kind in ("posonly", "normal"):
            params = params[1:]
        return Signature(params, found.where)

    def _is_method(self, found):
        tree = self.parse(found.path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and found.node in node.body:
                return True
            if isinstance(node, ast.ClassDef):
                for stmt in _walk_defs(node.body):
                    if stmt is found.node:
                        return True
        return False

    def is_dataclass(self, cls):
        for deco in cls.node.decorator_list:
            name = _dotted(deco) or ""
            if name in DATACLASS_DECORATORS or name.rpartition(".")[2] in DATACLASS_DECORATORS:
                return True
        return False

    def is_field_model(self, cls, _depth=0, kinds=FIELD_MODEL_BASES):
        for base in cls.node.bases:
            ref = _dotted(base) or ""
            if ref.rpartition(".")[2] in kinds:
                return True
        if _depth < MAX_HOPS:
            return any(self.is_field_model(b, _depth + 1, kinds) for b in self.bases(cls))
        return False

    def is_struct(self, cls):
        return self.is_field_model(cls, kinds=FIELD_STRUCT_BASES)

    def init_fields(self, cls, _depth=0):
        """Ordered init fields of a dataclass-like class, bases first: list of Param (kind 'normal')."""
        fields = []
        if _depth < MAX_HOPS:
            for base in reversed(self.bases(cls)):
                if self.is_dataclass(base) or self.is_field_model(base) or self.is_struct(base):
                    for p in self.init_fields(base, _depth + 1):
                        fields = [f for f in fields if f.name != p.name] + [p]
        for stmt in cls.node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = _dotted(stmt.annotation) or ""
            if ann.rpartition(".")[2] == "ClassVar":
                continue
            name = stmt.target.id
            if name.startswith("_") and self.is_field_model(cls):
                continue
            has_default, default, init = self._field_default(stmt.value)
            if not init:
                fields = [f for f in fields if f.name != name]
                continue
            fields = [f for f in fields if f.name != name] + [Param(name, "normal", has_default, default)]
        return fields

    @staticmethod
    def _field_default(value):
        """(has_default, default node, in __init__) for a field's assigned value."""
        if value is None:
            return False, None, True
        if isinstance(value, ast.Call) and (_dotted(value.func) or "").rpartition(".")[2] in FIELD_SPECIFIERS:
            init = True
            has_default = False
            default = None
            for kw in value.keywords:
                if kw.arg == "init" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                    init = False
                if kw.arg in ("default", "default_factory"):
                    has_default = True
                    default = kw.value if kw.arg == "default" else None
            name = (_dotted(value.func) or "").rpartition(".")[2]
            if name != "field" and value.args:
                first = value.args[0]
                if not (isinstance(first, ast.Constant) and first.value is Ellipsis):
                    has_default, default = True, first
            return has_default, default, init
        return True, value, True

    def init_signature(self, cls, _depth=0):
        """Constructor signature of a class, or None when it cannot be known statically."""
        own_init = None
        for stmt in _walk_defs(cls.node.body):
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__" and not _is_overload(stmt):
                own_init = stmt
        if own_init is not None:
            return self.function_signature(Found(own_init, cls.module, cls.path), drop_self=True)
        if self.is_dataclass(cls) or self.is_struct(cls):
            kw_only = any(k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                          for k in cls.node.keywords)
            kind = "kwonly" if kw_only else "normal"
            return Signature([Param(f.name, kind, f.has_default, f.default) for f in self.init_fields(cls)],
                             cls.where)
        if self.is_field_model(cls):
            fields = self.init_fields(cls)
            return Signature([Param(f.name, "kwonly", f.has_default, f.default) for f in fields], cls.where)
        if self.unresolved_bases(cls) or _depth >= MAX_HOPS:
            return None
        for base in self.bases(cls):
            sig = self.init_signature(base, _depth + 1)
            if sig is not None:
                return sig
            return None
        return Signature([], cls.where)

    def call_signature(self, found):
        """Signature a call to ``found`` binds to: constructor for classes, parameters for functions."""
        node = found.node
        if isinstance(node, ast.ClassDef):
            return self.init_signature(found)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return self.function_signature(found)
        return None

    def signature_of(self, target):
        """Signature for a ``module:Name[.attr]`` target; ``Class`` means its constructor."""
        found = self.resolve(target)
        sig = self.call_signature(found)
        if sig is None:
            raise ProbeError("the signature of %s (%s) cannot be read statically" % (target, found.where))
        return sig, found
