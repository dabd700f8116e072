#!/usr/bin/env bash
# Serve a pipeline run's drafts, trained elsewhere (e.g. on the CPU), on a GPU machine without network: the evaluate
# stage's own command (python -m specdec_pipeline.evaluate) on a copy of the run, after run-current.sh staged vLLM
# 0.26.0 and its dependencies (tests/gpu/fetch-current's bundles; the code LM is the target).
#
#   tests/gpu/run-current.sh DEST/bN            # back to back, one bundle a call (CURRENT_PROOF_STAGE_ONLY=1)
#   tests/gpu/evaluate-carried.sh RUN_DIR OUT   # RUN_DIR: the run's export*/, prepare/, manifests/ (no extract/)
#
# EVAL_DRAFTS (default "eagle3 dflash"; at least one: the stage measures the target alone only beside drafts, and
# last), EVAL_SETS (default "heldout"), EVAL_CONCURRENCY (default "1 8 32"), EVAL_PROMPTS_JSONL (the jsonl set's
# file, with "jsonl" in EVAL_SETS), EVAL_PROMPTS (32), EVAL_MAX_TOKENS (256), EVAL_NGRAM (false), EVAL_CHAT_MODE
# (instant), EVAL_COMPILE:
# "default" (vLLM's own: torch.compile, piecewise CUDA graphs for the target and the draft, full ones for decode
# steps) or "full" (CUDA graphs of the target's whole decode steps without torch.compile: faster starts, but the
# draft then runs eagerly, which costs EAGLE-3's three sequential draft passes more than DFlash's one).
# EVAL_TIMEOUT (default 420 s) bounds the stage so that what it measured comes back: each variant's figures are in
# OUT/evaluate.stderr as it finishes, results.json once all are measured.
set -euo pipefail
run_src=${1:?usage: evaluate-carried.sh RUN_DIR OUT}
out=$(realpath -m "${2:?usage: evaluate-carried.sh RUN_DIR OUT}")
stage=${CURRENT_STAGE:-/tmp/specdec-gpu}
here=$(cd "$(dirname "$0")/../.." && pwd)
if [ "${EVAL_DRAFTS-unset}" != unset ] && [ -z "${EVAL_DRAFTS// /}" ]; then
  echo "evaluate-carried: EVAL_DRAFTS is empty; name at least one draft (eagle3, dflash): the evaluate stage measures" \
    "the target alone only beside a draft" >&2
  exit 2
fi
[ -f "$stage/installed" ] || { echo "evaluate-carried: nothing staged in $stage (run tests/gpu/run-current.sh first)" >&2; exit 2; }
mkdir -p "$out"
run=/tmp/specdec-carried-run
rm -rf "$run" && mkdir -p "$run"  # a fresh evaluation: not the run's own evaluate/, report/ or logs/
for part in "$run_src"/*; do
  case $(basename "$part") in evaluate|report|logs|extract|train*) ;; *) cp -r "$part" "$run/" ;; esac
done
export PYTHONPATH="$stage/vsite:$stage/dsite" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# The stage asks its interpreter for vLLM's version with `python -I`, which ignores PYTHONPATH: a venv over the
# image's python3 whose .pth names the carried folders answers as an installed vLLM would.
venv=/tmp/specdec-eval-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages --without-pip "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # python3 may itself be a venv (the image's torch lives in one): its site folders too, after the carried ones
  { printf '%s\n' "$stage/vsite" "$stage/dsite"
    python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))'
  } > "$site/specdec-carried.pth"
fi
args='["--max-model-len", "2048", "--no-enable-prefix-caching", "--max-num-batched-tokens", "8192",
       "--dtype", "bfloat16", "--gpu-memory-utilization", "0.5"'
if [ "${EVAL_COMPILE:-default}" = full ]; then
  args+=', "--compilation-config", "{\"mode\": 0, \"cudagraph_mode\": \"FULL_DECODE_ONLY\"}"'
fi
args+=']'
list() { python3 -c 'import json, sys; print(json.dumps([int(x) if x.isdigit() else x for x in sys.argv[1:]]))' "$@"; }
# shellcheck disable=SC2086
cat > "$out/evaluate-config.json" <<EOF
{"run_dir": "$run", "target": "$stage/model", "python": "$venv/bin/python", "server_args": $args,
 "server_env": {}, "ready_timeout_s": 600, "drafts": $(list ${EVAL_DRAFTS:-eagle3 dflash}),
 "prompt_sets": $(list ${EVAL_SETS:-heldout}), "prompts_jsonl": "${EVAL_PROMPTS_JSONL:-}", "max_prompts": ${EVAL_PROMPTS:-32},
 "max_tokens": ${EVAL_MAX_TOKENS:-256}, "concurrency": $(list ${EVAL_CONCURRENCY:-1 8 32}), "baseline": true,
 "control": false, "ngram": ${EVAL_NGRAM:-false}, "chat_mode": "${EVAL_CHAT_MODE:-instant}"}
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/machine.txt" 2>&1 || true
started=$(date +%s)
rc=0
PYTHONPATH="$here/roles/eagle3_pipeline/files:$PYTHONPATH" timeout -s TERM -k 20 "${EVAL_TIMEOUT:-420}" \
  python3 -m specdec_pipeline.evaluate "$out/evaluate-config.json" run > "$out/evaluate.stdout" 2> "$out/evaluate.stderr" \
  || rc=$?
echo "evaluate: exit $rc after $(( $(date +%s) - started )) s" | tee -a "$out/evaluate.stderr"
cp "$run"/evaluate/results.json "$run"/report/evaluate.md "$out/" 2>/dev/null || true
mkdir -p "$out/details"  # few files come back from such a machine: the counters and the servers' lines in one
for f in "$run"/evaluate/metrics-*.prom; do [ -f "$f" ] && cp "$f" "$out/details/"; done
for f in "$run"/logs/evaluate-serve-*.log; do  # the backends vLLM chose, the start's last lines, any error
  [ -f "$f" ] || continue
  { grep -E -m 12 'backend|[Cc]uda ?graph|CUDAGraph|Error|error' "$f" || true; echo ...; tail -n 15 "$f"; } \
    > "$out/details/$(basename "$f" .log).txt"
done
tar -C "$out" -czf "$out/details.tgz" details && rm -rf "$out/details"
tail -n 30 "$out/evaluate.stderr"
exit 0
