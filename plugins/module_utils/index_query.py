# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which versions of a package the host's package sources publish: simple indexes (PEP 503 HTML or PEP 691 JSON,
over https or file://) and find-links folders, asked the way pip and uv would on that host.

Standard library and ansible's module_utils only: runs in a module on the managed host, before anything is
installed there.
"""

from __future__ import annotations

import json
import os
import re
import sys
from html.parser import HTMLParser
from urllib.error import URLError
from urllib.parse import unquote, urljoin

from ansible.module_utils.urls import open_url

PYPI = "https://pypi.org/simple"
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.5"
FILE_VERSION = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[0-9][^-]*?)(?:-[^-]+)*?(?:\.tar\.gz|\.zip|\.whl)$")


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(dict(attrs).get("href", ""))


def _file_versions(names, package):
    found = set()
    for name in names:
        base = unquote(name.split("#", 1)[0].rsplit("/", 1)[-1])
        match = FILE_VERSION.match(base)
        if match and normalize(match.group("name")) == normalize(package):
            found.add(match.group("version"))
    return found


def pip_sources(run_command, python=None):
    """(indexes, find_links) the host's pip settings name (`pip config list`, run through RUN_COMMAND: the module's
    run_command), or ([PyPI], []) without pip."""
    try:
        _rc, out, _err = run_command([python or sys.executable, "-m", "pip", "config", "list"])
    except OSError:
        out = ""
    best = {}
    rank = {"global": 0, "user": 1, "site": 2, "env": 3, ":env:": 4}
    for line in out.splitlines():
        scope, _dot, rest = line.partition(".")
        key, _eq, value = rest.partition("=")
        key = key.strip().split(".")[-1]
        if key and rank.get(scope, 0) >= best.get(key, (-1, ""))[0]:
            best[key] = (rank.get(scope, 0), value.strip().strip("'\""))
    if best.get("no-index", (0, ""))[1].lower() in ("1", "true", "yes", "on"):
        indexes = []
    else:
        indexes = [best.get("index-url", (0, PYPI))[1]] + best.get("extra-index-url", (0, ""))[1].split()
    return indexes, best.get("find-links", (0, ""))[1].split()


def versions_on(source, package, timeout=20):
    """The versions of PACKAGE that one index or find-links folder publishes; raises OSError when it cannot be read."""
    if source.startswith("file://") or "://" not in source:
        path = source[len("file://"):] if source.startswith("file://") else source
        if os.path.isdir(os.path.join(path, normalize(package))) or os.path.isfile(os.path.join(path, "index.html")):
            page = os.path.join(path, normalize(package), "index.html")
            if not os.path.isfile(page):
                return set()
            with open(page, encoding="utf-8", errors="replace") as handle:
                parser = _Links()
                parser.feed(handle.read())
            return _file_versions(parser.links, package)
        return _file_versions(os.listdir(path), package)  # a find-links folder
    url = urljoin(source.rstrip("/") + "/", normalize(package) + "/")
    try:
        response = open_url(url, headers={"Accept": ACCEPT}, timeout=timeout)
        body = response.read().decode("utf-8", errors="replace")
        kind = response.headers.get("Content-Type", "")
    except URLError as exc:
        if getattr(exc, "code", None) == 404:
            return set()
        raise OSError(str(getattr(exc, "reason", exc))) from exc
    if "json" in kind:
        data = json.loads(body)
        if data.get("versions"):
            return set(data["versions"])
        return _file_versions([f.get("filename", "") for f in data.get("files", [])], package)
    parser = _Links()
    parser.feed(body)
    return _file_versions(parser.links, package)


def unpublished(pins, sources, timeout=20):
    """For each (variable, name, version): a problem line when no source publishes it; a note per source not read."""
    problems, notes = [], []
    unreadable = set()
    for variable, name, version in pins:
        seen, read = set(), 0
        for source in sources:
            if source in unreadable:
                continue
            try:
                seen |= versions_on(source, name, timeout)
                read += 1
            except (OSError, ValueError) as exc:
                unreadable.add(source)
                notes.append(f"could not read {source} ({exc}): whether its packages are published there was not checked")
        if version in seen or not read:
            continue
        newest = sorted(seen, key=_key)[-3:]
        problems.append(f"{variable} is {version}, but {name} {version} is published on none of "
                        f"{', '.join(s for s in sources if s not in unreadable)}"
                        + (f" (the newest there: {', '.join(newest)})" if newest else f" ({name} is not there at all)")
                        + f"; set {variable} to a published version.")
    return problems, notes


def _key(version):
    return [int(p) if p.isdigit() else -1 for p in re.split(r"[.+-]", version)]
