#!/usr/bin/env bash
# The whole lab from nothing: train the Transformer, the Mamba-2 SSM and the hybrid, distil the
# SSM student from the Transformer, train finding 3's KV pair (two trainings at a time on 2 cores,
# one torch thread each; resumable:
# rerun after an interruption), then run the six findings on the new models:
#   bash scripts/lab_from_scratch.sh [OUT] [WORKDIR]   (defaults runs/lab-scratch, runs/lab-train)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
OUT=${1:-runs/lab-scratch}
WORKDIR=${2:-runs/lab-train}
N=${N:-200}
exec .venv/bin/ganda lab --from-scratch --workdir "$WORKDIR" --limit "$N" --out "$OUT" -q
