"""The evaluate stage's measuring: one vLLM server per variant (serve.VllmServer), the same prompts, the counters.

For a variant it starts vLLM's OpenAI server on 127.0.0.1 (a free port, a random API key, ready only when the
listening socket is the server's own, timeout, always stopped), sends every prompt set at every concurrency level
(the rendered prompts as /v1/completions requests, the recorded sampling settings), reads the spec-decode counters
from /metrics before and after each batch, and checks that the server's finished-request counter grew by exactly
the number of requests sent and that the server still owns its port. The control draft is the export's shape with
random weights.
"""

import concurrent.futures
import json
import sys
import threading
import time
from pathlib import Path

from specdec_pipeline import metrics, remote_code
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, read_json, sha256_file, sha256_json, write_json
from specdec_pipeline.serve import (
    SERVED_NAME,
    HttpError,
    NoAnswer,
    VllmServer,
    free_port,
    vllm_argv,
)
from specdec_pipeline.server_args import TRUST_ARG, owned_arg


NGRAM = "ngram"  # vLLM's prompt-lookup speculation: a variant without a draft model


def speculative_config(cfg, draft_dir, method="eagle3", tokens=None):
    """vLLM's --speculative-config of a variant, None for the target alone: the draft in DRAFT_DIR served with METHOD
    (the draft's algorithm, evaluate_drafts.specs), or n-gram lookup (METHOD ngram, no draft; CFG's lookup sizes),
    with TOKENS draft tokens per step (CFG's num_speculative_tokens by default)."""
    tokens = tokens or cfg["num_speculative_tokens"]
    if method == NGRAM:
        return {"method": NGRAM, "num_speculative_tokens": tokens, "prompt_lookup_min": cfg["ngram_lookup_min"],
                "prompt_lookup_max": cfg["ngram_lookup_max"]}
    if draft_dir:
        return {"method": method, "model": str(draft_dir), "num_speculative_tokens": tokens}
    return None


def server_argv(cfg, draft_dir, port=None, method="eagle3", tokens=None):
    """The evaluation server's command line: CFG's python and target, the seed, --trust-remote-code with the stage's
    switch on, the user's server_args and, when it speculates, the speculative config (speculative_config)."""
    trust = [TRUST_ARG] if cfg["trust_remote_code"] and not owned_arg(cfg["server_args"], (TRUST_ARG,)) else []
    argv = [*vllm_argv(cfg["python"], cfg["target"], port or cfg["port"]), "--seed", str(cfg["seed"]), *trust,
            *map(str, cfg["server_args"])]
    spec = speculative_config(cfg, draft_dir, method, tokens)
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv


def _post(srv, path, body, timeout):
    try:
        return srv.post(path, body, timeout)
    except HttpError as exc:
        raise PipelineError(f"evaluate: {exc.url} answered {exc.code}: {exc.detail}") from None
    except NoAnswer as exc:
        raise PipelineError(f"evaluate: request to {exc.url} failed ({exc.reason}); see the server log.") from None


def _metrics(srv):
    try:
        return srv.metrics()
    except (HttpError, NoAnswer) as exc:
        reason = exc.reason if isinstance(exc, NoAnswer) else f"HTTP Error {exc.code}: {exc.detail}"
        raise PipelineError(f"evaluate: cannot read {exc.url} ({reason}).") from None


def _request(srv, cfg, prompt):
    """One completion request: the prompt as rendered (token ids or text), the recorded sampling settings; stops at
    end-of-sequence unless ignore_eos (then exactly max_tokens)."""
    body = {"model": SERVED_NAME, "prompt": prompt["prompt"], "max_tokens": prompt.get("max_tokens", cfg["max_tokens"]),
            "temperature": float(cfg["temperature"]), "top_p": float(cfg["top_p"]), "seed": cfg["seed"],
            "ignore_eos": bool(cfg["ignore_eos"])}
    if cfg["ignore_eos"]:
        body["min_tokens"] = body["max_tokens"]
    started = time.monotonic()
    resp = _post(srv, "/v1/completions", body, cfg["request_timeout_s"])
    choice = resp["choices"][0]
    return {"tokens": int(resp["usage"]["completion_tokens"]), "seconds": time.monotonic() - started,
            "text": choice["text"], "finish_reason": choice.get("finish_reason")}


def _batch(srv, cfg, prompts, concurrency, answered=None):
    """PROMPTS sent with CONCURRENCY requests in flight; (answers in prompt order, wall seconds). ANSWERED, when
    given, is called with each answer as it arrives (from the sending threads)."""
    def one(prompt):
        answer = _request(srv, cfg, prompt)
        if answered:
            answered(answer)
        return answer

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(one, prompts))
    return done, time.monotonic() - started


def _warmup_prompts(cfg, psets):
    """The prompts measure() sends first to a fresh server, uncounted: the first set's first few."""
    return psets[0]["prompts"][: cfg["warmup_requests"]] if psets else []


def requests_per_variant(cfg, psets):
    """How many requests measure() sends to one variant's server: the warm-up, then every set at every level."""
    return len(_warmup_prompts(cfg, psets)) + sum(len(p["prompts"]) for p in psets) * len(cfg["concurrency"])


class _Ticker:
    """The stage's progress (progress.Progress) advanced by one request at a time, from several threads."""

    def __init__(self, prog, variant):
        self.prog, self.variant, self.lock, self.doing = prog, variant, threading.Lock(), ""

    def say(self, doing):
        self.doing = doing
        if self.prog:
            with self.lock:
                self.prog.step = f"evaluate {self.variant}"
                self.prog.update(force=True, message=doing)

    def answered(self, _answer):
        if self.prog:
            with self.lock:
                self.prog.update(done=self.prog.done + 1, message=self.doing)


