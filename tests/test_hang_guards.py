"""Policy: every hang guard in tests/ comes from tests/hang_guard.py (issue 61 item 2).

A literal guard is sized to one machine's speed and trips on a slower or busier one (a 60 s gloo
timeout failed `make test` at load 4-7 on 2 cores). This reads every test file's syntax tree and
refuses a number in a guard's place: a `timeout=` argument, a `.wait(n)` / `.join(n)` /
`.communicate(n)`, a `timedelta(...)`, a `time.monotonic() + n` or `- start < n` deadline, a
parameter named `*timeout*` or `*deadline*` with a number as its default, a module constant
named `*TIMEOUT*` or `*_MIN`, and a `subprocess.run` (or `check_output`, `check_call`, `call`)
with no timeout at all. A number is fine beside a guard name (`2 * HANG_GUARD_S`).

A timeout a test is *about* is no guard: SUBJECTS lists each, with why. `python
tests/test_hang_guards.py` prints every guard and subject (file:line, value, what it guards).
"""

import ast
import re
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
GUARD_NAMES = {"HANG_GUARD_S", "CHILD_GUARD_S", "COLLECTIVE_GUARD", "COLLECTIVE_GUARD_MIN"}
SUBPROCESS_CALLS = {"run", "check_output", "check_call", "call"}
GUARD_PARAM = re.compile(r"(^|_)(timeout|deadline)(_s|_min)?$")
# (file under tests/, the site's source as ast.unparse gives it): why it is not a hang guard.
SUBJECTS = {
    ("train/test_lost_peer.py", "timedelta(seconds=3)"): "the expiry lost_peer must recognise",
    ("rl/test_collective_timeout.py", "timedelta(minutes=90)"): "the value passed through",
    ("tasks/test_rewards.py", "TIMEOUT_S = 1.0"): "the reward deadline under test",
    ("tasks/test_reward_edges.py", "TIMEOUT_S, N, SLEEP_S = (0.3, 60, 1.0)"): (
        "a batch's deadline under test (N x 0.3 s, the reward sleeping 1 s)"
    ),
    ("tasks/test_env_guard.py", "TIMEOUT_S = 2.0"): "the environment step deadline under test",
}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _has_number(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Constant) and type(n.value) in (int, float) for n in ast.walk(node)
    )


def _literal(node: ast.AST) -> bool:
    """A number in a guard's place with no guard name beside it."""
    return _has_number(node) and not (_names(node) & GUARD_NAMES)


def _seconds(call: ast.Call) -> bool:
    """`x.wait(30)`-like: a duration as the argument of an object's method (not `" ".join(...)`)."""
    base = call.func.value if isinstance(call.func, ast.Attribute) else None
    plain = (ast.Constant, ast.Name, ast.Attribute, ast.BinOp, ast.UnaryOp)
    return (
        base is not None and not isinstance(base, ast.Constant) and isinstance(call.args[0], plain)
    )


