"""Import boundaries and the dependency direction (docs/DESIGN.md, "Layout"), checked statically
so that a violation fails CI.

The direction: kernels -> rollout -> control -> rl -> distill, monitor -> train -> cli ->
bench, experiments. A package imports only packages of a lower rank (and itself); packages of one
rank do not import each other. `models` (loading weights, the model shape), `tasks` (prompts,
rewards) and the leaf modules `distributed.py` (collectives over ranks) and `malloc.py` depend on
no other part of sparrow, so they sit at the bottom beside kernels; `cluster.py` (rollout ranks
apart from training ranks) imports only distributed.py and ranks beside rollout. The run's config is
train/config.py, ranked with train like any module (no exception). Inside train/ the same rule
holds one level down: run/ (the run dir's lifecycle) -> logs/ -> config.py -> memory/ -> the loop's
modules (the rest of train/). No import cycle among the modules. Each package's and subpackage's
docstring maps its files.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

PKG = Path(__file__).resolve().parents[1] / "sparrow"

RANK = {
    "kernels": 0,
    "models": 0,
    "tasks": 0,
    "malloc": 0,
    "distributed": 0,
    "cluster": 1,
    "rollout": 1,
    "control": 2,
    "rl": 3,
    "distill": 4,
    "monitor": 4,
    "train": 5,
    "cli": 6,
    "bench": 7,
    "experiments": 7,
}


def _imports(path: Path, root: Path = PKG.parent) -> set[str]:
    """Every module name `path` imports, at any depth (deferred imports in functions too);
    `from pkg import name` also yields `pkg.name`, which `_module_graph` keeps if it is a file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module
            else:
                parts = path.relative_to(root).with_suffix("").parts
                if path.name == "__init__.py":
                    parts = parts[:-1] + ("__init__",)
                base = ".".join(parts[: -node.level] + ((node.module,) if node.module else ()))
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _files(pkg: Path = PKG):
    return sorted(pkg.rglob("*.py"))


def _rel(path: Path, root: Path = PKG.parent) -> str:
    return path.relative_to(root).as_posix()


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _component(module: str) -> str | None:
    """The ranked part of sparrow a module belongs to (`sparrow.rl.losses` -> "rl")."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "sparrow":
        return None
    return parts[1]


# Inside train/: a part imports only parts of a lower rank (and itself); the loop is the top.
TRAIN_RANK = {"run": 0, "logs": 1, "config": 2, "memory": 3}
TRAIN_LOOP = 4


def _train_part(module: str) -> int | None:
    """The rank inside train/ of a module of it (`sparrow.train.run.lock` -> 0), or None."""
    parts = module.split(".")
    if parts[:2] != ["sparrow", "train"] or len(parts) < 3 or parts[2] == "__init__":
        return None
    return TRAIN_RANK.get(parts[2], TRAIN_LOOP)


def train_violations(path: Path, root: Path = PKG.parent) -> set[str]:
    """The sparrow.train modules `path` (a module of train/) imports against run -> logs ->
    config -> memory -> the loop."""
    own_module = _module(path, root)
    own = _train_part(own_module)
    if own is None or own == TRAIN_LOOP:
        return set()
    bad = set()
    for name in _imports(path, root):
        other = _train_part(name)
        same_part = name.split(".")[:3] == own_module.split(".")[:3]
        if other is not None and not same_part and other >= own:
            bad.add(name)
    return bad


def direction_violations(path: Path, root: Path = PKG.parent) -> set[str]:
    """The sparrow modules `path` imports against the dependency direction."""
    own = _component(_module(path, root))
    if own is None:  # sparrow/__init__.py
        return set()
    bad = set()
    for name in _imports(path, root):
        other = _component(name)
        if other is None or other == own or name == "sparrow." + other + ".__init__":
            continue
        if other not in RANK:
            bad.add(f"{name} (unranked)")
        elif own not in RANK or RANK[other] >= RANK[own]:
            bad.add(name)
    return bad


def _module_graph(pkg: Path) -> dict[str, set[str]]:
    root = pkg.parent
    modules = {_module(p, root): p for p in _files(pkg)}
    graph = {}
    for name, path in modules.items():
        graph[name] = {n for n in _imports(path, root) if n in modules and n != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("path", _files(), ids=_rel)
def test_import_boundaries(path):
    rel = _rel(path)
    roots = {name.split(".")[0] for name in _imports(path)}
    if "triton" in roots:
        assert rel.startswith("sparrow/kernels/"), f"{rel}: triton outside sparrow/kernels/"
    if "deepspeed" in roots:
        assert rel == "sparrow/rl/actor.py", f"{rel}: deepspeed outside the actor module"
    if roots & {"hydra", "omegaconf"}:
        assert rel.startswith("sparrow/cli/"), f"{rel}: Hydra outside the CLI edge"


@pytest.mark.parametrize("path", _files(), ids=_rel)
def test_dependency_direction(path):
    bad = direction_violations(path)
    assert not bad, f"{_rel(path)} imports against kernels -> ... -> cli: {sorted(bad)}"


@pytest.mark.parametrize("path", _files(PKG / "train"), ids=_rel)
def test_train_direction(path):
    bad = train_violations(path)
    assert not bad, f"{_rel(path)} imports against run -> logs -> config -> memory -> loop: {bad}"


def test_no_import_cycle():
    cycle = find_cycle(_module_graph(PKG))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_package_is_ranked():
    parts = {p.stem if p.is_file() else p.name for p in PKG.iterdir() if not p.name.startswith("_")}
    parts = {p for p in parts if (PKG / p).is_dir() or (PKG / f"{p}.py").is_file()}
    assert parts <= set(RANK), f"place {sorted(parts - set(RANK))} in RANK"


@pytest.mark.parametrize(
    "package",
    sorted(p.parent for p in PKG.rglob("__init__.py") if p.parent != PKG),
    ids=lambda p: _rel(p),
)
def test_every_package_maps_its_files(package):
    """Each package's docstring names every module and subpackage in it: the map a newcomer
    reads first."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    files = sorted(p.stem for p in package.glob("*.py") if p.name != "__init__.py")
    files += sorted(p.parent.name + "/" for p in package.glob("*/__init__.py"))
    missing = [f for f in files if not re.search(rf"\b{re.escape(f)}", doc)]
    assert not missing, f"{_rel(package)}/__init__.py does not name {missing}"


