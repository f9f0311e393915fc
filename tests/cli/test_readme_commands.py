"""Every command of the README's "Using it" block runs to completion on a CPU machine, with the
fewest steps (slow: the long-context one alone takes tens of minutes on 2 cores).

The commands are read from README.md, so a command added there is run here (or fails the
`test_every_readme_command_is_covered` check until it has its fewest-steps arguments below).
The GPU command runs as a dry run (the memory plan from its shipped config, no weights): it must
fit the H200 the dry run plans for.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

# Console script + its first README word -> the arguments added to run it briefly.
FEWEST = {
    "sparrow-train": ["rl.steps=1", "rl.eval.every=0"],
    "sparrow-train preset=smoke": [],
    "sparrow-train preset=tiny": [],
    "sparrow-train data=long_context": ["rl.steps=1"],
    "sparrow-train model=hf": ["dry_run=true"],
    "sparrow-train preset=qwen3_1p7b_gpu": ["dry_run=true"],
    "sparrow-train data=jsonl": ["rl.steps=1", "rl.prompts_per_step=2", "rl.eval.every=0"],
    "sparrow-train distill=default": ["rl.steps=1", "rl.eval.every=0"],
    "sparrow-report": [],
    "sparrow-calibrate": ["--prompts", "1", "--samples", "2", "--online", "1"],
    "sparrow-generate": [],
    "sparrow-eval": [],
    "sparrow-bench decode-step": [],  # a tiny shape on a CPU
    "sparrow-bench kernel": ["--contexts", "1024", "--budgets", "256", "--iters", "1"],
    "sparrow-bench rollout": ["--batch", "1", "--new-tokens", "4", "--sparse-new-tokens", "4"],
    "sparrow-bench step": [],
}


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    block = block.replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("sparrow-"):
            commands.append(" ".join(line.split()))
    return commands


def key(command: str) -> str:
    words = command.split()
    two = " ".join(words[:2])
    return two if two in FEWEST else words[0]


def test_every_readme_command_is_covered():
    assert len(readme_commands()) >= 10
    assert all(key(c) in FEWEST for c in readme_commands()), readme_commands()


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    readme_commands(),
    ids=[re.sub(r"[^\w]+", "_", key(c)) for c in readme_commands()],
)
def test_readme_command_runs_to_completion(command, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}
    if "data.source=train.jsonl" in command:
        rows = [f'{{"question": "What is {i} + {i}?", "answer": "{2 * i}"}}' for i in range(8)]
        (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    args = shlex.split(command) + FEWEST[key(command)]
    if args[0] == "sparrow-train" and "--cfg" not in args:
        args.append(f"run_dir={tmp_path / 'run'}")
    if args[0] in ("sparrow-report", "sparrow-eval"):  # the default run's metrics and policy,
        subprocess.run([sys.executable, "-m", "sparrow.cli.train", "preset=smoke",  # 2 steps
                        f"run_dir={tmp_path / 'runs/default'}"], cwd=tmp_path, env=env,
                       check=True, capture_output=True, timeout=HANG_GUARD_S)  # fmt: skip
        args = [args[0], str(tmp_path / "runs/default")]
    if args[0] == "sparrow-calibrate":
        args += ["--out", str(tmp_path / "calibrate")]
    script = Path(sys.executable).with_name(args[0])
    out = subprocess.run([str(script), *args[1:]], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=2 * HANG_GUARD_S)  # fmt: skip
    assert out.returncode == 0, f"{command}: {out.stderr[-2000:]}"
    if args[0] == "sparrow-eval":  # the exported policy's accuracy, with its interval
        assert re.fullmatch(r"accuracy [\d.]+ \(95% CI [\d.]+-[\d.]+, n=\d+\)\n", out.stdout)
    if re.match(r"sparrow-train (?!.*--cfg)(?!.*dry_run=true)", " ".join(args)):
        assert (tmp_path / "run" / "metrics.jsonl").exists()
