#!/usr/bin/env bash
# Run the current track's GPU proof (tests/gpu/current_proof.py) on a machine with an NVIDIA GPU and no network.
#
#   tests/gpu/fetch-current DEST CODE_LM_DIR [KIMI_DIR]  # where PyPI is reachable: vLLM 0.26.0 (CUDA), its
#                                                # dependencies, speculators 0.9.0, hs-connectors 0.9.0, the code LM,
#                                                # HEAD, the mini-Kimi when given (KIMI_TARGET on the GPU machine)
#   tests/gpu/run-current.sh DEST/b* [OUT_DIR]   # on the GPU machine, from the repository root
#
# Each BUNDLE argument is copied to $CURRENT_STAGE (default /tmp/specdec-gpu); once every file of the MANIFEST has
# arrived (bundles may come in separate calls) it is checked, installed there (vLLM unpacked, wheels installed
# with pip --target, the code LM assembled, HEAD's snapshot unpacked) and the proof runs from the snapshot, so
# what runs is a commit. CURRENT_PROOF_STAGE_ONLY=1 stops after staging/installing; CURRENT_PROOF_BACKGROUND=S
# starts the proof in its own session and waits at most S seconds; run-current.sh --wait S [OUT_DIR] waits again.
# CURRENT_PROOF_TREE=DIR runs the proof from DIR (e.g. `.`, the checkout the command runs in, with commits made after
# the bundles were packed; CURRENT_PROOF_COMMIT then names it) instead of the bundles' snapshot.
# The machine needs python3 3.12 with a CUDA build of torch 2.11.0, transformers 5.x, safetensors, numpy.
set -euo pipefail
stage=${CURRENT_STAGE:-/tmp/specdec-gpu}
mkdir -p "$stage/in"
wait_s=""
if [ "${1:-}" = --wait ]; then wait_s=${2:?usage: run-current.sh --wait SECONDS [OUT_DIR]}; shift 2; fi
bundles=()
while [ $# -gt 0 ] && [ -f "$1/MANIFEST" ]; do bundles+=("$1"); shift; done
out=${1:-gpu-proof-current}
for b in "${bundles[@]}"; do cp -r "$b"/. "$stage/in/"; done

report() {  # the proof's state, then up to WAIT seconds for it to end
  local deadline=$(( $(date +%s) + $1 ))
  while [ -f "$stage/proof.pid" ] && kill -0 "$(cat "$stage/proof.pid")" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 5
  done
  tail -n 40 "$stage/proof.log" 2>/dev/null || true
  if [ -f "$stage/proof.rc" ]; then echo "proof ended: exit $(cat "$stage/proof.rc")"; else echo "proof still running"; fi
}
if [ -n "$wait_s" ]; then report "$wait_s"; exit 0; fi

if [ ! -f "$stage/installed" ]; then
  missing=$(cd "$stage/in" && awk '{print $2}' MANIFEST | while read -r f; do [ -f "$f" ] || echo "$f"; done)
  if [ -n "$missing" ]; then
    echo "staged $(ls "$stage/in" | wc -l) entries; still missing: $(echo "$missing" | wc -l) files (send the other bundles)"
    exit 0
  fi
  (cd "$stage/in" && sha256sum -c --quiet MANIFEST)
  mkdir -p "$stage/vsite"
  if command -v zstd >/dev/null; then
    cat "$stage"/in/vllm.tar.zst.* | zstd -dc | tar -C "$stage/vsite" -xf -
  else  # the zstandard wheel carried along
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$stage/zs" "$stage"/in/zstandard-*.whl
    cat "$stage"/in/vllm.tar.zst.* | PYTHONPATH="$stage/zs" python3 -c "import sys, tarfile, zstandard
tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(sys.stdin.buffer), mode='r|').extractall(sys.argv[1])" \
      "$stage/vsite"
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$stage/dsite" \
    $(ls "$stage"/in/*.whl | grep -v /zstandard-)
  python3 -m compileall -q -j 0 "$stage/vsite/vllm" "$stage/dsite" >/dev/null 2>&1 || true
  mkdir -p "$stage/tree" && tar -C "$stage/tree" -xzf "$stage/in/tree.tar.gz"
  rm -rf "$stage/model" && cp -r "$stage/in/model" "$stage/model"
  if [ -d "$stage/in/kimi" ]; then rm -rf "$stage/kimi" && cp -r "$stage/in/kimi" "$stage/kimi"; fi
  touch "$stage/installed"
  echo "installed: vLLM, $(ls "$stage"/in/*.whl | wc -l) wheels, the code LM, tree at $(cat "$stage/in/COMMIT")"
fi
[ "${CURRENT_PROOF_STAGE_ONLY:-0}" = 1 ] && exit 0

export PYTHONPATH="$stage/vsite:$stage/dsite${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -d "$stage/kimi" ]; then export KIMI_TARGET=${KIMI_TARGET:-$stage/kimi}; fi
tree=$stage/tree
if [ -n "${CURRENT_PROOF_TREE:-}" ]; then  # a copy: later calls may change the checkout under a running proof
  rm -rf "$stage/live" && mkdir -p "$stage/live"
  tar -C "$CURRENT_PROOF_TREE" --exclude=./.cache --exclude=./.git --exclude=./.venv --exclude=./collections -cf - . \
    | tar -C "$stage/live" -xf -
  tree=$stage/live
fi
[ -n "${CURRENT_PROOF_TREE:-}" ] || CURRENT_PROOF_COMMIT=$(cat "$stage/in/COMMIT")
export CODE_LM=${CODE_LM:-$stage/model} CURRENT_PROOF_OUT=$(realpath -m "$out") CURRENT_PROOF_COMMIT=${CURRENT_PROOF_COMMIT:-unknown}
if [ -n "${CURRENT_PROOF_BACKGROUND:-}" ]; then
  rm -f "$stage/proof.rc"
  setsid bash -c "python3 '$tree/tests/gpu/current_proof.py' > '$stage/proof.log' 2>&1; echo \$? > '$stage/proof.rc'" \
    < /dev/null > /dev/null 2>&1 &
  echo $! > "$stage/proof.pid"
  report "$CURRENT_PROOF_BACKGROUND"
  exit 0
fi
exec python3 "$tree/tests/gpu/current_proof.py"
