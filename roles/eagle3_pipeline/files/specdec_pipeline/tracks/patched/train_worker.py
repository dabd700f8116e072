"""Training process (one per GPU under torchrun, or one on the CPU): builds speculators' Eagle3DraftModel
from the target's config, d2t/t2d and the extracted files, and runs speculators' Trainer.

Usage: python -m specdec_pipeline.tracks.patched.train_worker CONFIG.json cpu|cuda [OUT_DIR]

Training files are read in sorted order and split with a seeded shuffle of our own, so the split (and the
trained weights) never depend on the filesystem's directory order. A full disk ends the process with one
"ERROR: train: ..." line (the train step surfaces it) instead of a traceback.
"""

import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import torch

from specdec_pipeline import remote_code, tracks, vocab
from specdec_pipeline.config import run_path
from specdec_pipeline.fsutil import disk_full_error, is_disk_full, read_json, write_json
from specdec_pipeline.progress import setup_logging
from specdec_pipeline.target import target_config, text_config
from specdec_pipeline.tracks.patched import cpu_attention, fsdp_init
from specdec_pipeline.tracks.patched.rules import vllm_layer_ids


class MetricsFile(logging.Handler):
    """Appends speculators' metric records (its 'speculators.metrics' logger) to metrics.jsonl + progress.

    The batch sampler packs samples anew each epoch, so an epoch's batch count differs from the loader's length
    (37 estimated, 39 run on the tiny target). The total is the loader's length times the epochs until an epoch
    has ended, then what the ended epochs averaged; it never falls below the batches done, and no ETA is given
    once the estimate is used up.
    """

    def __init__(self, path, progress_path, total_epochs, steps_per_epoch):
        super().__init__()
        self.path, self.progress_path = path, progress_path
        self.total_epochs, self.steps_per_epoch = total_epochs, steps_per_epoch
        self.start = time.monotonic()
        self.steps = 0
        self.epoch = None
        self.epoch_first_step = 1  # the step number the current epoch began with

    def total(self):
        ended = self.epoch if isinstance(self.epoch, int) and self.epoch > 0 else 0
        per_epoch = (self.epoch_first_step - 1) / ended if ended else self.steps_per_epoch
        return max(round(per_epoch * self.total_epochs), self.steps)

    def emit(self, record):
        msg = record.msg if isinstance(record.msg, dict) else {"text": str(record.msg)}
        row = {"step": getattr(record, "step", None), "time": time.time(), **msg}
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")
        if "train" in msg:
            self.steps += 1
            if msg.get("epoch") != self.epoch:
                self.epoch, self.epoch_first_step = msg.get("epoch"), self.steps
            elapsed = time.monotonic() - self.start
            total = self.total()
            rate = self.steps / max(elapsed, 1e-6)
            write_json(self.progress_path, {
                "step": "train", "state": "running", "done": self.steps, "total": total, "unit": "batches",
                "epoch": msg.get("epoch"), "loss": msg["train"].get("loss"), "tokens_per_s": None,
                "elapsed_s": round(elapsed, 1),
                "eta_s": round((total - self.steps) / rate, 1) if rate and total > self.steps else None,
                "message": "", "updated": time.time()})


def build_model(cfg, device):
    from speculators.config import SpeculatorsConfig, VerifierConfig  # noqa: PLC0415
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: PLC0415
    from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: PLC0415
    from transformers import LlamaConfig  # noqa: PLC0415

    tc = text_config(cfg)
    d2t, t2d = vocab.load(cfg)
    extract_cfg = read_json(run_path(cfg, "extract", "data_config.json"))
    layer_cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        hidden_act=getattr(tc, "hidden_act", "silu"), max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6), num_hidden_layers=int(cfg["train"]["num_layers"]),
        head_dim=tc.hidden_size // tc.num_attention_heads)
    attention = cfg["train"]["attention"]
    if attention == "auto":
        attention = "simple_flex_attention" if device == "cuda" else cpu_attention.register()
    elif attention == cpu_attention.NAME:
        cpu_attention.register()
    layer_cfg._attn_implementation = attention  # noqa: SLF001 - the switch transformers reads per layer
    spec_cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg, draft_vocab_size=int(d2t.shape[0]), norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=vllm_layer_ids(extract_cfg["layer_ids"][:-1]),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=int(cfg["export"]["speculative_tokens"]))],
            verifier=VerifierConfig(name_or_path=cfg["target"]["path"],
                                    architectures=list(target_config(cfg).architectures or ["LlamaForCausalLM"]))))
    return Eagle3DraftModel(config=spec_cfg, t2d=t2d, d2t=d2t)


