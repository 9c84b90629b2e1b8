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
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
