"""The longest GPU gaps of the window, with what the host did in CUDA during each."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import clip, ns, pct

view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    report = v["report"]
    start = report["window"]["start_ns"]
    return ["Longest GPU gaps",
            text_table(report["gaps"], {
                "at": lambda r: ns(r["start_ns"] - start), "gap": lambda r: ns(r["duration_ns"]),
                "host in CUDA API": host_api, "after": lambda r: clip(r["after"], 50),
            }, min(v["top"], 5))]


def host_api(gap: dict[str, Any]) -> str:
    """What the host was doing in CUDA during a GPU gap: the top call and its share of the gap."""
    if not gap["host_api"]:
        return "none (host busy outside CUDA)"
    top = gap["host_api"][0]
    return f"{pct(gap['host_api_share'])} {top['name']}"
