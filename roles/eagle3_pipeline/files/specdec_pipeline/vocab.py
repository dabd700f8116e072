"""Step 3 - vocab: draft vocabulary from this run's token frequencies (speculators' own mapping function).

Writes vocab/d2t.npy (int64 offsets, draft -> target) and vocab/t2d.npy (bool mask over the target vocab).
"""

import shutil
import time

from specdec_pipeline import manifest
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, recover_swap, staging_dir, swap_in
from specdec_pipeline.target import text_config


def _save_npy(dest, array):
    import numpy as np  # noqa: PLC0415 - heavy: imported when the step runs

    def check(p):
        back = np.load(p)
        if back.shape != array.shape or back.dtype != array.dtype:
            raise ValueError(f"{dest}: written array does not read back")

    with atomic_path(dest, validate=check) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)


def run(cfg):
    import torch  # noqa: PLC0415 - heavy: imported when the step runs

    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution  # noqa: PLC0415

    started = time.time()
    freq = torch.load(run_path(cfg, "prepare", "token_freq.pt"), weights_only=True)
    target_vocab = int(text_config(cfg).vocab_size)
    draft_vocab = int(cfg["vocab"]["draft_vocab_size"])
    if not 0 < draft_vocab <= target_vocab:
        raise PipelineError(f"vocab.draft_vocab_size {draft_vocab}: expected 1..{target_vocab} (the target vocab of "
                            f"{cfg['target']['path']}); lower eagle3_pipeline_draft_vocab_size.")
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab, target_vocab)
    # Both files are built in vocab.new and replace the earlier pair together.
    final = run_path(cfg, "vocab")
    recover_swap(final)
    out = staging_dir(final)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _save_npy(out / "d2t.npy", d2t.numpy())
    _save_npy(out / "t2d.npy", t2d.numpy())
    swap_in(out, final)
    out = final
    masked_total = sum(freq.values())
    covered = sum(c for tid, c in freq.items() if t2d[int(tid)])
    counts = {"draft_vocab_size": draft_vocab, "target_vocab_size": target_vocab,
              "distinct_masked_tokens": len(freq), "masked_tokens": masked_total,
              "coverage": round(covered / masked_total, 6) if masked_total else 0.0}
    return manifest.write(cfg, "vocab", [out / "d2t.npy", out / "t2d.npy"], counts, started)


def load(cfg):
    import numpy as np  # noqa: PLC0415 - heavy: imported when the step runs
    import torch  # noqa: PLC0415

    out = run_path(cfg, "vocab")
    return torch.from_numpy(np.load(out / "d2t.npy")), torch.from_numpy(np.load(out / "t2d.npy"))
