"""The README's quickstart block runs as written, in order, on a CPU machine (slow: the default
run alone is ~14 min on 2 cores), and each guide's opening block runs with the fewest steps
(slow), so a command a reader copies first is a command that works.

The commands are read from the documents (parsed as tests/cli/test_documented_commands.py parses
them), so a command changed there is the command run here; a guide command without its
fewest-steps arguments below fails `test_every_guide_command_is_covered` until it has them.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from test_documented_commands import INFORMATION_ONLY, Command, extract

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

# Console script + its first word -> the arguments added to run it briefly (the longest match).
FEWEST = {
    "sparrow-train": ["rl.steps=1", "rl.eval.every=0"],
    "sparrow-train preset=smoke": [],
    "sparrow-train preset=tiny": [],
    "sparrow-train data=long_context": ["rl.steps=1"],
    "sparrow-train preset=qwen3_1p7b_gpu": ["dry_run=true"],
    "sparrow-report": [],
    "sparrow-calibrate": ["--prompts", "1", "--samples", "2", "--online", "1"],
    "sparrow-eval": [],
    "sparrow-bench decode-step": [],  # a tiny shape on a CPU
    "sparrow-bench kernel": ["--contexts", "1024", "--budgets", "256", "--iters", "1"],
    "sparrow-bench rollout": ["--batch", "1", "--new-tokens", "4", "--sparse-new-tokens", "4"],
    "sparrow-bench step": [],
}


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    return env | {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}


def _first_block(text: str, name: str, after: str = "") -> list[Command]:
    """The commands of the first bash block of `text` (after the line `after`), where-lines
    counted in the whole document."""
    start = text.index(after) if after else 0
    start = text.index("```bash", start)
    end = text.index("```", start + 7) + 3
    lines_before = "\n" * text.count("\n", 0, start)
    return [c for c in extract(lines_before + text[start:end], name) if not c.mention]


def quickstart() -> list[Command]:
    return _first_block(README.read_text(), "README.md", "## Quickstart")


def _option(command: Command, key: str) -> str | None:
    found = [w.split("=", 1)[1] for w in command.args if w.startswith(f"{key}=")]
    return found[-1] if found else None


def test_the_quickstart_is_the_five_first_commands():
    """The default run, your model/data/reward on the CPU, a GPU preset, sparrow-eval and
    sparrow-report, the last two reading the runs the block trains; then the Python tool task."""
    default, yours, gpu, evaluate, report, tool = quickstart()
    assert tool == python_tool_command()
    assert default.words == ("sparrow-train",)
    assert _option(yours, "data.source") and _option(yours, "rl.reward.function")
    assert (_option(yours, "model") or "").startswith("tiny_")
    assert (_option(gpu, "preset") or "").endswith("_gpu") and _option(gpu, "dry_run") == "true"
    assert evaluate.program == "sparrow-eval" and evaluate.args == [_option(yours, "run_dir")]
    assert report.program == "sparrow-report" and report.args == ["runs/default"]


def _run(words: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name(words[0])
    return subprocess.run([str(script), *words[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=2 * HANG_GUARD_S)  # fmt: skip


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = _env(tmp_path)
    for command in quickstart():  # in order: eval and report read the runs the block trains
        out = _run(list(command.words), tmp_path, env)
        assert out.returncode == 0, f"{shlex.join(command.words)}: {out.stderr[-2000:]}"
        if command.program == "sparrow-eval":
            assert re.search(r"^accuracy [\d.]+ \(95% CI [\d.]+-[\d.]+, n=\d+\)$", out.stdout, re.M)
        elif command.program == "sparrow-report":
            assert (tmp_path / "runs/default/report/report.png").is_file()
        elif _option(command, "dry_run") == "true":
            assert re.search(r"^memory: peak [\d.]+ GiB", out.stdout, re.M), out.stdout
        else:
            run_dir = tmp_path / (_option(command, "run_dir") or "runs/default")
            assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "policy").is_dir()


def python_tool_command() -> Command:
    """The README's command for the Python tool task on SmolLM2 (issue 62)."""
    (command,) = [c for c in quickstart() if _option(c, "env") == "python"]
    return command


@pytest.mark.slow
def test_the_python_tool_command_runs_as_written(tmp_path):
    """The README's `sparrow-train env=python ...` line, word for word, in a fresh directory
    holding the examples it reads: SmolLM2's episodes on the Python tool, every step logged."""
    command = python_tool_command()
    assert command.program == "sparrow-train" and _option(command, "rl.steps") == "2"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    out = _run(list(command.words), tmp_path, _env(tmp_path))
    assert out.returncode == 0, f"{shlex.join(command.words)}: {out.stderr[-2000:]}"
    run_dir = tmp_path / (_option(command, "run_dir") or "runs/default")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["env/episodes"] > 0 and "episode/turns_mean" in r for r in steps)
    assert (run_dir / "policy").is_dir()


def guide_commands() -> list[Command]:
    """Each guide's opening block, less what test_documented_commands already runs (information
    only) and the guide the your-model test runs; each distinct command once."""
    found: dict[tuple[str, ...], Command] = {}
    for guide in GUIDES:
        if guide.name == "your-model-data-reward.md":  # tests/cli/test_readme_your_model.py
            continue
        for c in _first_block(guide.read_text(), guide.name):
            if c.program.startswith("sparrow-") and not set(c.args) & set(INFORMATION_ONLY):
                found.setdefault(c.words, c)
    return list(found.values())


def key(command: Command) -> str:
    two = " ".join(command.words[:2])
    return two if two in FEWEST else command.words[0]


def test_every_guide_command_is_covered():
    commands = guide_commands()
    assert len(commands) >= 10
    assert all(key(c) in FEWEST for c in commands), [str(c) for c in commands]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", guide_commands(), ids=lambda c: re.sub(r"\W+", "_", str(c))[:60]
)
def test_guide_command_runs_with_the_fewest_steps(command, tmp_path):
    env = _env(tmp_path)
    args = list(command.words) + FEWEST[key(command)]
    if args[0] == "sparrow-train" and "dry_run=true" not in args:
        args.append(f"run_dir={tmp_path / 'run'}")
    if args[0] in ("sparrow-report", "sparrow-eval"):  # the smoke run's metrics and policy
        smoke = [sys.executable, "-m", "sparrow.cli.train", "preset=smoke",
                 f"run_dir={tmp_path / 'runs/default'}"]  # fmt: skip
        subprocess.run(smoke, cwd=tmp_path, env=env, check=True, capture_output=True,
                       timeout=HANG_GUARD_S)  # fmt: skip
        args = [args[0], str(tmp_path / "runs/default")]
    if args[0] == "sparrow-calibrate":
        args += ["--out", str(tmp_path / "calibrate")]
    out = _run(args, tmp_path, env)
    assert out.returncode == 0, f"{command}: {out.stderr[-2000:]}"
    if args[0] == "sparrow-train" and "dry_run=true" not in args:
        assert (tmp_path / "run" / "metrics.jsonl").exists()
