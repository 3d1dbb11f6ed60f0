"""CUDA runtime/driver API calls, like `nsys stats --report cuda_api_sum`, plus synchronization."""

from __future__ import annotations

import pandas as pd

from profkit.analysis.stats import columnar_histogram, id_histogram, summarize
from profkit.analysis.timeline import strip_api_version
from profkit.analysis.window import Window
from profkit.traces.apis import GRAPH_LAUNCH_APIS, LAUNCH_APIS, SYNC_APIS
from profkit.traces.model import Trace

__all__ = ["GRAPH_LAUNCH_APIS", "LAUNCH_APIS", "SYNC_APIS", "api_summary", "sync_summary"]


def api_summary(trace: Trace, window: Window) -> pd.DataFrame:
    """One row per API function (grouped by its string id, as nsys does), nsys's name spelling."""
    hist = columnar_histogram(trace, "api", "name_id", "end - start", window.where("api"), window.params)
    if hist is None:
        hist = id_histogram(trace, f"SELECT name_id, end - start AS dur FROM api WHERE {window.where('api')}",
                            "name_id", window.params)
    stats = summarize(hist, ["name_id"])
    if stats.empty:
        return stats.assign(name=[])
    names = trace.strings(stats["name_id"])
    stats["name"] = stats["name_id"].map(lambda i: strip_api_version(names.get(i, f"api#{i}")))
    return stats.sort_values("total", ascending=False).reset_index(drop=True)


def sync_summary(trace: Trace, window: Window) -> pd.DataFrame:
    """CUPTI synchronization records by type (the host waiting on the device)."""
    return pd.read_sql_query(
        f"""SELECT sync_type, count(*) AS count, sum(end - start) AS total_ns, max(end - start) AS max_ns
            FROM sync WHERE {window.where()} GROUP BY 1 ORDER BY total_ns DESC""",
        trace.conn, params=window.params,
    )
