"""The evaluate stage of a profile's real run, through Ansible: what `ansible-playbook -i inventory/<profile>
site.yml` measured (results, report, logs), a re-run of the stage that does not measure again, and a gate
that fails in one line without measuring again.

scripts/test-all runs it right after each CPU profile that evaluates (SPECDEC_EVAL_PROFILE=local-vllm after the
`local_vllm` check, local-current in the `current` check). Alone, after such a run:
    SPECDEC_EVAL_PROFILE=local-vllm .venv/bin/python -m pytest -q tests/evaluate/test_stage.py
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

PROFILE = os.environ.get("SPECDEC_EVAL_PROFILE", "")
pytestmark = pytest.mark.skipif(not PROFILE, reason="needs a profile's evaluated run: set SPECDEC_EVAL_PROFILE "
                                                    "(scripts/test-all does, after the profile ran)")


def _env():
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
                ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))


def playbook(*more):
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(ROOT / "inventory" / PROFILE),
           str(ROOT / "playbooks" / "evaluate.yml"), *more]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), text=True, capture_output=True, check=False)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The run directory the profile's inventory names (specdec_work_dir/runs/specdec_profile).

    Asked through a play that loads the specdec role, which owns the shared defaults: an ad-hoc `ansible -m debug`
    sees only the inventory, and an inventory restates no default."""
    play = tmp_path_factory.mktemp("run-dir") / "run-dir.yml"
    play.write_text("- hosts: eagle3_hosts\n  gather_facts: false\n  roles: [specdec.eagle3.specdec]\n  tasks:\n"
                    "    - name: run-dir\n      ansible.builtin.debug:\n        msg: \"{{ specdec_work_dir }}/runs/{{ specdec_profile }}\"\n")
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(ROOT / "inventory" / PROFILE), str(play)]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(_env(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                                                  ANSIBLE_STDOUT_CALLBACK="json"),
                          text=True, capture_output=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    task = next(x for x in json.loads(proc.stdout)["plays"][0]["tasks"] if x["task"]["name"] == "run-dir")
    host = next(iter(task["hosts"].values()))
    path = Path(host["msg"])
    assert (path / "evaluate" / "results.json").is_file(), f"{path}: the profile {PROFILE} has not been evaluated yet"
    return path


def test_the_measured_results_and_the_report(run_dir):
    """results.json as recorded: every setting that moves AL beside the figures, each prompt set on its own with its
    digest, each concurrency level, AL = 1 + the per-position sum, the margin over the control, the speed-ups - for
    each draft the run trained (the EAGLE-3 draft as `trained`, another as its algorithm's name), side by side with
    its draft tokens and block size; the report says the same."""
    results = json.loads((run_dir / "evaluate" / "results.json").read_text())
    settings = results["settings"]
    assert results["engine"]["name"] == "vLLM" and results["vllm"].startswith(results["engine"]["distribution"])
    assert "bonus token" in results["al_formula"]
    for key in ("num_speculative_tokens", "temperature", "top_p", "chat_mode", "max_tokens", "ignore_eos", "concurrency",
                "prompt_sets", "ngram", "ngram_lookup_min", "ngram_lookup_max"):
        assert key in settings, key
    run_config = json.loads(next(run_dir.parent.glob(f"{run_dir.name}.json")).read_text())
    assert settings["chat_mode"] == run_config["chat_mode"]  # the run's one chat mode reaches the evaluate stage
    assert list(results["sets"]) == settings["prompt_sets"]
    drafts = results["drafts"]
    assert results["format"] == 3 and list(drafts) == sorted(settings["drafts"])
    assert set(settings["drafts"]) == set(run_config.get("drafts", ["eagle3"]))  # every draft the pipeline trained
    expected = ({d["variant"] for d in drafts.values()} | ({"baseline"} if settings["baseline"] else set())
                | ({d["control"] for d in drafts.values()} if settings["control"] else set())
                | ({"ngram"} if settings["ngram"] else set()))
    report = (run_dir / "report" / "report.md").read_text()
    assert "## Evaluation (vLLM spec decode)" in report and results["vllm"] in report and results["al_formula"] in report
    for name, ps in results["sets"].items():
        assert set(ps["variants"]) == expected, name
        assert len(ps["digest"]) == 64 and len(ps["rendered_digest"]) == 64
        assert ps["count"] <= (settings["max_prompts"] or ps["count"])
        for variant, r in ps["variants"].items():
            assert sorted(map(int, r["by_concurrency"])) == sorted(settings["concurrency"]), (name, variant)
            for level, fig in r["by_concurrency"].items():
                assert fig["requests"] == ps["count"], (name, variant, level)
                assert 0 < fig["output_tokens"] <= ps["count"] * settings["max_tokens"]
                if settings["ignore_eos"]:
                    assert fig["output_tokens"] == ps["count"] * settings["max_tokens"]
            assert (run_dir / "logs" / f"evaluate-serve-{variant}.log").exists()
        for algo, draft in drafts.items():
            mine = ps["variants"][draft["variant"]]
            assert mine["acceptance_length"] >= 1.0
            per_pos = mine["per_position"]
            assert len(per_pos) == draft["num_speculative_tokens"]
            assert per_pos == sorted(per_pos, reverse=True)
            assert mine["acceptance_length"] == pytest.approx(1 + sum(per_pos), abs=1e-3)
            side = ps["drafts"][algo]
            assert side["acceptance_length"] == mine["acceptance_length"] and side["method"] == draft["method"]
            assert side["draft_tokens"] == mine["draft_tokens"] and side["drafts"] == mine["drafts"]
            if draft["block_size"]:  # a DFlash-family draft: no more draft tokens than its block trained
                assert draft["num_speculative_tokens"] <= draft["block_size"]
                assert side["draft_tokens_per_block"] == pytest.approx(draft["num_speculative_tokens"] / draft["block_size"])
            if settings["control"]:
                control = ps["variants"][draft["control"]]["acceptance_length"]
                assert side["margin_over_control"] == pytest.approx(mine["acceptance_length"] - control, abs=1e-3)
            if settings["baseline"]:
                assert set(ps["speedup"][draft["variant"]]) == {str(c) for c in settings["concurrency"]}
                assert all(x > 0 for x in ps["speedup"][draft["variant"]].values())
                assert side["speedup"] == ps["speedup"][draft["variant"]]
            if settings["ngram"]:  # every draft against vLLM's n-gram speculation, the free alternative
                ngram = ps["variants"]["ngram"]["acceptance_length"]
                assert len(ps["variants"]["ngram"]["per_position"]) == settings["num_speculative_tokens"]
                assert side["ngram_acceptance_length"] == ngram
                assert side["al_over_ngram"] == pytest.approx(mine["acceptance_length"] / ngram, abs=1e-3)
                assert f"The {'trained' if algo == 'eagle3' else algo} draft " in report and "n-gram speculation: AL" in report
        if settings["control"] and "eagle3" in drafts:
            control = ps["variants"]["control"]["acceptance_length"]
            assert ps["margin_over_control"] == pytest.approx(ps["variants"]["trained"]["acceptance_length"] - control,
                                                              abs=1e-3)
        if len(drafts) > 1:
            assert "| draft | method | draft tokens / block | AL |" in report
        assert f"### Prompt set {name}" in report and ps["digest"][:16] in report
    assert (run_dir / "report" / results["plot"]).exists()
    history = [json.loads(x) for x in (run_dir / "evaluate" / "history.jsonl").read_text().splitlines()]
    assert history and history[-1]["vllm"] == results["vllm"]
    if "heldout" in results["sets"]:
        prepare = json.loads((run_dir / "manifests" / "prepare.json").read_text())
        assert len(prepare["heldout"]["source_indices"]) >= results["sets"]["heldout"]["count"]


def test_rerun_does_not_evaluate_again(run_dir):
    before = (run_dir / "evaluate" / "results.json").read_bytes()
    again = playbook()
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert "not measured again" in again.stdout
    assert "changed=0" in again.stdout.split("PLAY RECAP")[-1]
    assert (run_dir / "evaluate" / "results.json").read_bytes() == before


def test_gate_fails_with_one_line_without_measuring(run_dir):
    before = (run_dir / "evaluate" / "results.json").read_bytes()
    try:
        failed = playbook("-e", "eagle3_evaluate_min_acceptance_length=3.9",
                          "-e", "eagle3_evaluate_require_beats_control=false")
    finally:
        playbook()  # the profile's own evaluation configuration back in place
    assert failed.returncode != 0
    assert "not measured again" in failed.stdout
    # The summary names the gate ("  gate: ..."); the failure is the one line after "FAILED - ...".
    out = failed.stdout.splitlines()
    at = next(i for i, ln in enumerate(out) if ln.startswith("FAILED - "))
    assert "Fail when the draft misses the gate" in out[at]
    lines = [out[at + 1]]
    assert not out[at + 2].strip() or out[at + 2].startswith(("PLAY RECAP", "==")), out[at:at + 4]
    assert re.search(r"on \w+, the acceptance length [0-9.]+ of the trained draft is below min_acceptance_length "
                     r"3.9; report: \S+report.md", lines[0])
    assert "Traceback" not in failed.stdout + failed.stderr
    assert (run_dir / "evaluate" / "results.json").read_bytes() == before
