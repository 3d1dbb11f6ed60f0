"""Launch metrics: host launch call -> kernel start latency, graph replay vs one-by-one launches."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profkit.analysis.window import Window
from profkit.traces.model import Trace

# Launch latency is a distribution: a uniform sample of this many eager launches pins its median
# and p90 to well under a microsecond, and keeps the join with the API table one linear scan.
LATENCY_SAMPLE = 50_000


def launch_latency(trace: Trace, window: Window, eager_kernels: int) -> dict[str, Any]:
    """Median/p90 of (kernel start - launch call start) over eager kernels, joined by correlation id."""
    if eager_kernels == 0 or not trace.has("api"):
        return {"sampled": 0}
    step = max(1, eager_kernels // LATENCY_SAMPLE)
    trace.conn.executescript("DROP TABLE IF EXISTS temp.launch_sample;")
    trace.conn.execute(
        f"""CREATE TEMP TABLE launch_sample AS SELECT correlation, pid, start FROM kernels
            WHERE graph_node IS NULL AND correlation IS NOT NULL AND {window.where()}
            AND correlation % :step = 0""",
        {**window.params, "step": step},
    )
    trace.conn.execute("CREATE INDEX temp.launch_sample_corr ON launch_sample (correlation)")
    lat = pd.read_sql_query(
        """SELECT l.start - a.start AS latency, a.end - a.start AS call FROM api a
           JOIN launch_sample l ON l.correlation = a.correlation
           AND (l.pid = a.pid OR l.pid IS NULL OR a.pid IS NULL)""",
        trace.conn,
    )
    if lat.empty:
        return {"sampled": 0}
    q = lat["latency"].quantile([0.5, 0.9])
    return {
        "sampled": int(len(lat)),
        "sample_step": step,
        "median_ns": float(q.loc[0.5]),
        "p90_ns": float(q.loc[0.9]),
        "call_median_ns": float(lat["call"].median()),
    }
