"""The evaluate stage's prompts: the held-out conversations prepare wrote (prepare/heldout.jsonl, never trained on)
and/or a local JSONL of {"prompt": text} | {"prompt_ids": [...]} | {"messages": [...]} records."""

import json
from pathlib import Path

from specdec_pipeline.errors import PipelineError


def load_prompts(cfg):
    """Return a list of request bodies' prompt parts: {"prompt": str|list[int]} or {"messages": [...]}."""
    out = []
    if cfg["prompts"]["heldout"]:
        held = Path(cfg["run_dir"]) / "prepare" / "heldout.jsonl"
        if not held.is_file():
            raise PipelineError(f"{held}: no held-out prompts; set eagle3_pipeline_heldout > 0 and re-run the pipeline "
                                "(prepare), or give a prompts JSONL (eagle3_evaluate_prompts_jsonl).")
        out += [{"prompt": r["prompt_ids"], "source": f"heldout:{r['source_index']}"} for r in _jsonl(held)]
    if cfg["prompts"]["jsonl"]:
        path = Path(cfg["prompts"]["jsonl"])
        if not path.is_file():
            raise PipelineError(f"prompts file {path} not found; set eagle3_evaluate_prompts_jsonl to a local .jsonl.")
        for n, rec in enumerate(_jsonl(path), 1):
            if isinstance(rec.get("prompt"), str) or isinstance(rec.get("prompt_ids"), list):
                out.append({"prompt": rec.get("prompt_ids") or rec["prompt"], "source": f"{path.name}:{n}"})
            elif isinstance(rec.get("messages") or rec.get("conversations"), list):
                msgs = [{"role": {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("role", m.get("from"))),
                         "content": m.get("content", m.get("value"))} for m in (rec.get("messages") or rec["conversations"])]
                cut = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
                out.append({"messages": msgs[:cut], "source": f"{path.name}:{n}"})
            else:
                raise PipelineError(f"{path}:{n}: expected a 'prompt' string, 'prompt_ids' list or 'messages' list; "
                                    "fix or drop the line.")
    limit = cfg["prompts"]["max_prompts"]
    out = out[: int(limit)] if limit else out
    if not out:
        raise PipelineError("evaluate: the prompt sources are empty; hold out conversations in prepare or give a JSONL.")
    return out


def _jsonl(path):
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise PipelineError(f"{path}:{n}: not valid JSON ({exc.msg}); fix the line.") from None
    return rows
