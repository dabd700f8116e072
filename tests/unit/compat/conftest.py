"""Reuse the source_patch fixtures (real wheels and sdists laid out as venvs) and add a vLLM swap."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_sp_conftest = _load("source_patch_conftest", HERE.parent / "source_patch" / "conftest.py")
vllm_tree = _sp_conftest.vllm_tree
make_venv = _sp_conftest.make_venv
sp_helpers = _load("source_patch_helpers", HERE.parent / "source_patch" / "helpers.py")


@pytest.fixture
def swap_vllm(vllm_tree):
    """swap_vllm(site, version): replace the venv's vLLM by another real release (an upgrade in place)."""

    def swap(site, version):
        os.unlink(site / "vllm")
        for info in site.glob("vllm-*.dist-info"):
            shutil.rmtree(info)
        pkg_dir, pkg_info = vllm_tree(version)
        os.symlink(pkg_dir, site / "vllm")
        info = site / ("vllm-%s.dist-info" % version)
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s\n" % version)
        (info / "top_level.txt").write_text("vllm\n")

    return swap
