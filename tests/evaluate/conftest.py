"""tests/evaluate: the evaluate stage (server lifecycle, /metrics parsing, held-out split, end to end).

The lifecycle and metrics tests need only the standard library (run them with any Python 3.11); the
held-out test needs the pipeline venv; the end-to-end test needs the evaluation venv (see docs/testing.md).
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))
sys.dont_write_bytecode = True
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
