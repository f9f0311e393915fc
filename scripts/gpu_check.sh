#!/usr/bin/env bash
# The GPU check, offline, in stages that each fit one 10-minute allocation (estimates below):
#
#   bash scripts/gpu_check.sh kernels   # the headline decode step, gpu-marked tests, benchmarks
#   bash scripts/gpu_check.sh step      # GRPO step bench, sparse vs dense, random Qwen3-1.7B
#   bash scripts/gpu_check.sh distill   # the same bench with distill=default: one DistillSparse
#                                       # update (its time and the step's peak GPU memory)
#
# On a stock PyTorch image (torch + triton + transformers, no network) the packages it lacks come
# from the folder scripts/gpu_wheels.sh filled (WHEELS, default ./wheels): installed with
# --no-index --no-deps into DEPS_DIR, which goes on PYTHONPATH. The image's torch and triton are
# never touched. Each stage writes under $OUT (else ./gpu_results), as it goes: <stage>.json
# (versions, and each part's exit status and seconds), one log per part, and the benchmarks'
# own JSON. Exit status is non-zero if a part failed.
#
# Time per stage on one H200, estimated (no GPU was at hand to measure) from component timings:
# kernels: its parts are bounded by their timeouts (below, 540 s in all), so the stage ends inside
# 9 minutes: first the headline (sparrow-bench decode-step: Qwen3-1.7B, 32K context, 2K-token
# budget, batch 16 and 64, sparse vs dense, graphs on and off; its JSON also lands in
# $OUT/docs/gpu/ for the repo), then the kernel tests, the engine's graph tests, the decode bench
# (launches per layer) and the kernel bench. The AOT report is left to CI (the same Triton 3.6
# compile runs on a CPU: tests/kernels/test_aot_compile.py).
# step: wheels install < 0.5 min; per run (sparse, then dense) a 1.7B random model and trainer
# ~0.5-1 min, a 640-token warm-up step and one step of 2 prompts x 8 x STEP_NEW_TOKENS (8192:
# about half the 160-250 s sparse / 120-170 s dense measured-by-estimate for 16K) = 5-7 min; a
# second size (STEP_SECOND_TOKENS, 4096) only if STAGE_BUDGET_S (450) leaves room for it.
# distill: the step stage's first run with DistillSparse on (STEP_DISTILL_TOKENS, 8192): the
# step plus the adapter's sparse forward/backward over the rollout, ~1.5x the sparse step.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-}"
case "$STAGE" in
    kernels|step|distill) ;;
    *) echo "usage: bash scripts/gpu_check.sh {kernels|step|distill}" >&2; exit 2 ;;
