"""The calculator tool: a safe arithmetic parser. Never `eval`.

Python's own parser (`ast.parse`) reads the expression into a tree; only numbers, + - * / and
parentheses (and a leading sign) are walked, with exact rationals (`fractions.Fraction`). Bounded:
the text's length, the number of tree nodes, and every intermediate value's magnitude; anything else
is a `CalcError` whose message the env returns to the model as the tool's answer.
"""

import ast
import operator
from fractions import Fraction

MAX_NODES = 64
MAX_MAGNITUDE = 10**15
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SPELLINGS = {"×": "*", "·": "*", "÷": "/", "−": "-", "\\times": "*", "\\cdot": "*", "\\div": "/"}


class CalcError(ValueError):
    """An expression the calculator refuses; the message says why, for the model to read."""


def _walk(node: ast.AST, budget: list[int]) -> Fraction:
    budget[0] -= 1
    if budget[0] < 0:
        raise CalcError(f"expression too long (more than {MAX_NODES} parts)")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_walk(node.operand, budget))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, budget), _walk(node.right, budget)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalcError("division by zero")
        value = _BINARY[type(node.op)](left, right)
    else:
        raise CalcError("only numbers, + - * / and parentheses are allowed")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError(f"number too large (over {MAX_MAGNITUDE:.0e})")
    return value


def format_number(value: Fraction) -> str:
    """An integer as itself; anything else as a decimal with at most 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def calculate(expression: str, *, max_chars: int = 100) -> str:
    """The value of `expression` as text, or CalcError."""
    text = expression.strip().rstrip("=").strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > max_chars:
        raise CalcError(f"expression longer than {max_chars} characters")
    for spelling, op in _SPELLINGS.items():
        text = text.replace(spelling, op)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CalcError("cannot read the expression") from None
    try:
        return format_number(_walk(tree.body, [MAX_NODES]))
    except RecursionError:
        raise CalcError("expression nested too deeply") from None
