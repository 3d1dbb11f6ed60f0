"""CUDA API calls on the host, like `nsys stats`'s cuda_api_sum."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import ns

view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    return ["CUDA API",
            text_table(v["report"]["api"], {
                "name": lambda r: r["name"], "calls": lambda r: r["count"], "time": lambda r: ns(r["total_ns"]),
                "avg": lambda r: ns(r["avg_ns"]), "max": lambda r: ns(r["max_ns"]),
            }, v["top"])]
