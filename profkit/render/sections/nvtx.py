"""NVTX ranges (vLLM's engine steps one row per kind of step), like `nsys stats`'s nvtx_sum."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import clip, ns

NAME_WIDTH = 70
# Which ranges the table counts, said where it is shown: a range where it starts (as nsys's nvtx_sum does), each
# style apart (a step's GPU range and its CPU range); the step view counts a step that overlaps the window.
NVTX_WINDOW = "counted where each range starts; GPU: the range as the GPU ran it, CPU: as the host did"


view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    return [f"NVTX ranges ({NVTX_WINDOW})",
            text_table(v["report"]["nvtx"], {
                "range": lambda r: clip(r["range"], NAME_WIDTH), "style": lambda r: r.get("style") or "-",
                "count": lambda r: r["count"], "time": lambda r: ns(r["total_ns"]), "avg": lambda r: ns(r["avg_ns"]),
            }, v["top"])]
