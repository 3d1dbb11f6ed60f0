"""Per-process CPU from the trace's context switches (exact, over the report's window)."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.sections.table import text_table
from profkit.units import clip, ns


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    sched = report.get("sched")
    return sched if sched and sched.get("processes") else None


def text(v: dict[str, Any]) -> list[str]:
    out = [f"CPU from the trace's context switches (cores used over the {ns(v['window_ns'])} window; the busiest "
           "thread of a Python process tops out at 1.0)"]
    out.append(text_table(v["processes"], {
        "pid": lambda r: r["pid"], "cores": lambda r: f"{r['cores']:.2f}", "threads": lambda r: r["threads"],
        "busiest thread": lambda r: f"{r['busiest_thread_cores']:.2f} (tid {r['busiest_tid']})",
        "process": lambda r: clip(terminal(r["name"]), 40)}, 10))
    return out
