"""The bounded sandbox a rule's expressions and templates run in.

A rule's templates (summary, why, to) and expressions (when, gain) are text from a rule file. Everything they may
build is bounded BEFORE it is built: a format width or precision, a repetition, a join, a replace, a
concatenation, a number's size, each output; and a template is text with {{ values }} and {% if %} only (no loop,
assignment, macro or call: nothing that repeats work). A rule that asks for more is hostile or broken: its file
is the error (one line), whatever the trace. Templates run in Jinja's immutable sandbox (`template_env`,
`render_template`), expressions in `simpleeval` (`evaluate_expression`: a small, safe evaluator, no Python `eval`),
each with profkit's bounded operators and filters.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from typing import Any, Literal

import jinja2.filters
import jinja2.nodes
import jinja2.sandbox
import jinja2.visitor
import simpleeval

from profkit import units
from profkit.errors import ProfkitError
from profkit.escape import one_line


class RuleError(ProfkitError):
    """A rule file that does not load, or breaks a bound when evaluated: the message names the file and line (a
    template refused here names neither: the caller, loading or evaluating a rule, says where)."""


MAX_TEMPLATE_SOURCE = 5_000  # characters of one template (the shipped rules' longest is under 700)
MAX_TEMPLATE_OUTPUT = 20_000  # characters a summary or why may render to
MAX_REPEAT = 10_000  # characters or items any one value a template or expression builds may hold
MAX_FORMAT_WIDTH = 1_000  # a format's width or precision (`%1000d`, `{:>1000}`, num(1000))
MAX_INT_BITS = 1 << 14  # an integer a rule computes (about 4,900 digits; Python prints at most 4,300)
MAX_EXPONENT = 64


class RuleBoundError(jinja2.sandbox.SecurityError):
    """A rule asked for more work or text than any rule needs (a bound above): the rule file is at fault."""


def _size(value: Any, limit: int = MAX_REPEAT) -> int:
    """How much text a value makes when printed, roughly (characters of strings, one per number or item, digits of
    big integers), counted without building anything; stops once past `limit`."""
    total, stack = 0, [iter((value,))]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 1
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        elif isinstance(item, dict):
            total += 1
            stack.append(iter(item.items()))
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 1
            stack.append(iter(item))
        elif isinstance(item, range):
            total += len(item)
        else:
            total += 1
        if total > limit:
            return total
    return total


_END = object()


def _bounded(value: Any, what: str) -> Any:
    if _size(value) > MAX_REPEAT:
        raise RuleBoundError(f"{what} of more than {MAX_REPEAT} characters or items")
    return value


def _check_width(spec: str, where: str) -> None:
    """Every width and precision in a format spec (`>10`, `.3f`, `%-20s`) at most MAX_FORMAT_WIDTH."""
    for digits in re.findall(r"\d+", spec):
        if len(digits) > 6 or int(digits) > MAX_FORMAT_WIDTH:
            shown = digits if len(digits) <= 20 else digits[:20] + "..."
            raise RuleBoundError(f"format width {shown} in {where} (at most {MAX_FORMAT_WIDTH})")


def _percent_specs(fmt: str) -> Iterator[tuple[str, str]]:
    """(width, precision) of each conversion of a printf-style format, read as CPython reads it (a mapping key
    may nest parentheses: `%(a(b))9d` has width 9)."""
    i, n = 0, len(fmt)
    while True:
        i = fmt.find("%", i) + 1
        if i == 0 or i >= n:
            return
        if fmt[i] == "%":
            i += 1
            continue
        if fmt[i] == "(":
            depth = 1
            i += 1
            while i < n and depth:
                depth += {"(": 1, ")": -1}.get(fmt[i], 0)
                i += 1
        while i < n and fmt[i] in "-+ #0":
            i += 1
        width = precision = ""
        while i < n and (fmt[i] == "*" or "0" <= fmt[i] <= "9"):
            width += fmt[i]
            i += 1
        if i < n and fmt[i] == ".":
            i += 1
            while i < n and (fmt[i] == "*" or "0" <= fmt[i] <= "9"):
                precision += fmt[i]
                i += 1
        yield width, precision


def _percent(fmt: str, args: Any) -> str:
    """`fmt % args` (printf-style) with every width and precision bounded, and the output estimated first."""
    specs = 0
    estimate = len(fmt)
    for width, precision in _percent_specs(fmt):
        if "*" in width + precision:
            raise RuleBoundError("a `*` width in a %-format (give the width as digits)")
        _check_width(f"{width}.{precision}", "a %-format")
        specs += 1
        estimate += int(width or 0) + int(precision or 0) + 400  # 400: more than a float's %f can make (~330)
    estimate += _size(args, MAX_TEMPLATE_OUTPUT) * (specs if isinstance(args, dict) else 1)
    if estimate > MAX_TEMPLATE_OUTPUT:
        raise RuleBoundError(f"a %-format that would make more than {MAX_TEMPLATE_OUTPUT} characters")
    return fmt % args


def _int_bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def bounded_mul(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and _size(seq) * max(n, 0) > MAX_REPEAT:
            raise RuleBoundError(f"repetition too large in a rule (more than {MAX_REPEAT} characters or items)")
    if _int_bits(a) + _int_bits(b) > MAX_INT_BITS:
        raise RuleBoundError("number too large in a rule")
    return a * b


def bounded_pow(a: Any, b: Any) -> Any:
    if isinstance(b, (int, float)) and abs(b) > MAX_EXPONENT and a not in (0, 1, -1):
        raise RuleBoundError(f"exponent too large in a rule (at most {MAX_EXPONENT})")
    if isinstance(a, int) and isinstance(b, int) and _int_bits(a) * max(b, 0) > MAX_INT_BITS:
        raise RuleBoundError("number too large in a rule")
    return a ** b


def bounded_add(a: Any, b: Any) -> Any:
    if isinstance(a, (str, bytes, list, tuple)) and isinstance(b, (str, bytes, list, tuple)):
        _bounded((a, b), "a concatenation")
    return a + b


def bounded_mod(a: Any, b: Any) -> Any:
    return _percent(a, b) if isinstance(a, str) else a % b


class BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's sandbox, immutable (a template reads the facts, never changes them), every operator that can build
    a large value bounded (`*`, `**`, `+`, `%`; `~` through the `profkit_concat` filter, see compile_template)."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])
    _BINOPS = {"*": bounded_mul, "**": bounded_pow, "+": bounded_add, "%": bounded_mod}

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        return self._BINOPS[operator](left, right)

    compiled: dict[str, jinja2.Template]  # template text -> checked, compiled template (compile_template)


def _num(value: Any, digits: int = 3) -> str:
    _check_width(str(digits), "num()")
    if value is None:
        return "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:  # a count that arrived as a float (JSON, metrics)
            return f"{int(value):,}"
        if abs(value) >= 10 ** digits:  # no exponent for numbers a person reads whole (198 requests, not 2e+02)
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _filter_join(value: Any, d: str = "") -> str:
    items = [str(x) for x in _bounded(value, "a join's items")]
    _bounded([d] * max(len(items) - 1, 0) + items, "a join")
    return str(d).join(items)


def _filter_replace(s: Any, old: Any, new: Any, count: int | None = None) -> str:
    s, old, new = str(s), str(old), str(new)
    times = len(s) + 1 if not old else s.count(old)
    if count is not None and count >= 0:
        times = min(times, count)
    if len(s) + times * len(new) > MAX_REPEAT:
        raise RuleBoundError(f"a replace that would make more than {MAX_REPEAT} characters")
    return s.replace(old, new, -1 if count is None else count)


def _filter_format(value: Any, *args: Any, **kwargs: Any) -> str:
    if args and kwargs:
        raise jinja2.exceptions.FilterArgumentError("format takes positional or keyword arguments, not both")
    return _percent(str(value), kwargs or args)


def _filter_center(value: Any, width: int = 80) -> str:
    _check_width(str(width), "center()")
    return str(value).center(width)


def _filter_sum(values: Any, start: Any = 0) -> Any:
    items = list(_bounded(values, "a sum's items"))
    if not all(isinstance(x, (int, float)) for x in (*items, start)):
        _bounded((items, start), "a sum")
    total = start
    for x in items:
        total = bounded_add(total, x)
    return total


def _filter_round(value: Any, precision: int = 0, method: Literal["common", "ceil", "floor"] = "common") -> float:
    _check_width(str(precision), "round()")
    return jinja2.filters.do_round(value, precision, method)


def _concat(parts: list[Any]) -> str:
    """`a ~ b`: the parts as text, bounded before they are joined."""
    return "".join(str(p) for p in _bounded(parts, "a `~` concatenation"))


def _checked(fn: Any) -> Any:
    """A filter whose every argument is first bounded in size (its result is then bounded by its kind)."""
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(fn)  # keeps Jinja's pass_environment/pass_eval_context mark
    def run(*args: Any, **kwargs: Any) -> Any:
        for a in (*args[skip:], *kwargs.values()):
            _bounded(a, "a filter's argument")
        return fn(*args, **kwargs)

    return run


# The filters a template may use: the units, the shipped rules' own, and Jinja's that build nothing larger than
# their input; `format`, `join`, `replace`, `center`, `sum` and `round` bounded here.
_JINJA_FILTERS = ("abs", "float", "int", "min", "max", "length", "count", "first", "last", "lower", "upper", "title",
                  "capitalize", "trim", "default", "d", "list", "sort", "reverse", "unique", "string", "wordcount",
                  "filesizeformat", "truncate")
_OWN_FILTERS = {"ns": units.ns, "pct": units.pct, "size": units.size, "num": _num, "format": _filter_format,
                "join": _filter_join, "replace": _filter_replace, "center": _filter_center, "sum": _filter_sum,
                "round": _filter_round}
_CONCAT = "profkit_concat"
# Template syntax a rule template may use: text, {{ expressions }} over `f`, {% if %}.
_TEMPLATE_NODES = (jinja2.nodes.Template, jinja2.nodes.Output, jinja2.nodes.TemplateData, jinja2.nodes.If,
                   jinja2.nodes.Const, jinja2.nodes.Name, jinja2.nodes.Getitem, jinja2.nodes.Getattr,
                   jinja2.nodes.Slice, jinja2.nodes.Filter, jinja2.nodes.Test, jinja2.nodes.CondExpr,
                   jinja2.nodes.Compare, jinja2.nodes.Operand, jinja2.nodes.And, jinja2.nodes.Or, jinja2.nodes.Not,
                   jinja2.nodes.Neg, jinja2.nodes.Pos, jinja2.nodes.Add, jinja2.nodes.Sub, jinja2.nodes.Mul,
                   jinja2.nodes.Div, jinja2.nodes.FloorDiv, jinja2.nodes.Mod, jinja2.nodes.Pow, jinja2.nodes.Concat,
                   jinja2.nodes.List, jinja2.nodes.Tuple, jinja2.nodes.Dict, jinja2.nodes.Pair, jinja2.nodes.Keyword)


@functools.cache  # one shared environment: building it wraps every filter, and it caches compiled templates
def template_env() -> BoundedSandbox:
    env = BoundedSandbox(undefined=jinja2.StrictUndefined, autoescape=False, optimized=False,
                          finalize=lambda value: _bounded(value, "a value printed"))
    defaults = env.filters
    env.filters = {**{name: _checked(defaults[name]) for name in _JINJA_FILTERS},
                   **{name: _checked(fn) for name, fn in _OWN_FILTERS.items()}, _CONCAT: _concat}
    env.globals = {}  # no range, lipsum, cycler, joiner, namespace: nothing to call
    env.compiled = {}
    return env


_STATEMENTS = {"Assign": "set", "AssignBlock": "set", "CallBlock": "call", "FilterBlock": "filter",
               "FromImport": "from", "ExprStmt": "do", "ScopedEvalContextModifier": "autoescape"}


def _check_syntax(tree: jinja2.nodes.Template, env: jinja2.Environment) -> str | None:
    """What in a parsed template a rule template may not use, or None."""
    for node in tree.find_all(jinja2.nodes.Node):
        kind = type(node).__name__
        if not isinstance(node, _TEMPLATE_NODES):
            tag = _STATEMENTS.get(kind, kind.lower())
            what = "a call" if kind == "Call" else f"`{{% {tag} %}}`" if isinstance(node, jinja2.nodes.Stmt) else kind
            return f"{what} is not allowed (a rule template is text with {{{{ values }}}} and {{% if %}})"
        if isinstance(node, jinja2.nodes.Name) and node.name != "f":
            return f"unknown name {node.name!r} (facts are read as f['gpu.utilization'])"
        if isinstance(node, jinja2.nodes.Getattr) and node.attr.startswith("_"):
            return f"attribute {node.attr!r} is not allowed"
        if isinstance(node, jinja2.nodes.Filter) and (node.name not in env.filters or node.name == _CONCAT):
            return f"unknown filter {node.name!r} (filters: {', '.join(sorted(set(env.filters) - {_CONCAT}))})"
        if isinstance(node, jinja2.nodes.Test) and node.name not in env.tests:
            return f"unknown test {node.name!r}"
    return None


class _BoundConcat(jinja2.visitor.NodeTransformer):
    """`a ~ b` compiles to a plain join Jinja gives no hook for: made the bounded `profkit_concat` filter."""

    def visit_Concat(self, node: jinja2.nodes.Concat) -> jinja2.nodes.Node:  # noqa: N802 - Jinja's visitor names
        self.generic_visit(node)
        return jinja2.nodes.Filter(jinja2.nodes.List(node.nodes, lineno=node.lineno), _CONCAT, [], [], None, None,
                                   lineno=node.lineno)


def compile_template(env: BoundedSandbox, text: str) -> jinja2.Template:
    """A rule template, checked (size, syntax, what it uses) and compiled with `~` bounded. RuleError (no file
    named: the caller says where) for a template that is not one. Compiled once per text (a report renders
    each rule's templates again; the shipped rules' ~80 compile in 0.15 s)."""
    hit = env.compiled.get(text)
    if hit is not None:
        return hit
    template = _compile_new(env, text)
    if len(env.compiled) < COMPILED_TEMPLATES:
        env.compiled[text] = template
    return template


COMPILED_TEMPLATES = 1_000  # templates kept compiled (the shipped rules have ~80)


def _compile_new(env: BoundedSandbox, text: str) -> jinja2.Template:
    if len(text) > MAX_TEMPLATE_SOURCE:
        raise RuleError(f"template of {len(text)} characters (at most {MAX_TEMPLATE_SOURCE})")
    try:
        tree = env.parse(text)
        problem = _check_syntax(tree, env)
        if problem:
            raise RuleError(f"bad template: {problem}")
        tree = _BoundConcat().visit(tree)
        tree.set_environment(env)
        return env.from_string(tree)
    except jinja2.TemplateSyntaxError as exc:
        raise RuleError(f"bad template: {one_line(exc.message, 160)}") from None
    except ValueError as exc:  # a number literal past Python's 4,300 digits
        raise RuleError(f"bad template: {one_line(exc, 160)}") from None
    except (RecursionError, MemoryError, SyntaxError):
        raise RuleError("template nested too deeply") from None


def render_template(env: BoundedSandbox, text: str, facts: dict[str, Any]) -> str:
    """A rule's template (env: `template_env()`) over a copy of the facts, its output bounded as it is made
    (RuleBoundError past MAX_TEMPLATE_OUTPUT)."""
    out: list[str] = []
    size = 0
    for chunk in compile_template(env, text).generate(f=dict(facts)):
        size += len(chunk)
        if size > MAX_TEMPLATE_OUTPUT:
            raise RuleBoundError(f"template output of more than {MAX_TEMPLATE_OUTPUT} characters")
        out.append(chunk)
    return "".join(out)


class _BoundedEval(simpleeval.SimpleEval):
    """simpleeval with profkit's bounds on what an expression may build: its own `*`, `**`, `+` and `%` (a
    %-format's widths) and f-string format specs (simpleeval formats those unbounded)."""

    def __init__(self, names: dict[str, Any]) -> None:
        operators = {**simpleeval.DEFAULT_OPERATORS, ast.Mult: bounded_mul, ast.Pow: bounded_pow,
                     ast.Add: bounded_add, ast.Mod: bounded_mod}
        super().__init__(operators=operators, functions={}, names=names)

    def _eval_formattedvalue(self, node: ast.FormattedValue) -> Any:
        if node.format_spec is None:
            return self._eval(node.value)
        spec = str(self._eval(node.format_spec))
        _check_width(spec, "an f-string")
        return format(self._eval(node.value), spec)


def evaluate_expression(expr: str, tree: dict[str, Any]) -> Any:
    """A rule's expression (`when`, `gain`) over the fact tree, every operator that can build a large value
    bounded."""
    return _BoundedEval(dict(tree)).eval(expr)


# What a rule file is at fault for, whatever the trace: a bound (RuleBoundError), the sandbox's refusal, simpleeval's
# own limits. Anything else (a division by a zero fact, a None compared) is that rule's error on this run.
RULE_FILE_FAULTS = (jinja2.sandbox.SecurityError, simpleeval.NumberTooHigh, simpleeval.IterableTooLong,
                    simpleeval.FeatureNotAvailable, RuleError)
