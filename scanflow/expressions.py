"""Safe boolean expressions for strategy constraints: `event.drift_rate > 0.1 and since('retrain') > 600`.

Why: a strategy's constraint comes from users (Python code, YAML, or `POST /strategies` over REST),
so it must never reach Python `eval`. Two stages:

1. `compile_expression(text)` parses once (Python's `ast`, mode "eval") and walks the tree against a
   whitelist: only the names below, only calls to whitelisted helpers by name, no dunder/underscore
   attributes, no lambdas, comprehensions, f-strings, walrus, imports or statements, bounded literal
   sizes and exponents, and a static cost model (`_check_binop`): nesting depth, nested powers of
   degree above `MAX_EXPONENT`, a string/list/tuple repeated by a non-literal factor or past
   `MAX_REPEAT` / `MAX_SEQUENCE`, `%` formatting of a string literal. (A power of literals cannot
   pass MAX_INT_BITS: 10**18, the largest literal, to 64 is 3,840 bits.)
   Anything else raises `ExpressionError` at registration time (REST: 422), not when it first fires.
2. `Expression.evaluate(event=..., state=..., now=..., since=...)` runs the pre-parsed tree with
   simpleeval. What depends on the payload is bounded at run time, before anything is computed:
   a power or product whose result would pass `MAX_INT_BITS`, a repetition, concatenation or list
   whose result would hold more than `MAX_SEQUENCE` items/characters, `round` to more than
   `MAX_ROUND_DIGITS` digits, string `%` formatting; and every evaluation has a CPU budget
   (`EVAL_BUDGET_S`, checked between nodes). Each single operation is therefore cheap and the whole
   evaluation is bounded. Errors at evaluation (a missing payload key, a type mismatch, a bound)
   raise `ExpressionError`; the engine records them as a decision with result "error".

Why not simpleeval's own limits alone: its `safe_power` bounds the operands (base and exponent up
to 4,000,000, so 4000000 ** 64 passes and a bigger base fails even where the result is small), not
the result; its `safe_mult`/`safe_add` count only the outer length, so `[[1] * 10**5] * 10**5` (10**10
items to compare) passes. Its `MAX_STRING_LENGTH` (100,000) is kept as our `MAX_SEQUENCE`.

Names available: `event` (the event payload; `event.x` and `event["x"]` both read a key), `state`
(the agent's JSON state, same access), `now` (seconds, the engine's clock), `since(action)` (seconds
since that action last succeeded, `inf` if never), and the helpers `abs`, `min`, `max`, `len`,
`round`, `float`, `int`, `get(mapping, key, default)`.
Who calls: scanflow.agent.engine (compile at registration, evaluate per matching event).
"""

from __future__ import annotations

import ast
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import simpleeval

from scanflow.expression_shape import depth as _depth
from scanflow.expression_shape import literal_number as _literal_number
from scanflow.expression_shape import power_degree as _degree
from scanflow.expression_shape import static_len as _static_len

MAX_EXPRESSION_CHARS = 2000
MAX_STRING_LITERAL = 1000
MAX_EXPONENT = 64
MAX_NODES = 400
MAX_DEPTH = 100  # AST nesting; simpleeval recurses ~2 frames per level (`-` * 1990 + "1" parses)
MAX_INT_BITS = 4096  # an integer result above this is refused (10**18 ** 64 is 3,840 bits)
MAX_SEQUENCE = simpleeval.MAX_STRING_LENGTH  # items/characters of a built string, list or tuple
MAX_REPEAT = 1000  # a literal factor of a repetition
MAX_ROUND_DIGITS = 1000  # round(1, -10**6) computes 10**10**6 (0.15 s); 10**18 would never end
EVAL_BUDGET_S = 0.1  # CPU seconds per evaluation; checked every _CHECK_EVERY nodes
_CHECK_EVERY = 32  # nodes between budget checks: a clock read costs a few nodes, so not on every node
# Lists/tuples of constants only (`event.name in ['a', 'b']`): sized at compile time by
# `_static_len`, so evaluation skips their `_weight` (~0.9 us each). Weak: trees come and go.
_LITERALS: weakref.WeakSet[ast.AST] = weakref.WeakSet()

_VARIABLES = frozenset({"event", "state", "now"})


def _get(mapping: Any, key: Any, default: Any = None) -> Any:
    """`get(event, 'x', 0)`: a key with a default, for payloads where the key may be absent."""
    if isinstance(mapping, Mapping):
        return mapping.get(key, default)
    return default


def _never(_name: str) -> float:
    return math.inf


class BudgetExceeded(simpleeval.InvalidExpression):
    """The evaluation passed its CPU budget (raised between nodes)."""


_NESTED = frozenset({str, bytes, list, tuple, dict})  # JSON payloads and what expressions build


