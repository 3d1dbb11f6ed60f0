"""Rules evaluated over the report's facts: a `Finding` per rule whose condition holds, with its proposed flag
changes. A rule whose condition needs a fact the trace cannot tell (None) is not evaluated, and the report says
which facts were missing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from profkit.diagnose.rule_files import SEVERITY_ORDER, Change, Rule, fact_names
from profkit.diagnose.sandbox import (
    RULE_FILE_FAULTS,
    BoundedSandbox,
    RuleError,
    evaluate_expression,
    render_template,
    template_env,
)
from profkit.escape import one_line
from profkit.vllm.command import changes_precision, dest_of
from profkit.vllm.options import coerce


def _fact_tree(facts: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in facts.items():
        node = tree
        parts = name.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return tree


def _holds(expr: str, tree: dict[str, Any]) -> bool:
    """A change's condition: unknown values (None) may be tested with `is None`; comparing one with
    a number means the condition cannot be decided, so the change is not proposed."""
    try:
        return bool(evaluate_expression(expr, tree))
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


def _part(rule: Rule, line: int, part: str, run: Any, *args: Any) -> Any:
    """`run(*args)` for one part of a rule (its condition, summary, a change's why): a bound it breaks is one
    RuleError naming the rule file, line and part."""
    try:
        return run(*args)
    except RULE_FILE_FAULTS as exc:
        raise RuleError(f"{rule.path}:{line}: {part}: {one_line(exc, 300)}") from None


def evaluate(rules: list[Rule], facts: dict[str, Any],
             propose_changes: bool = True) -> tuple[list[Finding], list[dict[str, Any]]]:
    """(findings, skipped): a finding per rule whose condition holds, most severe first; skipped lists rules
    that needed facts the inputs cannot tell, or failed on these facts (with the error). `propose_changes`
    False: findings without flag changes (a run not shown to be vLLM's gets no vLLM flag). RuleError for a rule
    that breaks a bound (a format width in the billions, a million-word string): the rule file is at fault."""
    tree = _fact_tree(facts)
    env = template_env()
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
             env: BoundedSandbox, propose_changes: bool) -> Finding | None:
    if not _part(rule, rule.line, "when", evaluate_expression, rule.when, tree):
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
        value = _part(rule, rule.line, "gain", evaluate_expression, rule.gain, tree)
    except (TypeError, ZeroDivisionError, ValueError):
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return None
    return float(min(1.0, max(0.0, value)))


def _change(rule: Rule, c: Change, facts: dict[str, Any], env: BoundedSandbox) -> ProposedChange:
    key = dest_of(c.flag)
    current = facts.get(f"config.{key}")
    source = facts.get(f"config_source.{key}") or ("unknown" if current is None else None)
    to = coerce(_part(rule, c.line, "to", render_template, env, c.to, facts)) if isinstance(c.to, str) else c.to
    return ProposedChange(flag=c.flag, from_=current, from_source=source, to=to,
                          why=_part(rule, c.line, "why", render_template, env, c.why, facts),
                          changes_precision=True if changes_precision(c.flag) else msgspec.UNSET)
