"""Rules as data: load and validate `rules/*.yaml`, evaluate them over the report's facts.

A rule file holds an id, a title, a severity, a condition (`when`) over facts, the evidence facts to
show with their thresholds and sources, a summary template, and flag changes, each with its own
condition. Conditions are expressions in `simpleeval` (a small, safe evaluator: no Python `eval`,
no attribute access beyond the fact tree). Facts are dotted names (`gpu.utilization`,
`config.max_num_seqs`); a rule whose condition needs a fact the trace cannot tell (None) is not
evaluated, and the report says which facts were missing.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2.filters
import jinja2.nodes
import jinja2.sandbox
import jinja2.visitor
import msgspec
import simpleeval
import yaml

from profkit import units
from profkit.errors import ProfkitError
from profkit.escape import one_line, terminal
from profkit.inputs import read_text
from profkit.resources import shipped_dir
from profkit.vllm.command import changes_precision, dest_of
from profkit.vllm.options import coerce

SEVERITIES = ("critical", "warning", "info")
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}
ALLOWED_KEYS = {"id", "title", "severity", "when", "summary", "evidence", "changes", "description", "gain"}
CHANGE_KEYS = {"flag", "when", "to", "why", "env"}
EVIDENCE_KEYS = {"fact", "threshold", "source"}


class RuleError(ProfkitError):
    """A rule file that does not load: the message names the file and line."""


@dataclass
class Change:
    flag: str
    to: Any
    why: str
    when: str | None = None
    line: int = 0


@dataclass
class Rule:
    id: str
    title: str
    severity: str
    when: str
    summary: str
    path: Path
    description: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    # What the finding's changes could win at most, as a share (0..1) of the run: an expression over facts (the
    # GPU's idle share for a host-bound rule, the share of launch gaps for a launch-bound one); orders tune's
    # candidates after the user's own missteps.
    gain: str | None = None
    line: int = 1  # the rule's mapping in its file, for errors found when it is evaluated

    def facts_used(self) -> set[str]:
        names = fact_names(self.when) | (fact_names(self.gain) if self.gain else set())
        for c in self.changes:
            if c.when:
                names |= fact_names(c.when)
        return names | {e["fact"] for e in self.evidence}


# libyaml's parser where PyYAML has it (22 rule files: 0.03 s instead of 0.3 s per report), else PyYAML's own
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """SafeLoader that remembers the line of every mapping, so errors can point at it."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def fact_names(expression: str) -> set[str]:
    """Dotted names an expression reads (`gpu.utilization < 0.5` -> {'gpu.utilization'})."""
    tree = ast.parse(expression, mode="eval")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                parts.append(cur.id)
                names.add(".".join(reversed(parts)))
    # Strip names that are prefixes of longer ones (the walk visits inner Attribute nodes too).
    return {n for n in names if not any(o != n and o.startswith(n + ".") for o in names)}


MAX_EXPRESSION = 2000  # characters; a condition is a few comparisons
MAX_NODES = 300


def _check_expression(expr: Any, where: str, known: set[str]) -> str:
    if not isinstance(expr, str) or not expr.strip():
        raise RuleError(f"{where}: expected an expression string")
    if len(expr) > MAX_EXPRESSION:
        raise RuleError(f"{where}: expression of {len(expr)} characters (at most {MAX_EXPRESSION})")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise RuleError(f"{where}: bad expression {one_line(expr, 80)!r}: {getattr(exc, 'msg', exc)}") from None
    except (RecursionError, MemoryError):
        raise RuleError(f"{where}: expression nested too deeply") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise RuleError(f"{where}: expression too large (more than {MAX_NODES} parts)")
    bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and id(node) not in bases and node.id not in ("True", "False", "None"):
            raise RuleError(f"{where}: unknown name {node.id!r} in {expr!r} (facts are dotted: gpu.utilization)")
        if isinstance(node, ast.Call):
            raise RuleError(f"{where}: function calls are not allowed in {expr!r}")
    for name in fact_names(expr):
        if name not in known:
            raise RuleError(f"{where}: unknown fact {name!r} (see `profkit rules facts`)")
    return expr


def _refuse_aliases(text: str, path: Path) -> None:
    """Rule files need no YAML anchors or aliases, and an alias bomb (a billion laughs) needs them."""
    for token in yaml.scan(text, Loader=_SafeLoader):
        if isinstance(token, (yaml.AliasToken, yaml.AnchorToken)):
            raise RuleError(f"{path}:{token.start_mark.line + 1}: YAML anchors and aliases are not allowed in rule "
                            "files")


