#!/usr/bin/env bash
# The test suite: install what is needed, lint, then every test (real-model tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # the HTML report is checked in a real headless browser; skip quietly where apt is unavailable
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser test will skip"
fi
.venv/bin/ruff check src tests benchmarks
.venv/bin/pytest -q -p no:cacheprovider "$@"
if [ $# -eq 0 ]; then
  # the family x analysis matrix once more in bf16 on the CPU: the precision a GPU runs in, through the
  # same code path (tests/test_device_matrix.py; the run above had it in fp32)
  GANDA_TEST_DTYPE=bfloat16 exec .venv/bin/pytest -q -p no:cacheprovider -m device
fi
