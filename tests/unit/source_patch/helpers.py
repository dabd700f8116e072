"""Run the source_patch engine the way the module does, against a venv's interpreter."""

from __future__ import annotations

import os
import subprocess

import yaml

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SETS = os.path.join(ROOT, "patch_sets")
STATES = {"A": "applied", "N": "not_needed"}


def load_set(name):
    with open(os.path.join(SETS, name + ".yml")) as handle:
        return yaml.safe_load(handle)


def runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def env_for(python, patches):
    dists = set(p["distribution"] for p in patches) | {"vllm"}
    return inspect(python, dists, dists, runner)


def apply(python, patches, state="present", check_mode=False, diff_mode=False, backup=False):
    env = env_for(python, patches)
    return run(patches, env, SourceTree(env.roots), state, check_mode=check_mode, diff_mode=diff_mode,
               backup=backup)


def snapshot(site):
    out = {}
    for base in ("speculators",):
        for dirpath, _unused, files in os.walk(os.path.join(site, base)):
            for fname in files:
                path = os.path.join(dirpath, fname)
                with open(path, "rb") as handle:
                    out[path] = handle.read()
    return out
