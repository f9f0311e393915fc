#!/usr/bin/env bash
# The GPU check, offline, in stages. Each stage refuses at once, in one line (exit 2), where torch
# sees no CUDA device; each fits one device call, and with the machine's start one device session
# (docs/gpu/README.md: ~15 min of device time, the start included, at most 10 min a command).
# Each stage's worst case (set-up plus every part's cap and kill grace) is at most 420 s, stated
# below and summed by tests/test_gpu_check_script.py.
#
#   bash scripts/gpu_check.sh kernels   # the headline: every kernel variant compiled, each Triton
#                                       # kernel checked against torch, then sparrow-bench
#                                       # decode-step (32K context, 2K budget)
#   bash scripts/gpu_check.sh rest      # gpu-marked kernel and engine tests, decode bench,
#                                       # kernel bench (what does not fit beside the headline)
#   bash scripts/gpu_check.sh step      # GRPO step bench, sparse vs dense, random Qwen3-1.7B
#   bash scripts/gpu_check.sh distill   # the same with distill=default
#   bash scripts/gpu_check.sh ranks     # cluster.rollout_ranks on GPUs: links over NCCL, the
#                                       # weight push bench, a 1 + 1 run against one process
#
# GPU_CHECK_BUDGET_S (default: the stage's worst case) is the time the stage may take: give it
# what is left of the session, less a margin. Before each part the stage compares the part's cap
# (plus its kill grace) with what is left of the budget and skips a part that would not fit,
# saying so in the bundle and the log (exit status 1: not everything ran); the step and distill
# parts take what is left as their cap, and are skipped under two thirds of their expected time.
# The probe (the gate) always runs.
#
# Before the call, on the machine that has the repo: `bash scripts/gpu_wheels.sh` (or
# `bash scripts/gpu_wheels.sh --stamp` when the wheels are there already) writes $WHEELS/COMMIT:
# the commit the tree is at and a fingerprint of the files that travel; carry the wheel folder.
# The device has no .git: the bundle's stamp comes from that file, and says its source and whether
# the tree that ran is the one it was written for; without it, the device's fingerprint alone,
# which scripts/gpu_results.sh matches to a commit (scripts/gpu_bundle.py).
#
# On a stock PyTorch image (torch + triton + transformers, no network) the packages it lacks come
# from the wheel folder (WHEELS, default ./wheels), installed with --no-index --no-deps into
# DEPS_DIR, which goes on PYTHONPATH (the rest, step, distill and ranks stages; the kernels stage
# imports none of them). The image's torch and triton are never touched.
#
# What comes back: the device returns at most 8 files, so a stage writes two under $OUT (else
# ./gpu_results): <stage>.json, one bundle (commit stamp, versions, and per part its cap, its
# expected H200 time, exit status, seconds and the JSON it wrote, or why it was skipped), and
# <stage>.log, every part's output. `bash scripts/gpu_results.sh DIR` files a returned bundle
# into docs/gpu/ (and refuses one from a machine without a GPU). Exit status is non-zero if a part
# failed or was skipped.
#
# Worst case per stage, seconds: set-up (each cap + KILL_GRACE_S) + every part's cap +
# KILL_GRACE_S + FINISH_S:
#   kernels  probe (30 + 5) + compile (150 + 5) + numerics (60 + 5) + decode_step (150 + 5)
#            + 5                                                                             = 415
#   rest     probe (30 + 5) + install (60 + 5) + gpu_tests (120 + 5)
#            + engine_gpu_tests (80 + 5) + decode_bench (50 + 5) + kernel_bench (45 + 5) + 5 = 420
#   ranks    probe (30 + 5) + install (60 + 5) + link_tests (40 + 5) + push_bench (70 + 5)
#            + rollout_ranks (190 + 5) + 5                                                   = 420
#   step, distill  the budget, 415 by default: the parts' caps are what is left of it
#                  ($SECONDS counts the set-up), less KILL_GRACE_S + FINISH_S
# WORST_CASE_S below says the same; tests/test_gpu_check_script.py recomputes it from the lines.
# Expected H200 times (the third number of each `part` line) are estimates, no GPU having run
# this yet, from counts: process start (import torch + transformers, CUDA init) ~15 s; a Triton
# compile ~1-5 s a variant (timed here with `triton.compile` for sm_90 on a loaded 2-core CPU:
# decode split 4.8 s, page score 1.4 s, merge 0.9 s; an upper bound for one core of the H200's
# host), times the variants a part meets (decode-step ~16: the 13 that the rehearsal's record of
# the real launchers shows at batch 16 and 64 (tests/rehearsal/test_launcher_rehearsal.py:
# 8 kernels, the split kernel split at batch 16 and not at 64, write_kv with and without
# summaries, both norms) and the split kernel's occupancy probes; the interpreter counts 11 at
# the CPU shape, fp32); steps at their bytes
# over ~4.3 TB/s (the dense batch-64 step reads ~240 GB of K/V: ~56 ms; sparse ~31 GB: ~8 ms)
# plus ~5-10 ms of host launches per eager step; ~1 s per profiler session. An H100 (~3.0 TB/s)
# takes ~1.4x as long for the steps, not for the compiles.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-}"
case "$STAGE" in
    kernels|rest|step|distill|ranks) ;;
    *) echo "usage: bash scripts/gpu_check.sh {kernels|rest|step|distill|ranks}" >&2; exit 2 ;;
