"""Server-side hidden-state extraction for the current track: vLLM's `extract_hidden_states` method.

The server is the pipeline's managed vLLM server (vllm_server: its launcher, settings and environment) with
`--speculative-config {"method": "extract_hidden_states", ...}` and a hidden-states KV connector. Each request is
a completion with max_tokens 1 over the prepared token ids; the connector writes the prompt's hidden states
[tokens, layers, hidden] and the token ids to one safetensors file and the response names it in
kv_transfer_params["hidden_states_path"]. Prefix caching is off: a cached prefix would not be recomputed, so its
rows would be missing.

What the answer names is not trusted: a file is taken only when its real path lies inside the run's staging
directory, it is a regular file (opened without following a link) and the pipeline user owns it (staged_file).
The requests carry the server's API key, and the server's finished-request counter must grow by exactly the
number of requests sent.

Taking a file (take_file) reads it once, through the descriptor those checks were made on: the sha256 and the
validation (check_tensors: from the stored bit patterns, without converting a value) come from the same bytes,
and after the rename the destination must be that very file. extract_batches runs the takes in threads of their
own (takers) while CONCURRENCY requests stay in flight, and hands the caller every file that is ready at once, so
that one ledger commit (one fsync) covers them all.
"""

import fcntl
import hashlib
import json
import os
import queue
import stat
import time
from concurrent.futures import ThreadPoolExecutor

from specdec_pipeline import metrics, vllm_server
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.serve import SERVED_NAME, HttpError, NoAnswer, bearer, get_text, post_json

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
    """The extraction server's command line: the managed server (vllm_server.argv) with the hidden-states method, its
    connector writing into STAGING_DIR, and prefix caching off."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}
    connector = kv_transfer_config(vllm_server.settings(cfg)["device"], cfg["current"]["hs_storage"], staging_dir)
    return vllm_server.argv(cfg, port, method=["--no-enable-prefix-caching", "--speculative-config", json.dumps(spec),
                                               "--kv-transfer-config", json.dumps(connector)])


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


def _open_staged(real):
    """(descriptor, fstat) of the staged file REAL, opened without following a link and checked: a regular file
    owned by the user running the pipeline. Anything else raises PipelineError (the descriptor closed)."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise PipelineError(f"extract: the hidden-states file {real} the server named cannot be opened without "
                            f"following links ({exc.strerror}); nothing was taken.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PipelineError(f"extract: {real}, named by the server as a hidden-states file, is not a regular file; "
                                "nothing was taken.")
        if st.st_uid != os.geteuid():
            raise PipelineError(f"extract: {real}, named by the server as a hidden-states file, is owned by uid "
                                f"{st.st_uid}, not by the pipeline user (uid {os.geteuid()}); another user wrote into "
                                f"the staging directory {os.path.dirname(real)} - make it writable by the pipeline "
                                "user only.")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def staged_file(path, staging_dir):
    """PATH as a validated real path: inside STAGING_DIR, a regular file (the last component opened without
    following a link) owned by the user running the pipeline. Anything else raises PipelineError."""
    real = _in_staging(path, staging_dir)
    fd, dummy = _open_staged(real)
    os.close(fd)
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


FP8_MAX = 448.0  # the largest float8_e4m3fn value
F32_MAX = 3.4028234663852886e38


