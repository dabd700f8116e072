"""Conversation sources: ShareGPT / UltraChat / any hub id through `datasets`, or a local JSON/JSONL file.

Every source is normalised to a list of {"role": user|assistant|system, "content": str} messages. A hub dataset
is loaded by a child process (`python -m specdec_pipeline.datasets_io NAME SPLIT OUT`), the one process of the
pipeline that may reach the hub; the pipeline itself, which loads the target, runs with HF_HUB_OFFLINE=1.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from specdec_pipeline.errors import PipelineError

HUB_ALIASES = {
    "sharegpt": ("Aeala/ShareGPT_Vicuna_unfiltered", "train"),
    "ultrachat": ("HuggingFaceH4/ultrachat_200k", "train_sft"),
}
ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
              "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}


def _normalise(record, where):
    turns = record.get("conversations") or record.get("messages") or record.get("conversation")
    if not isinstance(turns, list):
        raise PipelineError(f"{where}: expected a 'conversations' (or 'messages') list of "
                            "{from/role, value/content} turns; fix or drop this record.")
    out = []
    for turn in turns:
        role = ROLE_NAMES.get(str(turn.get("from", turn.get("role", ""))).lower())
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            raise PipelineError(f"{where}: turn {turn!r} has no known role (human/gpt/user/assistant/system) "
                                "or no text; fix or drop this record.")
        out.append({"role": role, "content": content})
    return out


def load_local(path):
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    records = []
    if path.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append((f"{path}:{n}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise PipelineError(f"{path}:{n}: not valid JSON ({exc.msg}); fix the line.") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PipelineError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); fix the file.") from None
        if not isinstance(data, list):
            raise PipelineError(f"{path}: expected a JSON list of conversation records.")
        records = [(f"{path}[{i}]", r) for i, r in enumerate(data)]
    return [_normalise(r, where) for where, r in records]


def load_conversations(source, split="train"):
    if source.endswith((".json", ".jsonl")):
        if not Path(source).is_file():
            raise PipelineError(f"dataset {source}: file not found; set eagle3_pipeline_dataset to an existing "
                                ".json/.jsonl file or a dataset id.")
        return load_local(source)
    name, default_split = HUB_ALIASES.get(source, (source, split))
    with tempfile.TemporaryDirectory(prefix="specdec-dataset.") as tmp:
        out = Path(tmp) / "conversations.json"
        env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARIABLES}
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
        proc = subprocess.run([sys.executable, "-m", "specdec_pipeline.datasets_io", name,
                               split if source not in HUB_ALIASES else default_split, str(out)],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.is_file():
            said = [line for line in proc.stderr.splitlines() if line.startswith("ERROR: ")]
            raise PipelineError(said[-1][len("ERROR: "):] if said else
                                f"dataset {name}: the loader exited with status {proc.returncode}: "
                                f"{(proc.stderr.strip().splitlines() or ['no output'])[-1][:300]}")
        return json.loads(out.read_text(encoding="utf-8"))


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def _fetch(name, split, dest):
    """The child process: load NAME from the hub and write its normalised conversations to DEST (JSON)."""
    import datasets  # noqa: PLC0415 - only the hub path needs it

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:
        raise PipelineError(f"dataset {name}: could not load it from the Hugging Face hub ({exc}); check the id, "
                            "the network and HF_TOKEN, or use a local .json/.jsonl.") from None
    Path(dest).write_text(json.dumps([_normalise(r, f"{name}[{i}]") for i, r in enumerate(ds)]), encoding="utf-8")


if __name__ == "__main__":
    try:
        _fetch(*sys.argv[1:4])
    except PipelineError as error:
        print("ERROR: " + " ".join(str(error).split()), file=sys.stderr)
        raise SystemExit(2) from None