esac
RESULTS="${OUT:-./gpu_results}"
PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-wheels}"
DEPS="${DEPS_DIR:-/tmp/sparrow-deps}"
BUNDLE="$RESULTS/$STAGE.json"
LOG="$RESULTS/$STAGE.log"
KILL_GRACE_S=5  # a part's SIGKILL comes 3 s after its SIGTERM; 2 s for the bundle update
INSTALL_CAP_S=60
PROBE_CAP_S=30
FINISH_S=5  # the bundle's last update
declare -A WORST_CASE_S=([kernels]=415 [rest]=420 [step]=415 [distill]=415 [ranks]=420)
BUDGET="${GPU_CHECK_BUDGET_S:-${WORST_CASE_S[$STAGE]}}"
case "$BUDGET" in
    ""|*[!0-9]*) echo "gpu_check: GPU_CHECK_BUDGET_S must be whole seconds, got '$BUDGET'" >&2
                 exit 2 ;;
esac
unset TRITON_INTERPRET  # compiled kernels only
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# One Triton cache for the stage: the compile part fills it, later parts (new processes) load.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/sparrow-triton-cache}"
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}"

# The gate and the bundle's head (commit stamp, versions, device): before anything else, so a
# machine without a GPU costs one torch import. Its refusal is its own line on stderr.
PROBED="$(timeout -k 3 "$PROBE_CAP_S" "$PY" scripts/gpu_bundle.py probe "$BUNDLE" "$STAGE" \
    "$WHEELS/COMMIT" "${WORST_CASE_S[$STAGE]}" "$BUDGET")"
rc=$?
if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 3 ] || echo "gpu_check $STAGE: refused: the probe failed (exit $rc)" >&2
    exit 2
fi
WORK="$(mktemp -d)"  # the parts' own JSON, folded into the bundle: not under $OUT
trap 'rm -rf "$WORK"' EXIT
echo "$PROBED" | tee "$LOG"
# device: begin (tests/test_gpu_check_device.py runs this block with a fake nvidia-smi)
# The device's kind and memory (nvidia-smi, else torch): the step stages plan for this device, an
# 80 GB GPU (H100, A100-80G) with the README's 80 GB plans, an H200 with 139 GiB, another with
# its own total; the expected times (written for an H200's 4.8 TB/s) scale by the HBM bandwidth.
DEVICE="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits -i 0 2>/dev/null \
    || "$PY" -c 'import torch; p = torch.cuda.get_device_properties(0)
