"""Server-side hidden-state extraction for the current track: vLLM's `extract_hidden_states` method.

The server is vLLM's OpenAI-compatible server (serve.vllm_argv, started through launch.py) with
`--speculative-config {"method": "extract_hidden_states", ...}` and a hidden-states KV connector. Each request is
a completion with max_tokens 1 over the prepared token ids; the connector writes the prompt's hidden states
[tokens, layers, hidden] and the token ids to one safetensors file and the response names it in
kv_transfer_params["hidden_states_path"]. Prefix caching is off: a cached prefix would not be recomputed, so its
rows would be missing.

What the answer names is not trusted: a file is taken only when its real path lies inside the run's staging
directory, it is a regular file (opened without following a link) and the pipeline user owns it (staged_file).
The requests carry the server's API key, and the server's finished-request counter must grow by exactly the
number of requests sent.
"""

import fcntl
import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed

from specdec_pipeline import config, metrics, remote_code
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.serve import SERVED_NAME, HttpError, NoAnswer, bearer, get_text, post_json, vllm_argv

MODEL_NAME = SERVED_NAME
SCALES_KEY = "hidden_states_scales"  # hs-connectors' FP8 layout: one float32 scale per token


def kv_transfer_config(device, storage, staging_dir):
    extra = {"shared_storage_path": str(staging_dir)}
    if device == "cpu":
        return {"kv_connector": "CpuHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_module_path": "specdec_pipeline.tracks.current.backends.cpu_connector",
                "kv_connector_extra_config": dict(extra, specdec_storage=storage)}
    if storage == "fp8":
        return {"kv_connector": "FP8HiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_module_path": "hs_connectors.fp8_hidden_states_connector",
                "kv_connector_extra_config": extra}
    return {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
            "kv_connector_extra_config": extra}


def server_argv(cfg, layer_ids, staging_dir, port):
    cur, ext = cfg["current"], cfg["extract"]
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}
    argv = vllm_argv(sys.executable, cfg["target"]["path"], port,
                     wrapper=[sys.executable, "-m", "specdec_pipeline.tracks.current.backends.launch"])
    argv += ["--dtype", ext["dtype"],
             "--max-model-len", str(config.max_model_len(cfg, cur["max_model_len"])),
             "--tensor-parallel-size", str(ext["tensor_parallel_size"]),
             "--max-num-batched-tokens", str(ext["max_num_batched_tokens"]),
             "--no-enable-prefix-caching",
             "--speculative-config", json.dumps(spec),
             "--kv-transfer-config", json.dumps(kv_transfer_config(cur["device"], cur["hs_storage"], staging_dir))]
    if cur["device"] == "cuda":
        argv += ["--gpu-memory-utilization", str(ext["gpu_memory_utilization"])]
    if cfg["target"]["trust_remote_code"]:
        argv.append("--trust-remote-code")
    if cur["language_model_only"]:
        argv.append("--language-model-only")
    if cur["enforce_eager"]:
        argv.append("--enforce-eager")
    return argv + [str(a) for a in cur["server_args"]]


def server_env(cfg):
    env = {**remote_code.OFFLINE_ENV, "TOKENIZERS_PARALLELISM": "false", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if cfg["current"]["device"] == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg["current"]["cpu_kvcache_gib"])
    return env


def request_hidden_states(base_url, input_ids, timeout, api_key=""):
    """One completion over INPUT_IDS; returns the path of the hidden-states file the server named."""
    body = {"model": MODEL_NAME, "prompt": list(input_ids), "max_tokens": 1, "return_token_ids": True}
    try:
        answer = post_json(base_url + "/v1/completions", body, timeout, bearer(api_key))
    except HttpError as exc:
        raise PipelineError(f"extract: the server refused a request ({exc.code}: {exc.detail}); see the server log.") from None
    except NoAnswer as exc:
        raise PipelineError(f"extract: no answer from the server at {base_url} ({exc.reason}); see the server log.") from None
    prompt_ids = (answer.get("choices") or [{}])[0].get("prompt_token_ids")
    if prompt_ids is not None and list(prompt_ids) != list(input_ids):
        raise PipelineError("extract: the server tokenized the request differently from the prepared sample "
                            "(prompt_token_ids differ); the target's tokenizer and the prepared data disagree.")
    path = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
    if not path:
        raise PipelineError("extract: the server answered without kv_transfer_params.hidden_states_path; it does "
                            "not run the extract_hidden_states method with a hidden-states connector.")
    return path


def _in_staging(path, staging_dir):
    """The real path of PATH when it lies inside STAGING_DIR (links resolved), else PipelineError."""
    staging = os.path.realpath(staging_dir)
    real = os.path.realpath(str(path))
    if real == staging or os.path.commonpath([real, staging]) != staging:
        raise PipelineError(f"extract: the server named {str(path)!r} as a hidden-states file, whose real path "
                            f"{real} is not inside the staging directory {staging}; something other than the "
                            "pipeline's server answered on its port, or it is misconfigured - nothing was taken.")
    return real


