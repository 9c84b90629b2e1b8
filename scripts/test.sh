#!/usr/bin/env bash
# The test suite: install what is needed, lint, then every tier (tests/README.md): fast, slow (the real
# models), integration (subprocesses, Ray, the browser, lab training) and the device matrix in fp32,
# spread over the cores by pytest-xdist, then the device matrix once more in bf16.
# With arguments, runs `pytest ARGS` after the same set-up (a bare `pytest` is the fast tier alone).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # the HTML report is checked in a real headless browser (an integration test, which says so where
  # chromium is missing)
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: the browser tests will say so"
fi
.venv/bin/ruff check src tests benchmarks
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest -q -p no:cacheprovider "$@"
fi
# the family x analysis matrix once more in bf16 on the CPU: the precision a GPU runs in, through the
# same code path (tests/test_device_matrix.py; the run below has it in fp32). It runs beside that run
# at the lowest CPU priority, so that it takes the cores only where that run leaves them idle (near
# its end, when one worker has finished its files); its cells are dealt one by one, and its output
# follows that run's.
bf16_log="$(mktemp)"
GANDA_TEST_DTYPE=bfloat16 nice -n 19 .venv/bin/pytest -q -p no:cacheprovider -m device --dist load --durations=5 \
  >"$bf16_log" 2>&1 &
bf16=$!
# every tier (-m "" lifts the fast-tier default of pyproject's addopts, which also spreads the files over
# the cores with pytest-xdist); the 15 slowest tests are listed
status=0
.venv/bin/pytest -q -p no:cacheprovider -m "" --durations=15 || status=$?
bf16_status=0
wait "$bf16" || bf16_status=$?
echo "--- the device matrix in bf16 ---"
cat "$bf16_log"
rm -f "$bf16_log"
[ "$status" -eq 0 ] || exit "$status"
exit "$bf16_status"