def test_layering_check_sees_violations(tmp_path):
    """The checkers themselves must notice a backward import and a cycle, or the policy tests
    above could never fail."""
    pkg = tmp_path / "sparrow"
    for name in ("rollout", "rl", "tasks"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    # rollout importing the algorithm, absolutely and relatively: both against the direction.
    probe = pkg / "rollout" / "probe.py"
    probe.write_text("import sparrow.rl.losses\nfrom ..rl import actor\nfrom . import sibling\n")
    assert direction_violations(probe, root=tmp_path) == {
        "sparrow.rl.losses",
        "sparrow.rl",
        "sparrow.rl.actor",
    }
    # The forward direction passes.
    (pkg / "rl" / "ok.py").write_text("from sparrow.rollout import probe\n")
    assert direction_violations(pkg / "rl" / "ok.py", root=tmp_path) == set()
    # A deferred import that closes a loop is a cycle.
    (pkg / "tasks" / "a.py").write_text("from sparrow.tasks.b import x\n")
    (pkg / "tasks" / "b.py").write_text("def f():\n    from sparrow.tasks import a\n")
    cycle = find_cycle(_module_graph(pkg))
    assert cycle is not None and {"sparrow.tasks.a", "sparrow.tasks.b"} <= set(cycle)
    # Inside train/: run/ importing the loop or logs/ is against the direction; logs/ -> run/ not.
    for part in ("train", "train/run", "train/logs"):
        (pkg / part).mkdir(parents=True, exist_ok=True)
        (pkg / part / "__init__.py").write_text("")
    (pkg / "train" / "run" / "lock.py").write_text(
        "from sparrow.train import trainer\nfrom sparrow.train.logs.panels import P\n"
    )
    assert train_violations(pkg / "train" / "run" / "lock.py", root=tmp_path) == {
        "sparrow.train.trainer",
        "sparrow.train.logs.panels",
        "sparrow.train.logs.panels.P",
    }
    (pkg / "train" / "logs" / "m.py").write_text("from sparrow.train.run.lock import x\n")
    assert train_violations(pkg / "train" / "logs" / "m.py", root=tmp_path) == set()
    (pkg / "tasks" / "b.py").write_text("x = 1\n")
    assert find_cycle(_module_graph(pkg)) is None


# The redesigns' bounds (issues 39, 52 and 65), tested so that they cannot slip unseen again.
MAX_FLAT_TRAIN_MODULES = 12  # sparrow/train/*.py, __init__ included; rooms hold the rest
MAX_EXPERIMENT_LINES = 250  # each sparrow/experiments/*.py
MAX_TRAINER_INIT_LINES = 40  # GRPOTrainer.__init__: the parts built, the rest in build.py
# rollouts/ draws with the loop's helpers and never reaches the update side or the actor.
ROLLOUTS_NEVER_IMPORT = (
    "sparrow.train.trainer",
    "sparrow.train.policy_update",
    "sparrow.train.evaluation",
    "sparrow.train.step_report",
    "sparrow.rl.actor",
)


def flat_modules(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("*.py"))


def private_imports(path: Path, root: Path = PKG.parent) -> set[str]:
    """`module.name` for each private name (`_x`, not dunder) `path` imports from another module
    of sparrow: what is private to a module is used only there."""
    own = _module(path, root)
    bad = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        names = _imports_from(node, path, root)
        if names is None or names[0] == own or not names[0].startswith("sparrow"):
            continue
        bad.update(f"{names[0]}.{n}" for n in names[1] if n.startswith("_") and n[:2] != "__")
    return bad


def _imports_from(node: ast.ImportFrom, path: Path, root: Path) -> tuple[str, list[str]] | None:
    if node.level == 0:
        base = node.module
    else:
        parts = path.relative_to(root).with_suffix("").parts
        if path.name == "__init__.py":
            parts = parts[:-1] + ("__init__",)
        base = ".".join(parts[: -node.level] + ((node.module,) if node.module else ()))
    return None if not base else (base, [alias.name for alias in node.names])


def function_lines(path: Path, cls: str, name: str) -> int:
    """How many lines `cls.name` spans in `path` (its def line to its last line)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    assert item.end_lineno is not None
                    return item.end_lineno - item.lineno + 1
    raise LookupError(f"{cls}.{name} not in {path}")


def rollouts_violations(path: Path, root: Path = PKG.parent) -> set[str]:
    """What a module of train/rollouts/ imports of the update side or the actor."""
    if not _module(path, root).startswith("sparrow.train.rollouts"):
        return set()
    names = _imports(path, root)
    return {n for n in names if any(n == m or n.startswith(m + ".") for m in ROLLOUTS_NEVER_IMPORT)}


def control_violations(path: Path, root: Path = PKG.parent) -> set[str]:
    """What a module of control/ (schedule, controller, cost model: math) imports of the
    rollout engine."""
    if _component(_module(path, root)) != "control":
        return set()
    return {n for n in _imports(path, root) if _component(n) == "rollout"}


def test_train_holds_at_most_twelve_flat_modules():
    flat = flat_modules(PKG / "train")
    assert len(flat) <= MAX_FLAT_TRAIN_MODULES, (
        f"sparrow/train/ holds {len(flat)} flat modules (bound {MAX_FLAT_TRAIN_MODULES}): "
        f"give a noun its room (run/, memory/, logs/, rollouts/): {flat}"
    )


@pytest.mark.parametrize("path", _files(), ids=_rel)
def test_no_private_name_imported_across_modules(path):
    bad = private_imports(path)
    assert not bad, f"{_rel(path)} imports private names of other modules: {sorted(bad)}"


@pytest.mark.parametrize("path", _files(PKG / "experiments"), ids=_rel)
def test_experiment_modules_stay_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_EXPERIMENT_LINES, f"{_rel(path)}: {lines} lines > {MAX_EXPERIMENT_LINES}"


def test_trainer_init_stays_short():
    lines = function_lines(PKG / "train" / "trainer.py", "GRPOTrainer", "__init__")
    assert lines <= MAX_TRAINER_INIT_LINES, (
        f"GRPOTrainer.__init__ is {lines} lines (bound {MAX_TRAINER_INIT_LINES}): build parts "
        "in train/build.py"
    )


@pytest.mark.parametrize("path", _files(PKG / "train" / "rollouts"), ids=_rel)
def test_rollouts_never_reach_the_update_side(path):
    bad = rollouts_violations(path)
    assert not bad, f"{_rel(path)} imports the update side or the actor: {sorted(bad)}"


@pytest.mark.parametrize("path", _files(PKG / "control"), ids=_rel)
def test_control_is_free_of_the_rollout_engine(path):
    bad = control_violations(path)
    assert not bad, f"{_rel(path)} imports the rollout engine: {sorted(bad)}"


def test_bound_checks_see_planted_violations(tmp_path):
    """Each bound above, planted in a scratch tree: the checkers must notice, or the tests could
    never fail."""
    pkg = tmp_path / "sparrow"
    for part in ("train", "train/rollouts", "control", "monitor", "experiments"):
        (pkg / part).mkdir(parents=True)
        (pkg / part / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for i in range(MAX_FLAT_TRAIN_MODULES):  # 12 with __init__.py: one too many
        (pkg / "train" / f"m{i}.py").write_text("")
    assert len(flat_modules(pkg / "train")) == MAX_FLAT_TRAIN_MODULES + 1
    # A private name across modules, absolute and relative; a module's own, and dunders, pass.
    probe = pkg / "monitor" / "same.py"
    probe.write_text(
        "from sparrow.monitor.exact import _split, public\n"
        "from .exact import _other\n"
        "from sparrow.monitor.same import _mine\n"
        "from sparrow import __version__\n"
    )
    assert private_imports(probe, root=tmp_path) == {
        "sparrow.monitor.exact._split",
        "sparrow.monitor.exact._other",
    }
    long = pkg / "experiments" / "study.py"
    long.write_text("x = 1\n" * (MAX_EXPERIMENT_LINES + 1))
    assert len(long.read_text().splitlines()) > MAX_EXPERIMENT_LINES
    trainer = pkg / "train" / "trainer.py"
    body = "".join(f"        self.x{i} = {i}\n" for i in range(MAX_TRAINER_INIT_LINES))
    trainer.write_text(f"class GRPOTrainer:\n    def __init__(self):\n{body}")
    assert function_lines(trainer, "GRPOTrainer", "__init__") == MAX_TRAINER_INIT_LINES + 1
    draw = pkg / "train" / "rollouts" / "draw.py"
    draw.write_text(
        "from sparrow.train.trainer import GRPOTrainer\n"
        "from sparrow.train.dynamic_sampling import Sampled\n"
        "def f():\n    from sparrow.rl import actor\n"
    )
    assert rollouts_violations(draw, root=tmp_path) == {
        "sparrow.train.trainer",
        "sparrow.train.trainer.GRPOTrainer",
        "sparrow.rl.actor",
    }
    steer = pkg / "control" / "controller.py"
    steer.write_text(
        "from sparrow.rollout.engine import LLMEngine\nfrom sparrow.control import x\n"
    )
    assert control_violations(steer, root=tmp_path) == {
        "sparrow.rollout.engine",
        "sparrow.rollout.engine.LLMEngine",
    }


# What a benchmark or the engine imports must work on a GPU image without the training-only
# packages: reading a config, the rollout engine and the decode/kernel/rollout benchmarks.
LIGHT_MODULES = [
    "sparrow.train.config",
    "sparrow.bench.cli",
    "sparrow.bench.decode",
    "sparrow.bench.decode_step",
    "sparrow.bench.random_runner",
    "sparrow.bench.kernel",
    "sparrow.bench.rollout",
    *sorted(f"sparrow.rollout.{p.stem}" for p in (PKG / "rollout").glob("*.py")),
]
HEAVY = ("deepspeed", "wandb")


def _pulled_in(modules: list[str], path: Path | None = None) -> list[str]:
    """The HEAVY packages in sys.modules after importing `modules` in a fresh interpreter
    (with `path` on the import path too)."""
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print('heavy:' + ','.join(n for n in {HEAVY!r} if n in sys.modules))\n"
    )
    paths = [str(PKG.parent), *([str(path)] if path else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-2000:]
    heavy = done.stdout.strip().splitlines()[-1].removeprefix("heavy:")
    return [n for n in heavy.split(",") if n]


def test_config_and_engine_paths_import_neither_deepspeed_nor_wandb():
    assert _pulled_in(LIGHT_MODULES) == []


def test_transitive_import_check_sees_deepspeed():
    """The actor imports deepspeed: the check must notice, or it could never fail."""
    assert "deepspeed" in _pulled_in(["sparrow.rl.actor"])


def test_the_trainer_with_a_plain_torch_actor_imports_no_deepspeed():
    """The trainer takes its actor as an argument and imports DenseActor only to build the
    default one, so the loop with tests/train/fake_actor.py's FakeActor needs no DeepSpeed."""
    fake_actor = PKG.parent / "tests" / "train"
    assert "deepspeed" not in _pulled_in(["sparrow.train.trainer", "fake_actor"], fake_actor)