print(f"{p.name}, {p.total_memory // 2**20}")' 2>/dev/null || echo "unknown, 0")"
DEVICE_NAME="${DEVICE%%,*}"
DEVICE_MIB="$(echo "${DEVICE##*,}" | tr -dc 0-9)"
DEVICE_GIB=$(( ${DEVICE_MIB:-0} / 1024 ))
case "$DEVICE_NAME" in
    *H200*) PLAN_GIB=139; SLOWER_PCT=100 ;;
    *H100*|*H800*) PLAN_GIB=80; SLOWER_PCT=140 ;;
    *A100*) PLAN_GIB=$(( DEVICE_GIB > 60 ? 80 : 40 )); SLOWER_PCT=240 ;;
    *) PLAN_GIB=$DEVICE_GIB; SLOWER_PCT=140 ;;
esac
[ "$PLAN_GIB" -gt 0 ] || PLAN_GIB=80  # unread (a CPU rehearsal): the smaller, usual GPU
# device: end
echo "device: $DEVICE_NAME, ${DEVICE_GIB} GiB: memory plans for ${PLAN_GIB} GiB, step times" \
    "expected ${SLOWER_PCT}% of an H200's" | tee -a "$LOG"

status=0
# skip NAME CAP_S EXPECTED_S REASON [optional]: the part does not run; the bundle and the log say
# why, and the stage's exit status is 1 unless the part was optional.
skip() {
    [ "${5:-}" = optional ] || status=1
    echo "== $1 skipped: $4" | tee -a "$LOG"
    "$PY" scripts/gpu_bundle.py skip "$BUNDLE" "$1" "$2" "$3" "$4"
}
# part NAME CAP_S EXPECTED_S CMD...: run CMD (its JSON, if any, at $WORK/NAME.json; a pytest
# run's JUnit XML at $WORK/NAME.xml) under a timeout of CAP_S, its output appended to the log;
# then its result goes into the bundle. Skipped when CAP_S + KILL_GRACE_S is more than what is
# left of the budget (FINISH_S kept for the end).
part() {
    local name="$1" cap="$2" expected="$3"
    shift 3
    local left=$(( BUDGET - SECONDS - FINISH_S ))
    if [ $(( cap + KILL_GRACE_S )) -gt "$left" ]; then
        skip "$name" "$cap" "$expected" "its cap ${cap}s + ${KILL_GRACE_S}s grace, ${left}s left of GPU_CHECK_BUDGET_S=$BUDGET"
        return 0
    fi
    echo "== $name (cap ${cap}s, expected ~${expected}s on an H200)" | tee -a "$LOG"
    local start=$SECONDS
    timeout -k 3 "$cap" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || status=1
    "$PY" scripts/gpu_bundle.py part "$BUNDLE" "$name" "$rc" "$((SECONDS - start))" "$cap" \
        "$expected" "$WORK/$name"
}

finish() {
    "$PY" scripts/gpu_bundle.py finish "$BUNDLE" "$SECONDS" "$status"
    echo "gpu_check $STAGE: exit status $status (results in $RESULTS)" | tee -a "$LOG"
    exit $status
}