def staged_file(path, staging_dir):
    """PATH as a validated real path: inside STAGING_DIR, a regular file (the last component opened without
    following a link) owned by the user running the pipeline. Anything else raises PipelineError."""
    real = _in_staging(path, staging_dir)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise PipelineError(f"extract: the hidden-states file {real} the server named cannot be opened without "
                            f"following links ({exc.strerror}); nothing was taken.") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise PipelineError(f"extract: {real}, named by the server as a hidden-states file, is not a regular file; "
                            "nothing was taken.")
    if st.st_uid != os.geteuid():
        raise PipelineError(f"extract: {real}, named by the server as a hidden-states file, is owned by uid "
                            f"{st.st_uid}, not by the pipeline user (uid {os.geteuid()}); another user wrote into the "
                            f"staging directory {os.path.dirname(real)} - make it writable by the pipeline user only.")
    return real


def wait_written(path):
    """Block until the connector has released its write lock on PATH (then remove the lock file)."""
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)
    try:
        os.unlink(lock)
    except FileNotFoundError:
        pass


def finished_requests(base_url, api_key=""):
    """The server's count of finished requests (vllm:request_success, all reasons) from GET /metrics."""
    try:
        text = get_text(base_url + "/metrics", 30, bearer(api_key))
    except (HttpError, NoAnswer) as exc:
        reason = exc.reason if isinstance(exc, NoAnswer) else f"HTTP Error {exc.code}: {exc.detail}"
        raise PipelineError(f"extract: cannot read {base_url}/metrics ({reason}); see the server log.") from None
    return metrics.finished_requests(text, "extract: the server")


def load_hidden_states(path):
    """{"token_ids", "hidden_states" (dequantized to float32 when stored as FP8), "stored_dtype"}."""
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file  # noqa: PLC0415

    data = load_file(str(path), device="cpu")
    hs = data["hidden_states"]
    stored = str(hs.dtype).removeprefix("torch.")
    if SCALES_KEY in data:
        hs = hs.to(torch.float32) * data[SCALES_KEY].to(torch.float32)
    return {"token_ids": data["token_ids"], "hidden_states": hs, "stored_dtype": stored}


def check_file(path, input_ids, n_layers, hidden, storage):
    """Raise ValueError unless PATH holds the hidden states of INPUT_IDS as the extraction promises."""
    import torch  # noqa: PLC0415

    data = load_hidden_states(path)
    if data["token_ids"].tolist() != list(input_ids):
        raise ValueError(f"{path}: token_ids differ from the prepared sample")
    shape = tuple(data["hidden_states"].shape)
    if shape != (len(input_ids), n_layers, hidden):
        raise ValueError(f"{path}: hidden_states shape {shape}, expected ({len(input_ids)}, {n_layers}, {hidden})")
    want = "float8_e4m3fn" if storage == "fp8" else "bfloat16"
    if data["stored_dtype"] != want:
        raise ValueError(f"{path}: hidden_states stored as {data['stored_dtype']}, expected {want} ({storage})")
    if not torch.isfinite(data["hidden_states"]).all():
        raise ValueError(f"{path}: hidden_states hold NaN or Inf")
    # A forward pass never leaves a captured row exactly zero; all-zero rows are a capture that wrote nothing (an
    # extraction that trains a draft to nothing: speculators #613, vLLM #46301).
    zero = data["hidden_states"].float().norm(dim=-1) == 0  # [tokens, captured layers]
    if zero.any():
        cols = sorted({int(c) for c in zero.nonzero()[:, 1]})
        raise ValueError(f"{path}: hidden_states all zero in {int(zero.any(dim=1).sum())} of {zero.shape[0]} tokens "
                         f"(captured layer positions {cols})")


def extract_all(base_url, todo, concurrency, timeout, staging_dir, api_key=""):
    """Yield (sample, validated staged path) as the server finishes them (CONCURRENCY requests in flight); when
    all are done, check that the server counted exactly the requests sent."""
    before = finished_requests(base_url, api_key)
    with ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
        futures = {pool.submit(request_hidden_states, base_url, s["input_ids"], timeout, api_key): s for s in todo}
        try:
            for fut in as_completed(futures):
                path = _in_staging(fut.result(), staging_dir)  # before touching its lock file
                wait_written(path)
                yield futures[fut], staged_file(path, staging_dir)
        finally:
            for fut in futures:
                fut.cancel()
    metrics.check_finished(lambda: finished_requests(base_url, api_key), before, len(todo),
                           "extract: the extraction server")
