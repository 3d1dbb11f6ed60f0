"""CUDA runtime/driver API calls, like `nsys stats --report cuda_api_sum`, plus synchronization."""

from __future__ import annotations

from typing import Any

from profkit.analysis.scans import API_SCAN
from profkit.analysis.stats import columnar_histogram, id_histogram, summarize
from profkit.analysis.timeline import strip_api_version
from profkit.analysis.window import Window
from profkit.traces.apis import GRAPH_LAUNCH_APIS, LAUNCH_APIS, SYNC_APIS
from profkit.traces.schema import Trace

__all__ = ["GRAPH_LAUNCH_APIS", "LAUNCH_APIS", "SYNC_APIS", "api_summary", "sync_summary"]


def api_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """One row per API function (grouped by its string id, as nsys does), nsys's name spelling; by total."""
    scan = trace.cache.get(API_SCAN)  # the CUDA API table's one read, where it was made (analysis/scans.py)
    hist = scan.histogram if scan is not None and scan.window == window else None
    if hist is None:
        hist = columnar_histogram(trace, "api", "name_id", "end - start", window.where("api"), window.params)
    if hist is None:
        hist = id_histogram(trace, f"SELECT name_id, end - start AS dur FROM api WHERE {window.where('api')}",
                            "name_id", window.params)
    stats = summarize(hist, ["name_id"])
    names = trace.strings(row["name_id"] for row in stats)
    for row in stats:
        row["name"] = strip_api_version(names.get(row["name_id"], f"api#{row['name_id']}"))
    return sorted(stats, key=lambda r: -r["total"])


def sync_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """CUPTI synchronization records by type (the host waiting on the device)."""
    rows = trace.query(
        f"""SELECT sync_type, count(*) AS count, sum(end - start) AS total_ns, max(end - start) AS max_ns
            FROM sync WHERE {window.where()} GROUP BY 1 ORDER BY total_ns DESC""", window.params)
    return [{"sync_type": t, "count": c, "total_ns": total, "max_ns": m} for t, c, total, m in rows]
