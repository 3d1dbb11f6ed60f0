"""The text of `profkit rules explain ID`: what a rule looks for, its thresholds and their sources, and the flags
it changes."""

from __future__ import annotations

import re

from profkit.diagnose.rule_files import Rule, fact_names
from profkit.escape import terminal


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
            to = "(removed)" if c.to is None else readable(str(c.to))
            lines.append(f"    {c.flag} -> {to}{cond}: {readable(' '.join(c.why.split()))}")
    return "\n".join(terminal(line) for line in lines)


_FACT = re.compile(r"f\[\s*['\"]([^'\"]+)['\"]\s*\]")
_FORMAT_FILTER = re.compile(r"\s*\|\s*(?:num|pct|int|float|round|ns|bytes)\b(?:\([^)]*\))?")
_LIST_FILTER = re.compile(r"^\[(.*)\]\s*\|\s*(max|min)$")


def readable(template: str) -> str:
    """A rule file's Jinja value as a reader says it: `{{ f['config.max_num_seqs'] * 2 }}` reads
    `config.max_num_seqs × 2`, `{{ [a, b] | max }}` reads `max(a, b)`; formatting filters and `{% %}` tags go."""
    def expression(m: re.Match[str]) -> str:
        text = _FORMAT_FILTER.sub("", _FACT.sub(r"\1", m.group(1))).strip()
        text = _LIST_FILTER.sub(r"\2(\1)", text)
        return text.replace(" * ", " × ").replace(" // ", " ÷ ").replace(" / ", " ÷ ")
    return re.sub(r"\{%.*?%\}", "", re.sub(r"\{\{(.*?)\}\}", expression, template, flags=re.S), flags=re.S)
