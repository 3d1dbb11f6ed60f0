"""The rules not evaluated: the facts they need are not in the inputs (a trace, evidence not given)."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal


def view(report: dict[str, Any], top: int) -> list[dict[str, Any]] | None:
    return report.get("rules_skipped") or None


def text(v: list[dict[str, Any]]) -> list[str]:
    return [f"Rules not evaluated ({len(v)}; they need a trace or evidence not given): "
            + ", ".join(terminal(s["rule"]) for s in v)]