def _bad_rows(hs, scales):
    """(any value NaN or Inf, [tokens, layers] mask of rows that are exactly zero) of the stored hidden states HS
    (bfloat16, or float8_e4m3fn with SCALES), read from the bit patterns - no value is converted: bf16 is non-finite
    when its exponent bits are all set and zero when all bits but the sign are clear; float8_e4m3fn has no Inf, is
    NaN when its 7 low bits are all set, zero when they are all clear. A dequantized row (value x scale) is zero when
    its values are or its scale is. None where the layout is not one of these (the caller then dequantizes)."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if hs.dtype == torch.bfloat16:
        bits = hs.contiguous().view(torch.int16).numpy().view(np.uint16)
        return bool(((bits & 0x7F80) == 0x7F80).any()), ~(bits & 0x7FFF).any(axis=-1)
    if hs.dtype != torch.float8_e4m3fn or scales is None or scales.dim() != hs.dim() or any(
            n != 1 for n in scales.shape[1:]) or scales.shape[0] != hs.shape[0]:
        return None
    per_token = scales.reshape(-1).to(torch.float32).numpy()
    if not np.isfinite(per_token).all():
        return True, None
    if per_token.size and float(np.abs(per_token).max()) * FP8_MAX >= F32_MAX:
        return None  # a product could overflow: dequantize
    mag = hs.contiguous().view(torch.uint8).numpy() & 0x7F
    if (mag == 0x7F).any():
        return True, None
    return False, ~mag.any(axis=-1) | (per_token == 0)[:, None]


def check_tensors(tensors, input_ids, n_layers, hidden, storage, name):
    """Raise ValueError (naming NAME) unless TENSORS, a hidden-states file as stored, hold the hidden states of
    INPUT_IDS as the extraction promises: the token ids, the shape, the stored dtype, every value finite, no
    captured row exactly zero."""
    import torch  # noqa: PLC0415

    if tensors["token_ids"].tolist() != list(input_ids):
        raise ValueError(f"{name}: token_ids differ from the prepared sample")
    hs = tensors["hidden_states"]
    shape = tuple(hs.shape)
    if shape != (len(input_ids), n_layers, hidden):
        raise ValueError(f"{name}: hidden_states shape {shape}, expected ({len(input_ids)}, {n_layers}, {hidden})")
    stored = str(hs.dtype).removeprefix("torch.")
    want = "float8_e4m3fn" if storage == "fp8" else "bfloat16"
    if stored != want:
        raise ValueError(f"{name}: hidden_states stored as {stored}, expected {want} ({storage})")
    scales = tensors.get(SCALES_KEY)
    found = _bad_rows(hs, scales)
    if found is None:  # an unusual layout: the values themselves
        values = hs.to(torch.float32) * scales.to(torch.float32) if scales is not None else hs.float()
        found = (not bool(torch.isfinite(values).all()), (values.norm(dim=-1) == 0).numpy())
    nonfinite, zero = found
    if nonfinite:
        raise ValueError(f"{name}: hidden_states hold NaN or Inf")
    # A forward pass never leaves a captured row exactly zero; all-zero rows are a capture that wrote nothing (an
    # extraction that trains a draft to nothing: speculators #613, vLLM #46301).
    if zero.any():
        cols = sorted({int(c) for c in zero.nonzero()[1]})
        raise ValueError(f"{name}: hidden_states all zero in {int(zero.any(axis=1).sum())} of {zero.shape[0]} tokens "
                         f"(captured layer positions {cols})")


def check_file(path, input_ids, n_layers, hidden, storage):
    """Raise ValueError unless PATH holds the hidden states of INPUT_IDS as the extraction promises
    (check_tensors)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    check_tensors(load_file(str(path), device="cpu"), input_ids, n_layers, hidden, storage, path)


