#!/usr/bin/env bash
# Run the GPU proof (tests/gpu/gpu_proof.py) on a machine with an NVIDIA GPU and no network.
#
#   tests/gpu/fetch-wheels WHEEL_DIR      # on a machine with PyPI access: the wheels the GPU machine lacks
#   tests/gpu/run.sh WHEEL_DIR [OUT_DIR]  # on the GPU machine, from the repository root
#
# The GPU machine needs python3 with a CUDA build of torch, safetensors, numpy, sentencepiece and matplotlib;
# the wheels add speculators 0.3.0 and the transformers 4.57 line it needs (plus their small dependencies).
set -euo pipefail
wheels=${1:?usage: tests/gpu/run.sh WHEEL_DIR [OUT_DIR]}
out=${2:-gpu-proof-out}
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
export PYTHONPATH="$site" GPU_PROOF_OUT="$out" PYTHONUNBUFFERED=1
exec python3 tests/gpu/gpu_proof.py
