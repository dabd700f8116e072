"""Step 1 - prepare: chat template + loss masks on assistant tokens + token frequencies.

Loss masks are built without offset mappings, so slow (Python) tokenizers such as Kimi-K2.5's tiktoken
tokenizer work: the conversation is rendered with the chat template, then growing prefixes of the rendered
text (ending before and after each assistant reply) are encoded and the token counts mark the reply's tokens.
Where a tokenizer merges across a boundary, the boundary moves to the longest prefix whose encoding agrees
with the full encoding.

Rendering follows the run's chat mode (chatmode.py): in thinking mode the generation prompt ends in the opening
reasoning tag, so the mask covers the last reply's reasoning, the closing tag and its content; in instant mode the
content. With regenerate on, the training conversations carry the target's own replies (regenerate.py); those
whose regeneration left no complete reply are dropped and counted.
"""

import json
import os
import tempfile
import time
from pathlib import Path

from specdec_pipeline import chatmode, manifest, regenerate
from specdec_pipeline.config import run_path
from specdec_pipeline.datasets_io import load_conversations
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, write_json
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.selection import select
from specdec_pipeline.target import load_tokenizer


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _render(tok, messages, add_generation_prompt=False, mode=None):
    return chatmode.render(tok, messages, mode, add_generation_prompt=add_generation_prompt)


def _boundary(tok, full_text, full_ids, char_pos):
    """Number of leading tokens of FULL_IDS that encode FULL_TEXT[:char_pos] (prefix-stable)."""
    ids = _encode(tok, full_text[:char_pos])
    n = len(ids)
    while n > 0 and full_ids[:n] != ids[:n]:
        n -= 1
    return n


def tokenize_conversation(tok, messages, seq_length, mode=None):
    """Return (input_ids, loss_mask) for one conversation rendered in chat MODE (None: the template's default);
    loss_mask is 1 on assistant reply tokens (in thinking mode the last reply's reasoning included). A last reply
    marked truncated (cut off at regenerate's length limit) ends the sample where its text ends: the end of turn
    the template would add was never written by the target and is neither input nor trained on."""
    messages = chatmode.for_training(messages, mode)
    full = _render(tok, messages, mode=mode)
    ids = _encode(tok, full)
    mask = [0] * len(ids)
    cut_at = None
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = _render(tok, messages[:i], add_generation_prompt=True, mode=mode)
        after = _render(tok, messages[: i + 1], mode=mode)
        if not full.startswith(after) or not after.startswith(before):
            raise ValueError("the chat template does not render conversations prefix-stably")
        start = _boundary(tok, full, ids, len(before))
        end_char = len(after)
        if msg.get("truncated") and i == len(messages) - 1:
            text = msg.get("content") or msg.get("reasoning_content") or ""
            at = after.rfind(text, len(before)) if text else -1
            if at < 0:
                raise ValueError("the cut reply is not in its rendering")
            end_char = at + len(text)
        end = _boundary(tok, full, ids, end_char)
        for t in range(start, end):
            mask[t] = 1
        if end_char != len(after):
            cut_at = end
    if cut_at is not None:
        ids, mask = ids[:cut_at], mask[:cut_at]
    return ids[:seq_length], mask[:seq_length]


def check(cfg):
    """The chat mode against the target's template, before the run writes anything (reads only; only when the
    step would run)."""
    if cfg["chat_mode"] not in chatmode.MODES or not manifest.is_current(cfg, "prepare")[0]:
        chatmode.check(cfg, load_tokenizer(cfg))


