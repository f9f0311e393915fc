"""Import boundaries of DESIGN.md §3, checked statically so a violation fails CI."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "sparrow"


def _imports(path: Path, root: Path = PKG.parent) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            base = ".".join(path.relative_to(root).with_suffix("").parts[: -node.level])
            names.add(f"{base}.{node.module}" if node.module else base)
    return names


def _files():
    return sorted(PKG.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(PKG.parent).as_posix()


@pytest.mark.parametrize("path", _files(), ids=_rel)
def test_import_boundaries(path):
    rel = _rel(path)
    imports = _imports(path)
    roots = {name.split(".")[0] for name in imports}
    if "triton" in roots:
        assert rel.startswith("sparrow/kernels/"), f"{rel}: triton outside sparrow/kernels/"
    if "deepspeed" in roots:
        assert rel == "sparrow/rl/actor.py", f"{rel}: deepspeed outside the actor module"
    if roots & {"hydra", "omegaconf"}:
        assert rel.startswith("sparrow/cli/"), f"{rel}: Hydra outside the CLI edge"
    if rel.startswith("sparrow/kernels/"):
        inner = {
            n for n in imports if n.startswith("sparrow.") and not n.startswith("sparrow.kernels")
        }
        assert not inner, f"{rel}: kernels import {inner}"
    if rel.startswith("sparrow/rollout/"):
        bad = {n for n in imports if n.startswith(("sparrow.rl", "sparrow.distill"))}
        assert not bad, f"{rel}: rollout imports {bad}"


def test_layering_check_sees_violations(tmp_path):
    """The checker itself must notice an import, or the policy test could never fail."""
    fake = tmp_path / "sparrow" / "kernels" / "probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("import sparrow.rl.losses\nfrom ..rollout import engine\n")
    assert {"sparrow.rl.losses", "sparrow.rollout"} <= _imports(fake, root=tmp_path)


# What a benchmark or the engine imports must work on a GPU image without the training-only
# packages: reading a config, the rollout engine and the kernel/rollout benchmarks.
LIGHT_MODULES = [
    "sparrow.config",
    "sparrow.bench.cli",
    "sparrow.bench.kernel",
    "sparrow.bench.rollout",
    *sorted(f"sparrow.rollout.{p.stem}" for p in (PKG / "rollout").glob("*.py")),
]
HEAVY = ("deepspeed", "wandb")


def _pulled_in(modules: list[str]) -> list[str]:
    """The HEAVY packages in sys.modules after importing `modules` in a fresh interpreter."""
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print('heavy:' + ','.join(n for n in {HEAVY!r} if n in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    heavy = done.stdout.strip().splitlines()[-1].removeprefix("heavy:")
    return [n for n in heavy.split(",") if n]


def test_config_and_engine_paths_import_neither_deepspeed_nor_wandb():
    assert _pulled_in(LIGHT_MODULES) == []


def test_transitive_import_check_sees_deepspeed():
    """The actor imports deepspeed: the check must notice, or it could never fail."""
    assert "deepspeed" in _pulled_in(["sparrow.rl.actor"])