def take_file(path, staging_dir, dest, input_ids, n_layers, hidden, storage):
    """Take the connector's file PATH (the hidden states of INPUT_IDS) to DEST: wait until its write is done, read
    it once through a descriptor checked as staged_file checks, hash and validate those bytes (check_tensors;
    ValueError), rename it to DEST and check that DEST is the file that was read. Returns {"size", "sha256",
    "wait_s" (waiting for the connector's write), "busy_s" (the rest)}."""
    from safetensors import SafetensorError  # noqa: PLC0415
    from safetensors.torch import load  # noqa: PLC0415

    started = time.monotonic()
    real = _in_staging(path, staging_dir)
    wait_written(real)
    waited = time.monotonic() - started
    fd, st = _open_staged(real)
    with open(fd, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as exc:
        raise ValueError(f"{real}: not a safetensors file ({exc}; {len(data)} bytes)") from None
    check_tensors(tensors, input_ids, n_layers, hidden, storage, real)
    os.replace(real, dest)
    now = os.lstat(dest)
    if (now.st_dev, now.st_ino, now.st_size) != (st.st_dev, st.st_ino, len(data)):
        raise PipelineError(f"extract: {real} changed while it was taken (now {now.st_size} bytes, {len(data)} read); "
                            f"something else writes into the staging directory {os.path.dirname(real)} - make it "
                            "writable by the pipeline user only; nothing was recorded.")
    return {"size": len(data), "sha256": digest, "wait_s": waited, "busy_s": time.monotonic() - started - waited}


def _staged(real, staging_dir):
    """The validated staged path REAL once the connector's write is done."""
    wait_written(real)
    return staged_file(real, staging_dir)


def takers(concurrency):
    """How many threads take files: one per request in flight (at least 2, at most 64). A take mostly waits - for
    the connector's write, which lands in a later engine step than the answer - and needs about a millisecond of
    CPU per file, so the takers are sized for the files in flight, not for the CPUs."""
    return max(2, min(int(concurrency), 64))


MAX_BATCH = 256  # files handed over at once at most (one ledger commit each)


def pipelined(todo, ask, take, concurrency, n_takers):
    """Yield lists of (sample, TAKE(sample, ASK(sample))) for the samples of TODO in the order they finish, every
    one that is ready at the time in one list: ASK runs in CONCURRENCY threads, TAKE in N_TAKERS threads of its
    own, so that the next requests are sent while files are taken. A failed ASK or TAKE ends the iteration with
    its error, after the ones that finished before it were yielded; what is still in flight is then cancelled
    or waited for."""
    ready = queue.SimpleQueue()
    asks = ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="extract-request")
    takes = ThreadPoolExecutor(max_workers=max(1, int(n_takers)), thread_name_prefix="extract-take")

    def one(sample):
        answer = ask(sample)
        takes.submit(take, sample, answer).add_done_callback(lambda fut: ready.put((sample, fut)))

    def failed(sample, fut):
        if not fut.cancelled() and fut.exception() is not None:
            ready.put((sample, fut))

    try:
        for sample in todo:
            asks.submit(one, sample).add_done_callback(lambda fut, sample=sample: failed(sample, fut))
        left = len(todo)
        while left:
            items = []
            while not items:
                try:
                    items.append(ready.get(timeout=1.0))
                except queue.Empty:
                    continue
            while len(items) < MAX_BATCH:
                try:
                    items.append(ready.get_nowait())
                except queue.Empty:
                    break
            left -= len(items)
            done, error = [], None
            for sample, fut in items:
                try:
                    done.append((sample, fut.result()))
                except Exception as exc:  # noqa: BLE001 - raised below, after the finished ones were handed over
                    error = error or exc
            if done:
                yield done
            if error is not None:
                raise error
    finally:
        asks.shutdown(wait=True, cancel_futures=True)
        takes.shutdown(wait=True, cancel_futures=True)


def extract_batches(base_url, todo, concurrency, timeout, staging_dir, api_key="", take=None, n_takers=None):
    """Yield lists of (sample, TAKE(sample, real path of the file the server named)) as the server finishes them
    (pipelined: CONCURRENCY requests in flight, the takes in threads of their own); without TAKE, the validated
    staged path once the connector's write is done. When all are done, check that the server counted exactly the
    requests sent."""
    before = finished_requests(base_url, api_key)

    def ask(sample):  # the path is checked before its lock file is touched
        return _in_staging(request_hidden_states(base_url, sample["input_ids"], timeout, api_key), staging_dir)

    take = take or (lambda dummy, real: _staged(real, staging_dir))
    yield from pipelined(todo, ask, take, concurrency, n_takers or takers(concurrency))
    metrics.check_finished(lambda: finished_requests(base_url, api_key), before, len(todo),
                           "extract: the extraction server")


def extract_all(base_url, todo, concurrency, timeout, staging_dir, api_key="", take=None, n_takers=None):
    """extract_batches, one (sample, result) at a time."""
    for batch in extract_batches(base_url, todo, concurrency, timeout, staging_dir, api_key, take, n_takers):
        yield from batch
