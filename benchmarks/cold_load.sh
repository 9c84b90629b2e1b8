#!/bin/sh
# Load a model in a fresh process with an empty private cache: the first load on a machine, the GGUF
# dequantised and its safetensors copy written. Usage: benchmarks/cold_load.sh SRC_DIR MODEL
# (SRC_DIR: the src/ of the checkout to time). BENCHMARKS.md times two checkouts side by side:
#   farm-bench -n 3 --warmup 0 --timeout 1800 --vs "benchmarks/cold_load.sh BASE/src gemma3-270m" \
#     -- benchmarks/cold_load.sh src gemma3-270m
set -eu
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
GANDA_CACHE=$cache OMP_NUM_THREADS=1 PYTHONPATH=$1 "$(dirname "$0")/../.venv/bin/python" -c "
import torch, ganda
a = ganda.load_model('$2', device='cpu')
with torch.no_grad():
    print(float(a.forward(torch.tensor([[1, 2, 3]]))[0, -1, :5].sum()))"
