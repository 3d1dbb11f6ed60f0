"""Memory operations (copies and memsets) by kind, like `nsys stats`'s cuda_gpu_mem_*_sum."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import ns, number, size

view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    return ["Memory operations",
            text_table(v["report"]["memops"], {
                "operation": lambda r: r["operation"], "count": lambda r: r["count"],
                "time": lambda r: ns(r["total_ns"]), "bytes": lambda r: size(r["bytes"]),
                "GB/s": lambda r: number(r["bandwidth_gbps"], 1),
            }, v["top"])]
