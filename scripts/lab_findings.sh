#!/usr/bin/env bash
# The paper's six findings replayed on the shipped lab checkpoints (no training; a few minutes on
# 2 CPU cores), one run directory per finding, then one self-contained HTML page:
#   bash scripts/lab_findings.sh [OUT]        (default runs/lab-findings; OUT/report.html)
# To retrain the models first: ganda train llama|mamba2|hybrid --out DIR, ganda distill lab-llama --out DIR
# (see docs/lab.md), and pass the directories instead of the lab-* names below.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
OUT=${1:-runs/lab-findings}
N=${N:-200}
G=.venv/bin/ganda
mkdir -p "$OUT"
T=lab-mmlu,lab-knowledge

echo "== the models on the four lab tasks"
$G lab --models lab-llama,lab-mamba2,lab-hybrid,lab-distilled --n "$N" --out "$OUT/models.json"

echo "== 1 and 3: single-head ablation sweeps (Transformer, SSM): which heads carry lab-mmlu"
$G sweep lab-llama --task lab-mmlu --limit "$N" --out "$OUT/sweep-llama" --top 5
$G sweep lab-mamba2 --task lab-mmlu --limit "$N" --out "$OUT/sweep-mamba2" --top 5

echo "== 2: layer pruning and remove-and-restore (Transformer)"
$G prune lab-llama --tasks "$T" --drop-task lab-mmlu --limit "$N" --min-layers 1 --out "$OUT/prune-llama" -q
$G prune lab-llama --tasks "$T" --remove-restore --minimal 3 --limit "$N" --out "$OUT/remove-restore-llama" -q

$G retain lab-llama --gather L1H2 --aggregate L2H3 --tasks "$T" --limit "$N" --out "$OUT/retain-llama" -q

echo "== 4: sharpness of the G&A maps, Transformer vs SSM, with bootstrap intervals"
$G sharpness lab-llama lab-mamba2 --task lab-mmlu --n 100 --top 1 --out "$OUT/sharpness" -q

echo "== 5: hybrid: mask the final row of its attention layer"
$G mask-last-row lab-hybrid --tasks "$T" --limit "$N" --out "$OUT/mask-hybrid" -q

echo "== 6: transplant teacher layers into the layer-wise distilled SSM"
$G transplant lab-distilled --donor lab-llama --layers 0,1,2 --score-donor --tasks "$T" --limit "$N" \
  --out "$OUT/transplant" -q

$G report "$OUT"/sweep-llama "$OUT"/sweep-mamba2 "$OUT"/prune-llama "$OUT"/remove-restore-llama "$OUT"/retain-llama "$OUT"/sharpness \
  "$OUT"/mask-hybrid "$OUT"/transplant --out "$OUT/report.html" --title "ganda lab: the paper's findings on CPU"
echo "wrote $OUT/report.html"