def _figures(done, wall):
    tokens = sum(d["tokens"] for d in done)
    return {"requests": len(done), "output_tokens": tokens, "seconds": round(wall, 3),
            "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
            "mean_request_s": round(sum(d["seconds"] for d in done) / len(done), 4),
            "stopped_at_eos": sum(d["finish_reason"] == "stop" for d in done),
            "outputs_sha256": sha256_json([d["text"] for d in done])}


def measure(cfg, variant, draft_dir, psets, prog=None, method="eagle3", tokens=None):
    """One server for VARIANT (DRAFT_DIR: the draft, served with METHOD and TOKENS as server_argv takes them; None
    for the baseline and for n-gram speculation, METHOD ngram); every prompt set of PSETS at every concurrency level; PROG (progress.Progress), when given,
    counts each answered request. Returns {"variant",
    "draft", "server_startup_s", "sets": {name: figures}} where a set's figures hold one entry per concurrency level
    (tokens/s, and with a draft its own AL) and, with a draft, the AL and per-position acceptance over all its
    levels."""
    log_path = Path(cfg["run_dir"]) / "logs" / f"evaluate-serve-{variant}.log"
    # HF_HUB_OFFLINE=1 after server_env: nothing of the target (an auto_map's code included) comes from the hub
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", **cfg["server_env"], **remote_code.OFFLINE_ENV}
    print(f"evaluate: starting vLLM for {variant} (log {log_path})", file=sys.stderr, flush=True)
    port = cfg["port"] or free_port(cfg["host"])
    name = f"vLLM server ({variant})"
    sets = {}
    tick = _Ticker(prog, variant)
    speculates = speculative_config(cfg, draft_dir, method, tokens) is not None
    tick.say("starting vLLM")
    with VllmServer(server_argv(cfg, draft_dir, port, method, tokens), host=cfg["host"], port=port, env=env,
                    log_path=log_path, ready_timeout_s=cfg["ready_timeout_s"], ready_path="/health", name=name) as srv:
        who = f"evaluate: the {name}"

        def scrape():
            return _metrics(srv)

        def finished():
            return metrics.finished_requests(scrape(), who)

        warmup = _warmup_prompts(cfg, psets)
        tick.say("warm-up")
        for p in warmup:
            tick.answered(_request(srv, cfg, p))
        counted = metrics.check_finished(finished, 0, len(warmup), who)  # a fresh server: only our warm-up
        for pset in psets:
            prompts, levels, total = pset["prompts"], {}, None
            for level in cfg["concurrency"]:
                before = metrics.spec_decode(scrape())
                tick.say(f"{pset['name']} at concurrency {level}")
                done, wall = _batch(srv, cfg, prompts, level, tick.answered)
                counted += metrics.check_finished(finished, counted, len(prompts), who)
                after_text = scrape()
                fig = _figures(done, wall)
                if speculates:
                    after = metrics.spec_decode(after_text)
                    if not after["present"]:
                        raise PipelineError(f"evaluate: the {variant} server exported no spec-decode counters on "
                                            f"/metrics; it did not speculate (see {log_path}).")
                    counts = metrics.delta(after, before)
                    fig.update(metrics.summarise(counts))
                    total = counts if total is None else metrics.add(total, counts)
                levels[str(level)] = fig
                with atomic_path(Path(cfg["run_dir"]) / "evaluate" / f"metrics-{variant}.prom") as tmp:
                    tmp.write_text(after_text)
            entry = {"by_concurrency": levels}
            if total is not None:
                entry.update(metrics.summarise(total))
            sets[pset["name"]] = entry
            print(f"evaluate: {variant} on {pset['name']}: "
                  + ", ".join(f"{levels[str(c)]['output_tokens_per_s']} output tokens/s at concurrency {c}"
                              for c in cfg["concurrency"])
                  + (f"; AL {entry['acceptance_length']}" if speculates else ""), file=sys.stderr, flush=True)
        srv.check_ours()  # still our server: the counters read above are its own
        startup = srv.startup_s
    return {"variant": variant, "draft": str(draft_dir) if draft_dir else None, "server_startup_s": startup,
            "sets": sets}


def build_control_draft(export_dir, dest, seed=0):
    """A draft with the export's config and tensor shapes but random weights (d2t/t2d and 1-D tensors such as
    norms kept), written atomically; rebuilt only when the export changed."""
    import torch  # noqa: PLC0415 - the evaluation venv has torch through vLLM
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    export_dir, dest = Path(export_dir), Path(dest)
    src = export_dir / "model.safetensors"
    stamp = {"export_sha256": sha256_file(src), "seed": seed}
    if read_json(dest / "specdec_control.json") == stamp and (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, t in load_file(str(src)).items():
        if t.is_floating_point() and t.dim() >= 2:
            std = float(t.float().std()) or 0.02
            t = (torch.randn(t.shape, generator=gen) * std).to(t.dtype)
        tensors[name] = t.contiguous()
    with atomic_path(dest / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    for extra in ("config.json", "config.py", "generation_config.json"):
        if (export_dir / extra).exists():
            (dest / extra).write_bytes((export_dir / extra).read_bytes())
    write_json(dest / "specdec_control.json", stamp)
    return dest
