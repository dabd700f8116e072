"""The managed vLLM server of the target: its settings, command line, environment and launcher - one home for the
steps that start one (regenerate on every track; the current track's extraction adds its method's arguments).

    port = vllm_server.port(cfg)
    with vllm_server.start(cfg, vllm_server.argv(cfg, port), port, log_path, name="regenerate server") as srv:
        ...

Its settings are declared here (SETTINGS, checked by check_settings) and added to the run configuration by
tracks.load. They lie in the configuration's SECTION, "current" - the track that brought the managed server; the
role renders that section on every track (templates/config.json.j2) and regenerate's hash covers its
max_model_len, so the name stays until every server user reads it through settings().

serve.py holds what every vLLM server shares, the evaluate stage's included (the server module, API key, lifecycle,
requests); this module what the pipeline's managed server adds: the extraction settings it runs with.
"""

import sys

from specdec_pipeline import config, remote_code
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.serve import VllmServer, free_port, vllm_argv
from specdec_pipeline.server_args import owned_arg

LAUNCHER = "specdec_pipeline.vllm_launch"  # the server ends with the pipeline, even on SIGKILL
SECTION = "current"
SETTINGS = {SECTION: {
    "device": "cuda",            # cuda | cpu (the CPU build: no GPU memory share; its KV cache in cpu_kvcache_gib)
    "port": 0,                   # 0: a free port is picked at start
    "ready_timeout_s": 1800,
    "request_timeout_s": 900,
    "max_model_len": None,       # None: seq_length + 1 (config.max_model_len)
    "language_model_only": False,
    "enforce_eager": False,
    "cpu_kvcache_gib": 2,
    "server_args": [],           # extra `vllm serve` arguments, last on the command line
}}
DEVICES = ("cuda", "cpu")


def settings(cfg):
    """The managed server's settings of CFG."""
    return cfg[SECTION]


def check_settings(cfg, where):
    """The server settings of CFG (read from WHERE), checked: one PipelineError naming the first problem."""
    srv = settings(cfg)
    if srv["device"] not in DEVICES:
        raise PipelineError(f"{where}: {SECTION}.device is {srv['device']!r}; expected 'cuda' or 'cpu'.")
    if not isinstance(srv["server_args"], list):
        raise PipelineError(f"{where}: {SECTION}.server_args is {srv['server_args']!r}; expected a list of "
                            "strings (eagle3_pipeline_server_args).")
    owned = owned_arg(srv["server_args"])
    if owned:
        raise PipelineError(f"{where}: {SECTION}.server_args (eagle3_pipeline_server_args) contains {owned!r}; the "
                            "pipeline sets the extraction server's host (127.0.0.1), port and API key itself - remove "
                            f"it ({SECTION}.port chooses a fixed port; 0 picks a free one).")


def argv(cfg, port, method=()):
    """The server's command line: the launcher, the target on 127.0.0.1:PORT, the extraction settings (dtype,
    context, parallelism, batching), METHOD (e.g. the extraction's hidden-states method), the GPU memory share on
    CUDA, the target's own code switch, language-model-only, eager mode and the configured server_args last."""
    srv, ext = settings(cfg), cfg["extract"]
    out = vllm_argv(sys.executable, cfg["target"]["path"], port, wrapper=[sys.executable, "-m", LAUNCHER])
    out += ["--dtype", config.extract_dtype(cfg),
            "--max-model-len", str(config.max_model_len(cfg, srv["max_model_len"])),
            "--tensor-parallel-size", str(ext["tensor_parallel_size"]),
            "--max-num-batched-tokens", str(ext["max_num_batched_tokens"]),
            *map(str, method)]
    if srv["device"] == "cuda":
        out += ["--gpu-memory-utilization", str(ext["gpu_memory_utilization"])]
    if cfg["target"]["trust_remote_code"]:
        out.append("--trust-remote-code")
    if srv["language_model_only"]:
        out.append("--language-model-only")
    if srv["enforce_eager"]:
        out.append("--enforce-eager")
    return out + [str(a) for a in srv["server_args"]]


def env(cfg):
    """The server's environment: offline (remote_code.OFFLINE_ENV), spawned workers, the KV cache size on the CPU
    build."""
    out = {**remote_code.OFFLINE_ENV, "TOKENIZERS_PARALLELISM": "false", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if settings(cfg)["device"] == "cpu":
        out["VLLM_CPU_KVCACHE_SPACE"] = str(settings(cfg)["cpu_kvcache_gib"])
    return out


def port(cfg):
    """The configured port, or a free one (0)."""
    return int(settings(cfg)["port"]) or free_port()


def request_timeout(cfg):
    return float(settings(cfg)["request_timeout_s"])


def start(cfg, command, at_port, log_path, name="vLLM server"):
    """The server of COMMAND (argv) on AT_PORT as a context manager (serve.VllmServer) with this module's
    environment and the configured ready timeout."""
    return VllmServer(command, port=at_port, env=env(cfg), log_path=log_path,
                      ready_timeout_s=float(settings(cfg)["ready_timeout_s"]), name=name)
