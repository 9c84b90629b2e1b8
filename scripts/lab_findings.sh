#!/usr/bin/env bash
# The paper's six findings replayed on the shipped lab checkpoints (no training; minutes on a
# 2-core CPU): heads discovered, one run directory per finding, verdicts next to the paper's
# numbers, one self-contained HTML page:
#   bash scripts/lab_findings.sh [OUT]        (default runs/lab; N=200 held-out prompts per task)
# From scratch (trains the six models first, two at a time): bash scripts/lab_from_scratch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
OUT=${1:-runs/lab}
N=${N:-200}
exec .venv/bin/ganda lab --limit "$N" --out "$OUT" -q
