"""`python -m specdec_pipeline.target_check < FACTS.json`: the pipeline's rules for a target model and a work
directory, applied to what the role read on the host before the stack exists (its preflight,
roles/eagle3_pipeline/tasks/validate_target.yml) - one home for each rule, the same code `validate` runs later on
the host.

FACTS (one JSON object on stdin):
- "config": the run configuration the role renders (templates/config.json.j2), loaded by tracks.from_raw;
- "target_config": the target's config.json as an object (null when it could not be read);
- "free": bytes free on the work directory's filesystem;
- "conversations": the number of lines of the local dataset (null when not known).

Prints one JSON line {"problem": "..."} per problem on stdout and exits 2 when there is one, else 0 (nothing
printed). Checks: the configuration (every part's settings check), the capture ids against the target's
num_hidden_layers by the track's rule (layer_ids_problem) and the room for the hidden states by the track's
estimate (disk.problem). It reads no file: it runs where the role runs, with the standard library only.
"""

import json
import sys

from specdec_pipeline import disk, tracks
from specdec_pipeline.errors import PipelineError


def _text_config(conf):
    """The text model's part of a config.json (nested text_config, e.g. Kimi-K2.5), or CONF itself."""
    inner = conf.get("text_config") if isinstance(conf, dict) else None
    return inner if isinstance(inner, dict) else (conf if isinstance(conf, dict) else {})


def _whole(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def problems(facts):
    """Every problem of FACTS (see the module's doc), one line each."""
    try:
        cfg = tracks.from_raw(facts["config"], "the run configuration")
    except PipelineError as exc:
        return [str(exc)]
    track = tracks.of(cfg)
    text = _text_config(facts.get("target_config"))
    layers, hidden = _whole(text.get("num_hidden_layers")), _whole(text.get("hidden_size"))
    if layers is None:  # no config.json or no layer count: the role's file check names what is missing
        return []
    if not isinstance(cfg["extract"]["layer_ids"] or [], list):  # text from -e key=value: its own line elsewhere
        return []
    ids = cfg["extract"]["layer_ids"] or track.default_layer_ids(layers)
    problem = track.layer_ids_problem(ids, layers, cfg["target"]["path"])
    if problem:
        return [problem]
    if hidden is None or facts.get("free") is None:
        return []
    tokens, counted = disk.planned_tokens(cfg, facts.get("conversations"))
    problem = disk.problem(cfg, track, tokens, counted, len(ids), hidden, int(facts["free"]))
    return [problem] if problem else []


def main(stdin=sys.stdin, out=sys.stdout):
    try:
        facts = json.load(stdin)
        if not isinstance(facts, dict) or not isinstance(facts.get("config"), dict):
            raise ValueError("expected an object with a 'config' object")
    except ValueError as exc:
        print(json.dumps({"problem": f"target_check: its input is not the facts it reads ({exc}); run it through "
                                     "the eagle3_pipeline role (tasks/validate_target.yml)."}), file=out)
        return 2
    found = problems(facts)
    for line in found:
        print(json.dumps({"problem": line}), file=out)
    return 2 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
