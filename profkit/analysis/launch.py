"""Launch metrics: host launch call -> kernel start latency, graph replay vs one-by-one launches."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profkit.analysis.seq import SEQ_MARGIN, first_seq_at, seq_bounds
from profkit.analysis.timeline import LOOKBACK_NS
from profkit.analysis.window import Window
from profkit.traces.model import Trace

# Launch latency is a distribution: a sample of this many eager launches pins its median and p90
# to well under a microsecond.
LATENCY_SAMPLE = 50_000
# The sample is this many short time slices spread evenly over the window (not every n-th kernel):
# each slice is a seq range of the kernel and API tables (both in start order), so the join reads
# the API calls around the sampled kernels instead of scanning millions of them.
LATENCY_SLICES = 20


def launch_latency(trace: Trace, window: Window, eager_kernels: int) -> dict[str, Any]:
    """Median/p90 of (kernel start - launch call start) over eager kernels, joined by correlation id.

    Launch calls more than LOOKBACK_NS (100 ms) before their kernel's start are outside the slice's
    API range and not matched: `sampled` counts the kernels that were.
    """
    kernel_bounds = seq_bounds(trace, "kernels")
    api_bounds = seq_bounds(trace, "api") if trace.has("api") else None
    if eager_kernels == 0 or kernel_bounds is None or api_bounds is None:
        return {"sampled": 0}
    w0, w1 = window.start_ns, window.end_ns + 1
    share = min(1.0, LATENCY_SAMPLE / eager_kernels)
    if share >= 1.0:
        slices = [(w0, w1)]
    else:
        step = (w1 - w0) / LATENCY_SLICES
        length = max(1, int(step * share))
        slices = [(int(w0 + (i + 0.5) * step - length / 2), int(w0 + (i + 0.5) * step + length / 2))
                  for i in range(LATENCY_SLICES)]
    frames = []
    for a, b in slices:
        k_lo = first_seq_at(trace, a, kernel_bounds, "kernels") - SEQ_MARGIN
        k_hi = first_seq_at(trace, b, kernel_bounds, "kernels") + SEQ_MARGIN
        a_lo = first_seq_at(trace, a - LOOKBACK_NS, api_bounds, "api") - SEQ_MARGIN
        a_hi = first_seq_at(trace, b, api_bounds, "api") + SEQ_MARGIN
        trace.conn.executescript("DROP TABLE IF EXISTS temp.launch_sample;")
        trace.conn.execute(
            """CREATE TEMP TABLE launch_sample AS SELECT correlation, pid, start FROM kernels
               WHERE seq BETWEEN :k_lo AND :k_hi AND start >= :a AND start < :b
               AND graph_node IS NULL AND correlation IS NOT NULL""",
            {"k_lo": k_lo, "k_hi": k_hi, "a": a, "b": b},
        )
        trace.conn.execute("CREATE INDEX temp.launch_sample_corr ON launch_sample (correlation)")
        frames.append(pd.read_sql_query(
            """SELECT l.start - a.start AS latency, a.end - a.start AS call FROM api a
               JOIN launch_sample l ON l.correlation = a.correlation
               AND (l.pid = a.pid OR l.pid IS NULL OR a.pid IS NULL)
               WHERE a.seq BETWEEN :a_lo AND :a_hi""",
            trace.conn, params={"a_lo": a_lo, "a_hi": a_hi},
        ))
    lat = pd.concat(frames, ignore_index=True)
    if lat.empty:
        return {"sampled": 0}
    q = lat["latency"].quantile([0.5, 0.9])
    return {
        "sampled": int(len(lat)),
        "slices": len(slices),
        "median_ns": float(q.loc[0.5]),
        "p90_ns": float(q.loc[0.9]),
        "call_median_ns": float(lat["call"].median()),
    }
