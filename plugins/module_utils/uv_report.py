# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a `uv pip` call consulted and, when it failed, why - in one line a user can act on.

uv prints a failed resolution as a tree of causes and a hint (several lines, in uv's words); the collection's
refusals are one line naming the package, the version range, the indexes that were asked, the index strategy and
what to set.  Standard library only: the uv_pip module and the tests share it.
"""

from __future__ import annotations

import re

PYPI = "https://pypi.org/simple"
STRATEGIES = ("first-index", "unsafe-first-match", "unsafe-best-match")

# What the user can set, named once for every message.
SET_STRATEGY = "ml_venv_index_strategy"
SET_FIND_LINKS = "ml_venv_find_links"
SET_WHEELHOUSE = "specdec_wheelhouse"


class Sources:
    """The package sources of one uv call: indexes in uv's order of priority, find-links folders, the strategy."""

    def __init__(self, indexes, find_links, strategy, no_index=False, offline=False):
        self.indexes = indexes
        self.find_links = find_links
        self.strategy = strategy
        self.no_index = no_index
        self.offline = offline

    def wheelhouse(self):
        """Whether this is the ml_venv role's wheelhouse mode: offline, no index, the wheelhouse as find-links."""
        return self.offline and self.no_index and bool(self.find_links)

    def describe(self):
        """`indexes A, B (first-index); find-links C` - the sources as one clause."""
        if self.no_index:
            where = "no index (--no-index)"
        else:
            where = f"indexes {', '.join(self.indexes)} ({self.strategy})"
        if self.find_links:
            where += f"; find-links {', '.join(self.find_links)}"
        return where


def _split(value):
    return [v for v in re.split(r"[\s]+", value or "") if v]


def sources_of(args, env):
    """The sources a `uv pip install` with these arguments and environment consults.

    uv asks the extra indexes first, in the order given, and the default index (--index-url, PyPI unless set) last;
    arguments win over the environment, as in uv.
    """
    default, extras, links, strategy, no_index, offline = None, [], [], None, False, False
    pending = None
    for arg in args:
        if pending:
            name, pending = pending, None
            value = arg
        else:
            name, eq, value = arg.partition("=")
            if name in ("--index-url", "-i", "--default-index", "--extra-index-url", "--index", "--find-links", "-f",
                        "--index-strategy") and not eq:
                pending = name
                continue
        if name in ("--index-url", "-i", "--default-index"):
            default = value
        elif name in ("--extra-index-url", "--index"):
            extras.append(value)
        elif name in ("--find-links", "-f"):
            links.append(value)
        elif name == "--index-strategy":
            strategy = value
        elif name == "--no-index":
            no_index = True
        elif name == "--offline":
            offline = True
    if default is None:
        default = env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL") or PYPI
    extras = extras or _split(env.get("UV_INDEX")) + _split(env.get("UV_EXTRA_INDEX_URL"))
    links = links or _split(env.get("UV_FIND_LINKS"))
    strategy = strategy or env.get("UV_INDEX_STRATEGY") or "first-index"
    no_index = no_index or env.get("UV_NO_INDEX", "").lower() in ("1", "true", "yes", "on")
    offline = offline or env.get("UV_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    indexes = []
    for url in extras + [default]:
        if url not in indexes:
            indexes.append(url)
    return Sources(indexes, links, strategy, no_index, offline)


def _sentence(text):
    return " ".join(text.split()).rstrip(".")


def _causes(stderr):
    """uv's `error:` line and its `cause:` lines (or the tree form `╰─▶`), joined words only."""
    out = []
    for line in stderr.splitlines():
        stripped = line.strip()
        for lead in ("error:", "cause:", "Caused by:", "╰─▶", "×"):
            if stripped.startswith(lead):
                out.append(_sentence(stripped[len(lead):]))
                break
    return [c for c in out if c]


def failure_line(stderr, target, sources):
    """One line for a failed `uv pip` call into ``target`` (a venv), from uv's stderr and the call's sources."""
    text = " ".join(stderr.split())
    where = sources.describe()
    because = re.search(r"Because (.+?)(?:, we can conclude that .*?unsatisfiable)?\.(?:\s|$)", text)
    if "No solution found" in text and because:
        reason = because.group(1)
        if sources.wheelhouse():
            return _wheelhouse_line(reason, target, sources)
        hint = re.search(r"hint: `([^`]+)` was found on (\S+?), but not at the requested version \(([^)]+)\)", text)
        if hint:
            package, index, wanted = hint.groups()
            return (f"uv found no version of {package} that satisfies {wanted} for {target}: {index} lists {package} "
                    f"but not at that version, and with the first-index strategy uv asks no later index ({reason}). "
                    f"Sources: {where}. If every index is trusted, set {SET_STRATEGY}: unsafe-best-match (pip's "
                    f"behaviour); otherwise put a wheel of {package} matching {wanted} in a find-links folder "
                    f"({SET_FIND_LINKS}) or take {index} out of pip's extra-index-url.")
        return (f"uv found no set of versions to install into {target}: {reason}. Sources: {where}. None of them has "
                f"a matching version: correct the pinned version or requirement, or put a matching wheel in a "
                f"find-links folder ({SET_FIND_LINKS}).")
    hash_bad = re.search(r"Hash mismatch for `([^`]+)`.*?Expected:\s*(.+?)\s*Computed:\s*(sha256:[0-9a-f]+)", text)
    if hash_bad:
        what, expected, computed = hash_bad.groups()
        return (f"uv refused {what} for {target}: the file it got has {computed}, not the pinned {expected}. Sources: "
                f"{where}. Nothing was installed from it; check which source serves that file and the pinned sha256.")
    causes = _causes(stderr)
    if causes:
        detail = ": ".join(dict.fromkeys(causes))
        return f"uv could not install into {target}: {detail}. Sources: {where}."
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "no message")
    return f"uv could not install into {target}: {last}. Sources: {where}."


def _wheelhouse_line(reason, target, sources):
    """A resolution that failed with the wheelhouse as the only source: the requirement it lacks a wheel for."""
    folder = ", ".join(dict.fromkeys(sources.find_links))
    absent = re.search(r"(\S+) was not found in the provided package locations", reason)
    wanted = re.search(r"you require (.+?)(?:,| and |$)", reason)
    missing = absent.group(1) if absent else (wanted.group(1) if wanted else reason)
    return (f"the wheelhouse {folder} ({SET_WHEELHOUSE}) has no wheel for {missing}, which installing into {target} "
            f"needs ({reason}); nothing was installed. Add a wheel of {missing} for this host's Python and platform "
            f"to {folder} with its line in SHA256SUMS, then run again.")


CHANGED = re.compile(r"^\s*(Would )?(Installed|Uninstalled|install|uninstall) [0-9]+ packages?\b", re.MULTILINE)


def changed(stderr):
    """Whether uv's report says it installed or removed something (or, in a dry run, would)."""
    return bool(CHANGED.search(stderr or ""))
