"""`python -m specdec_pipeline CONFIG validate`: everything the run would refuse, said before it starts, reading only.

Runs every step's settings check (the same checks `run` makes first; on the current track with today's prepared
samples also the exact disk space) and the target checks: the model directory holds config.json, a tokenizer and
weights; the capture ids fit the target's num_hidden_layers by the running track's rule; the work directory's
filesystem has room for the hidden states by the track's estimate. Each problem is one line; nothing is written.
"""

import json
from pathlib import Path

from specdec_pipeline import disk, manifest, tracks
from specdec_pipeline.config import extract_dtype, run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import dir_size, free_bytes


def _settings(cfg):
    """What the rules shared by the steps (the track's capture ids, extract.dtype) and then each step's settings
    check (the checks `run` makes first, which stop at their first problem) refuse; each problem once."""
    found = []
    for check in (tracks.of(cfg).layer_ids, extract_dtype, *tracks.checks(cfg)):
        try:
            check(cfg)
        except PipelineError as exc:
            if str(exc) not in found:
                found.append(str(exc))
    return found


def _target_files(cfg):
    target = Path(cfg["target"]["path"])
    if not target.is_dir():
        return [f"target.path is {str(target)!r}; expected an existing model directory on the host, but it does not "
                "exist or cannot be read (eagle3_pipeline_target_path). Download the model there first."]
    try:
        names = [p.name for p in target.iterdir()]
    except OSError as exc:
        return [f"target.path {target}: cannot list it ({exc.strerror}); the pipeline user must be able to read it."]
    missing = [what for what, ok in (
        ("config.json", "config.json" in names),
        ("a tokenizer", any(n.startswith("tokenizer") or n.endswith(".model") for n in names)),
        ("weights (*.safetensors or *.bin)", any(n.endswith((".safetensors", ".bin")) for n in names))) if not ok]
    if missing:
        return [f"target.path is {str(target)!r}; expected config.json, a tokenizer and weights in it; missing: "
                f"{', '.join(missing)} (eagle3_pipeline_target_path)."]
    return []


def _planned_tokens(cfg):
    """(tokens, how they were counted) the extraction will hold: the prepared samples' tokens when prepare ran with
    these settings, else disk.planned_tokens (max_samples, or the local .jsonl dataset's conversations)."""
    if manifest.is_current(cfg, "prepare")[0]:
        rows = [json.loads(line) for line in run_path(cfg, "prepare", "samples.jsonl").read_text().splitlines()
                if line.strip()]
        return sum(len(r["input_ids"]) for r in rows), f"the {len(rows)} prepared samples"
    source = Path(str(cfg["dataset"]["source"]))
    lines = None
    if source.suffix == ".jsonl" and source.is_file():
        lines = sum(1 for line in source.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
    return disk.planned_tokens(cfg, lines)


def _disk(cfg, ids):
    """The hidden states of the planned tokens against the free space of the run directory's filesystem, by the
    track's bytes per token (disk.py); what is already extracted counts as done."""
    if manifest.is_current(cfg, "extract")[0]:
        return []
    tokens, counted = _planned_tokens(cfg)
    if not tokens:
        return []
    from specdec_pipeline.target import text_config  # noqa: PLC0415 - reads the target's config (transformers)

    have = dir_size(run_path(cfg, "extract")) + dir_size(run_path(cfg, "extract.new"))
    problem = disk.problem(cfg, tracks.of(cfg), tokens, counted, len(ids), int(text_config(cfg).hidden_size),
                           free_bytes(cfg["run_dir"]), have)
    return [problem] if problem else []


def problems(cfg):
    """Every problem the run would refuse, one line each (an empty list: the run can start)."""
    files = _target_files(cfg)
    if files:  # nothing else about the target can be read
        return files
    found = _settings(cfg)
    try:
        ids = tracks.of(cfg).layer_ids(cfg)
    except PipelineError:
        return found  # the settings check named it
    if any(line.startswith("extract: not enough disk space") for line in found):
        return found  # the step's own check measured the prepared samples exactly
    try:
        return found + _disk(cfg, ids)
    except PipelineError as exc:  # e.g. a damaged manifest: one line naming it
        return [*found, str(exc)]


def main(cfg, out, err):
    """Print the problems (one 'ERROR: ' line each on ERR) and a JSON summary on OUT; 2 when there are any."""
    found = problems(cfg)
    for line in found:
        print(f"ERROR: {line}", file=err)
    print(json.dumps({"ok": not found, "problems": found, "track": cfg["track"]}), file=out)
    return 2 if found else 0
