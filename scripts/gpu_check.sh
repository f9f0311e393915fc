#!/usr/bin/env bash
# One call on a GPU machine (e.g. one H200, python with torch + triton, no network): make sparrow
# importable, run the `gpu`-marked kernel tests (compiled Triton, fp32 and bf16 vs the references)
# and the kernel benchmark (with a small Triton config sweep). Results go to $OUT if set, else
# ./gpu_results: env.txt, gpu_tests.txt, kernel_bench.txt, kernel_bench.json,
# kernel_bench.sweep.json. Exit status is non-zero if the tests or the benchmark failed.
#
#   bash scripts/gpu_check.sh              # PYTHON=/path/to/python to choose the interpreter
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${OUT:-./gpu_results}"
mkdir -p "$RESULTS"
PY="${PYTHON:-python3}"
unset TRITON_INTERPRET  # compiled kernels only
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

# Use the machine's torch + triton when they work; otherwise try to install, and carry on anyway.
if ! "$PY" -c "import torch, triton, pytest; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "torch/triton/pytest with CUDA not importable by $PY; trying make setup, then pip"
    if timeout 300 make setup && [ -x .venv/bin/python ]; then
        PY=.venv/bin/python
    else
        timeout 300 "$PY" -m pip install -q -e '.[dev]' || echo "install failed; continuing"
    fi
fi
# No network needed: --no-deps, no build isolation. Only for the sparrow-bench console script;
# PYTHONPATH below makes the package importable even if this fails.
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

{
    date -u
    git rev-parse HEAD 2>/dev/null
    nvidia-smi 2>&1
    "$PY" -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, \
'triton', triton.__version__, torch.cuda.get_device_name(0))"
} >"$RESULTS/env.txt" 2>&1
cat "$RESULTS/env.txt"

status=0
echo "== gpu tests"
timeout 360 "$PY" -m pytest tests/kernels/test_gpu_kernels.py -m gpu -q -rs -p no:cacheprovider \
    2>&1 | tee "$RESULTS/gpu_tests.txt" || status=1
echo "== kernel benchmark"
timeout 300 "$PY" -m sparrow.bench.cli kernel --sweep --json "$RESULTS/kernel_bench.json" \
    2>&1 | tee "$RESULTS/kernel_bench.txt" || status=1
echo "gpu_check: exit status $status (results in $RESULTS)"
exit $status
