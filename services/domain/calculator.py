"""The calculator's arithmetic: numbers, + - * / // % **, parentheses and unary signs, through `ast`.

Nothing else is evaluated (no names, calls, attributes, strings or comparisons), and sizes are
bounded before anything large is computed, so a hostile expression costs microseconds.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from quipu.tools import ToolError

MAX_INT_BITS = 4096
"""Largest integer (about 1,233 digits) the calculator computes or returns."""

MAX_EXPONENT = 10_000
"""Largest exponent magnitude the calculator accepts."""

MAX_DEPTH = 300
"""Deepest nesting of operations evaluated (a 500-character sum of ones is 250 deep)."""

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}

_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ToolError):
    """Raised when an expression is not plain arithmetic, or its value cannot be computed."""


def calculate(expression: str) -> Number:
    """The value of an arithmetic expression: numbers, + - * / // % **, parentheses, unary signs.

    Nothing but these is evaluated: no names, calls, attributes, strings or comparisons. Integers
    stay exact up to MAX_INT_BITS; exponents are bounded, and a power that would exceed the
    bound is refused before it is computed. Raises CalculatorError.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculatorError(f"not an arithmetic expression: {error.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculatorError("expression is too deeply nested") from None
    try:
        return _evaluate(tree.body, 0)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result is too large") from None
    except RecursionError:
        raise CalculatorError("expression is too deeply nested") from None


def _evaluate(node: ast.expr, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError("expression is too deeply nested")
    if isinstance(node, ast.Constant):
        return _checked(_literal(node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _evaluate(node.left, depth + 1)
        right = _evaluate(node.right, depth + 1)
        _check_size_before(node.op, left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    raise CalculatorError(f"not allowed in an arithmetic expression: {_describe_node(node)}")


def _literal(value: object) -> Number:
    # bool is an int subclass; True + True is not arithmetic a model should rely on.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"not a number: {type(value).__name__} literal")
    return value


def _describe_node(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Call):
        return "function call"
    if isinstance(node, ast.Attribute):
        return "attribute access"
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return f"operator {type(node.op).__name__}"
    return type(node).__name__


def _check_size_before(op: ast.operator, left: Number, right: Number) -> None:
    """Refuse an operation whose result would be too large, before spending time computing it."""
    integers = isinstance(left, int) and isinstance(right, int)
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent is too large (at most {MAX_EXPONENT} in magnitude)")
        if integers and right > 0 and abs(left) > 1 and math.log2(abs(left)) * right > MAX_INT_BITS:
            raise CalculatorError("result is too large")
    # A product has at most as many bits as its factors together.
    elif isinstance(op, ast.Mult) and integers and _bits(left) + _bits(right) > MAX_INT_BITS + 1:
        raise CalculatorError("result is too large")


def _bits(value: Number) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _checked(value: object) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is too large")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError("result is too large")
    if not isinstance(value, int | float):
        raise CalculatorError("result is not a number")
    return value
