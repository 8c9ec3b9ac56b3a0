"""Check the arithmetic of a reasoning chain, statement by statement.

The paper's sequence-level view (Theorem 4.4): a reasoning chain is correct only if *every* step is, so the
accuracy of the final answer is an upper bound on 1 - SER and the fraction of chains whose steps all hold
measures it. `check_chain` finds every arithmetic statement in a generated chain and evaluates it:

- GSM8K's calculator annotations ``<<48/2=24>>`` (checked, then removed from the text so that the visible
  statement around them, ``48/2 = 24``, is read on its own);
- statements written in the text, ``a op b = c``, including chained equalities ``1+2+3 = 6 = 3*2`` where every
  ``=`` must hold between its neighbours (``1+2=3+3=6`` is *false*: the running-total shorthand is not an
  equality);
- numbers with thousands separators (``80,000``), decimals (``.75``, ``2.5``), currency (``$18``), percentages
  (``150%`` = 1.5), the operators ``+ - * / ^ x × ÷`` and parentheses.

Reading rules, chosen so that text around the arithmetic never makes a true statement look false:

- a statement is a maximal run of arithmetic characters containing ``=`` and at least one operator; words end it;
- an edge side that is not a complete expression (``X*25% = 19.50`` reads ``*25%``; ``X = 26`` reads nothing; a
  run ending in an operator) is dropped, and an unparseable inner side makes the statement uncheckable; a
  leading bare number right after a word (``3 times 4 = 12`` reads ``4 = 12``) is dropped as well. Statements
  left with fewer than two sides are not statements;
- a literal written with d decimals equals a non-integer value that rounds to it at d decimals (``10/3 = 3.33``,
  ``100/7 = 14``); integers must match exactly (``5*4 = 25`` is false); errors such as division by zero make a
  statement false.

A chain is valid when all its statements hold. A chain with no statement at all is valid only if its final answer
is a number stated in the question: then nothing had to be computed; otherwise the answer came from a step that
was not written down, which cannot be checked and is not counted as valid.

Evaluation is ast-based (numbers, + - * / ** and unary signs on floats); nothing is ``eval``-ed.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Statement", "ChainCheck", "safe_eval", "find_statements", "check_chain", "numbers_in"]

_MAX_SIDE_CHARS = 200
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
_TIMES_RE = re.compile(r"(?<=[\d)%])[ \t]*[x×][ \t]*(?=\$?\(?\.?\d)")
_RUN_RE = re.compile(r"[0-9$.,%+\-*/÷×^()= \t]+")
_FRACTION_RE = re.compile(r"(?<![\d.,/])(\d+)/(\d+)(?![\d.,/])")
_MIXED_NUMBER_RE = re.compile(r"\s+and\s+\(?\d+/\d+\)?(?![\d/]|\s*[-+*/=])")  # "5 and 2/3"
_DASHES_RE = re.compile("[\u2013\u2212]")  # en dash and minus sign, written for "-"
# A word right before a run that is itself arithmetic: the run's first side is only the end of an operand.
_OPERATOR_WORDS = frozenset({"x", "X", "times", "of", "by", "plus", "minus", "over", "per"})
_OPERATOR_RE = re.compile(r"(?<=[\d)%.])\s*(?:\*\*|[-+*/^÷×(])")
_BINARY_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Uncheckable(ValueError):
    """The text is not a complete arithmetic expression."""


@dataclass(frozen=True)
class Statement:
    """One arithmetic statement: its sides as written, their values and whether every ``=`` holds."""

    text: str
    sides: tuple[str, ...]
    values: tuple[Optional[float], ...]
    holds: bool
    source: str  # "annotation" (GSM8K's <<...>>) or "text"


@dataclass
class ChainCheck:
    """Result of `check_chain`."""

    valid: bool
    statements: list[Statement] = field(default_factory=list)

    @property
    def num_statements(self) -> int:
        return len(self.statements)

    @property
    def num_false(self) -> int:
        return sum(not s.holds for s in self.statements)


def safe_eval(expression: str) -> float:
    """Value of an arithmetic expression of numbers, ``+ - * / **``, unary signs and parentheses (as floats).

    Raises `ValueError` for anything else (names, calls, ...) and `ArithmeticError` for division by zero or
    overflow.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as error:
        raise _Uncheckable(f"not an expression: {expression!r}") from error
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1024:
            raise OverflowError("exponent too large")
        value = _BINARY_OPS[type(node.op)](left, right)
        if isinstance(value, complex) or math.isinf(value) or math.isnan(value):
            raise OverflowError("result is not a finite real number")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_eval_node(node.operand))
    raise _Uncheckable(f"unsupported syntax: {ast.dump(node)[:80]}")


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text`` (thousands separators, decimals; signs ignored)."""
    return [float(m.group().replace(",", "")) for m in _NUMBER_RE.finditer(text)]


def _to_python(side: str) -> str:
    """Rewrite a side as a Python expression of plain float literals; raise `_Uncheckable` if it is not one."""
    side = side.strip()
    if not side or len(side) > _MAX_SIDE_CHARS:
        raise _Uncheckable(side)
    if side[0] in "+*/^" or side[-1] in "+-*/^(" or re.match(r"-\s", side):
        raise _Uncheckable(side)  # an operand is outside the run (a word or a variable)
    text = side.replace("$", "").replace("÷", "/").replace("×", "*").replace("^", "**")

    def literal(match: re.Match) -> str:
        return repr(float(match.group().replace(",", "")))

    text = _FRACTION_RE.sub(r"(\1/\2)", text)  # "28 / 1/5": a fraction written tight is one operand
    text = _NUMBER_RE.sub(literal, text)
    text = re.sub(r"(\d+\.\d+)\s*%", r"(\1/100)", text)
    text = re.sub(r"(?<=[\d)])\s*\(", "*(", text)  # implicit multiplication: 2(60), (1/2)(4)
    if re.search(r"[,%]", text):
        raise _Uncheckable(side)
    return text


def _literal_readings(side: str) -> list[tuple[float, int]]:
    """(value, decimals) readings of a side that is one literal: ``3.33`` -> [(3.33, 2)]; a percentage ``p%``
    reads as p/100 and as p (a result "expressed in percent", ``18/450*100 = 4%``)."""
    match = re.fullmatch(r"\s*(-?)\$?((?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d+))?)\s*(%?)\s*", side)
    if match is None or not match.group(2):
        return []
    value = float(match.group(2).replace(",", "")) * (-1.0 if match.group(1) else 1.0)
    decimals = len(match.group(3) or "")
    if match.group(4):
        return [(value / 100.0, decimals + 2), (value, decimals)]
    return [(value, decimals)]


def _equal(a: float, a_side: str, b: float, b_side: str) -> bool:
    """a == b, or one side is a literal that the other value equals, or rounds to at the literal's decimals when
    that value is not an integer (integers must match exactly)."""
    if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
        return True
    for value, side in ((a, b_side), (b, a_side)):
        for literal, decimals in _literal_readings(side):
            if math.isclose(value, literal, rel_tol=1e-9, abs_tol=1e-9):
                return True
            if not float(value).is_integer() and abs(value - literal) <= 0.5 * 10.0 ** (-decimals) + 1e-9:
                return True
    return False


def _parse_sides(text: str) -> Optional[list[tuple[str, str]]]:
    """(side as written, Python expression) for each side of ``s0 = s1 = ...``; an edge side that is not an
    expression gets ""; None if an inner side is not one."""
    sides = [s.strip() for s in text.split("=")]
    if sides[-1]:
        sides[-1] = sides[-1].rstrip(".,").strip()  # sentence punctuation after the last number
    parsed: list[tuple[str, str]] = []
    for index, side in enumerate(sides):
        try:
            parsed.append((side, _to_python(side)))
        except _Uncheckable:
            if 0 < index < len(sides) - 1:
                return None
            parsed.append((side, ""))
    return parsed


def _statement(text: str, source: str, before: str = "", after: str = "") -> Optional[Statement]:
    """Parse one run ``s0 = s1 = ...`` into a Statement, or None if it states nothing checkable.

    ``before`` / ``after`` are the text right before and after the run: a first side that follows an operator
    word (``15 pages x 1/3``), or a bare number that follows any word (``3 times 4``), is only the end of an
    operand, and a last side glued to a letter (``(5/2)x``) only the start of one; such sides are dropped.
    """
    parsed = _parse_sides(text)
    if parsed is None:
        return None
    if parsed and before[-1:] == ":":
        parsed[0] = (parsed[0][0], "")  # a clock time, 6:00
    if parsed and after[:1] == ":":
        parsed[-1] = (parsed[-1][0], "")
    words = before.split()
    if parsed and parsed[0][1] and words:
        if words[-1] in _OPERATOR_WORDS or (words[-1][-1].isalpha() and _literal_readings(parsed[0][0])):
            parsed[0] = (parsed[0][0], "")
    if parsed and (after[:1].isalpha() or _MIXED_NUMBER_RE.match(after)):  # "(5/2)x", "5 and 2/3"
        parsed[-1] = (parsed[-1][0], "")
    if parsed and not parsed[0][1]:
        parsed.pop(0)
    if parsed and not parsed[-1][1]:
        parsed.pop()
    if len(parsed) < 2 or not any(_OPERATOR_RE.search(side) for side, _ in parsed):
        return None
    values: list[Optional[float]] = []
    for _, expression in parsed:
        try:
            values.append(safe_eval(expression))
        except _Uncheckable:
            return None
        except (ArithmeticError, ValueError):
            values.append(None)
    holds = all(v is not None for v in values) and all(
        _equal(values[i], parsed[i][0], values[i + 1], parsed[i + 1][0]) for i in range(len(values) - 1)
    )
    sides = tuple(side for side, _ in parsed)
    return Statement(text=" = ".join(sides), sides=sides, values=tuple(values), holds=holds, source=source)


def find_statements(text: str) -> list[Statement]:
    """Every checkable arithmetic statement of ``text``: GSM8K annotations first, then the visible text."""
    statements = []
    for match in _ANNOTATION_RE.finditer(text):
        statement = _statement(match.group(1), "annotation")
        if statement is not None:
            statements.append(statement)
    visible = _DASHES_RE.sub("-", _ANNOTATION_RE.sub("", text))
    visible = _TIMES_RE.sub(" * ", visible)
    for match in _RUN_RE.finditer(visible):
        run = match.group()
        if "=" not in run or not re.search(r"\d", run):
            continue
        start = match.start() + len(run) - len(run.lstrip())
        end = match.end() - (len(run) - len(run.rstrip()))
        before = visible[max(0, start - 40) : start]
        statement = _statement(visible[start:end], "text", before=before, after=visible[end : end + 20])
        if statement is not None:
            statements.append(statement)
    return statements


def check_chain(text: str, answer: Optional[str] = None, question: Optional[str] = None) -> ChainCheck:
    """Check every arithmetic statement of a generated chain.

    Args:
        text: the generated chain (answer text, stop strings already cut).
        answer: the chain's extracted final answer; with ``question``, decides chains without statements.
        question: the problem statement.

    Returns:
        `ChainCheck` with ``valid`` = all statements hold; a chain with no statement is valid only if ``answer``
        is a number stated in ``question`` (see the module docstring).
    """
    statements = find_statements(text)
    if statements:
        return ChainCheck(valid=all(s.holds for s in statements), statements=statements)
    return ChainCheck(valid=_answer_in_question(answer, question), statements=[])


def _answer_in_question(answer: Optional[str], question: Optional[str]) -> bool:
    if not answer or not question:
        return False
    values = numbers_in(answer)
    if len(values) != 1:
        return False
    return any(math.isclose(values[0], q, rel_tol=0, abs_tol=1e-9) for q in numbers_in(question))
