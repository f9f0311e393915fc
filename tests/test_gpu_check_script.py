"""scripts/gpu_check.sh: every stage refuses at once, in one line, without a CUDA device; every
stage ends inside 7 minutes worst case (set-up, every part's cap, the kill grace and the bundle's
last update summed from the script's own lines; the statement in the script says the same) and
inside the budget it is given (GPU_CHECK_BUDGET_S), skipping what would not fit and saying so;
the kernels stage compiles first, checks the kernels' numbers, then runs only what that compile
warmed; each part states its expected H200 time beside its cap; a stage writes its results as
two files (a bundle and a log) stamped from the carried COMMIT file, never git.
scripts/gpu_results.sh files a bundle into a docs/gpu copy and regenerates its table, refuses a
bundle that names no GPU, and finds an unstamped bundle's commit from its fingerprint."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
LIMIT_S = 420  # 7 minutes: one device call of 10 with room to rerun


def text() -> str:
    return SCRIPT.read_text()


def constant(name: str) -> int:
    return int(re.search(rf"^{name}=(\d+)", text(), flags=re.M).group(1))


def stage_block(stage: str) -> str:
    body = text()[text().index('case "$STAGE" in\nkernels)') :]
    start = body.index(f"\n{stage})" if stage != "step" else "\nstep|distill)")
    return body[start : body.index(";;", start)]


def parts(stage: str) -> list[tuple[str, int, int, str]]:
    """(name, cap s, expected s, command) of each `part` line of a stage."""
    calls = re.findall(r"^\s*part (\S+) (\d+) (\d+) (.*)$", stage_block(stage), flags=re.M)
    return [(name, int(cap), int(expected), cmd) for name, cap, expected, cmd in calls]


def setup_s(stage: str) -> int:
    grace = constant("KILL_GRACE_S")
    probe = constant("PROBE_CAP_S") + grace
    install = constant("INSTALL_CAP_S") + grace
    assert 'if [ "$STAGE" != kernels ]; then' in text()  # the install skips the kernels stage
    return probe + (0 if stage == "kernels" else install)


def worst_case_s(stage: str) -> int:
    grace = constant("KILL_GRACE_S")
    return setup_s(stage) + sum(cap + grace for _, cap, _, _ in parts(stage)) + constant("FINISH_S")


def stated() -> dict[str, int]:
    found = re.search(r"declare -A WORST_CASE_S=\((.*)\)", text()).group(1)
    return {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", found)}


def test_every_stage_ends_inside_seven_minutes_as_stated():
    for stage in ("kernels", "rest", "ranks"):
        assert worst_case_s(stage) <= LIMIT_S, (stage, worst_case_s(stage))
        assert stated()[stage] == worst_case_s(stage), stage
        assert f"= {worst_case_s(stage)}" in text()  # the header's sum
    # step and distill: the parts take what is left of the budget (by default the stated worst
    # case), set-up included
    assert 'BUDGET="${GPU_CHECK_BUDGET_S:-${WORST_CASE_S[$STAGE]}}"' in text()
    assert stated()["step"] == stated()["distill"] <= LIMIT_S
    assert "$(( BUDGET - SECONDS - KILL_GRACE_S - FINISH_S ))" in stage_block("step")


def test_each_part_states_its_expected_h200_time_below_its_cap():
    for stage in ("kernels", "rest", "ranks"):
        for name, cap, expected, _ in parts(stage):
            assert 0 < expected < cap, (stage, name)
    assert "Expected H200 times" in text() and "estimates" in text()


def test_kernels_stage_compiles_checks_numbers_then_runs_only_what_it_warmed():
    (compile_name, _, _, compile_cmd), *later = parts("kernels")
    assert compile_name == "compile" and "decode-step --compile-only" in compile_cmd
    # The kernels against their references before any step is timed (sparrow-bench
    # kernel-check: tests/bench/test_kernel_check.py), then the headline.
    assert [name for name, *_ in later] == ["numerics", "decode_step"]
    assert "kernel-check --json" in later[0][3] and "decode-step --json" in later[1][3]
    assert "export TRITON_CACHE_DIR" in text()  # one cache across the stage's processes


def test_results_are_one_bundle_and_one_log_stamped_without_git():
    code = [line for line in text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"\bgit\b", line)]
    written = {m for line in code for m in re.findall(r'"\$RESULTS/[^"]*"', line)}
    assert written == {'"$RESULTS/$STAGE.json"', '"$RESULTS/$STAGE.log"'}, written
    assert '"$WHEELS/COMMIT"' in text()
    wheels = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    assert 'gpu_bundle.py stamp "$DEST/COMMIT"' in wheels and "--stamp" in wheels


def bundle(commit: str | None, runs: list[dict] | None = None, rc: int = 0,
           device: str = "NVIDIA H200") -> dict:  # fmt: skip
    result = {"runs": runs or []}
    return {
        "stage": "kernels", "commit": commit, "stamp": {"commit": commit, "dirty": False},
        "versions": {"device": device}, "started_at": "2026-12-04T10:00:00Z",
        "seconds": 300, "parts": [
            {"name": "compile", "rc": 0, "seconds": 60, "cap_s": 150, "expected_s": 60,
             "result": None},
            {"name": "decode_step", "rc": rc, "seconds": 45, "cap_s": 150, "expected_s": 45,
             "result": result},
        ],
    }  # fmt: skip


def test_gpu_results_files_a_bundle_and_regenerates_the_table(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text((ROOT / "docs/gpu/README.md").read_text())
    returned = tmp_path / "returned"
    returned.mkdir()
    arm = {"step_ms": 2.5, "host_share": 0.1}
    runs = [{"batch": 16, "graphs": True, "sparse": arm, "dense": {**arm, "step_ms": 10.0},
             "ratio": 4.0}]  # fmt: skip
    (returned / "kernels.json").write_text(json.dumps(bundle("a" * 40, runs)))
    (returned / "kernels.log").write_text("a log stays out of the tree\n")
    script = [str(ROOT / "scripts/gpu_results.sh"), str(returned), "--docs", str(docs)]
    subprocess.run(["bash", *script], check=True, capture_output=True, timeout=HANG_GUARD_S)
    assert sorted(p.name for p in docs.iterdir()) == ["README.md", f"kernels_{'a' * 12}.json"]
    readme = (docs / "README.md").read_text()
    assert f"| kernels | {'a' * 12} | 2026-12-04 | NVIDIA H200 | 2/2 | 300 |" in readme
    assert f"| {'a' * 12} | 16 | on | 2.500 | 10.000 | 4.00 | 0.10 | 0.10 |" in readme
    # A second bundle: both in the table, the first one's row unchanged, the prose kept.
    (returned / "kernels.json").write_text(json.dumps(bundle("b" * 40, rc=1)))
    subprocess.run(["bash", *script], check=True, capture_output=True, timeout=HANG_GUARD_S)
    readme = (docs / "README.md").read_text()
    assert "| 2/2 |" in readme and "| 1/2 (failed: decode_step) |" in readme
    assert readme.count("gpu_results: begin") == 1 and "What it measures" in readme


def run_stage(name: str, out: Path, **extra: str) -> subprocess.CompletedProcess:
    """`bash scripts/gpu_check.sh NAME` where torch sees no CUDA device (CUDA_VISIBLE_DEVICES
    empty: the same on a GPU machine), its results under `out`, `extra` in its environment."""
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(["bash", str(SCRIPT), name], env=env | extra, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)  # fmt: skip


STAGES = ("kernels", "rest", "step", "distill", "ranks")


@pytest.mark.parametrize("name", STAGES)
def test_every_stage_refuses_without_a_cuda_device_in_one_line(name, tmp_path):
    done = run_stage(name, tmp_path / "out")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"gpu_check {name}: refused: torch ") and "no CUDA" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing that gpu_results.sh could file


def test_a_budget_that_is_not_whole_seconds_is_refused(tmp_path):
    done = run_stage("kernels", tmp_path / "out", GPU_CHECK_BUDGET_S="5m")
    assert done.returncode == 2 and "GPU_CHECK_BUDGET_S must be whole seconds" in done.stderr


@pytest.mark.parametrize("name", ["kernels", "rest", "step"])
def test_parts_that_would_not_fit_the_budget_are_skipped_and_the_bundle_says_why(name, tmp_path):
    """A 20 s budget (the CPU rehearsal, GPU_CHECK_ON_CPU=1): the probe runs, no part fits, so
    none runs; each is in the bundle with its cap, why it was skipped and no exit status, and
    the stage exits 1. The step stage's second size is optional: skipped, it fails nothing."""
    out = tmp_path / "out"
    done = run_stage(name, out, GPU_CHECK_ON_CPU="1", GPU_CHECK_BUDGET_S="20",
                     WHEELS=str(tmp_path / "no-wheels"))  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((out / f"{name}.json").read_text())
    assert result["budget_s"] == 20 and result["status"] == 1 and result["on_cpu"]
    expected = [n for n, *_ in parts(name)] if name != "step" else ["step_bench", "step_bench_4096"]
    assert [p["name"] for p in result["parts"]] == expected
    for part in result["parts"]:
        assert part["rc"] is None and "left of GPU_CHECK_BUDGET_S=20" in part["skipped"], part
        assert f"== {part['name']} skipped: {part['skipped']}" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == [f"{name}.json", f"{name}.log"]


