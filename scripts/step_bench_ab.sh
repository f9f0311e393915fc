#!/usr/bin/env bash
# The step bench (sparrow-bench step, preset bench_step_cpu unless BENCH_ARGS says otherwise) at
# two commits, alternating on one machine, so that their decode rates compare code rather than
# the machine's phase. Issue 32's CPU check: the sparse decode tok/s of the rollout, before the
# fixed-shape selection (4d95aae) and after.
#
#   bash scripts/step_bench_ab.sh [BEFORE_REV [AFTER_REV [ROUNDS]]]   # default: 4d95aae HEAD 1
#
# Each round runs BEFORE, AFTER, AFTER, BEFORE (drift over a round cancels in its pairs' means),
# each run under `nice -n 10` (the machine is shared). Each revision is checked out into a
# temporary worktree and imported from there with this checkout's venv (PYTHON to use another).
# Writes OUT (default runs/step_ab)/<n>_<rev>.json and .log, then prints every run: sparse and
# dense decode tok/s, rollout speedup, and both runs' update seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE="${1:-4d95aae}"
AFTER="${2:-HEAD}"
ROUNDS="${3:-1}"
OUT="$(realpath -m "${OUT:-runs/step_ab}")"
PY="${PYTHON:-$PWD/.venv/bin/python}"
BENCH_ARGS="${BENCH_ARGS:-}"  # e.g. preset=tiny for a smoke run
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'git worktree remove --force "$tmp/before" 2>/dev/null; git worktree remove --force "$tmp/after" 2>/dev/null; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/before" "$BEFORE"
git worktree add -q --detach "$tmp/after" "$AFTER"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
n=0
for _ in $(seq "$ROUNDS"); do
    for side in before after after before; do
        n=$((n + 1))
        rev="$(git -C "$tmp/$side" rev-parse --short HEAD)"
        start=$SECONDS
        (cd "$tmp/$side" && PYTHONPATH="$tmp/$side" nice -n 10 "$PY" -m sparrow.bench.cli step \
            --json "$OUT/${n}_${rev}.json" $BENCH_ARGS) >"$OUT/${n}_${rev}.log" 2>&1 || true
        echo "$n $side $rev: $((SECONDS - start)) s -> $OUT/${n}_${rev}.json"
    done
done
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
print("run  commit   sparse decode tok/s  dense decode tok/s  rollout speedup  update_s sparse/dense")
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: int(p.stem.split("_")[0])):
    r = json.loads(path.read_text())
    if "dense" not in r:
        print(f"{path.stem}: incomplete")
        continue
    s, d = r["sparse"], r["dense"]
    n, rev = path.stem.split("_")
    print(f"{n:>3}  {rev}  {s['decode_tok_s']:19.1f}  {d['decode_tok_s']:18.1f}  "
          f"{r['rollout_speedup']:15.3f}  {s['update_s']:.1f} / {d['update_s']:.1f}")
PYEOF