esac
RESULTS="${OUT:-./gpu_results}"
mkdir -p "$RESULTS"
PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-wheels}"
DEPS="${DEPS_DIR:-/tmp/sparrow-deps}"
SUMMARY="$RESULTS/$STAGE.json"
unset TRITON_INTERPRET  # compiled kernels only
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    timeout 60 "$PY" -m pip install -q --no-index --no-deps --target "$DEPS" "$WHEELS"/*.whl \
        2>&1 | tail -3
else
    echo "no wheels in $WHEELS (bash scripts/gpu_wheels.sh fills it): using what is installed"
fi
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}"

# <stage>.json: the versions this ran with, then each part as it finishes.
"$PY" - "$SUMMARY" "$STAGE" <<'PYEOF'
import importlib, json, subprocess, sys
path, stage = sys.argv[1:]
versions = {"python": sys.version.split()[0]}
from importlib.metadata import version
for module, dist in [("torch", "torch"), ("triton", "triton"), ("transformers", "transformers"),
                     ("deepspeed", "deepspeed"), ("hydra", "hydra-core"),
                     ("omegaconf", "omegaconf"), ("math_verify", "math-verify"),
                     ("gguf", "gguf"), ("wandb", "wandb")]:
    try:
        importlib.import_module(module)
        versions[dist] = version(dist)
    except Exception as e:  # reported, not fatal: a later part will say what it needs
        versions[dist] = f"missing ({type(e).__name__}: {e})"
try:
    import torch
    versions["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
except Exception:
    pass
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
json.dump({"stage": stage, "commit": commit.strip(), "versions": versions, "parts": []},
          open(path, "w"), indent=1)
print(json.dumps(versions))
PYEOF

status=0
# part NAME TIMEOUT_S CMD...: run, log to $RESULTS/NAME.log, append its result to the summary.
part() {
    local name="$1" limit="$2"
    shift 2
    echo "== $name (timeout ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$RESULTS/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || status=1
    "$PY" -c "import json, sys; p = sys.argv[1]; s = json.load(open(p)); \
s['parts'].append({'name': sys.argv[2], 'rc': int(sys.argv[3]), 'seconds': int(sys.argv[4])}); \
json.dump(s, open(p, 'w'), indent=1)" "$SUMMARY" "$name" "$rc" "$((SECONDS - start))"
}

if [ "$STAGE" = kernels ]; then
    # Part timeouts sum to 540 s (decode_step 180 + gpu_tests 150 + engine_gpu_tests 90 +
    # decode_bench 60 + kernel_bench 60): the stage fits one call with a minute to spare.
    part decode_step 180 "$PY" -m sparrow.bench.cli decode-step --json "$RESULTS/decode_step.json"
    if [ -f "$RESULTS/decode_step.json" ]; then
        mkdir -p "$RESULTS/docs/gpu"
        cp "$RESULTS/decode_step.json" \
            "$RESULTS/docs/gpu/decode_step_$(git rev-parse --short HEAD 2>/dev/null || echo local).json"
    fi
    part gpu_tests 150 "$PY" -m pytest tests/kernels/test_gpu_kernels.py -m gpu -q -rs \
        -p no:cacheprovider
    # The engine's CUDA-graph replay against eager, every batch bucket; the trainer's host-side
    # reductions under NCCL.
    part engine_gpu_tests 90 "$PY" -m pytest tests/rollout/test_cuda_graphs_gpu.py \
        tests/rollout/test_engine_gpu.py tests/train/test_host_collectives.py -m gpu -q -rs \
        -p no:cacheprovider
    part decode_bench 60 "$PY" -m sparrow.bench.cli decode --json "$RESULTS/decode_bench.json"
    part kernel_bench 60 "$PY" -m sparrow.bench.cli kernel --sweep \
        --json "$RESULTS/kernel_bench.json"
else
    BUDGET="${STAGE_BUDGET_S:-450}"
    PROMPTS="${STEP_PROMPTS:-2}"
    GROUP="${STEP_GROUP:-8}"
    run_step() {  # run_step NAME NEW_TOKENS TIMEOUT_S [extra overrides...]
        local name="$1" tokens="$2" limit="$3"
        shift 3
        # KV pool: every sequence at full length at once (short prompts), plus slack.
        local pages=$(( PROMPTS * GROUP * (tokens / 16 + 8) + 256 ))
        # The warm-up runs past 512 tokens (the first bin's budget), so the sparse decode path
        # is compiled before the measured step.
        part "$name" "$limit" "$PY" -m sparrow.bench.cli step --warmup --warmup-tokens 640 \
            --random-model "${STEP_MODEL:-qwen3-1.7b}" --json "$RESULTS/$name.json" \
            preset="${STEP_PRESET:-qwen3_1p7b_gpu}" data=arithmetic data.tasks.num_examples=64 \
            data.tasks.num_heldout=8 rollout.progress=false rollout.max_new_tokens="$tokens" \
            rollout.engine.num_pages="$pages" rl.prompts_per_step="$PROMPTS" \
            rl.group_size="$GROUP" "$@"
    }
    if [ "$STAGE" = distill ]; then
        # The largest length we expect to fit next to the KV pool; lower it if the run OOMs.
        run_step distill_bench "${STEP_DISTILL_TOKENS:-8192}" $(( BUDGET - SECONDS - 10 )) \
            distill=default
        echo "gpu_check $STAGE: exit status $status (results in $RESULTS)"
        exit $status
    fi
    run_step step_bench "${STEP_NEW_TOKENS:-8192}" $(( BUDGET - SECONDS - 10 ))
    SECOND="${STEP_SECOND_TOKENS:-4096}"
    LEFT=$(( BUDGET - SECONDS - 10 ))
    if [ "$SECOND" -gt 0 ] && [ "$LEFT" -ge 150 ]; then
        run_step "step_bench_$SECOND" "$SECOND" "$LEFT"
    else
        echo "no time left for a second size (${LEFT}s of STAGE_BUDGET_S=$BUDGET)"
    fi
fi
echo "gpu_check $STAGE: exit status $status (results in $RESULTS)"
exit $status
