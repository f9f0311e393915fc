"""Import boundaries of DESIGN.md §3, checked statically so a violation fails CI."""

import ast
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
