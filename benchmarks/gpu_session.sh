#!/bin/bash
# One session on a GPU machine without network (docs/gpu.md): install ganda's wheel and the wheels
# the machine lacks, then, each under its own time limit and writing into OUT as it goes,
#   1. the family x analysis matrix on CUDA in bf16 and in fp32 (tests/test_device_matrix.py),
#   2. the test suite as a CUDA machine runs it (every test but the matrix pinned to the CPU; the
#      SmolLM2 tests need its GGUF, which does not travel: -m "not slow"),
#   3. benchmarks/bench_gpu.py on the full-size configs, beside the planner's prediction.
#
#   bash benchmarks/gpu_session.sh WHEELS OUT [BENCH_BUDGET_S=200] [SUITE_S=220]
#
# WHEELS: ganda's wheel (pip wheel --no-deps .) and transformers==5.23.0, gguf, wonderwords for the
# machine's Python (pip download --no-deps --only-binary=:all: --python-version 3.12 ...).
set -u
WHEELS=$1
OUT=$2
BUDGET=${3:-200}
SUITE=${4:-220}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHEELS"/*.whl \
    > "$OUT/install.log" 2>&1
# the tests import the installed wheel, whose lab plugin looks for lab-checkpoints/ beside its own
# source tree: point it at the checkout's
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH GANDA_LAB_CHECKPOINTS=$PWD/lab-checkpoints
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import sys, torch, transformers, ganda; print(sys.version.split()[0], torch.__version__,
transformers.__version__, torch.cuda.get_device_name(0), ganda.__file__)" >> "$OUT/gpu.txt" 2>&1

matrix() {  # dtype
    GANDA_TEST_DEVICE=cuda GANDA_TEST_DTYPE=$1 timeout 110 python3 -m pytest -q -p no:cacheprovider -n 6 \
        tests/test_device_matrix.py --junitxml="$OUT/matrix-$1.xml" > "$OUT/matrix-$1.log" 2>&1
    echo "rc=$?" >> "$OUT/matrix-$1.log"
}
matrix bfloat16 &
matrix float32 &
wait

# -v streams one line per test (a timeout keeps them); the reasons go to a file of their own
timeout "$SUITE" python3 -m pytest -v -rfE -p no:cacheprovider -n 15 -m "not slow and not device" \
    > /tmp/suite.log 2>&1
echo "rc=$?" > "$OUT/suite-rc.txt"
grep -cE " PASSED" /tmp/suite.log >> "$OUT/suite-rc.txt"
grep -E "^(FAILED|ERROR) " /tmp/suite.log | cut -c1-400 > "$OUT/suite-failed.txt"
grep -E "^E  " /tmp/suite.log | sort | uniq -c | sort -rn | head -n 60 | cut -c1-300 > "$OUT/suite-reasons.txt"

timeout $((BUDGET + 60)) python3 benchmarks/bench_gpu.py --budget-s "$BUDGET" \
    --sections attribution,sweep,eval,maps,memory --out "$OUT/bench_gpu.json" > "$OUT/bench_gpu.log" 2>&1
echo "rc=$?" >> "$OUT/bench_gpu.log"
