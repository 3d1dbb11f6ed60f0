"""The top kernels by GPU time, like `nsys stats`'s cuda_gpu_kern_sum (the HTML report lists them all)."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import clip_middle, ns, pct

NAME_WIDTH = 70


view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    kernels = v["report"]["kernels"]
    return [f"Top kernels (of {len(kernels)})",
            text_table(kernels, {
                "time": lambda r: ns(r["total_ns"]), "share": lambda r: pct(r["share"]),
                "count": lambda r: r["count"], "avg": lambda r: ns(r["avg_ns"]), "med": lambda r: ns(r["median_ns"]),
                "category": lambda r: r["category"],
                "name": lambda r: clip_middle(r.get("label") or r["short_name"], NAME_WIDTH),
            }, v["top"])]