def test_gpu_results_refuses_a_bundle_that_names_no_gpu(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text((ROOT / "docs/gpu/README.md").read_text())
    for device in ("cpu", "unknown (RuntimeError: no driver)"):
        returned = tmp_path / "returned"
        returned.mkdir(exist_ok=True)
        (returned / "kernels.json").write_text(json.dumps(bundle("a" * 40, device=device)))
        script = [str(ROOT / "scripts/gpu_results.sh"), str(returned), "--docs", str(docs)]
        done = subprocess.run(
            ["bash", *script], capture_output=True, text=True, timeout=HANG_GUARD_S
        )
        assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "names no GPU" in done.stderr and repr(device) in done.stderr
        assert sorted(p.name for p in docs.iterdir()) == ["README.md"]  # nothing filed


def load_bundle_script():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_bundle
    finally:
        sys.path.pop(0)
    return gpu_bundle


def head_fingerprint() -> dict:
    """The fingerprint of HEAD's files, listed by git (as gpu_results.sh lists them)."""
    gpu_bundle = load_bundle_script()
    listing = subprocess.run(["git", "ls-tree", "-r", "HEAD", "--", *gpu_bundle.FOLDERS], cwd=ROOT,
                             capture_output=True, text=True, check=True,
                             timeout=HANG_GUARD_S).stdout  # fmt: skip
    entries = [(line.split("\t", 1)[1], line.split()[2]) for line in listing.splitlines()]
    return gpu_bundle.fingerprint_of(entries)


def test_fingerprint_of_a_tree_equals_the_commits_listing(tmp_path):
    """What the device hashes from the files as they lie equals what git lists for the commit
    (file modes and Python's caches do not count): the tie between a bundle and its commit."""
    gpu_bundle = load_bundle_script()
    archive = subprocess.run(["git", "archive", "HEAD", *gpu_bundle.FOLDERS], cwd=ROOT,
                             capture_output=True, check=True,
                             timeout=HANG_GUARD_S).stdout  # fmt: skip
    subprocess.run(
        ["tar", "-x", "-C", str(tmp_path)], input=archive, check=True, timeout=HANG_GUARD_S
    )
    (tmp_path / "sparrow/__pycache__").mkdir(exist_ok=True)
    (tmp_path / "sparrow/__pycache__/x.cpython-311.pyc").write_bytes(b"cache")
    os.chmod(tmp_path / "scripts/gpu_check.sh", 0o644)  # a copy that lost the exec bit
    assert gpu_bundle.fingerprint(tmp_path) == head_fingerprint()
    (tmp_path / "sparrow/__init__.py").write_text("# edited\n")
    assert gpu_bundle.fingerprint(tmp_path) != head_fingerprint()


def test_stamp_says_its_source_and_whether_the_tree_is_the_one_stamped(tmp_path):
    gpu_bundle = load_bundle_script()
    tree = {"fingerprint": "f" * 64, "files": 3}
    missing = gpu_bundle.stamp_of(str(tmp_path / "COMMIT"), tree)
    assert missing["commit"] is None and missing["source"].startswith("none: no COMMIT file")
    assert missing["tree"] == tree
    stamp = {"commit": "c" * 40, "dirty": False, "stamped_at": "2026-12-06T00:00:00Z"}
    for fingerprint, matches in (("f" * 64, True), ("e" * 64, False)):
        (tmp_path / "COMMIT").write_text(json.dumps(stamp | {"fingerprint": fingerprint}))
        found = gpu_bundle.stamp_of(str(tmp_path / "COMMIT"), tree)
        assert found["commit"] == "c" * 40 and found["tree_matches_stamp"] is matches
        assert found["source"].startswith(f"{tmp_path / 'COMMIT'} (scripts/gpu_wheels.sh --stamp")


def test_gpu_results_finds_an_unstamped_bundles_commit_from_its_fingerprint(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=HANG_GUARD_S).stdout.strip()  # fmt: skip
    docs, returned = tmp_path / "docs", tmp_path / "returned"
    docs.mkdir()
    returned.mkdir()
    unstamped = bundle(None)
    unstamped["stamp"] = {"commit": None, "source": "none: ...", "tree": head_fingerprint()}
    (returned / "kernels.json").write_text(json.dumps(unstamped))
    script = [str(ROOT / "scripts/gpu_results.sh"), str(returned), "--docs", str(docs)]
    subprocess.run(["bash", *script], check=True, capture_output=True, timeout=HANG_GUARD_S)
    filed = json.loads((docs / f"kernels_{head[:12]}.json").read_text())
    assert filed["commit"] == filed["stamp"]["commit"] == head
    assert filed["stamp"]["resolved"] == "gpu_results.sh: the device's fingerprint matched"
