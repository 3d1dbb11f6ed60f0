"""Rules as data: load and validate `rules/*.yaml` into `Rule`s.

A rule file holds an id, a title, a severity, a condition (`when`) over facts, the evidence facts to
show with their thresholds and sources, a summary template, and flag changes, each with its own
condition. Conditions are expressions in `simpleeval` (a small, safe evaluator: no Python `eval`,
no attribute access beyond the fact tree); facts are dotted names (`gpu.utilization`,
`config.max_num_seqs`). Each expression and template is checked when its file loads; what they may build
is bounded by profkit.diagnose.sandbox.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from profkit.diagnose.sandbox import RuleError, compile_template, template_env
from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.inputs import read_text
from profkit.resources import shipped_dir

SEVERITIES = ("critical", "warning", "info")
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}
ALLOWED_KEYS = {"id", "title", "severity", "when", "summary", "evidence", "changes", "description", "gain"}
CHANGE_KEYS = {"flag", "when", "to", "why", "env"}
EVIDENCE_KEYS = {"fact", "threshold", "source"}


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


def _line(item: Any, rule_line: Any) -> int:
    """The line of a rule file an item of the rule is on (the loader marks each mapping), else the rule's."""
    line = item.get("__line__") if isinstance(item, dict) else None
    return int(line if isinstance(line, int) else rule_line if isinstance(rule_line, int) else 1)


def fact_names(expression: str) -> set[str]:
    """Dotted names an expression reads (`gpu.utilization < 0.5` -> {'gpu.utilization'})."""
    tree = ast.parse(expression, mode="eval")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            cur: ast.expr = node
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
        at = f":{mark.line + 1}" if mark else ""
        raise RuleError(f"{path}{at}: bad YAML: {one_line(getattr(exc, 'problem', exc), 160)}") from None
    except RecursionError:
        raise RuleError(f"{path}: bad YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise RuleError(f"{path}:1: a rule file is a mapping (id, title, severity, when, ...)")
    top = data.get("__line__", 1)
    unknown = set(data) - ALLOWED_KEYS - {"__line__"}
    if unknown:
        shown = sorted(unknown, key=str)  # YAML keys may be integers, dates, ...: not comparable with text
        raise RuleError(f"{path}:{top}: unknown key(s) {shown}; allowed: {sorted(ALLOWED_KEYS)}")
    for key in ("id", "title", "severity", "when", "summary"):
        if not data.get(key):
            raise RuleError(f"{path}:{top}: missing {key!r}")
    for key in ("id", "title"):
        if not isinstance(data[key], (str, int)) or isinstance(data[key], bool):
            raise RuleError(f"{path}:{top}: {key} must be a text")
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
        line = _line(item, top)
        if not isinstance(item, dict) or "fact" not in item or set(item) - EVIDENCE_KEYS - {"__line__"}:
            raise RuleError(f"{path}:{line}: evidence items are {{fact, threshold, source}}")
        if not all(isinstance(item.get(k), (str, type(None))) or _scalar(item[k]) for k in EVIDENCE_KEYS) \
                or not isinstance(item["fact"], str):
            raise RuleError(f"{path}:{line}: evidence: fact is a fact's name, threshold and source are texts")
        if item["fact"] not in known_facts:
            raise RuleError(f"{path}:{line}: evidence: unknown fact {item['fact']!r}")
        evidence.append({k: v if v is None or isinstance(v, str) else str(v) for k, v in item.items()
                         if k != "__line__"})
    changes = []
    for item in data.get("changes") or []:
        line = _line(item, top)
        keys = set(item) - {"__line__"} if isinstance(item, dict) else set()
        if not {"flag", "to", "why"} <= keys or keys - CHANGE_KEYS:
            raise RuleError(f"{path}:{line}: changes items are {{flag, to, why, when?}}")
        cond = _check_expression(item["when"], f"{path}:{line}: changes.when", known_facts) if "when" in item else None
        if not isinstance(item["flag"], str) or not item["flag"].startswith("--"):
            raise RuleError(f"{path}:{line}: changes.flag must be a flag such as --max-num-seqs")
        if not (item["to"] is None or _scalar(item["to"])):
            raise RuleError(f"{path}:{line}: changes.to is a value (a number, a text, true/false) or null")
        _check_template(str(item["why"]), f"{path}:{line}: why")
        if isinstance(item["to"], str):
            _check_template(item["to"], f"{path}:{line}: to")
        changes.append(Change(flag=item["flag"], to=item["to"], why=str(item["why"]), when=cond, line=line))
    return Rule(id=str(data["id"]), title=str(data["title"]), severity=data["severity"], when=when,
                summary=str(data["summary"]), path=path, description=str(data.get("description", "")).strip(),
                evidence=evidence, changes=changes, gain=gain, line=top)


def _scalar(value: Any) -> bool:
    """A YAML scalar a rule may hold as a value: text, a number, true/false (not a list, a map or a date)."""
    return isinstance(value, (str, int, float, bool))


def _check_template(text: str, where: str) -> None:
    try:
        compile_template(template_env(), text)
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
        files = sorted(d.glob("*.yaml"))
        if not files and d != dirs[0]:  # a folder given for its rules that holds none is a wrong folder
            raise RuleError(f"{d}: no rule files (*.yaml) in this folder")
        for path in files:
            rule = load_rule_file(path, known)
            if rule.id in rules:
                raise RuleError(f"{path}: rule id {rule.id!r} already defined in {rules[rule.id].path}")
            rules[rule.id] = rule
    return list(rules.values())