def _is_monotonic(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "time.monotonic"


def sites(tree: ast.AST) -> list[tuple[ast.AST, ast.AST, str]]:
    """(node to report, value, what it guards) for every place a hang guard goes."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            for kw in node.keywords:
                if kw.arg == "timeout":
                    found.append((node, kw.value, func))
            method = func.rsplit(".", 1)[-1]
            if method in ("wait", "join", "communicate") and node.args and _seconds(node):
                found.append((node, node.args[0], func))
            if func.endswith("timedelta"):
                found.append((node, node, "a process group / store timeout"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if _is_monotonic(node.left):
                found.append((node, node.right, "a polling deadline"))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.BinOp):
            if _is_monotonic(node.left.left):
                found.append((node, node.comparators[0], "a polling deadline"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults))
            defaults += node.args.defaults + node.args.kw_defaults
            for arg, default in zip(args, defaults, strict=True):
                if default is not None and GUARD_PARAM.search(arg.arg):
                    found.append((default, default, f"{node.name}({arg.arg}=...)"))
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign):
            targets = _names(ast.Tuple(elts=node.targets))
            if any("TIMEOUT" in t or t.endswith("_MIN") for t in targets):
                found.append((node, node.value, "a module constant"))
    return found


def unguarded_subprocesses(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "subprocess"
        and node.func.attr in SUBPROCESS_CALLS
        and not any(kw.arg in ("timeout", None) for kw in node.keywords)  # None: **kwargs
    ]


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "hang_guard.py")


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS)}:{getattr(node, 'lineno', '?')}"


def violations() -> list[str]:
    found = []
    for path in _test_files():
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(TESTS))
        for node, value, what in sites(tree):
            if _literal(value) and (rel, ast.unparse(node)) not in SUBJECTS:
                found.append(f"{_where(path, node)}: {ast.unparse(node)[:90]}  ({what})")
        for call in unguarded_subprocesses(tree):
            found.append(f"{_where(path, call)}: {ast.unparse(call)[:90]}  (no timeout)")
    return found


def test_every_hang_guard_comes_from_hang_guard_py():
    found = violations()
    assert not found, (
        "literal or missing hang guards: use tests/hang_guard.py's HANG_GUARD_S (a test's wait) "
        "or CHILD_GUARD_S / COLLECTIVE_GUARD(_MIN) (a wait inside a child process); a timeout "
        "the test is about goes in tests/test_hang_guards.py's SUBJECTS with why:\n"
        + "\n".join(found)
    )


def test_the_policy_sees_a_planted_literal_guard(tmp_path):
    planted = ast.parse(
        "import subprocess, time\n"
        "from datetime import timedelta\n"
        "TIMEOUT_MIN = 0.5\n"
        "def f(proc, timeout: float = 60):\n"
        "    subprocess.run(['x'], timeout=300)\n"
        "    subprocess.run(['x'])\n"
        "    proc.wait(timeout=2 * HANG_GUARD_S)\n"
        "    deadline = time.monotonic() + 600\n"
        "    split_world(1, 'gloo', timedelta(seconds=60))\n"
    )
    literal = [ast.unparse(v) for _, v, _ in sites(planted) if _literal(v)]
    assert sorted(literal) == sorted(["0.5", "60", "300", "600", "timedelta(seconds=60)"])
    assert len(unguarded_subprocesses(planted)) == 1


def _uses(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, value, what receives it) for every use of a guard name."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for name in ast.walk(tree):
        if not (isinstance(name, ast.Name) and name.id in GUARD_NAMES):
            continue
        value = name  # widened to the arithmetic around it: `2 * HANG_GUARD_S`
        while isinstance(parents.get(value), (ast.BinOp, ast.UnaryOp)):
            if any(_is_monotonic(n) for n in ast.iter_child_nodes(parents[value])):
                break
            value = parents[value]
        holder = parents.get(value)
        if isinstance(holder, ast.keyword):
            holder = parents[holder]
        if isinstance(holder, ast.Call) and ast.unparse(holder.func) in ("str", "float"):
            what = "a child process's argument"
        elif isinstance(holder, ast.Call):
            what = ast.unparse(holder.func)
        elif isinstance(holder, (ast.BinOp, ast.Compare)):
            what = "a polling deadline"
        elif isinstance(holder, ast.arguments):
            what = "a parameter's default"
        elif isinstance(holder, ast.Assign):
            what = ast.unparse(holder.targets[0]) + " ="
        else:
            what = type(holder).__name__
        found.append((name.lineno, ast.unparse(value), what))
    return found


def main() -> None:
    """Print every guard and subject, tab-separated: file:line, value, what receives it."""
    for path in _test_files():
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(TESTS))
        rows = _uses(tree)
        for node, _, _ in sites(tree):
            if (rel, ast.unparse(node)) in SUBJECTS:
                rows.append((node.lineno, ast.unparse(node), SUBJECTS[rel, ast.unparse(node)]))
        for line, value, what in sorted(rows):
            print(f"{rel}:{line}\t{value}\t{what}")


if __name__ == "__main__":
    sys.exit(main())
