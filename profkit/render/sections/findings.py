"""The findings: each rule that fired, its summary and evidence, and the flag changes it proposes."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.units import change_from, change_to

PRECISION_NOTE = "changes model precision: check accuracy before shipping"


def view(report: dict[str, Any], top: int) -> list[dict[str, Any]]:
    return report.get("findings") or []  # none: the HTML report says no rule fired; the others say nothing


def text(v: list[dict[str, Any]]) -> list[str]:
    if not v:
        return []
    out = ["Findings"]
    for f in v:
        out.append(f"  [{terminal(f['severity'])}] {terminal(f['title'])} ({terminal(f['rule'])}): "
                   f"{terminal(f['summary'])}")
        for c in f.get("changes", []):
            action = f" [{terminal(c['action'])}]" if c.get("action") else ""
            out.append(f"      {terminal(c['flag'])}: {terminal(change_from(c))} -> {terminal(change_to(c))}"
                       f"{action}  ({terminal(c.get('why', ''))})")
            if c.get("changes_precision"):
                out.append(f"        ! {PRECISION_NOTE}")
    return out
