#!/usr/bin/env bash
# The main job: install what is needed, then `ganda demo` on the embedded SmolLM2-135M (CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/ganda demo "$@"
