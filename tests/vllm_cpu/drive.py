"""Run the pipeline's vLLM backend (speculators' generator, whatever copy is first on PYTHONPATH) on a target.

    python drive.py TARGET_DIR SEQ_LENGTH [--provoke-split]

Feeds two batches (two generate() calls: p07's failure shows only on the second) of random token ids, one
sample of exactly SEQ_LENGTH tokens in each, and prints one JSON line: {"ok": true, "shapes": ...} or
{"ok": false, "error": "<type>: <message>", "where": [files of the traceback]}.

--provoke-split lowers the generator's scheduler budget below one batch so that vLLM splits a request over
two steps (speculators issue #279), bypassing the backend's own packing; the backend must notice.
"""

import json
import sys
import traceback


def main():
    target, seq = sys.argv[1], int(sys.argv[2])
    provoke = "--provoke-split" in sys.argv
    import torch

    from specdec_pipeline.tracks.patched.backends.vllm_backend import VllmBackend

    # the tiny Llama target has no code of its own (the pipeline's config defaults the switch off as well)
    cfg = {"seq_length": seq, "target": {"path": target, "trust_remote_code": False},
           "extract": {"gpu_memory_utilization": 0.8, "tensor_parallel_size": 1, "batch_size": 8,
                       "max_num_batched_tokens": 8192}}
    gen = torch.Generator().manual_seed(0)
    vocab = 300
    lengths = [seq, 17, 40, seq, 33]
    samples = [{"id": i, "input_ids": torch.randint(5, vocab, (n,), generator=gen).tolist()}
               for i, n in enumerate(lengths)]
    try:
        backend = VllmBackend(cfg, [2, 4, 5, 7], torch.bfloat16)
        shapes = []
        if provoke:
            backend.generator.scheduler.max_num_scheduled_tokens = seq + 8
            batches = [samples[:3]]
        else:
            batches = [samples[:3], samples[3:]]
        for batch in batches:
            for s, hs in zip(batch, backend.run(batch)):
                shapes.append([len(s["input_ids"])] + [list(h.shape) for h in hs])
        backend.close()
        print(json.dumps({"ok": True, "shapes": shapes}))
    except Exception as exc:  # noqa: BLE001 - the test asserts on the message
        frames = [f.filename.rsplit("/", 1)[-1] for f in traceback.extract_tb(exc.__traceback__)]
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}", "where": frames}))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