def _weight(value: Any, cap: int) -> int:
    """Pure: how many items and characters `value` holds, nested containers counted per reference
    (what a comparison or a copy may touch); stops walking once past `cap` and returns cap + 1.
    Element types are collected with C-level `map(type, ...)`: a per-item Python loop cost 23 ms
    for 100,000 items here, this ~1 ms."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is str or kind is bytes:
            total += len(v)
        elif kind is list or kind is tuple:
            total += len(v)
            if total <= cap and not _NESTED.isdisjoint(set(map(type, v))):
                stack.extend(x for x in v if type(x) in _NESTED)
        elif isinstance(v, Mapping):
            total += 2 * len(v)
            if total <= cap:
                stack.extend(v.keys())
                values = list(v.values())
                if not _NESTED.isdisjoint(set(map(type, values))):
                    stack.extend(x for x in values if type(x) in _NESTED)
        else:
            total += 1
        if total > cap:
            return cap + 1
    return total


def _is_int(v: Any) -> bool:
    return isinstance(v, int)  # bool included: True * 'a' repeats once


def _is_seq(v: Any) -> bool:
    return isinstance(v, (str, bytes, list, tuple))


def _too_long(what: str) -> simpleeval.IterableTooLong:
    return simpleeval.IterableTooLong(f"{what} would hold more than {MAX_SEQUENCE} items or characters")


def _bounded_power(a: Any, b: Any) -> Any:
    """`a ** b`, refused before computing when the integer result would pass MAX_INT_BITS."""
    if isinstance(b, (int, float)) and abs(b) > MAX_EXPONENT:
        raise simpleeval.NumberTooHigh(f"exponent {b} is above the limit {MAX_EXPONENT}")
    if _is_int(a) and _is_int(b) and b > 1 and abs(a) > 1 and abs(a).bit_length() * b > MAX_INT_BITS:
        raise simpleeval.NumberTooHigh(
            f"a power of a {abs(a).bit_length()}-bit integer to {b} would pass {MAX_INT_BITS} bits"
        )
    return a**b


def _bounded_mult(a: Any, b: Any) -> Any:
    """`a * b`, refused before computing: an integer product over MAX_INT_BITS, a repetition whose
    result would hold more than MAX_SEQUENCE items/characters (nested ones counted)."""
    if _is_int(a) and _is_int(b):
        if abs(a).bit_length() + abs(b).bit_length() > MAX_INT_BITS:
            raise simpleeval.NumberTooHigh(f"a product would pass {MAX_INT_BITS} bits")
    elif _is_seq(a) and _is_int(b) or _is_seq(b) and _is_int(a):
        seq, n = (a, b) if _is_seq(a) else (b, a)
        if n > 0 and _weight(seq, MAX_SEQUENCE // n) * n > MAX_SEQUENCE:
            raise _too_long("a repetition")
    return a * b


def _bounded_add(a: Any, b: Any) -> Any:
    """`a + b`, refused before computing when a concatenation would pass MAX_SEQUENCE."""
    if _is_seq(a) and _is_seq(b):
        wa = _weight(a, MAX_SEQUENCE)
        if wa + _weight(b, MAX_SEQUENCE - wa) > MAX_SEQUENCE:
            raise _too_long("a concatenation")
    return a + b


def _no_formatting_mod(a: Any, b: Any) -> Any:
    """`a % b` for numbers; string formatting ('%0999999999d' % 1 builds a gigabyte) is refused."""
    if isinstance(a, (str, bytes)):
        raise simpleeval.FeatureNotAvailable("string formatting with % is not available")
    return a % b


def _bounded_round(number: Any, ndigits: Any = None) -> Any:
    """`round`, with ndigits bounded: round(1, -10**18) would compute 10 ** 10**18."""
    if ndigits is not None and _is_int(ndigits) and abs(ndigits) > MAX_ROUND_DIGITS:
        raise simpleeval.NumberTooHigh(f"round to {ndigits} digits: the limit is {MAX_ROUND_DIGITS}")
    return round(number) if ndigits is None else round(number, ndigits)


HELPERS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "min": min,
    "max": max,
    "len": len,
    "round": _bounded_round,
    "float": float,
    "int": int,
    "get": _get,
}
_CALLABLE = frozenset(HELPERS) | {"since"}
ALLOWED_NAMES = _VARIABLES | _CALLABLE | {"True", "False", "None"}

_ALLOWED_NODES: tuple[type[ast.AST], ...] = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.Is,
    ast.IsNot,
    ast.IfExp,
    ast.Call,
    ast.Name,
    ast.Load,
    ast.Attribute,
    ast.Subscript,
    ast.Constant,
    ast.Tuple,
    ast.List,
)


class ExpressionError(ValueError):
    """An expression was refused (at compile time) or failed (at evaluation); the message says why."""


class _Evaluator(simpleeval.EvalWithCompoundTypes):
    """simpleeval with attribute access that reads mapping keys only (never Python attributes).

    `event.items` on a dict would otherwise return the bound method; here it reads the key 'items'.
    """

    budget_s: float = EVAL_BUDGET_S
    _deadline: float | None = None  # time.thread_time() past which the evaluation stops
    _steps: int = 0

    def start(self, budget_s: float) -> None:
        """Arm the CPU budget for one evaluation (called by Expression.evaluate). The clock is first
        read at node _CHECK_EVERY: most constraints end before it and never pay for the syscall."""
        self.budget_s = budget_s
        self._deadline = None
        self._steps = 0

    def _check_budget(self) -> None:
        now = time.thread_time()
        if self._deadline is None:
            self._deadline = now + self.budget_s
        elif now > self._deadline:
            raise BudgetExceeded(f"evaluation passed its budget of {self.budget_s * 1000:.0f} ms of CPU time")

    def _eval(self, node: ast.AST) -> Any:
        # simpleeval re-checks every intermediate result for modules/forbidden functions; here the
        # tree was whitelisted at compile time (helpers only called by name, attributes read mapping
        # keys only), so no such value can appear: dispatch directly, ~25% faster per evaluation.
        self._steps += 1
        if not self._steps % _CHECK_EVERY:
            self._check_budget()
        handler = self.nodes.get(type(node))  # type: ignore[union-attr]
        if handler is None:
            raise simpleeval.FeatureNotAvailable(f"{type(node).__name__} is not available")
        return handler(node)

    def _eval_list(self, node: ast.List) -> list[Any]:  # type: ignore[override]
        out = [self._eval(x) for x in node.elts]
        if node not in _LITERALS and _weight(out, MAX_SEQUENCE) > MAX_SEQUENCE:
            raise _too_long("a list")
        return out

    def _eval_tuple(self, node: ast.Tuple) -> tuple[Any, ...]:  # type: ignore[override]
        out = tuple(self._eval(x) for x in node.elts)
        if node not in _LITERALS and _weight(out, MAX_SEQUENCE) > MAX_SEQUENCE:
            raise _too_long("a tuple")
        return out

    def _eval_attribute(self, node: ast.Attribute) -> Any:  # type: ignore[override]
        if node.attr.startswith("_"):
            raise simpleeval.FeatureNotAvailable(f"attribute {node.attr!r} is not available")
        value = self._eval(node.value)
        if isinstance(value, Mapping):
            try:
                return value[node.attr]
            except KeyError:
                raise simpleeval.AttributeDoesNotExist(node.attr, self.expr) from None
        raise simpleeval.FeatureNotAvailable(
            f"attribute access .{node.attr} works on the event payload and state (mappings) only, "
            f"not on {type(value).__name__}"
        )


def _reject(text: str, node: ast.AST, why: str) -> ExpressionError:
    col = getattr(node, "col_offset", None)
    where = f" at column {col + 1}" if col is not None else ""
    return ExpressionError(f"constraint {text!r}{where}: {why}")


def _validate(text: str, tree: ast.Expression) -> None:
    """Walk the parsed tree; raise ExpressionError for anything outside the whitelist or the cost model."""
    depth = _depth(tree)  # first: the checks below recurse
    if depth > MAX_DEPTH:
        raise ExpressionError(f"constraint is nested {depth} levels deep; the limit is {MAX_DEPTH}")
    for count, node in enumerate(ast.walk(tree), start=1):
        if count > MAX_NODES:
            raise ExpressionError(f"constraint is too complex (more than {MAX_NODES} nodes)")
        if not isinstance(node, _ALLOWED_NODES):
            raise _reject(text, node, f"{type(node).__name__} is not allowed in a constraint")
        if isinstance(node, ast.Name):
            if node.id not in ALLOWED_NAMES:
                raise _reject(
                    text,
                    node,
                    f"unknown name {node.id!r}; use one of {sorted(ALLOWED_NAMES - {'True', 'False', 'None'})}",
                )
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise _reject(text, node, f"attribute {node.attr!r} is not allowed (no '_' attributes)")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _CALLABLE:
                shown = ast.unparse(node.func)
                raise _reject(
                    text, node, f"call to {shown!r} is not allowed; callable helpers: {sorted(_CALLABLE)}"
                )
            if node.keywords:
                raise _reject(text, node, "keyword arguments are not allowed")
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, (str, bytes)) and len(value) > MAX_STRING_LITERAL:
                raise _reject(text, node, f"string literal longer than {MAX_STRING_LITERAL} characters")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
                raise _reject(text, node, "integer literal is too large")
        elif isinstance(node, ast.BinOp):
            _check_binop(text, node)
        elif isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in node.elts):
            _LITERALS.add(node)  # at most MAX_NODES constants of MAX_STRING_LITERAL characters


def _check_binop(text: str, node: ast.BinOp) -> None:
    """The static cost model of one operator: what can be refused before any event arrives."""
    if isinstance(node.op, ast.Pow):
        exp = _literal_number(node.right)
        if exp is None:
            raise _reject(text, node, "an exponent must be a number literal")
        if abs(exp) > MAX_EXPONENT:
            raise _reject(text, node, f"exponent {exp} is above the limit {MAX_EXPONENT}")
        degree = _degree(node)
        if degree > MAX_EXPONENT:
            raise _reject(
                text, node, f"nested powers raise to the {degree:.0f}th power; the limit is {MAX_EXPONENT}"
            )
    elif isinstance(node.op, ast.Mult):
        for seq, factor in ((node.left, node.right), (node.right, node.left)):
            length = _static_len(seq)
            if length is None:
                continue
            n = _literal_number(factor)
            if not isinstance(n, int):
                raise _reject(
                    text, node, "a string, list or tuple literal may be repeated by an integer literal only"
                )
            if n > MAX_REPEAT:
                raise _reject(text, node, f"repeating a literal more than {MAX_REPEAT} times")
    elif isinstance(node.op, ast.Mod) and _static_len(node.left) is not None:
        raise _reject(text, node, "string formatting with % is not allowed")
    length = _static_len(node)
    if length is not None and length > MAX_SEQUENCE:
        raise _reject(text, node, f"this would build more than {MAX_SEQUENCE} items or characters")


@dataclass(frozen=True)
class Expression:
    """A validated, pre-parsed constraint. Build it with `compile_expression`; evaluate many times."""

    text: str
    _tree: ast.AST = field(repr=False, compare=False)
    _local: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    @property
    def is_constant(self) -> bool:
        """'True', '1': a literal, nothing to evaluate (the runtime keeps these on its loop)."""
        return isinstance(self._tree, ast.Constant)

    def _evaluator(self) -> _Evaluator:
        """One evaluator per thread, built once: construction costs more than a typical evaluation."""
        ev: _Evaluator | None = getattr(self._local, "ev", None)
        if ev is None:
            ev = _Evaluator(functions=dict(HELPERS), names={})
            ev.operators[ast.Pow] = _bounded_power
            ev.operators[ast.Mult] = _bounded_mult
            ev.operators[ast.Add] = _bounded_add
            ev.operators[ast.Mod] = _no_formatting_mod
            ev.expr = self.text
            self._local.ev = ev
        return ev

    def evaluate(
        self,
        *,
        event: Mapping[str, Any] | None = None,
        state: Mapping[str, Any] | None = None,
        now: float = 0.0,
        since: Callable[[str], float] | None = None,
        budget_s: float | None = None,
    ) -> Any:
        """Evaluate with the given names; raises ExpressionError with a clear message on failure,
        a bound passed included (`budget_s`: CPU seconds this evaluation may take; default
        EVAL_BUDGET_S, read at each call)."""
        if isinstance(self._tree, ast.Constant):  # 'True', '1': nothing to evaluate
            return self._tree.value
        evaluator = self._evaluator()
        evaluator.functions["since"] = since or _never
        evaluator.names = {
            "event": event if event is not None else {},
            "state": state if state is not None else {},
            "now": now,
            "True": True,
            "False": False,
            "None": None,
        }
        evaluator.start(EVAL_BUDGET_S if budget_s is None else budget_s)
        try:
            return evaluator._eval(self._tree)
        except BudgetExceeded as exc:
            raise ExpressionError(f"constraint {self.text!r} stopped: {exc}") from None
        except simpleeval.AttributeDoesNotExist as exc:
            raise ExpressionError(
                f"constraint {self.text!r}: the event/state has no key {exc.attr!r}"
            ) from None
        except (
            simpleeval.InvalidExpression,
            KeyError,
            IndexError,
            TypeError,
            ValueError,
            ZeroDivisionError,
            OverflowError,
            RecursionError,
            MemoryError,
        ) as exc:
            raise ExpressionError(f"constraint {self.text!r} failed: {type(exc).__name__}: {exc}") from None

    def test(self, **names: Any) -> bool:
        """Evaluate and coerce to bool (the engine's use)."""
        return bool(self.evaluate(**names))


def compile_expression(text: str) -> Expression:
    """Parse and validate `text`; raise ExpressionError saying what is wrong and what is allowed."""
    if not isinstance(text, str):
        raise ExpressionError(f"a constraint must be a string, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ExpressionError("a constraint must not be empty (use 'True' to always fire)")
    if len(stripped) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"constraint is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(stripped, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(
            f"constraint {stripped!r} is not a valid expression: {exc.msg} (column {exc.offset})"
        ) from None
    _validate(stripped, tree)
    return Expression(stripped, tree.body)
