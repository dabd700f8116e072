"""source_patch engine on real speculators wheels x real vLLM sources laid out as installed venvs."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest
import yaml

from helpers import STATES, apply, load_set, snapshot

from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import PatchError, validate_patches
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import EnvError

CASES = yaml.safe_load((Path(__file__).parent / "cases.yml").read_text())["pairs"]
EARLIER = yaml.safe_load((Path(__file__).parent / "earlier_patches.yml").read_text())
SWITCH = "_specdec_trust_remote_code"


def remote_code_arguments(path):
    """Every trust_remote_code= argument of a call in PATH as source text, e.g. 'True' or '_specdec_...()'."""
    tree = ast.parse(Path(path).read_text())
    return [ast.unparse(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
            for kw in node.keywords if kw.arg == "trust_remote_code"]


def assert_switch_everywhere(site):
    """The generator (tokenizer, config, vLLM's ModelConfig) and the draft's verifier config read the switch."""
    generator = site / "speculators/data_generation/vllm_hidden_states_generator.py"
    core = site / "speculators/models/eagle3/core.py"
    assert remote_code_arguments(generator) == [SWITCH + "()"] * 3
    assert remote_code_arguments(core) == [SWITCH + "()"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_pair_states_idempotence_assert_and_revert(case, make_venv):
    python, site = make_venv(case["speculators"], case["vllm"])
    patches = load_set(case["patch_set"])["patches"]
    pristine = snapshot(site)

    # check mode: reports the same decisions, writes nothing
    checked = apply(python, patches, check_mode=True, diff_mode=True)
    assert snapshot(site) == pristine
    assert checked["changed"] is True and checked["diff"]

    first = apply(python, patches)
    got = {r["id"][:3]: r["state"] for r in first["results"]}
    assert got == {k: STATES[v] for k, v in case["expect"].items()}
    assert first["changed"] is True
    for path in {r["file"] for r in first["results"]}:
        compile(Path(path).read_bytes(), path, "exec")
    assert_switch_everywhere(site)  # no hard-coded trust_remote_code=True is left (p01, t01)

    second = apply(python, patches)
    assert second["changed"] is False
    assert {r["id"][:3]: r["state"] for r in second["results"]} == {
        k: ("already_applied" if v == "A" else "not_needed") for k, v in case["expect"].items()}

    asserted = apply(python, patches, state="asserted")
    assert "failed" not in asserted, asserted.get("msg")
    assert asserted["calls"] and all(c["state"] != "broken" for c in asserted["calls"])

    reverted = apply(python, patches, state="absent")
    assert reverted["changed"] is True
    assert snapshot(site) == pristine  # byte-identical


def test_asserted_fails_on_unpatched_and_names_the_broken_calls(make_venv):
    python, site = make_venv("0.3.0", "0.16.0")
    pristine = snapshot(site)
    out = apply(python, load_set("speculators_0_3_0")["patches"], state="asserted")
    assert out["failed"] is True
    assert snapshot(site) == pristine
    assert "p02_scheduler_config_is_encoder_decoder" in out["msg"]
    broken = {c["symbol"] for c in out["calls"] if c["state"] == "broken"}
    assert "vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups(...)" in broken
    assert "vllm.config:SchedulerConfig(...)" in broken
    assert "vllm.v1.core.sched.scheduler:Scheduler(...)" in broken


def test_drift_from_a_real_later_file_fails_and_writes_nothing(make_venv, tmp_path):
    # the 0.4.0 generator/worker placed where 0.3.0 expects its own files
    python, site = make_venv("0.3.0", "0.16.0")
    _unused, site040 = make_venv("0.4.0", None, name="other")
    for rel in ("speculators/data_generation/vllm_hidden_states_generator.py",
                "speculators/data_generation/custom_worker.py"):
        (site / rel).write_bytes((site040 / rel).read_bytes())
    before = snapshot(site)
    out = apply(python, load_set("speculators_0_3_0")["patches"])
    assert out["failed"] is True
    assert snapshot(site) == before
    msg = out["msg"]
    assert "vllm_hidden_states_generator.py" in msg and "speculators 0.3.0" in msg and "vllm 0.16.0" in msg
    assert out["changed"] is False
    drifted = {r["id"] for r in out["results"] if r["state"] == "drifted"}
    # p05: 0.4.0 passes block_size=VLLM_BLOCK_SIZE, not the cache config's block size p05 writes.
    assert drifted == {"p03_worker_language_model_navigation", "p05_scheduler_block_size",
                       "p06_cache_config_no_prefix_caching",
                       "p07_sample_tokens_after_execute", "p08_collective_rpc_single_reply"}
    assert "patch 'p07_sample_tokens_after_execute'" in msg
    assert "        aux_hidden_states = captured_states_list[0]" in msg  # expected anchor
    assert "line 314: model_output = self.executor.execute_model(scheduler_output)" in msg  # closest real line
    assert "closest lines found:" in msg and "line " in msg
    assert "Nothing was written" in msg


def test_read_only_file_gives_one_clear_message(make_venv):
    if os.geteuid() == 0:
        pytest.skip("root ignores file modes; the molecule scenario runs this check as an unprivileged user")
    python, site = make_venv("0.4.0.1", "0.16.0")
    target = site / "speculators/data_generation/vllm_hidden_states_generator.py"
    target.chmod(stat.S_IRUSR)
    out = apply(python, load_set("speculators_0_4_0")["patches"])
    assert out["failed"] is True and "vllm_hidden_states_generator.py" in out["msg"] and "not writable" in out["msg"]


def test_read_only_directory_as_root_is_reported(make_venv):
    python, site = make_venv("0.4.0.1", "0.16.0")
    target = site / "speculators/data_generation/vllm_hidden_states_generator.py"
    original = target.read_bytes()
    os.chmod(target, 0o444)
    os.chmod(target.parent, 0o555)
    try:
        if os.access(target, os.W_OK) and os.geteuid() == 0:
            # root can write anyway: the module's own check uses os.access, which root passes; the
            # patch then applies.  Assert that the mode survives the atomic rename instead.
            out = apply(python, load_set("speculators_0_4_0")["patches"])
            assert out["changed"] is True
            assert stat.S_IMODE(target.stat().st_mode) == 0o444
        else:
            out = apply(python, load_set("speculators_0_4_0")["patches"])
            assert out["failed"] is True and "is not writable by this user" in out["msg"]
            assert target.read_bytes() == original
    finally:
        os.chmod(target.parent, 0o755)


def test_missing_distribution(make_venv):
    python, _unused = make_venv(None, "0.16.0")
    with pytest.raises(EnvError, match="distribution 'speculators' is not installed"):
        apply(python, load_set("speculators_0_3_0")["patches"])


@pytest.mark.parametrize("python,needle", [
    ("/nonexistent/bin/python", "does not exist"),
    ("relative/python", "must be an absolute path"),
    ("/bin/true", "printed no environment report"),
    ("/bin/false", "could not run the environment probe"),
])
def test_wrong_interpreter(python, needle):
    with pytest.raises(EnvError, match=needle):
        apply(python, load_set("speculators_0_3_0")["patches"])


def test_upgrade_to_moved_api_fails_before_writing(make_venv):
    python, site = make_venv("0.3.0", "0.33.0")
    before = snapshot(site)
    with pytest.raises(PatchError, match="get_kv_cache_config_from_groups") as err:
        apply(python, load_set("speculators_0_3_0")["patches"])
    assert "vllm 0.33.0" in str(err.value)
    # the refusal names the way forward: the current track and its pins
    assert "specdec_track: current" in str(err.value) and "speculators 0.9.0" in str(err.value)
    assert snapshot(site) == before


def test_backup_keeps_the_original(make_venv):
    python, site = make_venv("0.4.0.1", "0.16.0")
    target = site / "speculators/data_generation/vllm_hidden_states_generator.py"
    original = target.read_bytes()
    core = site / "speculators/models/eagle3/core.py"
    core_original = core.read_bytes()
    out = apply(python, load_set("speculators_0_4_0")["patches"], backup=True)
    # one backup per written file: the generator (p01) and the draft model's core (t01)
    assert len(out["backups"]) == 2
    by_file = {Path(b).name.split(".")[0]: Path(b).read_bytes() for b in out["backups"]}
    assert by_file == {"vllm_hidden_states_generator": original, "core": core_original}


@pytest.mark.parametrize("name,spec", [("speculators_0_3_0", "0.3.0"), ("speculators_0_4_0", "0.4.0.1")])
def test_a_venv_patched_by_the_earlier_p01_t01_is_updated_in_place(make_venv, name, spec):
    python, site = make_venv(spec, "0.16.0")
    fresh_python, fresh_site = make_venv(spec, "0.16.0", name="fresh")
    pristine = snapshot(site)
    current = load_set(name)["patches"]
    earlier_by_id = {p["id"]: p for p in EARLIER[name]}
    earlier = [earlier_by_id.get(p["id"], p) for p in current]
    assert "failed" not in apply(python, earlier)  # the venv as the earlier collection left it
    old = snapshot(site)

    asserted = apply(python, current, state="asserted")
    assert asserted["failed"] is True and snapshot(site) == old
    assert all(pid in asserted["msg"] for pid in earlier_by_id), asserted["msg"]
    checked = apply(python, current, check_mode=True)
    assert checked["changed"] is True and "failed" not in checked and snapshot(site) == old

    updated = apply(python, current)
    assert "failed" not in updated, updated.get("msg")
    by_id = {r["id"]: r for r in updated["results"]}
    for pid in earlier_by_id:
        assert by_id[pid]["state"] == "applied" and by_id[pid]["updated"] is True, by_id[pid]
    assert all(r["state"] in ("already_applied", "not_needed") for r in updated["results"]
               if r["id"] not in earlier_by_id)
    assert_switch_everywhere(site)
    # byte-identical to the current set applied to a fresh install
    apply(fresh_python, current)
    assert {k[len(str(site)):]: v for k, v in snapshot(site).items()} == \
        {k[len(str(fresh_site)):]: v for k, v in snapshot(fresh_site).items()}

    again = apply(python, current)
    assert again["changed"] is False
    assert "failed" not in apply(python, current, state="asserted")
    assert apply(python, current, state="absent")["changed"] is True
    assert snapshot(site) == pristine

    # state=absent straight from the earlier text restores the original too
    assert "failed" not in apply(python, earlier)
    reverted = apply(python, current, state="absent")
    assert "failed" not in reverted, reverted.get("msg")
    assert snapshot(site) == pristine


def test_formerly_must_be_a_list_of_other_texts():
    patch = {"id": "x01", "distribution": "speculators", "file": "speculators/a.py",
             "hunks": [{"before": "a\n", "after": "b\n", "formerly": ["b\n"]}]}
    with pytest.raises(PatchError, match="patch 'x01' hunk 1: 'formerly' is .* expected a list of the texts"):
        validate_patches([patch], "set")
