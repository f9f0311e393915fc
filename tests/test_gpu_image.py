"""The GPU check's `step` stage on a simulated stock PyTorch image (slow; needs PyPI once).

tests/simulated_image/sitecustomize.py hides, in a child interpreter, the packages such an image
lacks (hydra, omegaconf, deepspeed, wandb, datasets, math-verify, gguf and their dependencies)
unless they come from one folder; that folder is filled the way scripts/gpu_check.sh fills it:
`pip install --no-index --no-deps --target` from the wheel folder of scripts/gpu_wheels.sh, here
for this interpreter's Python version. SPARROW_TEST_WHEELS names an already fetched folder.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

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
        subprocess.run(["bash", *script, "--dest", str(wheels)], check=True, timeout=HANG_GUARD_S)
    target = tmp / "deps"
    files = sorted(str(w) for w in Path(wheels).glob("*.whl"))
    assert not [f for f in files if Path(f).name.startswith(("torch-", "triton-", "nvidia"))]
    install = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target)]
    subprocess.run([sys.executable, *install, *files], check=True, timeout=HANG_GUARD_S)
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


def _python(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
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
    done = _python(argv, _image(deps, tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"sparse", "dense", "rollout_speedup", "step_speedup"} <= report.keys()


def test_rollout_rank_launch_takes_its_packages_from_the_wheel_folder(deps, tmp_path):
    """The ranks stage's runs start torchrun workers (scripts/launch_multinode.sh) and a
    one-process run from a test: each child must still find the wheel folder's packages (its
    PYTHONPATH extended, not replaced). The CPU twin of tests/train/test_rollout_ranks_gpu.py."""
    test = "tests/train/test_rollout_ranks.py::test_rollout_rank_run_equals_the_one_process_run"
    argv = ["-m", "pytest", "-q", "-m", "slow", "-p", "no:cacheprovider", test]
    argv += ["--basetemp", str(tmp_path / "runs")]
    env = _image(deps, tmp_path) | {"PYTHON": sys.executable}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:]


def test_kernels_stage_rehearsed_on_the_cpu_returns_a_stamped_bundle(tmp_path):
    """The kernels stage rehearsed on this CPU (GPU_CHECK_ON_CPU=1: without it the stage refuses
    to run), in a copy of the tree without .git, on an image without the wheel folder's packages
    (the stage needs none): at most 4 files come back (the device returns 8), the bundle names
    the commit from the carried COMMIT stamp and says the tree is the one stamped, every part
    ran (the numeric check before the timed headline), and scripts/gpu_results.sh refuses the
    CPU bundle; the same bundle as a GPU would have named it files into a copy of docs/gpu."""
    tree, out, docs = tmp_path / "tree", tmp_path / "out", tmp_path / "docs"
    for folder in ("conf", "scripts", "sparrow", "tests"):  # what the fingerprint covers
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs/gpu", docs)
    # Stamped here, from the checkout the copy was taken of: the same files, so the same
    # fingerprint as the copy's on the "device".
    stamp = ["bash", str(ROOT / "scripts/gpu_wheels.sh"), "--stamp", "--dest", str(tree / "wheels")]
    subprocess.run(stamp, check=True, capture_output=True, timeout=HANG_GUARD_S)
    commit = json.loads((tree / "wheels/COMMIT").read_text())["commit"]
    env = _image(tmp_path / "no-deps", tmp_path, with_deps=False)
    env |= {
        "OUT": str(out),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT / "tests/simulated_image"),
        "GPU_CHECK_ON_CPU": "1",
    }
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "kernels"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (tree / ".git").exists()
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == ["kernels.json", "kernels.log"], files  # <= 4
    bundle = json.loads((out / "kernels.json").read_text())
    assert bundle["commit"] == commit and bundle["worst_case_s"] <= 420
    assert bundle["stamp"]["tree_matches_stamp"] is True and bundle["on_cpu"] is True
    ran = [(p["name"], p["rc"]) for p in bundle["parts"]]
    assert ran == [("compile", 0), ("numerics", 0), ("decode_step", 0)]
    assert all(c["ok"] for c in bundle["parts"][1]["result"]["checks"])  # the check's own JSON
    assert bundle["parts"][2]["result"]["runs"]  # the bench's own JSON, inside the bundle
    script = [str(ROOT / "scripts/gpu_results.sh"), str(out), "--docs", str(docs)]
    refused = subprocess.run(
        ["bash", *script], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert refused.returncode != 0 and "names no GPU" in refused.stderr
    bundle["versions"]["device"], bundle["on_cpu"] = "NVIDIA H100 80GB HBM3", False
    (out / "kernels.json").write_text(json.dumps(bundle))
    subprocess.run(["bash", *script], check=True, capture_output=True, timeout=HANG_GUARD_S)
    assert (docs / f"kernels_{commit[:12]}.json").exists()
    readme = (docs / "README.md").read_text()
    assert f"| kernels | {commit[:12]}" in readme and "| 3/3 |" in readme
    assert f"| {commit[:12]} | 4 | off |" in readme  # the decode-step row (CPU shape: batch 4)
