"""Launch metrics: host launch call -> kernel start latency, graph replay vs one-by-one launches."""

from __future__ import annotations

import numpy as np

from profkit.analysis.scans import API_SCAN, KERNEL_SCAN
from profkit.analysis.sections import LaunchLatency
from profkit.analysis.seq import seq_bounds, seq_range
from profkit.analysis.timeline import LOOKBACK_NS
from profkit.analysis.window import Window
from profkit.traces.columns import NULL_INT, read_columns
from profkit.traces.schema import Trace

# Launch latency is a distribution: a uniform sample of this many eager launches (every n-th by
# correlation id, so spread over the whole window) pins its median and p90 to well under a microsecond.
# Time slices would be cheaper but are not representative: latency follows the queue depth, which
# changes through a serve run (measured on a real vLLM serve trace: slice median 47 us, uniform 22 us).
LATENCY_SAMPLE = 50_000


def launch_latency(trace: Trace, window: Window, eager_kernels: int) -> LaunchLatency:
    """Median/p90 of (kernel start - launch call start) over eager kernels, joined by correlation id.

    For a bounded window only the API rows from LOOKBACK_NS (100 ms) before it to its end are read
    (a seq range): a launch call earlier than that is not matched, and `sampled` counts those that were.
    Both sides are read as columns with the sample's filter (every `step`-th correlation id) in the query,
    and joined in numpy: a sort of the sampled calls by correlation id, a binary search per kernel."""
    if eager_kernels == 0 or not trace.has("api"):
        return LaunchLatency(sampled=0)
    step = sample_step(eager_kernels)
    kscan, ascan = trace.cache.get(KERNEL_SCAN), trace.cache.get(API_SCAN)
    if kscan is not None and ascan is not None and ascan.step == step and ascan.window == window \
            and ascan.launch is not None:  # both sides from the tables' one reads (analysis/scans.py)
        return _join(kscan.launch_kernels(window, step), ascan.launch, step)
    k = read_columns(trace, "kernels", {"c": "correlation", "p": "pid", "s": "start"},
                     where=f"graph_node IS NULL AND correlation IS NOT NULL AND {window.where('kernels')} "
                           f"AND correlation % {step} = 0", params=window.params,
                     seq_span=seq_bounds(trace, "kernels"))
    api_rows = api_sample_rows(trace, window)
    bounds = seq_bounds(trace, "api")
    a = read_columns(trace, "api", {"c": "correlation", "p": "pid", "s": "start", "e": "end"},
                     where=f"correlation % {step} = 0" + (f" AND seq BETWEEN {int(api_rows[0])} AND {int(api_rows[1])}"
                                                          if api_rows else ""),
                     seq_span=(max(bounds[0], api_rows[0]), min(bounds[1], api_rows[1])) if api_rows and bounds
                     else bounds)
    return _join(k, a, step)


def api_sample_rows(trace: Trace, window: Window) -> tuple[int, int] | None:
    """The seq range of the CUDA API calls launch latency reads for a bounded window (None: every call)."""
    return seq_range(trace, "api", window.start_ns - LOOKBACK_NS, window.end_ns) if window.bounded else None


def sample_step(eager_kernels: int) -> int:
    """The launch sample's stride over correlation ids."""
    return max(1, eager_kernels // LATENCY_SAMPLE)


def _join(k: dict[str, np.ndarray], a: dict[str, np.ndarray], step: int) -> LaunchLatency:
    # every (kernel, call) pair with the same correlation id: the calls sorted by id, a range per kernel
    order = np.argsort(a["c"], kind="stable")
    ac = a["c"][order]
    lo = np.searchsorted(ac, k["c"], side="left")
    n = np.searchsorted(ac, k["c"], side="right") - lo
    ik = np.repeat(np.arange(len(k["c"])), n)
    ia = order[np.repeat(lo, n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)]
    kp, ap = k["p"][ik], a["p"][ia]
    ok = (k["s"][ik] >= a["s"][ia]) & ((kp == ap) | (kp == NULL_INT) | (ap == NULL_INT))
    latency = (k["s"][ik] - a["s"][ia])[ok]
    if not len(latency):
        return LaunchLatency(sampled=0)
    call = (a["e"][ia] - a["s"][ia])[ok]
    return LaunchLatency(
        sampled=int(len(latency)),
        sample_step=step,
        median_ns=float(np.quantile(latency, 0.5)),
        p90_ns=float(np.quantile(latency, 0.9)),
        call_median_ns=float(np.median(call)),
    )
