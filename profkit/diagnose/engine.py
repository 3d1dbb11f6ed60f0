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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2.sandbox
import msgspec
import simpleeval
import yaml

from profkit import units
from profkit.diagnose.vllm_command import changes_precision, coerce, dest_of
from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.inputs import read_text
from profkit.resources import shipped_dir

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

    def facts_used(self) -> set[str]:
        names = fact_names(self.when) | (fact_names(self.gain) if self.gain else set())
        for c in self.changes:
            if c.when:
                names |= fact_names(c.when)
        return names | {e["fact"] for e in self.evidence}


class _LineLoader(yaml.SafeLoader):
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
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
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
                evidence=evidence, changes=changes, gain=gain)


MAX_TEMPLATE_OUTPUT = 20_000  # characters a summary or why may render to
MAX_REPEAT = 10_000  # items a `*` may build, range() may yield


class _BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's sandbox, immutable (a template reads the facts, never changes them), with bounded work:
    no string or list multiplied past MAX_REPEAT items, no huge powers, ranges of at most MAX_REPEAT."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise jinja2.sandbox.SecurityError("exponent too large in a rule template")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_REPEAT:
                    raise jinja2.sandbox.SecurityError("repetition too large in a rule template")
        return super().call_binop(context, operator, left, right)


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_REPEAT:
        raise jinja2.sandbox.SecurityError(f"range of {len(r)} items in a rule template (at most {MAX_REPEAT})")
    return r


def _template_env() -> jinja2.sandbox.SandboxedEnvironment:
    env = _BoundedSandbox(undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters.update(ns=units.ns, pct=units.pct, size=units.size, num=_num)
    env.globals["range"] = _bounded_range
    return env


def render_template(env: jinja2.sandbox.SandboxedEnvironment, text: str, facts: dict[str, Any]) -> str:
    """A rule's template over a copy of the facts, its output bounded."""
    out = env.from_string(text).render(f=dict(facts))
    if len(out) > MAX_TEMPLATE_OUTPUT:
        raise jinja2.sandbox.SecurityError(f"template output of {len(out)} characters (at most {MAX_TEMPLATE_OUTPUT})")
    return out


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:  # a count that arrived as a float (JSON, metrics)
            return f"{int(value):,}"
        if abs(value) >= 10 ** digits:  # no exponent for numbers a person reads whole (198 requests, not 2e+02)
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _check_template(text: str, where: str) -> None:
    try:
        _template_env().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise RuleError(f"{where}: bad template: {one_line(exc.message, 160)}") from None
    except (RecursionError, MemoryError):
        raise RuleError(f"{where}: template nested too deeply") from None


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


def _evaluate(expr: str, tree: dict[str, Any]) -> Any:
    evaluator = simpleeval.SimpleEval(names=dict(tree), functions={})
    return evaluator.eval(expr)


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


def evaluate(rules: list[Rule], facts: dict[str, Any],
             propose_changes: bool = True) -> tuple[list[Finding], list[dict[str, Any]]]:
    """(findings, skipped): a finding per rule whose condition holds, most severe first; skipped lists rules
    that needed facts the inputs cannot tell. `propose_changes` False: findings without flag changes (a run
    not shown to be vLLM's gets no vLLM flag)."""
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
        except Exception as exc:  # noqa: BLE001 - one rule's failure is that rule's error, not the report's
            skipped.append({"rule": rule.id, "missing": [],
                            "error": f"{rule.path}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"})
            continue
        if finding:
            findings.append(finding)
    findings.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return findings, skipped


def _finding(rule: Rule, facts: dict[str, Any], tree: dict[str, Any],
             env: jinja2.sandbox.SandboxedEnvironment, propose_changes: bool) -> Finding | None:
    if not _evaluate(rule.when, tree):
        return None
    changes = [_change(c, facts, env) for c in rule.changes if not c.when or _holds(c.when, tree)]
    return Finding(
        rule=rule.id,
        severity=rule.severity,
        title=rule.title,
        summary=render_template(env, rule.summary, facts),
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
        value = _evaluate(rule.gain, tree)
    except (TypeError, ZeroDivisionError, ValueError):
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return None
    return float(min(1.0, max(0.0, value)))


def _change(c: Change, facts: dict[str, Any], env: jinja2.sandbox.SandboxedEnvironment) -> ProposedChange:
    key = dest_of(c.flag)
    current = facts.get(f"config.{key}")
    source = facts.get(f"config_source.{key}") or ("unknown" if current is None else None)
    to = coerce(render_template(env, c.to, facts)) if isinstance(c.to, str) else c.to
    return ProposedChange(flag=c.flag, from_=current, from_source=source, to=to,
                          why=render_template(env, c.why, facts),
                          **({"changes_precision": True} if changes_precision(c.flag) else {}))


def explain(rule: Rule) -> str:
    """The text of `profkit rules explain ID`."""
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
    return "\n".join(lines)
