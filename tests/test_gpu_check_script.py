"""scripts/gpu_check.sh: every stage ends inside 7 minutes worst case (set-up, every part's cap,
the kill grace and the bundle's last update summed from the script's own lines; the statement
in the script says the same), the kernels stage compiles first and then runs only what that
compile warmed, each part states its expected H200 time beside its cap, and a stage writes its
results as two files (a bundle and a log) stamped from the carried COMMIT file, never git.
scripts/gpu_results.sh files a bundle into a docs/gpu copy and regenerates its table."""

import json
import re
import subprocess
from pathlib import Path

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
    # step and distill: the parts take what is left of the stage budget, set-up included
    budget = int(re.search(r'BUDGET="\$\{STAGE_BUDGET_S:-(\d+)\}"', text()).group(1))
    assert budget <= LIMIT_S and stated()["step"] == stated()["distill"] == budget
    assert "$(( BUDGET - SECONDS - 10 ))" in stage_block("step")


def test_each_part_states_its_expected_h200_time_below_its_cap():
    for stage in ("kernels", "rest", "ranks"):
        for name, cap, expected, _ in parts(stage):
            assert 0 < expected < cap, (stage, name)
    assert "Expected H200 times" in text() and "estimates" in text()


def test_kernels_stage_compiles_first_then_runs_only_what_it_warmed():
    (compile_name, _, _, compile_cmd), *later = parts("kernels")
    assert compile_name == "compile" and "decode-step --compile-only" in compile_cmd
    assert [name for name, *_ in later] == ["decode_step"]
    assert all("decode-step --json" in cmd for *_, cmd in later)
    assert "export TRITON_CACHE_DIR" in text()  # one cache across the stage's processes


def test_results_are_one_bundle_and_one_log_stamped_without_git():
    code = [line for line in text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"\bgit\b", line)]
    written = {m for line in code for m in re.findall(r'"\$RESULTS/[^"]*"', line)}
    assert written == {'"$RESULTS/$STAGE.json"', '"$RESULTS/$STAGE.log"'}, written
    assert '"$WHEELS/COMMIT"' in text()
    wheels = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    assert '>"$DEST/COMMIT"' in wheels and "--stamp" in wheels


def bundle(commit: str, runs: list[dict] | None = None, rc: int = 0) -> dict:
    result = {"runs": runs or []}
    return {
        "stage": "kernels", "commit": commit, "stamp": {"commit": commit, "dirty": False},
        "versions": {"device": "NVIDIA H200"}, "started_at": "2026-12-04T10:00:00Z",
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
    subprocess.run(["bash", *script], check=True, capture_output=True, timeout=60)
    assert sorted(p.name for p in docs.iterdir()) == ["README.md", f"kernels_{'a' * 12}.json"]
    readme = (docs / "README.md").read_text()
    assert f"| kernels | {'a' * 12} | 2026-12-04 | NVIDIA H200 | 2/2 | 300 |" in readme
    assert f"| {'a' * 12} | 16 | on | 2.500 | 10.000 | 4.00 | 0.10 | 0.10 |" in readme
    # A second bundle: both in the table, the first one's row unchanged, the prose kept.
    (returned / "kernels.json").write_text(json.dumps(bundle("b" * 40, rc=1)))
    subprocess.run(["bash", *script], check=True, capture_output=True, timeout=60)
    readme = (docs / "README.md").read_text()
    assert "| 2/2 |" in readme and "| 1/2 (failed: decode_step) |" in readme
    assert readme.count("gpu_results: begin") == 1 and "What it measures" in readme
