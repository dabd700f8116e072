"""Fixtures of tests/pipeline (the tiny target, run configurations, the pipeline CLI), shared with these tests."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "pipeline_conftest", Path(__file__).resolve().parents[1] / "pipeline" / "conftest.py")
pipeline_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline_conftest)

FILES, ROOT = pipeline_conftest.FILES, pipeline_conftest.ROOT
pipeline, write_config = pipeline_conftest.pipeline, pipeline_conftest.write_config
tiny_target = pipeline_conftest.tiny_target
