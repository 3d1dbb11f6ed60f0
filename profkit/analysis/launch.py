"""Launch metrics: host launch call -> kernel start latency, graph replay vs one-by-one launches."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profkit.analysis.seq import seq_range
from profkit.analysis.timeline import LOOKBACK_NS
from profkit.analysis.window import Window
from profkit.traces.model import Trace

# Launch latency is a distribution: a uniform sample of this many eager launches (every n-th by
# correlation id, so spread over the whole window) pins its median and p90 to well under a microsecond.
# Time slices would be cheaper but are not representative: latency follows the queue depth, which
# changes through a serve run (measured on a real vLLM serve trace: slice median 47 us, uniform 22 us).
LATENCY_SAMPLE = 50_000


def launch_latency(trace: Trace, window: Window, eager_kernels: int) -> dict[str, Any]:
    """Median/p90 of (kernel start - launch call start) over eager kernels, joined by correlation id.

    For a bounded window only the API rows from LOOKBACK_NS (100 ms) before it to its end are read
    (a seq range): a launch call earlier than that is not matched, and `sampled` counts those that were.
    """
    if eager_kernels == 0 or not trace.has("api"):
        return {"sampled": 0}
    step = max(1, eager_kernels // LATENCY_SAMPLE)
    trace.conn.executescript("DROP TABLE IF EXISTS temp.launch_sample;")
    trace.conn.execute(
        f"""CREATE TEMP TABLE launch_sample AS SELECT correlation, pid, start FROM kernels
            WHERE graph_node IS NULL AND correlation IS NOT NULL AND {window.where('kernels')}
            AND correlation % :step = 0""",
        {**window.params, "step": step},
    )
    trace.conn.execute("CREATE INDEX temp.launch_sample_corr ON launch_sample (correlation)")
    api_rows = seq_range(trace, "api", window.start_ns - LOOKBACK_NS, window.end_ns) if window.bounded else None
    lat = pd.read_sql_query(
        f"""SELECT l.start - a.start AS latency, a.end - a.start AS call FROM api a
            JOIN launch_sample l ON l.correlation = a.correlation AND l.start >= a.start
            AND (l.pid = a.pid OR l.pid IS NULL OR a.pid IS NULL)
            {'WHERE a.seq BETWEEN :lo AND :hi' if api_rows else ''}""",
        trace.conn, params={"lo": api_rows[0], "hi": api_rows[1]} if api_rows else {},
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
