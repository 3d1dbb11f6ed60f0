"""Which change first: the user's own missteps, then the largest expected gain.

A change that takes a flag the run set away from vLLM's default back toward it (or removes it) undoes the user's
own misstep: it is the cheapest fix to try and the likeliest to help, whatever the rule's severity label (a
`--max-cudagraph-capture-size 16` found by an `info` rule can cost more than a `critical` frontend limit). After
those, a finding's `gain` (what its changes could win at most, from its evidence) orders the rest. Report and tune
both order by this module: findings of equal severity, and tune's candidates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from profkit.diagnose.engine import Finding, ProposedChange
from profkit.diagnose.rule_files import SEVERITY_ORDER
from profkit.vllm.command import dest_of
from profkit.vllm.options import default_of


def undoes(change: ProposedChange | dict[str, Any], gpu: str | None) -> str | None:
    """Why `change` undoes the user's own misstep, or None: the run gave the flag, and the change removes it or
    moves it back toward vLLM's default."""
    get = change.get if isinstance(change, dict) else lambda k, d=None: getattr(change, k, d)
    if get("from_source") != "given":
        return None
    flag, old, new = str(get("flag")), get("from_", get("from")), get("to")
    default = default_of(dest_of(flag), gpu)
    shown = f"{flag} {_text(old)}" if old is not None else flag
    if new is None:
        told = _text(default) if default is not None else "its own"
        return f"removes {shown}, which the run set (vLLM's default: {told})"
    if default is None:
        return None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, new, default))
    if new == default or (numbers and abs(new - default) < abs(old - default)):
        return f"takes {shown} back toward vLLM's default ({_text(default)})"
    return None


def _text(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


@dataclass(frozen=True)
class Priority:
    undo: str | None  # the user's misstep this undoes
    gain: float | None  # the finding's gain
    severity: str

    @property
    def reason(self) -> str:
        if self.undo:
            return f"first: {self.undo}"
        if self.gain is not None:
            return f"expected gain up to {100 * self.gain:.0f} % (the rule's gain over this run's facts)"
        return f"no gain estimate; {self.severity}"


def priority(finding: Finding | dict[str, Any], changes: Iterable[ProposedChange | dict[str, Any]] | None = None,
             gpu: str | None = None) -> Priority:
    """A finding's priority (over `changes`, default its own)."""
    get = finding.get if isinstance(finding, dict) else lambda k, d=None: getattr(finding, k, d)
    found = [u for c in (changes if changes is not None else get("changes") or []) if (u := undoes(c, gpu))]
    return Priority("; ".join(found) or None, get("gain"), str(get("severity")))


def order_findings(findings: list[Finding], gpu: str | None) -> list[Finding]:
    """Most severe first; among equal severity the user's missteps first, then the larger gain."""
    def key(f: Finding) -> tuple:
        p = priority(f, gpu=gpu)
        return SEVERITY_ORDER[f.severity], p.undo is None, -(p.gain or 0.0)

    return sorted(findings, key=key)


def candidate_key(p: Priority) -> tuple:
    """Tune's order: the user's missteps first (whatever the severity), then the larger expected gain, then the
    more severe."""
    return p.undo is None, -(p.gain if p.gain is not None else -1.0), SEVERITY_ORDER.get(p.severity, 9)
