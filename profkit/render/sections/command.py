"""The command the user copies: the run's own command before and after the changes, and how it was checked."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.cmdline import check_name, command_pairs


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    cmd = report.get("command") or {}
    return {"command": cmd, "pairs": command_pairs(report)} if cmd.get("suggested") else None


def text(v: dict[str, Any]) -> list[str]:
    cmd = v["command"]
    out = [f"Suggested command (the run's command from the {terminal(cmd['source'])}, changes applied)"]
    for before, after in zip(cmd["original"], cmd["suggested"], strict=True):
        # the benchmark's client is the same before and after: said once (the changes are the server's)
        out += [f"  before: {terminal(before)}", f"  after:  {terminal(after)}"] if before != after \
            else [f"  as is:  {terminal(before)}"]
    for check in cmd.get("checks", []):
        verdict = "ok" if check["ok"] else "WOULD NOT START: " + "; ".join(check["problems"])
        out.append(f"  checked {terminal(check_name(check))} with {terminal(check['by'])}: {terminal(verdict)}")
    return out