def sample_files(extract_dir):
    """data_<id>.pt files of EXTRACT_DIR ordered by id (never in the directory's own order)."""
    found = [p for p in Path(extract_dir).glob("data_*.pt") if p.stem[5:].isdigit()]
    return [str(p) for p in sorted(found, key=lambda p: int(p.stem[5:]))]


def split_samples(files, ratio, seed):
    """(train, val): a shuffle seeded by SEED of FILES (given in a fixed order), the first RATIO for training."""
    order = list(files)
    random.Random(seed).shuffle(order)
    n = int(len(order) * ratio)
    return order[:n], order[n:]


def loaders(cfg, world_size, rank):
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn  # noqa: PLC0415
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2  # noqa: PLC0415
    from torch.utils.data import DataLoader  # noqa: PLC0415

    total = int(cfg["train"]["total_seq_len"])
    train_files, val_files = split_samples(sample_files(run_path(cfg, "extract")), 0.9, int(cfg["train"]["seed"]))
    out = []
    for files in (train_files, val_files):
        ds = Eagle3SampleFileDataset(max_len=total, file_list=files)
        sampler = MultipackDistributedBatchSamplerV2(batch_max_length=total, lengths=ds.approx_lengths,
                                                     num_replicas=world_size, rank=rank)
        out.append(DataLoader(ds, batch_sampler=sampler, num_workers=0, collate_fn=create_collate_fn(total)))
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        return train(argv)
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        cfg = tracks.load(argv[0])
        out = Path(argv[2]) if len(argv) > 2 else run_path(cfg, "train")
        path = getattr(exc, "filename", None) or out / "checkpoints"
        logging.getLogger("specdec_pipeline").debug("disk full", exc_info=True)
        print(f"ERROR: {disk_full_error('train', path, None)}", file=sys.stderr, flush=True)
        return 28


def train(argv):
    from speculators.train.trainer import Trainer, TrainerConfig  # noqa: PLC0415
    from speculators.train.utils import maybe_destroy_distributed, maybe_setup_distributed  # noqa: PLC0415

    cfg = tracks.load(argv[0])
    os.environ.update(remote_code.switch_env(cfg))  # the patched speculators (t01) reads the switch
    device = argv[1]
    setup_logging(run_path(cfg, "logs", "train.log"))
    torch.manual_seed(int(cfg["train"]["seed"]))
    local_rank, world_size, rank, is_distributed = maybe_setup_distributed()
    train_loader, val_loader = loaders(cfg, world_size, rank)
    model = build_model(cfg, device)
    if is_distributed:  # speculators' FSDP start would leave the norms uninitialised (see fsdp_init)
        fsdp_init.make_norms_resettable(model)
    out = Path(argv[2]) if len(argv) > 2 else run_path(cfg, "train")
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        metrics = logging.getLogger("speculators.metrics")
        metrics.setLevel(logging.INFO)
        metrics.addHandler(MetricsFile(out / "metrics.jsonl", run_path(cfg, "progress.json"),
                                       int(cfg["train"]["epochs"]), len(train_loader)))
    ckpt = out / "checkpoints"
    # speculators 0.3.0's single-process checkpointer reloads onto cuda:0; its distributed one (torchrun) onto the CPU.
    resume = device == "cuda" or is_distributed
    tcfg = TrainerConfig(
        lr=float(cfg["train"]["lr"]), num_epochs=int(cfg["train"]["epochs"]), save_path=str(ckpt),
        resume_from_checkpoint=resume, is_distributed=is_distributed,
        local_rank=local_rank if device == "cuda" else "cpu",
        train_call_kwargs={"ttt_steps": int(cfg["train"]["ttt_steps"]),
                           "ttt_step_loss_decay": float(cfg["train"]["ttt_step_loss_decay"])},
        val_call_kwargs={"ttt_steps": int(cfg["train"]["ttt_steps"]),
                         "ttt_step_loss_decay": float(cfg["train"]["ttt_step_loss_decay"])})
    Trainer(model, tcfg, train_loader, val_loader).run_training()
    maybe_destroy_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
