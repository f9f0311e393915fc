#!/usr/bin/env bash
# File what a GPU check returned into docs/gpu/: every bundle (<stage>.json, written by
# scripts/gpu_check.sh) in DIR is copied to docs/gpu/<stage>_<commit>.json, and the table in
# docs/gpu/README.md (between its two `gpu_results` markers) is regenerated from every bundle
# there. Logs stay out of the tree (history, not documents). A bundle that names no GPU (device
# "cpu" or "unknown ...": the stage ran without one, GPU_CHECK_ON_CPU=1) is refused, in one line,
# and nothing is filed. A bundle whose stamp has no commit (no COMMIT file was carried) gets the
# commit whose files match the device's fingerprint (scripts/gpu_bundle.py), among the last 500.
#
#   bash scripts/gpu_results.sh DIR                 # DIR: where the device's files landed
#   bash scripts/gpu_results.sh DIR --docs OTHER    # into another docs/gpu copy (tests)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_results.sh DIR [--docs DOCS_DIR]" >&2; exit 2; }
SRC="$1"
DOCS=docs/gpu
[ "${2:-}" != --docs ] || DOCS="$3"
"${PYTHON:-python3}" - "$SRC" "$DOCS" <<'PYEOF'
import json, subprocess, sys
from pathlib import Path

sys.path.insert(0, "scripts")
from gpu_bundle import FOLDERS, fingerprint_of  # noqa: E402

src, docs = Path(sys.argv[1]), Path(sys.argv[2])
BEGIN, END = "<!-- gpu_results: begin (scripts/gpu_results.sh writes this table) -->", \
    "<!-- gpu_results: end -->"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def commit_of(tree: dict) -> str | None:
    """The newest of the last 500 commits whose FOLDERS hold exactly the fingerprinted files."""
    for commit in git("rev-list", "--max-count=500", "HEAD").split():
        listing = git("ls-tree", "-r", commit, "--", *FOLDERS).splitlines()
        entries = [(line.split("\t", 1)[1], line.split()[2]) for line in listing]
        if fingerprint_of(entries)["fingerprint"] == tree.get("fingerprint"):
            return commit
    return None


bundles = []
for path in sorted(src.glob("*.json")):
    bundle = json.loads(path.read_text())
    if not isinstance(bundle, dict) or "stage" not in bundle or "parts" not in bundle:
        continue  # not a gpu_check bundle
    device = str(bundle.get("versions", {}).get("device", "unknown"))
    if bundle.get("on_cpu") or device == "cpu" or device.startswith("unknown"):
        sys.exit(f"gpu_results: {path} names no GPU (device {device!r}): a bundle from a machine "
                 "without CUDA is no GPU result; nothing filed")
    bundles.append(bundle)
filed = []
for bundle in bundles:
    stamp = bundle.get("stamp", {})
    if not bundle.get("commit") and stamp.get("tree"):
        found = commit_of(stamp["tree"])
        how = "matched" if found else "matched no commit of the last 500"
        stamp["resolved"] = f"gpu_results.sh: the device's fingerprint {how}"
        bundle["commit"] = stamp["commit"] = found
    commit = (bundle.get("commit") or "unstamped")[:12]
    target = docs / f"{bundle['stage']}_{commit}.json"
    target.write_text(json.dumps(bundle, indent=1) + "\n")
    filed.append(target)
if not filed:
    sys.exit(f"gpu_results: no gpu_check bundle (<stage>.json) in {src}")


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


bundles = [(p, json.loads(p.read_text())) for p in sorted(docs.glob("*_*.json"))]
bundles = [(p, b) for p, b in bundles if isinstance(b, dict) and "parts" in b]
bundles.sort(key=lambda pb: pb[1].get("started_at") or "")
lines = [BEGIN, "", "| stage | commit | date | device | parts passed | seconds | file |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
for path, b in bundles:
    ok = sum(part["rc"] == 0 for part in b["parts"])
    dirty = " (dirty)" if b.get("stamp", {}).get("dirty") else ""
    failed = [p["name"] for p in b["parts"] if p["rc"] not in (0, None)]
    skipped = [p["name"] for p in b["parts"] if p["rc"] is None]
    notes = [f"{what}: {', '.join(names)}" for what, names in
             (("failed", failed), ("skipped", skipped)) if names]  # fmt: skip
    parts = f"{ok}/{len(b['parts'])}" + (f" ({'; '.join(notes)})" if notes else "")
    lines.append(f"| {b['stage']} | {(b.get('commit') or 'unstamped')[:12]}{dirty} | "
                 f"{(b.get('started_at') or '-')[:10]} | {b['versions'].get('device', '-')} | "
                 f"{parts} | {b.get('seconds', '-')} | [{path.name}]({path.name}) |")
rows = []
for path, b in bundles:
    for part in b["parts"]:
        result = part.get("result") or {}
        if part["name"] != "decode_step" or not result.get("runs"):
            continue
        for r in result["runs"]:
            s, d = r["sparse"], r["dense"]
            rows.append(f"| {(b.get('commit') or 'unstamped')[:12]} | {r['batch']} | "
                        f"{'on' if r['graphs'] else 'off'} | {fmt(s['step_ms'], 3)} | "
                        f"{fmt(d['step_ms'], 3)} | {fmt(r['ratio'])} | {fmt(s.get('host_share'))} "
                        f"| {fmt(d.get('host_share'))} |")
if rows:
    lines += ["", "Decode step (`sparrow-bench decode-step`; its context and budget are in the "
              "bundle):", "", "| commit | batch | graphs | sparse ms | dense ms | dense/sparse "
              "| host share sparse | host share dense |", "| --- | --- | --- | --- | --- | --- | "
              "--- | --- |", *rows]
lines += ["", END]
readme = docs / "README.md"
text = readme.read_text() if readme.exists() else "# GPU results\n"
if BEGIN in text and END in text:
    head, rest = text.split(BEGIN, 1)
    text = head + "\n".join(lines) + rest.split(END, 1)[1]
else:
    text = text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
readme.write_text(text)
for target in filed:
    print(f"filed {target}")
print(f"regenerated the table in {readme} ({len(bundles)} bundles)")
PYEOF
