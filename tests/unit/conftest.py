"""Fixtures shared by the unit tests."""

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture()
def open_tmp():
    """A directory others may enter (the pipeline user's checks need to pass through it), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="specdec-open-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)
