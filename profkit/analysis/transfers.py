"""Memory operations, like `cuda_gpu_mem_time_sum` and `cuda_gpu_mem_size_sum`, plus memory kinds."""

from __future__ import annotations

import pandas as pd

from profkit.analysis.stats import histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.model import Trace


def memop_summary(trace: Trace, window: Window) -> pd.DataFrame:
    """One row per operation: time stats (ns), size stats (bytes) and achieved bandwidth."""
    src = f"SELECT operation, end - start AS dur, bytes FROM memops WHERE {window.where()}"
    time = summarize(histogram(trace, src, ["operation"], window.params), ["operation"])
    if time.empty:
        return time
    size = summarize(histogram(trace, src, ["operation"], window.params, value="bytes"), ["operation"])
    size = size.rename(columns={c: f"bytes_{c}" for c in size.columns if c != "operation"})
    out = time.merge(size.drop(columns=["bytes_count"]), on="operation")
    out["bandwidth_gbps"] = out["bytes_total"] / out["total"].where(out["total"] > 0)
    return out.sort_values("total", ascending=False).reset_index(drop=True)


def memory_kinds(trace: Trace, window: Window) -> pd.DataFrame:
    """Copies by (operation, source kind, destination kind): pageable host memory shows up here."""
    return pd.read_sql_query(
        f"""SELECT operation, coalesce(src_kind, '') AS src_kind, coalesce(dst_kind, '') AS dst_kind,
                   count(*) AS count, sum(end - start) AS total_ns, sum(bytes) AS bytes
            FROM memops WHERE {window.where()} AND operation != '[CUDA memset]'
            GROUP BY 1, 2, 3 ORDER BY total_ns DESC""",
        trace.conn, params=window.params,
    )