def load_rule_file(path: Path, known_facts: set[str]) -> Rule:
    try:
        text = read_text(path, "rule file")
    except ProfkitError as exc:
        raise RuleError(str(exc)) from None
    try:
        _refuse_aliases(text, path)
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RuleError(f"{path}{line}: bad YAML: {one_line(getattr(exc, 'problem', exc), 160)}") from None
    except RecursionError:
        raise RuleError(f"{path}: bad YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise RuleError(f"{path}:1: a rule file is a mapping (id, title, severity, when, ...)")
    top = data.get("__line__", 1)
    unknown = set(data) - ALLOWED_KEYS - {"__line__"}
    if unknown:
        raise RuleError(f"{path}:{top}: unknown key(s) {sorted(unknown)}; allowed: {sorted(ALLOWED_KEYS)}")
    for key in ("id", "title", "severity", "when", "summary"):
        if not data.get(key):
            raise RuleError(f"{path}:{top}: missing {key!r}")
    if data["severity"] not in SEVERITIES:
        raise RuleError(f"{path}:{top}: severity must be one of {SEVERITIES}, not {data['severity']!r}")
    for key in ("evidence", "changes"):
        if data.get(key) is not None and not isinstance(data[key], list):
            raise RuleError(f"{path}:{top}: {key} must be a list")
    if not isinstance(data["summary"], str):
        raise RuleError(f"{path}:{top}: summary must be a text (a template)")
    where = f"{path}:{top}: when"
    when = _check_expression(data["when"], where, known_facts)
    raw_gain = data.get("gain")
    if isinstance(raw_gain, (int, float)) and not isinstance(raw_gain, bool):
        raw_gain = str(raw_gain)  # a constant share
    gain = _check_expression(raw_gain, f"{path}:{top}: gain", known_facts) if "gain" in data else None
    _check_template(data["summary"], f"{path}:{top}: summary")
    evidence = []
    for item in data.get("evidence") or []:
        line = item.get("__line__", top) if isinstance(item, dict) else top
        if not isinstance(item, dict) or "fact" not in item or set(item) - EVIDENCE_KEYS - {"__line__"}:
            raise RuleError(f"{path}:{line}: evidence items are {{fact, threshold, source}}")
        if item["fact"] not in known_facts:
            raise RuleError(f"{path}:{line}: evidence: unknown fact {item['fact']!r}")
        evidence.append({k: v for k, v in item.items() if k != "__line__"})
    changes = []
    for item in data.get("changes") or []:
        line = item.get("__line__", top) if isinstance(item, dict) else top
        keys = set(item) - {"__line__"} if isinstance(item, dict) else set()
        if not {"flag", "to", "why"} <= keys or keys - CHANGE_KEYS:
            raise RuleError(f"{path}:{line}: changes items are {{flag, to, why, when?}}")
        cond = _check_expression(item["when"], f"{path}:{line}: changes.when", known_facts) if "when" in item else None
        if not isinstance(item["flag"], str) or not item["flag"].startswith("--"):
            raise RuleError(f"{path}:{line}: changes.flag must be a flag such as --max-num-seqs")
        _check_template(str(item["why"]), f"{path}:{line}: why")
        if isinstance(item["to"], str):
            _check_template(item["to"], f"{path}:{line}: to")
        changes.append(Change(flag=item["flag"], to=item["to"], why=str(item["why"]), when=cond, line=line))
    return Rule(id=str(data["id"]), title=str(data["title"]), severity=data["severity"], when=when,
                summary=str(data["summary"]), path=path, description=str(data.get("description", "")).strip(),
                evidence=evidence, changes=changes, gain=gain, line=top)


# --- bounded rendering -------------------------------------------------------------------------------------------
# A rule's templates (summary, why, to) and expressions (when, gain) are text from a rule file. Everything they may
# build is bounded BEFORE it is built: a format width or precision, a repetition, a join, a replace, a
# concatenation, a number's size, each output; and a template is text with {{ values }} and {% if %} only (no loop,
# assignment, macro or call: nothing that repeats work). A rule that asks for more is hostile or broken: its file
# is the error (one line), whatever the trace.
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


class _BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's sandbox, immutable (a template reads the facts, never changes them), every operator that can build
    a large value bounded (`*`, `**`, `+`, `%`; `~` through the `profkit_concat` filter, see _compile)."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])
    _BINOPS = {"*": bounded_mul, "**": bounded_pow, "+": bounded_add, "%": bounded_mod}

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        return self._BINOPS[operator](left, right)

    compiled: dict[str, jinja2.Template]  # template text -> checked, compiled template (_compile)


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
        raise jinja2.FilterArgumentError("format takes positional or keyword arguments, not both")
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


def _filter_round(value: Any, precision: int = 0, method: str = "common") -> float:
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
def _template_env() -> _BoundedSandbox:
    env = _BoundedSandbox(undefined=jinja2.StrictUndefined, autoescape=False, optimized=False,
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


def _compile(env: _BoundedSandbox, text: str) -> jinja2.Template:
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


def _compile_new(env: _BoundedSandbox, text: str) -> jinja2.Template:
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


def render_template(env: _BoundedSandbox, text: str, facts: dict[str, Any]) -> str:
    """A rule's template (env: `_template_env()`) over a copy of the facts, its output bounded as it is made
    (RuleBoundError past MAX_TEMPLATE_OUTPUT)."""
    out: list[str] = []
    size = 0
    for chunk in _compile(env, text).generate(f=dict(facts)):
        size += len(chunk)
        if size > MAX_TEMPLATE_OUTPUT:
            raise RuleBoundError(f"template output of more than {MAX_TEMPLATE_OUTPUT} characters")
        out.append(chunk)
    return "".join(out)


def _check_template(text: str, where: str) -> None:
    try:
        _compile(_template_env(), text)
    except RuleError as exc:
        raise RuleError(f"{where}: {exc}") from None


def load_rules(extra_dirs: list[Path] | None = None, known_facts: set[str] | None = None) -> list[Rule]:
    """The shipped rules plus every `*.yaml` in `extra_dirs`; ids must be unique."""
    from profkit.diagnose.facts import known_fact_names

    known = known_facts or known_fact_names()
    dirs = [shipped_dir("rules")] + [Path(d) for d in (extra_dirs or [])]
    rules: dict[str, Rule] = {}
    for d in dirs:
        if not d.is_dir():
            raise RuleError(f"{d}: no such rules folder")
        for path in sorted(d.glob("*.yaml")):
            rule = load_rule_file(path, known)
            if rule.id in rules:
                raise RuleError(f"{path}: rule id {rule.id!r} already defined in {rules[rule.id].path}")
            rules[rule.id] = rule
    return list(rules.values())


def _fact_tree(facts: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in facts.items():
        node = tree
        parts = name.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return tree


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


def _evaluate(expr: str, tree: dict[str, Any]) -> Any:
    return _BoundedEval(dict(tree)).eval(expr)


def _holds(expr: str, tree: dict[str, Any]) -> bool:
    """A change's condition: unknown values (None) may be tested with `is None`; comparing one with
    a number means the condition cannot be decided, so the change is not proposed."""
    try:
        return bool(_evaluate(expr, tree))
    except TypeError:
        return False


class ProposedChange(msgspec.Struct, kw_only=True, frozen=True):
    """A finding's flag change. `from` is the run's value when known, else vLLM's default (`from_source` says
    which); both values typed; `to` None removes the flag. `action` (edit | add | remove | none) says what the
    suggested command does with it, and `note` why it differs from `to`."""

    flag: str
    from_: Any = msgspec.field(name="from")
    from_source: str | None
    to: Any
    why: str
    action: str | msgspec.UnsetType = msgspec.UNSET
    note: str | msgspec.UnsetType = msgspec.UNSET
    # it changes the model's numerics (FP8 weights or KV cache, any quantization): check accuracy before shipping
    changes_precision: bool | msgspec.UnsetType = msgspec.UNSET


class Finding(msgspec.Struct, kw_only=True, frozen=True):
    rule: str
    severity: str
    title: str
    summary: str
    evidence: list[dict[str, Any]]
    changes: list[ProposedChange]
    gain: float | None = None  # the rule's `gain` over the facts: what its changes could win at most, 0..1


# What a rule file is at fault for, whatever the trace: a bound (RuleBoundError), the sandbox's refusal, simpleeval's
# own limits. Anything else (a division by a zero fact, a None compared) is that rule's error on this run.
_HOSTILE = (jinja2.sandbox.SecurityError, simpleeval.NumberTooHigh, simpleeval.IterableTooLong,
            simpleeval.FeatureNotAvailable, RuleError)


def _part(rule: Rule, line: int, part: str, run: Any, *args: Any) -> Any:
    """`run(*args)` for one part of a rule (its condition, summary, a change's why): a bound it breaks is one
    RuleError naming the rule file, line and part."""
    try:
        return run(*args)
    except _HOSTILE as exc:
        raise RuleError(f"{rule.path}:{line}: {part}: {one_line(exc, 300)}") from None


def evaluate(rules: list[Rule], facts: dict[str, Any],
             propose_changes: bool = True) -> tuple[list[Finding], list[dict[str, Any]]]:
    """(findings, skipped): a finding per rule whose condition holds, most severe first; skipped lists rules
    that needed facts the inputs cannot tell, or failed on these facts (with the error). `propose_changes`
    False: findings without flag changes (a run not shown to be vLLM's gets no vLLM flag). RuleError for a rule
    that breaks a bound (a format width in the billions, a million-word string): the rule file is at fault."""
    tree = _fact_tree(facts)
    env = _template_env()
    findings, skipped = [], []
    for rule in rules:
        missing = sorted(n for n in fact_names(rule.when) if facts.get(n) is None)
        if missing:
            skipped.append({"rule": rule.id, "missing": missing})
            continue
        try:
            finding = _finding(rule, facts, tree, env, propose_changes)
        except RuleError:
            raise
        except Exception as exc:  # noqa: BLE001 - one rule's failure is that rule's error, not the report's
            skipped.append({"rule": rule.id, "missing": [],
                            "error": f"{rule.path}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"})
            continue
        if finding:
            findings.append(finding)
    findings.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return findings, skipped


def _finding(rule: Rule, facts: dict[str, Any], tree: dict[str, Any],
             env: _BoundedSandbox, propose_changes: bool) -> Finding | None:
    if not _part(rule, rule.line, "when", _evaluate, rule.when, tree):
        return None
    changes = [_change(rule, c, facts, env) for c in rule.changes
               if not c.when or _part(rule, c.line, "changes.when", _holds, c.when, tree)]
    return Finding(
        rule=rule.id,
        severity=rule.severity,
        title=rule.title,
        summary=_part(rule, rule.line, "summary", render_template, env, rule.summary, facts),
        evidence=[{"fact": e["fact"], "value": facts.get(e["fact"]), "threshold": e.get("threshold"),
                   "source": e.get("source")} for e in rule.evidence],
        changes=changes if propose_changes else [],
        gain=_gain(rule, tree),
    )


def _gain(rule: Rule, tree: dict[str, Any]) -> float | None:
    """The rule's gain expression, as a share in 0..1; None where the facts cannot tell."""
    if rule.gain is None:
        return None
    try:
        value = _part(rule, rule.line, "gain", _evaluate, rule.gain, tree)
    except (TypeError, ZeroDivisionError, ValueError):
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return None
    return float(min(1.0, max(0.0, value)))


def _change(rule: Rule, c: Change, facts: dict[str, Any], env: _BoundedSandbox) -> ProposedChange:
    key = dest_of(c.flag)
    current = facts.get(f"config.{key}")
    source = facts.get(f"config_source.{key}") or ("unknown" if current is None else None)
    to = coerce(_part(rule, c.line, "to", render_template, env, c.to, facts)) if isinstance(c.to, str) else c.to
    return ProposedChange(flag=c.flag, from_=current, from_source=source, to=to,
                          why=_part(rule, c.line, "why", render_template, env, c.why, facts),
                          **({"changes_precision": True} if changes_precision(c.flag) else {}))


def explain(rule: Rule) -> str:
    """The text of `profkit rules explain ID`: every line terminal-safe (a rule file's text may carry escape
    sequences or newlines; each value stays on its line)."""
    from profkit.diagnose.facts import FACT_DOCS

    lines = [f"{rule.id} ({rule.severity}): {rule.title}", f"  file: {rule.path}", ""]
    if rule.description:
        lines += ["  " + line for line in rule.description.splitlines()] + [""]
    lines.append(f"  fires when: {rule.when}")
    for name in sorted(fact_names(rule.when)):
        lines.append(f"    {name}: {FACT_DOCS.get(name, '')}")
    if rule.gain:
        lines.append(f"  gain (what its changes could win at most, orders tune's candidates): {rule.gain}")
    if rule.evidence:
        lines += ["", "  evidence shown:"]
        for e in rule.evidence:
            extra = " ".join(x for x in (e.get("threshold") and f"threshold {e['threshold']}",
                                         e.get("source") and f"[{e['source']}]") if x)
            lines.append(f"    {e['fact']} {extra}".rstrip())
    if rule.changes:
        lines += ["", "  flag changes:"]
        for c in rule.changes:
            cond = f" (when {c.when})" if c.when else ""
            to = "(removed)" if c.to is None else c.to
            lines.append(f"    {c.flag} -> {to}{cond}: {' '.join(c.why.split())}")
    return "\n".join(terminal(line) for line in lines)
