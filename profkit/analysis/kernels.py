"""Per-kernel summary, like `nsys stats --report cuda_gpu_kern_sum` (demangled names)."""

from __future__ import annotations

import pandas as pd

from profkit.analysis.categories import categorize
from profkit.analysis.stats import columnar_histogram, id_histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.model import Trace

# Kernels shorter than this are dominated by launch cost (a launch takes ~2-5 us of host time).
SHORT_KERNEL_NS = 10_000


def kernel_summary(trace: Trace, window: Window) -> pd.DataFrame:
    """One row per kernel name: stats, category, graph-replayed count, short-kernel count."""
    hist = columnar_histogram(trace, "kernels", "name_id", "end - start", window.where("kernels"), window.params,
                              extras={"graph": "graph_node IS NOT NULL"})
    if hist is None:
        hist = id_histogram(
            trace,
            f"SELECT name_id, end - start AS dur, graph_node IS NOT NULL AS graph FROM kernels "
            f"WHERE {window.where('kernels')}",
            key="name_id",
            params=window.params,
            extras={"graph": "graph"},
        )
    if hist.empty:
        return pd.DataFrame(columns=["name", "short_name", "category", "count", "total"])
    hist["short"] = hist["c"].where(hist["v"] < SHORT_KERNEL_NS, 0)
    stats = summarize(hist, ["name_id"])
    extra = hist.groupby("name_id", as_index=False)[["graph", "short"]].sum()
    stats = stats.merge(extra, on="name_id")
    names = trace.strings(stats["name_id"])
    short_names = _short_names(trace, window)
    stats["name"] = stats["name_id"].map(names).fillna("<no name>")
    stats["short_name"] = stats["name_id"].map(short_names).fillna(stats["name"])
    stats["category"] = stats["name"].map(categorize)
    stats = stats.sort_values(["total", "count", "name"], ascending=[False, True, True]).reset_index(drop=True)
    return stats


def _short_names(trace: Trace, window: Window) -> dict[int, str]:
    # The (demangled -> short) mapping is one-to-one; DISTINCT over the ids is a cheap scan.
    rows = trace.query(
        f"SELECT DISTINCT k.name_id, s.value FROM (SELECT DISTINCT name_id, short_id FROM kernels "
        f"WHERE {window.where('kernels')}) k JOIN strings s ON s.id = k.short_id",
        window.params,
    )
    return dict(rows)
