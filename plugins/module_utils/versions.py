# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PEP 440 version ordering and specifier matching without the ``packaging`` library.

Covers release segments, pre-releases (a/b/rc), post-releases, dev-releases and local labels (ignored for
ordering), e.g. ``0.16.0rc2.dev344+gea5f903f8`` sorts after ``0.16.0rc1`` and before ``0.16.0``.
"""

from __future__ import annotations

import re

_VERSION = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:(?:-(?P<post_n1>\d+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*)))?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
    re.IGNORECASE,
)
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")
_SPEC = re.compile(r"^\s*(===|==|!=|~=|>=|<=|>|<)\s*(\S+)\s*$")


class VersionError(ValueError):
    pass


def version_key(text):
    """Sort key for a PEP 440 version string; raises VersionError when it is not one."""
    match = _VERSION.match(str(text))
    if not match:
        raise VersionError("'%s' is not a PEP 440 version" % text)
    release = tuple(int(x) for x in match.group("release").split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    epoch = int(match.group("epoch") or 0)
    if match.group("pre_l"):
        pre = (_PRE_ORDER[match.group("pre_l").lower()], int(match.group("pre_n") or 0))
    elif match.group("dev_l") and not (match.group("post_l") or match.group("post_n1")):
        pre = (-1, 0)  # X.Y.devN sorts before X.Y's pre-releases
    else:
        pre = (_INF, 0)
    if match.group("post_n1"):
        post = int(match.group("post_n1"))
    elif match.group("post_l"):
        post = int(match.group("post_n2") or 0)
    else:
        post = -1
    dev = int(match.group("dev_n") or 0) if match.group("dev_l") else _INF
    return (epoch, release, pre, post, dev)


def compare(left, right):
    a, b = version_key(left), version_key(right)
    return (a > b) - (a < b)


def _release(text):
    return version_key(text)[1]


def matches(version, spec):
    """True when ``version`` satisfies every comma-separated clause of ``spec`` (e.g. ``>=0.12,<0.17``)."""
    for clause in [c for c in str(spec).split(",") if c.strip()]:
        match = _SPEC.match(clause)
        if not match:
            raise VersionError("'%s' is not a version clause (use ==, !=, >=, <=, >, <, ~=)" % clause.strip())
        op, ref = match.groups()
        if op in ("==", "!=") and ref.endswith(".*"):
            prefix = tuple(int(x) for x in ref[:-2].split("."))
            got = version_key(version)[1] + (0,) * len(prefix)
            ok = got[: len(prefix)] == prefix
            if (op == "==") != ok:
                return False
            continue
        cmp = compare(version, ref)
        if op == "===":
            ok = str(version).strip() == ref
        elif op == "==":
            ok = cmp == 0
        elif op == "!=":
            ok = cmp != 0
        elif op == ">=":
            ok = cmp >= 0
        elif op == "<=":
            ok = cmp <= 0
        elif op == ">":
            ok = cmp > 0
        elif op == "<":
            ok = cmp < 0
        else:  # ~=
            parts = ref.split(".")
            if len(parts) < 2:
                raise VersionError("'~=%s' needs at least two release segments" % ref)
            upper = parts[:-1]
            upper[-1] = str(int(re.match(r"\d+", upper[-1]).group(0)) + 1)
            ok = cmp >= 0 and compare(version, ".".join(upper) + ".dev0") < 0
        if not ok:
            return False
    return True
