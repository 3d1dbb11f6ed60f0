"""The before -> after view of a suggested command: which arguments went, which came."""

from __future__ import annotations

import difflib
from typing import Any

from profkit.escape import shell_word


def token_diff(before: list[str], after: list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Two lists of (state, shell-quoted token): state is 'same', 'del' (before only) or 'ins' (after only)."""
    old: list[tuple[str, str]] = []
    new: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        old += [("same" if op == "equal" else "del", shell_word(t)) for t in before[i1:i2]]
        new += [("same" if op == "equal" else "ins", shell_word(t)) for t in after[j1:j2]]
    return old, new


def command_pairs(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each of the run's commands with its suggested form, diffed token by token (for HTML)."""
    cmd = report.get("command") or {}
    if not cmd.get("suggested_argv"):
        return []
    out = []
    for before, after in zip(cmd["original_argv"], cmd["suggested_argv"], strict=True):
        old, new = token_diff(before, after)
        out.append({"before": old, "after": new, "changed": before != after})
    return out


def check_name(check: dict[str, Any]) -> str:
    """The checked command's name (`vllm serve`); a report saved before checks named it: its first two words."""
    return check.get("name") or " ".join(check["command"].split()[:2])
