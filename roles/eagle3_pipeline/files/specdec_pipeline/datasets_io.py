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

from specdec_pipeline import dataset_rules
from specdec_pipeline.errors import PipelineError

HUB_ALIASES = {
    "sharegpt": ("Aeala/ShareGPT_Vicuna_unfiltered", "train"),
    "ultrachat": ("HuggingFaceH4/ultrachat_200k", "train_sft"),
}


def _normalise(record, where):
    problem = dataset_rules.turns_problem(record, where)
    if problem:
        raise PipelineError(problem)
    turns = record.get("conversations") or record.get("messages") or record.get("conversation")
    return [{"role": dataset_rules.ROLE_NAMES[str(t.get("from", t.get("role", ""))).lower()],
             "content": t.get("value", t.get("content"))} for t in turns]


def load_local(path):
    """The conversations of a local .json/.jsonl file (dataset_rules: what such a file must be)."""
    text, problem = dataset_rules.read_text(str(path))
    if problem:
        raise PipelineError(problem)
    out = []
    for where, record, bad in dataset_rules.records(os.path.expanduser(str(path)), text):
        if bad:
            raise PipelineError(bad)
        out.append(_normalise(record, where))
    return out


def load_conversations(source, split="train"):
    if dataset_rules.is_local(source):
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