def run(cfg):
    started = time.time()
    out_dir = run_path(cfg, "prepare")
    tok = load_tokenizer(cfg)
    mode = cfg["chat_mode"]
    chatmode.check(cfg, tok)
    convs = load_conversations(cfg["dataset"]["source"], cfg["dataset"]["split"])
    chosen = select(cfg, convs)
    order, heldout_idx, contaminated = chosen["order"], chosen["heldout"], chosen["contaminated"]
    convs, unanswered, cut = regenerate.conversations_for_training(cfg, convs, order)
    order = [i for i in order if i not in set(unanswered)]
    out_dir.mkdir(parents=True, exist_ok=True)
    prog = Progress(run_path(cfg, "progress.json"), "prepare", len(order), unit="conversations")
    samples, failed, empty = [], 0, 0
    for n, idx in enumerate(order):
        try:
            ids, mask = tokenize_conversation(tok, convs[idx], int(cfg["seq_length"]), mode)
        except Exception as exc:  # noqa: BLE001 - counted and reported; the share check below decides
            failed += 1
            log.warning("conversation %s skipped: %s", idx, exc)
            continue
        if sum(mask) == 0:
            empty += 1
            continue
        samples.append({"id": len(samples), "source_index": idx, "input_ids": ids, "loss_mask": mask})
        prog.update(n + 1, tokens=len(ids))
    share = len(samples) / max(len(order), 1)
    if share < float(cfg["min_mask_share"]):
        raise PipelineError(
            f"prepare: only {len(samples)}/{len(order)} conversations ({share:.0%}) of {cfg['dataset']['source']} "
            f"have a non-empty assistant loss mask with the tokenizer of {cfg['target']['path']} "
            f"({failed} failed, {empty} empty); expected at least {float(cfg['min_mask_share']):.0%} "
            "(min_mask_share). Check the chat template and the dataset's roles.")
    samples_path = out_dir / "samples.jsonl"
    with atomic_path(samples_path) as tmp:
        with open(tmp, "w") as f:
            for s in samples:
                f.write(json.dumps(s, separators=(",", ":")) + "\n")
    heldout_path = out_dir / "heldout.jsonl"
    heldout = _write_heldout(tok, convs, heldout_idx, int(cfg["seq_length"]), heldout_path, mode)
    freq_path = out_dir / "token_freq.pt"
    _token_freq(samples, freq_path)
    lengths = [len(s["input_ids"]) for s in samples]
    write_json(out_dir / "lengths.json", lengths)
    prog.finish(f"{len(samples)} samples")
    counts = {"conversations": len(order), "samples": len(samples), "failed": failed, "empty_mask": empty,
              "tokens": sum(lengths), "masked_tokens": sum(sum(s["loss_mask"]) for s in samples),
              "heldout": len(heldout), "dropped_same_prompt_as_heldout": len(contaminated),
              "chat_mode": mode, "regenerated": bool(cfg["regenerate"]["enabled"]),
              "dropped_no_complete_regenerated_reply": len(unanswered),
              "trained_on_cut_replies": sum(s["source_index"] in set(cut) for s in samples)}
    if counts["trained_on_cut_replies"]:
        log.warning("prepare: %d samples end in a regenerated reply cut off at the length limit, trained on up to the "
                    "cut (regenerate.keep_truncated: eagle3_pipeline_regenerate_keep_truncated)",
                    counts["trained_on_cut_replies"])
    return manifest.write(cfg, "prepare", [samples_path, freq_path, out_dir / "lengths.json", heldout_path], counts,
                          started, extra={"heldout": {"file": "prepare/heldout.jsonl",
                                                      "source_indices": sorted(r["source_index"] for r in heldout)}})


def _write_heldout(tok, convs, indices, seq_length, dest, mode=None):
    """Write the held-out conversations as evaluation prompts: the turns before the first assistant reply,
    rendered with the generation prompt in chat MODE (prompt_ids), plus that reply as the reference. Never
    trained on."""
    rows = []
    for idx in indices:
        msgs = convs[idx]
        first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), None)
        if not first:
            log.warning("held-out conversation %s has no user turn before an assistant reply; not used", idx)
            continue
        prompt = msgs[:first]
        ids = _encode(tok, _render(tok, prompt, add_generation_prompt=True, mode=mode))[:seq_length]
        rows.append({"source_index": idx, "messages": prompt, "reference": msgs[first]["content"], "prompt_ids": ids,
                     "chat_mode": mode})
    with atomic_path(dest) as tmp:
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    return rows


def _token_freq(samples, dest):
    """Token frequencies over loss-masked tokens, written by speculators' own function, inside this run.

    The function only iterates items with input_ids/loss_mask tensors, so plain dicts are handed to it
    (a datasets.Dataset with torch formatting would drag in torchvision's video reader on some hosts).
    """
    import torch  # noqa: PLC0415 - only this writer needs it (the settings check and validate stay light)
    from speculators.train.vocab_mapping import save_token_frequency_distribution  # noqa: PLC0415

    items = [{"input_ids": torch.tensor(s["input_ids"], dtype=torch.long),
              "loss_mask": torch.tensor(s["loss_mask"], dtype=torch.long)} for s in samples]
    # torch.save stores the file's name in the archive: write under the final name (in a temporary directory),
    # so the same frequencies always give the same bytes.
    with atomic_path(dest, validate=lambda p: torch.load(p, weights_only=True)) as tmp, \
            tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as named:
        save_token_frequency_distribution(items, str(Path(named) / dest.name))
        os.replace(Path(named) / dest.name, tmp)


def load_samples(cfg):
    path = run_path(cfg, "prepare", "samples.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
