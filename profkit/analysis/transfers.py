"""Memory operations, like `cuda_gpu_mem_time_sum` and `cuda_gpu_mem_size_sum`, plus memory kinds."""

from __future__ import annotations

from typing import Any

from profkit.analysis.stats import histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.schema import Trace


def memop_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """One row per operation: time stats (ns), size stats (bytes_*) and achieved bandwidth; by total time."""
    src = f"SELECT operation, end - start AS dur, bytes FROM memops WHERE {window.where()}"
    time = summarize(histogram(trace, src, ["operation"], window.params), ["operation"])
    size = {row["operation"]: row for row in
            summarize(histogram(trace, src, ["operation"], window.params, value="bytes"), ["operation"])}
    out = []
    for row in time:
        sized = size.get(row["operation"], {})
        row.update({f"bytes_{k}": v for k, v in sized.items() if k not in ("operation", "count")})
        row["bandwidth_gbps"] = row["bytes_total"] / row["total"] if row["total"] > 0 and sized else None
        out.append(row)
    return sorted(out, key=lambda r: -r["total"])


def memory_kinds(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """Copies by (operation, source kind, destination kind): pageable host memory shows up here."""
    rows = trace.query(
        f"""SELECT operation, coalesce(src_kind, '') AS src_kind, coalesce(dst_kind, '') AS dst_kind,
                   count(*) AS count, sum(end - start) AS total_ns, sum(bytes) AS bytes
            FROM memops WHERE {window.where()} AND operation != '[CUDA memset]'
            GROUP BY 1, 2, 3 ORDER BY total_ns DESC""", window.params)
    keys = ("operation", "src_kind", "dst_kind", "count", "total_ns", "bytes")
    return [dict(zip(keys, row, strict=True)) for row in rows]
