"""Server-side hidden-state extraction for the current track: vLLM's `extract_hidden_states` method.

The server is vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`: the same code as
`vllm serve`, and it also runs from vLLM's CPU build, whose distribution name `vllm serve` cannot find) with
`--speculative-config {"method": "extract_hidden_states", ...}` and a hidden-states KV connector. Each request is
a completion with max_tokens 1 over the prepared token ids; the connector writes the prompt's hidden states
[tokens, layers, hidden] and the token ids to one safetensors file and the response names it in
kv_transfer_params["hidden_states_path"]. Prefix caching is off: a cached prefix would not be recomputed, so its
rows would be missing.
"""

import fcntl
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed

from specdec_pipeline.errors import PipelineError

MODEL_NAME = "specdec-target"
SCALES_KEY = "hidden_states_scales"  # hs-connectors' FP8 layout: one float32 scale per token


def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def kv_transfer_config(device, storage, staging_dir):
    extra = {"shared_storage_path": str(staging_dir)}
    if device == "cpu":
        return {"kv_connector": "CpuHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_module_path": "specdec_pipeline.backends.current_cpu_connector",
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
    argv = [sys.executable, "-m", "specdec_pipeline.backends.current_launch",
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", cfg["target"]["path"], "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", ext["dtype"],
            "--max-model-len", str(cur["max_model_len"] or int(cfg["seq_length"]) + 1),
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
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if cfg["current"]["device"] == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg["current"]["cpu_kvcache_gib"])
    return env


def request_hidden_states(base_url, input_ids, timeout):
    """One completion over INPUT_IDS; returns the path of the hidden-states file the server wrote."""
    body = json.dumps({"model": MODEL_NAME, "prompt": list(input_ids), "max_tokens": 1,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - local http
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise PipelineError(f"extract: the server refused a request ({exc.code}: {detail}); see the server log.") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PipelineError(f"extract: no answer from the server at {base_url} ({exc}); see the server log.") from None
    prompt_ids = (answer.get("choices") or [{}])[0].get("prompt_token_ids")
    if prompt_ids is not None and list(prompt_ids) != list(input_ids):
        raise PipelineError("extract: the server tokenized the request differently from the prepared sample "
                            "(prompt_token_ids differ); the target's tokenizer and the prepared data disagree.")
    path = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
    if not path:
        raise PipelineError("extract: the server answered without kv_transfer_params.hidden_states_path; it does "
                            "not run the extract_hidden_states method with a hidden-states connector.")
    return path


def wait_written(path):
    """Block until the connector has released its write lock on PATH (then remove the lock file)."""
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
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


def extract_all(base_url, todo, concurrency, timeout):
    """Yield (sample, staged_path) as the server finishes them (CONCURRENCY requests in flight)."""
    with ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
        futures = {pool.submit(request_hidden_states, base_url, s["input_ids"], timeout): s for s in todo}
        try:
            for fut in as_completed(futures):
                path = fut.result()
                wait_written(path)
                yield futures[fut], path
        finally:
            for fut in futures:
                fut.cancel()
