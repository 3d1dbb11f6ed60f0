"""Kernel time by category (GEMM, attention, communication, ...): where the GPU's time went."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import ns, pct

view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    return ["Time by kernel category",
            text_table(v["report"]["categories"], {
                "category": lambda r: r["category"], "kernels": lambda r: r["count"],
                "time": lambda r: ns(r["total_ns"]), "share": lambda r: pct(r["share"])}, 20)]
