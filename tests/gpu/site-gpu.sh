#!/usr/bin/env bash
# Run `ansible-playbook -i inventory/gpu-code site.yml` on a GPU machine without network, as a user with such a host
# runs it, from what tests/gpu/fetch-site packed; twice, so that the second run shows what a re-run changes.
#
#   tests/gpu/fetch-site DEST CODE_LM_DIR        # where PyPI is reachable
#   tests/gpu/site-gpu.sh DEST/b* [OUT_DIR]      # on the GPU machine, from the repository root, as root
#   tests/gpu/site-gpu.sh --wait S [OUT_DIR]     # wait up to S more seconds for the runs, then report
#
# Bundles may come in separate calls; once every file of the MANIFEST has arrived they are checked and placed where
# inventory/gpu-code expects them, root's and 0755 as the collection's root-run checks demand: the wheelhouse in
# /opt/specdec-wheelhouse (vLLM's wheel rebuilt from its parts; the ml_venv role checks SHA256SUMS), the code LM in
# /opt/specdec-models/code-lm-16m (and the mini-Kimi in /opt/specdec-models/mini-kimi where the bundles carry one),
# ansible-core in the venv /opt/specdec-controller, HEAD's snapshot in /opt/specdec-src. Debian's sudo package is
# installed only where the image has no sudo.
# SITE_GPU_STAGE_ONLY=1 stops after that; SITE_GPU_RUNS (default 2) runs of each inventory of SITE_GPU_INVENTORIES
# (default gpu-code; e.g. "gpu-code gpu-kimi") follow in their own session, and the call waits at most
# SITE_GPU_BACKGROUND (default 540) seconds for them; SITE_GPU_ARGS are added to each ansible-playbook
# command (e.g. "-e eagle3_pipeline_epochs=3"); SITE_GPU_TREE=. runs the checkout the command runs in instead of the
# bundles' snapshot (SITE_GPU_COMMIT names it). OUT_DIR (default site-gpu-out) receives the
# logs, each run's recap and wall time (runs.tsv), the image's pip freeze and the run's manifests and reports.
set -euo pipefail
stage=${SITE_GPU_STAGE:-/tmp/specdec-site}
src=/opt/specdec-src
mkdir -p "$stage/in"
wait_s=""
if [ "${1:-}" = --wait ]; then wait_s=${2:?usage: site-gpu.sh --wait SECONDS [OUT_DIR]}; shift 2; fi
bundles=()
while [ $# -gt 0 ] && [ -f "$1/MANIFEST" ]; do bundles+=("$1"); shift; done
out=$(realpath -m "${1:-site-gpu-out}")
for b in "${bundles[@]}"; do cp -r "$b"/. "$stage/in/"; done
export LC_ALL=C.UTF-8 LANG=C.UTF-8

collect() {  # what the runs left, small files only, into OUT_DIR
  mkdir -p "$out"
  cp "$stage"/run*.log "$stage"/runs.tsv "$stage"/image-freeze.txt "$stage"/machine.txt "$stage"/tree-commit "$out/" \
    2>/dev/null || true
  local run name
  for run in /opt/specdec-code/work/runs/*/; do
    [ -d "$run" ] || continue
    name=$(basename "$run"); [ "$name" = code-gpu ] && name=run  # run 8's records named the code LM's run "run"
    (cd "$run" && find . -type f -size -4M \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.log' \
      -o -name '*.png' -o -name '*.txt' -o -path './export*' \) -not -path './extract/*' | tar -cf - -T - 2>/dev/null) \
      | (mkdir -p "$out/$name" && tar -C "$out/$name" -xf -) || true
  done
}
report() {  # the runs' state, then up to WAIT seconds for them to end
  local deadline=$(( $(date +%s) + $1 ))
  while [ -f "$stage/runs.pid" ] && kill -0 "$(cat "$stage/runs.pid")" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 5
  done
  for log in "$stage"/run*.log; do [ -f "$log" ] && { echo "== $log"; tail -n 25 "$log"; }; done
  cat "$stage/runs.tsv" 2>/dev/null || true
  if [ -f "$stage/runs.done" ]; then echo "runs ended"; else echo "runs still going"; fi
  collect
}
if [ -n "$wait_s" ]; then report "$wait_s"; exit 0; fi

unzstd_to() {  # the parts on stdin, decompressed into $1 (zstd, else the zstandard wheel carried along)
  if command -v zstd >/dev/null; then zstd -q -dc > "$1"; else
    python3 -m pip install -q --no-index --no-deps --target "$stage/zs" "$stage"/in/controller/zstandard-*.whl
    PYTHONPATH="$stage/zs" python3 -c "import sys, zstandard
zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, open(sys.argv[1], 'wb'))" "$1"
  fi
}

if [ ! -f "$stage/installed" ]; then
  missing=$(cd "$stage/in" && awk '{print $2}' MANIFEST | while read -r f; do [ -f "$f" ] || echo "$f"; done)
  if [ -n "$missing" ]; then
    echo "staged $(cd "$stage/in" && find . -type f | wc -l) files; still missing: $(echo "$missing" | wc -l) (send the other bundles)"
    exit 0
  fi
  (cd "$stage/in" && sha256sum -c --quiet MANIFEST)
  umask 022
  rm -rf /opt/specdec-wheelhouse && install -d -m 0755 /opt/specdec-wheelhouse
  cp "$stage"/in/wheelhouse/* /opt/specdec-wheelhouse/
  cat "$stage"/in/vllm-wheel/part.* | unzstd_to "/opt/specdec-wheelhouse/$(cat "$stage/in/vllm-wheel/NAME")"
  chmod 0644 /opt/specdec-wheelhouse/*
  install -d -m 0755 /opt/specdec-models && rm -rf /opt/specdec-models/code-lm-16m /opt/specdec-models/mini-kimi
  cp -r "$stage/in/model" /opt/specdec-models/code-lm-16m && chmod -R u=rwX,go=rX /opt/specdec-models/code-lm-16m
  if [ -d "$stage/in/model-kimi" ]; then
    cp -r "$stage/in/model-kimi" /opt/specdec-models/mini-kimi && chmod -R u=rwX,go=rX /opt/specdec-models/mini-kimi
  fi
  rm -rf /opt/specdec-controller && python3 -m venv /opt/specdec-controller
  /opt/specdec-controller/bin/python -m pip install -q --disable-pip-version-check --no-index --no-deps \
    $(ls "$stage"/in/controller/*.whl | grep -v /zstandard-)
  rm -rf "$src" && install -d -m 0755 "$src" && tar -C "$src" -xzf "$stage/in/tree.tar.gz"
  mkdir -p "$src/collections/ansible_collections/specdec" && ln -sfn "$src" "$src/collections/ansible_collections/specdec/eagle3"
  command -v sudo >/dev/null || dpkg -i "$stage"/in/debs/sudo_*.deb >/dev/null || echo "sudo: not installed (dpkg failed)"
  python3 -m pip list --format=freeze > "$stage/image-freeze.txt" 2>/dev/null || true
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 --version; id; \
    command -v sudo; nproc; } > "$stage/machine.txt" 2>&1 || true
  touch "$stage/installed"
  echo "installed: the wheelhouse ($(ls /opt/specdec-wheelhouse | wc -l) files), the code LM, ansible-core, tree at $(cat "$stage/in/COMMIT")"
fi
[ "${SITE_GPU_STAGE_ONLY:-0}" = 1 ] && exit 0

if [ -n "${SITE_GPU_TREE:-}" ]; then  # the checkout this command runs in (commits made after the bundles were packed)
  rm -rf "$src" && install -d -m 0755 "$src"
  tar -C "$SITE_GPU_TREE" --exclude=./.cache --exclude=./.git --exclude=./.venv --exclude=./collections -cf - . \
    | tar -C "$src" --no-same-owner -xf -
  mkdir -p "$src/collections/ansible_collections/specdec"
  ln -sfn "$src" "$src/collections/ansible_collections/specdec/eagle3"
  echo "${SITE_GPU_COMMIT:-unknown}" > "$stage/tree-commit"
else
  cp "$stage/in/COMMIT" "$stage/tree-commit"
fi
rm -f "$stage/runs.done"
setsid bash -c '
  cd "$1"; printf "run\tinventory\tstart\tend\tseconds\trc\trecap\n" > "$2/runs.tsv"
  for inv in $5; do
    for i in $(seq 1 "$3"); do
      log=$2/run$i.log; [ "$inv" = gpu-code ] || log=$2/run$i-$inv.log
      t0=$(date +%s)
      /opt/specdec-controller/bin/ansible-playbook -i "inventory/$inv" site.yml $4 > "$log" 2>&1; rc=$?
      t1=$(date +%s)
      recap=$(grep -E "ok=[0-9]+ +changed=[0-9]+" "$log" | tail -n 1 | tr -s " ")
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$i" "$inv" "$t0" "$t1" "$((t1 - t0))" "$rc" "$recap" >> "$2/runs.tsv"
      [ "$rc" = 0 ] || break
    done
  done
  touch "$2/runs.done"' _ "$src" "$stage" "${SITE_GPU_RUNS:-2}" "${SITE_GPU_ARGS:-}" "${SITE_GPU_INVENTORIES:-gpu-code}" \
  < /dev/null > /dev/null 2>&1 &
echo $! > "$stage/runs.pid"
report "${SITE_GPU_BACKGROUND:-540}"
