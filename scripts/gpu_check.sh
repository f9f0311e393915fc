#!/usr/bin/env bash
# One call on a GPU machine (e.g. one H200, python with torch + triton, no network): make sparrow
# importable, run the `gpu`-marked kernel tests (compiled Triton, fp32 and bf16 vs the references)
# the kernel benchmark (with a small Triton config sweep), then one GRPO step on a random-weight
# Qwen3-1.7B-shaped model with sparse (the paper's tau 0.86 schedule) and with dense rollouts of
# STEP_NEW_TOKENS fixed-length tokens (EOS ignored). Results go to $OUT if set, else ./gpu_results:
# env.txt, gpu_tests.txt, kernel_bench.txt, kernel_bench.json, kernel_bench.sweep.json,
# step_bench.txt, step_bench.json (written after each run, so a timeout keeps the sparse half).
# Exit status is non-zero if the tests or a benchmark failed.
#
#   bash scripts/gpu_check.sh              # PYTHON=/path/to/python to choose the interpreter
#   GPU_BUDGET_S=600 STEP_NEW_TOKENS=16384 STEP_PROMPTS=2 STEP_GROUP=8 bash scripts/gpu_check.sh
#
# The step benchmark gets whatever is left of GPU_BUDGET_S seconds (counted from the start).
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
echo "== engine gpu tests (CUDA-graph replay = eager)"
timeout 300 "$PY" -m pytest tests/rollout/test_cuda_graphs_gpu.py tests/rollout/test_engine_gpu.py \
    -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$RESULTS/engine_gpu_tests.txt" || status=1
echo "== kernel benchmark"
timeout 300 "$PY" -m sparrow.bench.cli kernel --sweep --json "$RESULTS/kernel_bench.json" \
    2>&1 | tee "$RESULTS/kernel_bench.txt" || status=1
echo "== GRPO step benchmark: random Qwen3-1.7B shape, sparse vs dense rollouts"
NEW_TOKENS="${STEP_NEW_TOKENS:-16384}"
PROMPTS="${STEP_PROMPTS:-2}"
GROUP="${STEP_GROUP:-8}"
# KV pool: every sequence at full length at once (short arithmetic prompts), plus slack.
PAGES=$(( PROMPTS * GROUP * (NEW_TOKENS / 16 + 8) + 256 ))
LEFT=$(( ${GPU_BUDGET_S:-600} - SECONDS - 15 ))
if [ "$LEFT" -lt 120 ]; then LEFT=120; fi
echo "step benchmark: $PROMPTS prompts x $GROUP samples x $NEW_TOKENS tokens, $PAGES KV pages, \
timeout ${LEFT}s"
# The warm-up step runs past 512 tokens (the first bin's budget), so the sparse decode path
# (Triton page scoring, selection, sparse attention) is compiled before the measured step.
timeout "$LEFT" "$PY" -m sparrow.bench.cli step --warmup --warmup-tokens 640 \
    --random-model qwen3-1.7b \
    --json "$RESULTS/step_bench.json" preset=qwen3_1p7b_gpu data=arithmetic \
    data.tasks.num_examples=64 data.tasks.num_heldout=8 rollout.progress=false \
    rollout.max_new_tokens="$NEW_TOKENS" rollout.engine.num_pages="$PAGES" \
    rl.prompts_per_step="$PROMPTS" rl.group_size="$GROUP" \
    2>&1 | tee "$RESULTS/step_bench.txt" || status=1
echo "gpu_check: exit status $status (results in $RESULTS)"
exit $status
