"""CPU operators (torch.profiler `cpu_op` events: aten::mm, aten::copy_, ...) summarised per name."""

from __future__ import annotations

import pandas as pd

from profkit.analysis.stats import id_histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.model import Trace


def cpu_op_summary(trace: Trace, window: Window, top: int = 50) -> pd.DataFrame:
    """Top CPU operators by total time (inclusive of their children, as the profiler records them)."""
    if not trace.has("cpu_ops"):
        return pd.DataFrame()
    stats = summarize(id_histogram(trace, f"SELECT name_id, end - start AS dur FROM cpu_ops WHERE {window.where()}",
                                   "name_id", window.params), ["name_id"])
    if stats.empty:
        return stats
    stats = stats.sort_values("total", ascending=False).head(top)
    names = trace.strings(stats["name_id"])
    stats["name"] = stats["name_id"].map(names)
    return stats.drop(columns=["name_id"]).reset_index(drop=True)
