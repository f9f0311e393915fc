"""The GPU check's `step` stage on a simulated stock PyTorch image (slow; needs PyPI once).

tests/simulated_image/sitecustomize.py hides, in a child interpreter, the packages such an image
lacks (hydra, omegaconf, deepspeed, wandb, datasets, math-verify, gguf and their dependencies)
unless they come from one folder; that folder is filled the way scripts/gpu_check.sh fills it:
`pip install --no-index --no-deps --target` from the wheel folder of scripts/gpu_wheels.sh, here
for this interpreter's Python version. SPARROW_TEST_WHEELS names an already fetched folder.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
IMPORTS = (
    "import sparrow.bench.step, sparrow.cli.config_loader, sparrow.train.trainer, "
    "sparrow.rl.actor, sparrow.tasks.math_verifier, math_verify, gguf, wandb, hydra, omegaconf, "
    "deepspeed\n"
    "for m in (hydra, omegaconf, deepspeed, math_verify, gguf, wandb): print(m.__file__)\n"
)


@pytest.fixture(scope="module")
def deps(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("image")
    wheels = os.environ.get("SPARROW_TEST_WHEELS")
    if not wheels:
        wheels = tmp / "wheels"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        script = [str(ROOT / "scripts/gpu_wheels.sh"), "--python-version", version]
        subprocess.run(["bash", *script, "--dest", str(wheels)], check=True, timeout=1500)
    target = tmp / "deps"
    files = sorted(str(w) for w in Path(wheels).glob("*.whl"))
    assert not [f for f in files if Path(f).name.startswith(("torch-", "triton-", "nvidia"))]
    install = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target)]
    subprocess.run([sys.executable, *install, *files], check=True, timeout=600)
    return target


def _image(deps: Path, tmp_path: Path, with_deps: bool = True) -> dict[str, str]:
    path = [str(ROOT / "tests/simulated_image"), str(ROOT)] + ([str(deps)] if with_deps else [])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "SPARROW_IMAGE_DEPS": str(deps if with_deps else tmp_path / "empty"),
        "SPARROW_CACHE": str(tmp_path / "cache"),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"),  # DeepSpeed's CPU ops
        "HF_HUB_OFFLINE": "1",
    }


def _python(args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_hiding_is_real(deps, tmp_path):
    """Without the folder the image has no hydra or deepspeed (though this venv does)."""
    env = _image(deps, tmp_path, with_deps=False)
    for name in ("hydra", "deepspeed", "math_verify", "gguf", "wandb", "datasets"):
        done = _python(["-c", f"import {name}"], env)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, name
    assert _python(["-c", "import sparrow.train.config, torch, transformers"], env).returncode == 0


def test_step_stage_imports_resolve_from_the_wheel_folder(deps, tmp_path):
    done = _python(["-c", IMPORTS], _image(deps, tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    files = done.stdout.strip().splitlines()[-6:]
    assert all(f.startswith(str(deps)) for f in files), files


def test_tiny_step_runs_to_its_json(deps, tmp_path):
    out = tmp_path / "step.json"
    argv = ["-m", "sparrow.bench.cli", "step", "--random-model", "qwen3-debug"]
    argv += ["--json", str(out), "preset=tiny", "rollout.max_new_tokens=16"]
    # The GPU presets' actor settings: token-budget micro-batches, activation checkpointing.
    argv += ["actor.max_tokens_per_micro_batch=64", "actor.activation_checkpointing=true"]
    done = _python(argv, _image(deps, tmp_path), timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"sparse", "dense", "rollout_speedup", "step_speedup"} <= report.keys()
