"""Tools tunesmith ships for agent rollouts: `--tool_funcs tunesmith.rl.tool_funcs:calculate`. Any function of
the same shape works: type hints on every parameter and a docstring with an Args: section (transformers'
get_json_schema turns them into the schema the chat template lists), returning what the tool message says."""

from __future__ import annotations

import ast
import operator

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPONENT = 64  # 2 ** 10 ** 9 would hold a worker for minutes: a calculator refuses, as a person would


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, such as "347 * 29" or "(12 + 7) / 4".

    Args:
        expression: Numbers joined by +, -, *, /, //, % and ** with parentheses.
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 10) if isinstance(value, float) else value)


def _evaluate(node: ast.AST) -> int | float:
    """Numbers and the operators above only: anything else (names, calls, attributes) is refused, so the
    expression the model writes cannot run code."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers exactly.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b
