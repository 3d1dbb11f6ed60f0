"""CPU operators (torch.profiler `cpu_op` events: aten::mm, aten::copy_, ...) summarised per name."""

from __future__ import annotations

from typing import Any

from profkit.analysis.stats import id_histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.schema import Trace


def cpu_op_summary(trace: Trace, window: Window, top: int = 50) -> list[dict[str, Any]]:
    """Top CPU operators by total time (inclusive of their children, as the profiler records them)."""
    if not trace.has("cpu_ops"):
        return []
    stats = summarize(id_histogram(trace, f"SELECT name_id, end - start AS dur FROM cpu_ops WHERE {window.where()}",
                                   "name_id", window.params), ["name_id"])
    stats = sorted(stats, key=lambda r: -r["total"])[:top]
    names = trace.strings(row["name_id"] for row in stats)
    return [{"name": names.get(row.pop("name_id")), **row} for row in stats]
