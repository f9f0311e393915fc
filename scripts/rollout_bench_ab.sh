#!/usr/bin/env bash
# The rollout bench (sparrow-bench rollout, default sizes) at two commits, one after the other on
# the same machine, so that their ratios (engine vs HF generate, sparse vs dense decode) compare
# code rather than machines. Needs an idle machine: a concurrent job measures contention.
#
#   bash scripts/rollout_bench_ab.sh [BEFORE_REV [AFTER_REV]]   # default: 4729811 and HEAD
#
# 4729811 is the last commit before the decode-step work (plan, sync-free selection, fused
# kernels). Each revision is checked out into a temporary worktree and imported from there with
# this checkout's venv (PYTHON to use another). Writes OUT (default runs/bench_ab)/<n>_<rev>.json and .log, in the order
# BEFORE, AFTER, AFTER, BEFORE (drift over the run cancels in the pairs' means).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE="${1:-4729811}"
AFTER="${2:-HEAD}"
OUT="$(realpath -m "${OUT:-runs/bench_ab}")"
PY="${PYTHON:-$PWD/.venv/bin/python}"
BENCH_ARGS="${BENCH_ARGS:-}"  # e.g. --quick for a smoke run
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'git worktree remove --force "$tmp/before" 2>/dev/null; git worktree remove --force "$tmp/after" 2>/dev/null; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/before" "$BEFORE"
git worktree add -q --detach "$tmp/after" "$AFTER"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
n=0
for side in before after after before; do
    n=$((n + 1))
    rev="$(git -C "$tmp/$side" rev-parse --short HEAD)"
    start=$SECONDS
    (cd "$tmp/$side" && PYTHONPATH="$tmp/$side" "$PY" -m sparrow.bench.cli rollout --threads 2 \
        --json "$OUT/${n}_${rev}.json" $BENCH_ARGS) >"$OUT/${n}_${rev}.log" 2>&1
    echo "$n $side $rev: $((SECONDS - start)) s -> $OUT/${n}_${rev}.json"
done
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(path.read_text())
    print(f"{path.name}: engine/HF {r['engine_vs_hf']['ratio']:.3f}  "
          f"sparse/dense {r['sparse_vs_dense']['ratio']:.3f}  p5 {r['sparse_vs_dense']['p5_acceptance']:.3f}")
PYEOF
