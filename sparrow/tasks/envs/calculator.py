"""`env.function=calculator`: an exact arithmetic tool, deterministic, for tests and tiny runs.

The tool evaluates +, -, *, /, //, %, ** and parentheses on numbers, exactly (integers stay
integers; a division is exact when it can be), with no names, calls or attributes: a parser of
its own, never `eval`. The task is the row's arithmetic question (the task generator's, e.g.
`data.tasks.min_digits=3 data.tasks.operators="*"`), rewarded 1.0 for the exact answer.
"""

import ast
import operator
from fractions import Fraction

from sparrow.tasks.envs.tool_task import ToolTask
from sparrow.tasks.tool_calls import Tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64  # 10**64 is plenty for a calculator; 9**9**9 would hold the worker for minutes
MAX_DIGITS = 200  # results and operands larger than this are an error, not a slow bignum
SYSTEM_PROMPT = (
    "Use the calculator tool for arithmetic: call it, read its result, then answer with just "
    "the number."
)
SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly: + - * / // % ** and ( ).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (17 + 4) * 23"}},
            "required": ["expression"],
        },
    },
}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculate(expression: str) -> str:
    """The exact value of `expression` as text ("391", "2.5", "1/3" for a non-terminating one);
    ValueError says what is wrong with it."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be text, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression over {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**").replace(",", ""), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    return _format(_value(tree.body))


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(repr(node.value))  # 0.1 is 1/10, not its binary neighbour
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        operand: Fraction | int = right  # an int exponent: Fraction ** int stays exact
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponents are whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise ValueError("division by zero")
            operand = int(right)
        elif isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        result = Fraction(_BINARY[type(node.op)](left, operand))
        if max(len(str(result.numerator)), len(str(result.denominator))) > MAX_DIGITS:
            raise ValueError(f"a number over {MAX_DIGITS} digits")
        return result
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {ast.unparse(node)!r}")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator == 1:  # a terminating decimal: exact as a decimal
        text = f"{float(value):.15f}".rstrip("0")
        if Fraction(text) == value:
            return text
    return f"{value.numerator}/{value.denominator}"


def make_env(row: dict) -> ToolTask:
    return ToolTask(row, [Tool(calculate, SCHEMA)], SYSTEM_PROMPT)