if [ "$STAGE" != kernels ]; then
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        part install "$INSTALL_CAP_S" 10 "$PY" -m pip install -q --no-index --no-deps \
            --target "$DEPS" "$WHEELS"/*.whl
    else
        echo "no wheels in $WHEELS (bash scripts/gpu_wheels.sh fills it): using what is" \
            "installed" | tee -a "$LOG"
    fi
fi

case "$STAGE" in
kernels)
    # compile: every Triton variant and CUDA-graph shape the headline meets, timed: the same
    # run's warm-up steps (every step of a batch has one page-table width, so they meet all of
    # it), no timed step; later parts load the variants from Triton's cache (TRITON_CACHE_DIR).
    # 15 s start + ~5 s weights and K/V + ~14 variants x ~2.5 s + 24 steps and 4 captures ~3 s,
    # + the speculative arm's verify pass (its variants ~2 x 2.5 s, 2 passes).
    part compile 150 65 "$PY" -m sparrow.bench.cli decode-step --compile-only \
        --json "$WORK/compile.json" --speculative-k 4
    # decode_step: the headline (Qwen3-1.7B, 32K context, 2K-token budget, batch 16 and 64,
    # sparse vs dense, graphs on and off; the profiling pass after every timed configuration):
    # 15 s start + ~5 s weights and K/V + 184 steps ~6 s + 4 captures ~2 s + 8 profiler sessions
    # ~10 s + cache loads; the speculative arm (decode_step_spec.py): a dense verify pass of
    # 5 positions per row, 23 passes at about a dense step's bytes (~2 s), its speedup over
    # dense beside docs/gpu/speculative_prediction.md (written before any GPU ran it).
    # numerics: each Triton kernel of the decode step against its torch reference at the
    # headline's model shape, a few pages, bf16 and fp32 (sparrow-bench kernel-check), before
    # any step is timed: a headline from kernels that compute the wrong thing fails here.
    # 15 s start + the bf16 variants from the compile part's cache + ~8 fp32 variants x ~2.5 s.
    part numerics 60 35 "$PY" -m sparrow.bench.cli kernel-check --json "$WORK/numerics.json"
    part decode_step 150 50 "$PY" -m sparrow.bench.cli decode-step --json "$WORK/decode_step.json" \
        --speculative-k 4
    ;;
rest)
    # gpu_tests: the kernels against the reference at awkward shapes: 50 cases, ~35 variants
    # compiled at ~2 s (most of the time) + 15 s start.
    part gpu_tests 120 90 "$PY" -m pytest tests/kernels/test_gpu_kernels.py -m gpu -q -rs \
        -p no:cacheprovider --junitxml="$WORK/gpu_tests.xml"
    # engine_gpu_tests: CUDA-graph replay against eager at every batch bucket; the trainer's
    # host-side reductions under NCCL: a tiny model's ~10 variants and a few captures, two
    # NCCL ranks started (~15 s).
    part engine_gpu_tests 80 60 "$PY" -m pytest tests/rollout/test_cuda_graphs_gpu.py \
        tests/rollout/test_engine_gpu.py tests/train/test_host_collectives.py -m gpu -q -rs \
        -p no:cacheprovider --junitxml="$WORK/engine_gpu_tests.xml"
    # decode_bench: launches per layer, torch and Triton x fp32 and bf16 (~12 variants).
    part decode_bench 50 40 "$PY" -m sparrow.bench.cli decode --json "$WORK/decode_bench.json"
    # kernel_bench: the tile sweep (~8 variants) at the benchmark's default shape.
    part kernel_bench 45 35 "$PY" -m sparrow.bench.cli kernel --sweep \
        --json "$WORK/kernel_bench.json"
    ;;
ranks)
    # link_tests: a Link over NCCL as split_world builds the push group (1 rank: NCCL refuses
    # two on one GPU), objects landing on the receiver's GPU: 15 s start + NCCL init ~5 s.
    part link_tests 40 25 "$PY" -m pytest tests/test_cluster_gpu.py -m gpu -q -rs \
        -p no:cacheprovider --junitxml="$WORK/link_tests.xml"
    # push_bench: 2 ranks push random Qwen3-1.7B weights (3.4 GB in bf16), 64 and 256 MiB
    # buckets, twice each, checked equal at the end; NCCL with 2 GPUs, gloo through host memory
    # on one (the JSON's push_backend). 2 x 15 s start + ~5 s init + 3 engines + 4 pushes (the
    # best of 2 per size: the first carries NCCL's communicator set-up), ~1-3 s each over gloo.
    part push_bench 70 45 "$PY" -m sparrow.bench.cli push --device cuda --dtype bfloat16 \
        --model qwen3-1.7b --bucket-mb 64 256 --repeats 2 --json "$WORK/push_bench.json"
    # rollout_ranks: preset=tiny, 3 steps at staleness 1: the 1 + 1 launch (2 x 15 s start,
    # ~20 s of Triton compiles into the stage's cache, 3 tiny steps), the one-process run
    # (~30 s) and, on one GPU, the NCCL refusal (~20 s).
    part rollout_ranks 190 120 "$PY" -m pytest tests/train/test_rollout_ranks_gpu.py -m gpu \
        -q -rs -s -p no:cacheprovider --junitxml="$WORK/rollout_ranks.xml"
    ;;
step|distill)
    # The parts take what is left of the budget (set-up included: $SECONDS counts from the
    # start), less KILL_GRACE_S + FINISH_S, so the stage ends inside it; a part left under two
    # thirds of its expected time is skipped (it would most likely be cut off before its JSON).
    PROMPTS="${STEP_PROMPTS:-2}"
    GROUP="${STEP_GROUP:-8}"
    run_step() {  # run_step NAME NEW_TOKENS EXPECTED_S [extra overrides...]
        local name="$1" tokens="$2" expected=$(( $3 * SLOWER_PCT / 100 ))
        shift 3
        local cap=$(( BUDGET - SECONDS - KILL_GRACE_S - FINISH_S ))
        if [ "$cap" -lt $(( expected * 2 / 3 )) ]; then
            skip "$name" "$cap" "$expected" "${cap}s left of GPU_CHECK_BUDGET_S=$BUDGET, under two thirds of its expected ${expected}s"
            return 0
        fi
        # KV pool: every sequence at full length at once (short prompts), plus slack.
        local pages=$(( PROMPTS * GROUP * (tokens / 16 + 8) + 256 ))
        # The warm-up runs past 512 tokens (the first bin's budget), so the sparse decode path
        # is compiled before the measured step.
        part "$name" "$cap" "$expected" "$PY" -m sparrow.bench.cli step \
            --warmup --warmup-tokens 640 --random-model "${STEP_MODEL:-qwen3-1.7b}" \
            --json "$WORK/$name.json" preset="${STEP_PRESET:-qwen3_1p7b_gpu}" data=arithmetic \
            data.tasks.num_examples=64 data.tasks.num_heldout=8 rollout.progress=false \
            rollout.max_new_tokens="$tokens" rollout.engine.num_pages="$pages" \
            rl.prompts_per_step="$PROMPTS" rl.group_size="$GROUP" \
            memory.device_gib="$PLAN_GIB" "$@"
    }
    if [ "$STAGE" = distill ]; then
        # The step plus the adapter's sparse forward/backward over the rollout, ~1.5x the step,
        # at the size its memory plan fits an H100 with (the adapter counted: 55 GiB at its
        # update with one row of 4K tokens, where one row of 8K needs 80 GiB and distill's
        # default 4 rows 184 GiB; tests/train/memory/test_adapter_plan.py).
        run_step distill_bench "${STEP_DISTILL_TOKENS:-4096}" 240 distill=default \
            "distill.micro_batch_size=${STEP_DISTILL_ROWS:-1}"
        finish
    fi
    # A 1.7B random model and trainer ~0.5-1 min, the 640-token warm-up and one step of
    # 2 prompts x 8 x 8192 tokens: 5-6 min.
    run_step step_bench "${STEP_NEW_TOKENS:-8192}" 330
    # A second, shorter size when the time is left (optional: its skip fails nothing).
    SECOND="${STEP_SECOND_TOKENS:-4096}"
    LEFT=$(( BUDGET - SECONDS - KILL_GRACE_S - FINISH_S ))
    if [ "$SECOND" -gt 0 ] && [ "$LEFT" -ge 150 ]; then
        run_step "step_bench_$SECOND" "$SECOND" 150
    elif [ "$SECOND" -gt 0 ]; then
        skip "step_bench_$SECOND" "$LEFT" 150 "${LEFT}s left of GPU_CHECK_BUDGET_S=$BUDGET" optional
    fi
    ;;
esac
finish
