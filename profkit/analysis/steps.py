"""Engine steps: each vLLM scheduler step's cycle time, the GPU busy time inside it, and the GPU's wait
at its start; prefill-bearing vs decode-only steps.

Step boundaries come from vLLM's own step annotations (`execute_context_N(T)_generation_M(M)`: N
requests with T prompt tokens, M decoding; the torch profiler records them, and nsys where vLLM emits
them as NVTX ranges). A step's cycle runs from its start to the next step's start; its GPU busy time is
the cycle less the GPU's idle time in it, summed from the gap table by primary-key ranges (the steps are
disjoint, so all of them together read each gap of the window once).
"""

from __future__ import annotations

import re
from typing import Any

from profkit.analysis.window import Window
from profkit.traces import Trace

STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
SERIES_MAX = 400  # steps kept for the chart (evenly spaced)


def _quantile(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def engine_steps(trace: Trace, win: Window) -> dict[str, Any] | None:
    """The step view, or None when the trace holds no step annotations (then the report says so)."""
    if "nvtx" not in trace.present:
        return None
    lo, hi = (win.start_ns, win.end_ns) if win.bounded else (-(1 << 62), 1 << 62)  # `all`: every step
    rows = trace.query(
        "SELECT start, end, name FROM nvtx WHERE name LIKE '%execute\\_context\\_%' ESCAPE '\\' "
        "AND style != 'GPU' AND start >= ? AND start < ? ORDER BY start", (lo, hi))
    steps = []
    for start, end, name in rows:
        m = STEP.search(name or "")
        if m and end is not None and end >= start:
            steps.append((int(start), int(end), int(m.group(1)), int(m.group(2)), int(m.group(3))))
    if not steps:
        return None
    device, first, last = trace.query("SELECT device, first_start, last_end FROM gpu_spans ORDER BY device")[0]
    bounds = [(s[0], steps[i + 1][0] if i + 1 < len(steps) else max(s[1], s[0] + 1)) for i, s in enumerate(steps)]
    # The gap table holds idle time between GPU operations only: clip each step to the GPU's active span.
    clipped = [(max(a, first), max(max(a, first), min(b, last))) for a, b in bounds]
    trace.conn.execute("DROP TABLE IF EXISTS temp.steps")
    trace.conn.execute("CREATE TEMP TABLE steps (i INTEGER PRIMARY KEY, a INTEGER, b INTEGER)")
    trace.conn.executemany("INSERT INTO temp.steps VALUES (?, ?, ?)", [(i, a, b) for i, (a, b) in enumerate(clipped)])
    # idle in [a, b): gaps starting inside it, plus the one gap that may straddle a (found by a PK seek)
    idle = trace.query(
        """SELECT s.i,
             (SELECT coalesce(sum(min(g.end, s.b) - g.start), 0) FROM gpu_gaps g
               WHERE g.device = :d AND g.start >= s.a AND g.start < s.b),
             (SELECT max(min(g.end, s.b) - s.a, 0) FROM gpu_gaps g
               WHERE g.device = :d AND g.start < s.a ORDER BY g.start DESC LIMIT 1),
             (SELECT CASE WHEN g.end > s.a THEN g.end - s.a ELSE 0 END FROM gpu_gaps g
               WHERE g.device = :d AND g.start <= s.a ORDER BY g.start DESC LIMIT 1)
           FROM temp.steps s ORDER BY s.i""", {"d": device})
    trace.conn.execute("DROP TABLE temp.steps")
    cycles, busy, waits, prefill = [], [], [], []
    for (i, inside, straddle, wait), (a, b), (ca, cb) in zip(idle, bounds, clipped, strict=True):
        cycle = b - a
        cycles.append(cycle)
        busy.append(max(0, (cb - ca) - inside - (straddle or 0)))
        # the GPU's wait at the step's start: idle from the start to its next operation (before the first
        # operation of the trace, the time until it)
        waits.append(min(cycle, (wait or 0) + (ca - a)))
        prefill.append(steps[i][2] > 0)
    total = sum(cycles)
    stride = max(1, len(steps) // SERIES_MAX)

    def summary(mask: list[bool]) -> dict[str, Any]:
        c = [x for x, k in zip(cycles, mask, strict=True) if k]
        g = [x for x, k in zip(busy, mask, strict=True) if k]
        return {"count": len(c), "cycle_p50_ns": _quantile(c, 0.5), "cycle_p90_ns": _quantile(c, 0.9),
                "gpu_busy_p50_ns": _quantile(g, 0.5), "gpu_share": sum(g) / sum(c) if sum(c) else None}

    return {
        "source": "vLLM step annotations (execute_context_N(T)_generation_M(M))",
        "device": device,
        "count": len(steps),
        "total_ns": total,
        "gpu_share": sum(busy) / total if total else None,
        "wait_share": sum(waits) / total if total else None,
        "wait_p50_ns": _quantile(waits, 0.5),
        "all": summary([True] * len(steps)),
        "prefill": summary(prefill),
        "decode": summary([not p for p in prefill]),
        "series": [{"cycle_ns": cycles[i], "gpu_busy_ns": busy[i], "prefill": prefill[i]}
                   for i in range(0, len(steps), stride)],
    }


STEP_FACT_DOCS = {
    "steps.count": "engine steps in the window (vLLM's step annotations)",
    "steps.gpu_share": "GPU busy time inside the steps / their total cycle time",
    "steps.wait_share": "share of step time the GPU waited at a step's start for the host to submit work",
    "steps.cycle_p50_ns": "median step cycle (one step's start to the next one's)",
    "steps.decode_cycle_p50_ns": "median cycle of decode-only steps",
    "steps.prefill_share": "share of steps that carry prefill (context) tokens",
}


def step_facts(steps: dict[str, Any] | None) -> dict[str, Any]:
    if not steps:
        return {k: None for k in STEP_FACT_DOCS}
    return {"steps.count": steps["count"], "steps.gpu_share": steps["gpu_share"],
            "steps.wait_share": steps["wait_share"], "steps.cycle_p50_ns": steps["all"]["cycle_p50_ns"],
            "steps.decode_cycle_p50_ns": steps["decode"]["cycle_p50_ns"],
            "steps.prefill_share": steps["prefill"]["count"] / steps["count"]}
