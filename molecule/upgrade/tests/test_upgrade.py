"""After 0.16.0 -> 0.17.0 -> 0.33.0: the worker file was not touched after the first converge (its patches were
already applied), the generator changed only by the patch 0.17 newly needs, and the refused 0.33.0 run wrote
nothing (asserted by checksums in upgrade_033.yml)."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
VENV = "/opt/specdec/ml-env"
WORK = "/opt/specdec/work"
PATCHES = {p["id"]: p for p in yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]}
WORKER = "speculators/data_generation/custom_worker.py"
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"


def _site(host):
    return host.check_output(f"{VENV}/bin/python -c \"import sysconfig; print(sysconfig.get_paths()['purelib'])\"")


def _sums(text):
    return {line.split()[1]: line.split()[0] for line in text.splitlines() if line.strip()}


def test_venv_ends_on_vllm_0330(host):
    out = host.check_output(f"{VENV}/bin/python -c \"import importlib.metadata as m; print(m.version('vllm'))\"")
    assert out == "0.33.0"


def test_worker_untouched_since_0160_generator_only_gained_p10(host):
    site = _site(host)
    before = _sums(host.file(f"{WORK}/speculators-before-0.17.sha256").content_string)
    now = _sums(host.check_output(f"cd {site} && sha256sum {WORKER} {GENERATOR}"))
    assert now[WORKER] == before[WORKER]
    assert now[GENERATOR] != before[GENERATOR]
    text = host.file(f"{site}/{GENERATOR}").content_string
    for hunk in PATCHES["p10_request_without_eos_token_id"]["hunks"]:
        assert hunk["after"] in text and hunk["before"] not in text


def test_patched_files_compile(host):
    site = _site(host)
    for rel in (WORKER, GENERATOR):
        host.run_expect([0], f"{VENV}/bin/python -m py_compile {site}/{rel}")


def test_current_track_venv_is_the_released_stack(host):
    out = host.check_output("/opt/specdec/current-env/bin/python -c \"import importlib.metadata as m; "
                            "print(m.version('vllm'), m.version('speculators'), m.version('hs-connectors'))\"")
    assert out == "0.33.0 0.9.0 0.9.0"


def test_record_what_ran_for_the_compatibility_table(host):
    """Reached only when every step of the scenario passed: the combinations it proved (scripts/compat-table)."""
    import json  # noqa: PLC0415

    test = "molecule test -s upgrade"
    records = {
        "upgrade-0.3.0-0.16.0": ("0.3.0", "vllm 0.16.0", "patched", "patch stage: 0.3.0 set applied and asserted"),
        "upgrade-0.3.0-0.17.0": ("0.3.0", "vllm 0.17.0", "patched", "patch stage after the upgrade: p10 added, idempotent"),
        "upgrade-0.3.0-0.33.0": ("0.3.0", "vllm 0.33.0", "patched", "refused before writing (moved import; way forward named)"),
        "upgrade-0.9.0-0.33.0": ("0.9.0", "vllm 0.33.0", "current", "patch stage: nothing needed, every file as released"),
    }
    out = ROOT / ".cache" / "compat"
    out.mkdir(parents=True, exist_ok=True)
    for name, (spec, vllm, track, result) in records.items():
        (out / f"{name}.json").write_text(json.dumps({"speculators": spec, "vllm": vllm, "track": track,
                                                      "result": result, "test": test}) + "\n")
