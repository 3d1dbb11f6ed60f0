"""GPU busy/idle from the union of kernel and memory-operation intervals, per device.

One window-function pass over all GPU operations (sorted by start per device) writes every idle
gap into a TEMP table keyed by (device, start). Everything else (utilization of any window, the
gap list, phases for the automatic window, utilization over time) is read from that table, and
every time range is a primary-key range scan: the idle time of a range is the gaps starting in
it plus the one gap reaching into it from before (a device's gaps never overlap).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from profkit.analysis.seq import seq_bounds, seq_range
from profkit.analysis.window import PHASE_GAP_NS, Window
from profkit.traces.model import Trace

# Idle time is reported by gap size class (upper bounds). Gaps under 20 us are the launch-to-launch
# spacing of back-to-back kernels; 1 ms and more is host-side work between GPU steps.
GAP_CLASSES = [(20_000, "lt_20us"), (1_000_000, "20us_1ms"), (100_000_000, "1ms_100ms"), (None, "ge_100ms")]


def build_gap_table(trace: Trace) -> None:
    """Write temp.gpu_gaps(device, start, end) and temp.gpu_spans(device, first_start, last_end) once."""
    devices = sorted({r[0] for r in trace.query("SELECT DISTINCT device FROM kernels UNION "
                                                "SELECT DISTINCT device FROM memops")})
    # With one GPU (the common case) the pass needs no PARTITION BY and the span no GROUP BY:
    # each would add a sort of every operation.
    partition = "PARTITION BY device" if len(devices) > 1 else ""
    trace.conn.executescript(
        f"""
        DROP TABLE IF EXISTS temp.gpu_gaps;
        DROP TABLE IF EXISTS temp.gpu_spans;
        CREATE TEMP TABLE gpu_gaps (device INTEGER, start INTEGER, end INTEGER, PRIMARY KEY (device, start))
            WITHOUT ROWID;
        INSERT INTO gpu_gaps
        WITH ops AS (
            SELECT device, start, end FROM kernels
            UNION ALL
            SELECT device, start, end FROM memops
        ),
        ordered AS (
            -- Only the running max: extra window columns (lag of names) would double this pass.
            SELECT device, start,
                   max(end) OVER ({partition} ORDER BY start
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
            FROM ops
        )
        SELECT device, prev_end AS start, start AS end FROM ordered WHERE start > prev_end;
        CREATE TEMP TABLE gpu_spans (device INTEGER PRIMARY KEY, first_start INTEGER, last_end INTEGER);
        """
    )
    for d in devices:
        row = trace.query(
            "SELECT min(s), max(e) FROM (SELECT min(start) AS s, max(end) AS e FROM kernels WHERE device = :d "
            "UNION ALL SELECT min(start), max(end) FROM memops WHERE device = :d)", {"d": d})[0]
        trace.conn.execute("INSERT INTO temp.gpu_spans VALUES (?, ?, ?)", (d, row[0], row[1]))


def phases(trace: Trace, split_ns: int = PHASE_GAP_NS) -> list[dict[str, Any]]:
    """GPU-active phases of the whole trace (all devices), split at gaps >= split_ns."""
    first, last = trace.query("SELECT min(first_start), max(last_end) FROM gpu_spans")[0]
    # A gap splits phases only where every device is idle; with one device that is every gap.
    n_devices = trace.query("SELECT count(*) FROM gpu_spans")[0][0]
    if n_devices == 1:
        cuts = trace.query("SELECT start, end FROM gpu_gaps WHERE end - start >= ? ORDER BY start", (split_ns,))
    else:
        cuts = _common_idle(trace, split_ns)
    bounds, cursor = [], first
    for gap_start, gap_end in cuts:
        bounds.append((cursor, gap_start))
        cursor = gap_end
    bounds.append((cursor, last))
    idle = {d: _idle_ranges(trace, d, bounds) for d in _devices(trace)}
    result = []
    for i, (start, end) in enumerate(bounds):
        busy = sum(max(0, (end - start) - idle[d][i]) for d in idle)
        result.append({"start_ns": start, "end_ns": end, "busy_ns": busy})
    return result


def _common_idle(trace: Trace, split_ns: int) -> list[tuple[int, int]]:
    # Intersect long gaps across devices: a sweep over the (few) long gaps, done in pandas.
    df = pd.read_sql_query(
        "SELECT device, start, end FROM gpu_gaps WHERE end - start >= ?", trace.conn, params=(split_ns,)
    )
    devices = _devices(trace)
    if df.empty:
        return []
    events = pd.concat([
        pd.DataFrame({"t": df.start, "d": 1}), pd.DataFrame({"t": df.end, "d": -1}),
    ]).sort_values(["t", "d"])
    level, out, opened = 0, [], None
    for t, d in zip(events.t, events.d, strict=True):
        level += d
        if level == len(devices) and opened is None:
            opened = t
        elif level < len(devices) and opened is not None:
            if t - opened >= split_ns:
                out.append((int(opened), int(t)))
            opened = None
    return out


def _devices(trace: Trace) -> list[int]:
    return [r[0] for r in trace.query("SELECT device FROM gpu_spans ORDER BY device")]


def _idle_ranges(trace: Trace, device: int, ranges: list[tuple[int, int]]) -> list[int]:
    """Idle ns of `device` in each [lo, hi): gaps clipped to the range, plus the time before the
    device's first and after its last operation. Two primary-key seeks and a range scan per range."""
    trace.conn.executescript(
        "DROP TABLE IF EXISTS temp.idle_ranges;"
        "CREATE TEMP TABLE idle_ranges (i INTEGER PRIMARY KEY, lo INTEGER, hi INTEGER);"
    )
    trace.conn.executemany("INSERT INTO temp.idle_ranges VALUES (?, ?, ?)",
                           [(i, lo, hi) for i, (lo, hi) in enumerate(ranges)])
    rows = trace.query(
        """SELECT r.i, r.lo, r.hi,
                  coalesce((SELECT sum(min(g.end, r.hi) - g.start) FROM gpu_gaps g
                            WHERE g.device = :d AND g.start >= r.lo AND g.start < r.hi), 0)
                  + coalesce((SELECT max(0, min(g.end, r.hi) - r.lo) FROM gpu_gaps g
                              WHERE g.device = :d AND g.start < r.lo ORDER BY g.start DESC LIMIT 1), 0),
                  s.first_start, s.last_end
           FROM idle_ranges r, gpu_spans s WHERE s.device = :d ORDER BY r.i""",
        {"d": device},
    )
    out = []
    for _, lo, hi, gaps, first, last in rows:
        outside = max(0, min(first, hi) - lo) + max(0, hi - max(last, lo))
        out.append(min(int(gaps) + outside, max(0, hi - lo)))
    return out


@dataclass
class Timeline:
    """Busy/idle of the window, per device and in total, plus the gaps and utilization over time."""

    window_ns: int
    devices: list[dict[str, Any]]
    busy_ns: int
    idle_ns: int
    utilization: float
    gaps: list[dict[str, Any]] = field(default_factory=list)
    gap_classes: dict[str, dict[str, int]] = field(default_factory=dict)
    buckets: dict[str, Any] = field(default_factory=dict)


def gpu_timeline(trace: Trace, window: Window, gap_threshold_ns: int = 100_000, max_gaps: int = 50,
                 n_buckets: int = 100) -> Timeline:
    """Busy/idle, gap list and utilization-over-time of `window` (gap table must be built)."""
    w0, w1 = window.start_ns, window.end_ns
    # The buckets partition the window, so their idle times add up to the window's.
    bucket_idle, buckets = _buckets(trace, w0, w1, n_buckets)
    idle = {d: sum(series) for d, series in bucket_idle.items()}
    length = max(1, w1 - w0)
    devices = [
        {"device": d, "busy_ns": length - idle.get(d, 0), "idle_ns": idle.get(d, 0),
         "utilization": (length - idle.get(d, 0)) / length}
        for d in _devices(trace)
    ]
    busy = sum(d["busy_ns"] for d in devices)
    idle_total = sum(d["idle_ns"] for d in devices)
    return Timeline(
        window_ns=length,
        devices=devices,
        busy_ns=busy,
        idle_ns=idle_total,
        utilization=busy / max(1, busy + idle_total),
        gaps=_gap_list(trace, w0, w1, gap_threshold_ns, max_gaps),
        gap_classes=_gap_classes(trace, w0, w1),
        buckets=buckets,
    )


def _gap_classes(trace: Trace, w0: int, w1: int) -> dict[str, dict[str, int]]:
    """Idle time by gap size class. Gaps inside the window count by their duration; the few that cross
    a window edge are clipped. Most gaps are short (back-to-back kernels): the classes above the first
    are counted over the longer gaps only, the first is the rest."""
    bounds, lower = [], 0
    for upper, label in GAP_CLASSES:
        bounds.append((label, lower, upper))
        lower = upper or 0
    out = {label: {"count": 0, "idle_ns": 0} for label, _, _ in bounds}
    first_label, first_hi = bounds[0][0], bounds[0][2]
    aggs = ", ".join(
        f"count(*) FILTER (WHERE d >= {lo}{f' AND d < {hi}' if hi else ''}), "
        f"coalesce(sum(d) FILTER (WHERE d >= {lo}{f' AND d < {hi}' if hi else ''}), 0)"
        for _, lo, hi in bounds[1:])
    for d in _devices(trace):
        params = {"d": d, "w0": w0, "w1": w1, "t": first_hi}
        inside = "device = :d AND start >= :w0 AND start < :w1 AND end <= :w1"
        n, total = trace.query(f"SELECT count(*), coalesce(sum(end - start), 0) FROM gpu_gaps WHERE {inside}",
                               params)[0]
        longer = trace.query(f"SELECT {aggs} FROM (SELECT end - start AS d FROM gpu_gaps "
                             f"WHERE {inside} AND end - start >= :t)", params)[0]
        for i, (label, _, _) in enumerate(bounds[1:]):
            out[label]["count"] += int(longer[2 * i])
            out[label]["idle_ns"] += int(longer[2 * i + 1])
        out[first_label]["count"] += int(n) - sum(int(c) for c in longer[0::2])
        out[first_label]["idle_ns"] += int(total) - sum(int(v) for v in longer[1::2])
        # At most one gap crosses each window edge.
        crossing = trace.query(
            """SELECT min(end, :w1) - max(start, :w0) FROM (
                   SELECT start, end FROM gpu_gaps WHERE device = :d AND start < :w0 ORDER BY start DESC LIMIT 1)
               WHERE end > :w0
               UNION ALL
               SELECT min(end, :w1) - start FROM gpu_gaps
               WHERE device = :d AND start >= :w0 AND start < :w1 AND end > :w1""", params)
        for (dur,) in crossing:
            label = next(lb for lb, lo, hi in bounds if dur >= lo and (hi is None or dur < hi))
            out[label]["count"] += 1
            out[label]["idle_ns"] += int(dur)
    return out


def _gap_list(trace: Trace, w0: int, w1: int, threshold: int, limit: int) -> list[dict[str, Any]]:
    trace.conn.executescript("DROP TABLE IF EXISTS temp.top_gaps;")
    trace.conn.execute(
        """CREATE TEMP TABLE top_gaps AS
           SELECT g.device, g.start AS gap_start, g.end AS gap_end,
                  max(g.start, :w0) AS start, min(g.end, :w1) AS end
           FROM gpu_gaps g  -- the duration test first: it rejects almost every gap
           WHERE g.end - g.start >= :t AND g.end > :w0 AND g.start < :w1
                 AND min(g.end, :w1) - max(g.start, :w0) >= :t
           ORDER BY min(g.end, :w1) - max(g.start, :w0) DESC LIMIT :n""",
        {"w0": w0, "w1": w1, "t": threshold, "n": limit},
    )
    gaps = pd.read_sql_query(
        "SELECT rowid AS gid, device, gap_start, gap_end, start, end FROM top_gaps ORDER BY end - start DESC",
        trace.conn,
    )
    if gaps.empty:
        return []
    api_bounds, kernel_bounds = seq_bounds(trace, "api"), seq_bounds(trace, "kernels")
    by_gap = {int(g.gid): _host_api_during(trace, int(g.start), int(g.end), api_bounds)
              for g in gaps.itertuples()}
    neighbours = _neighbours(trace, gaps, kernel_bounds)
    out = []
    for g in gaps.itertuples(index=False):
        dur = int(g.end - g.start)
        api = by_gap[int(g.gid)]
        out.append({
            "device": int(g.device), "start_ns": int(g.start), "duration_ns": dur,
            "before": neighbours[int(g.gid)][0], "after": neighbours[int(g.gid)][1], "host_api": api,
            # the calls' summed overlap: several threads (or duplicated rows) in calls at once can pass the
            # gap's length, yet they cover at most all of it
            "host_api_share": min(1.0, api[0]["overlap_ns"] / dur) if api else 0.0,
        })
    return out


# API calls (and the kernel before a gap) that began this long before the gap are not looked at: a
# bound that keeps each lookup to the events around the gap instead of a scan of a whole table.
LOOKBACK_NS = 100_000_000


def _neighbours(trace: Trace, gaps: pd.DataFrame, kernel_bounds: tuple[int, int] | None) -> dict:
    """(before, after) names per listed gap: the operation that ended at the gap's start and the one
    that started at its end (a memory operation where one sits exactly there, else a kernel)."""
    trace.conn.executescript(
        "CREATE INDEX IF NOT EXISTS temp.top_gaps_s ON top_gaps (gap_start);"
        "CREATE INDEX IF NOT EXISTS temp.top_gaps_e ON top_gaps (gap_end);"
    )
    mem_before = dict(trace.query(
        "SELECT g.rowid, m.operation FROM memops m JOIN top_gaps g ON g.gap_start = m.end AND g.device = m.device"))
    mem_after = dict(trace.query(
        "SELECT g.rowid, m.operation FROM memops m JOIN top_gaps g ON g.gap_end = m.start AND g.device = m.device"))
    out = {}
    for g in gaps.itertuples():
        gid, g0, g1 = int(g.gid), int(g.gap_start), int(g.gap_end)
        before = mem_before.get(gid)
        after = mem_after.get(gid)
        if kernel_bounds and before is None:
            lo, hi = seq_range(trace, "kernels", g0 - LOOKBACK_NS, g0, kernel_bounds)
            row = trace.query("SELECT s.value FROM kernels k JOIN strings s ON s.id = k.name_id WHERE k.seq "
                              "BETWEEN ? AND ? AND k.device = ? AND k.end = ? LIMIT 1", (lo, hi, int(g.device), g0))
            before = row[0][0] if row else None
        if kernel_bounds and after is None:
            lo, hi = seq_range(trace, "kernels", g1, g1, kernel_bounds)
            row = trace.query("SELECT s.value FROM kernels k JOIN strings s ON s.id = k.name_id WHERE k.seq "
                              "BETWEEN ? AND ? AND k.device = ? AND k.start = ? LIMIT 1", (lo, hi, int(g.device), g1))
            after = row[0][0] if row else None
        out[gid] = (before, after)
    return out


def _host_api_during(trace: Trace, g0: int, g1: int, bounds: tuple[int, int] | None) -> list[dict[str, Any]]:
    """CUDA API calls in flight on the host during [g0, g1], by overlap; top 3.

    The API table is in start order (nsys writes it so; `seq` is its row id), so each gap needs
    two binary searches and a short range scan rather than a scan of millions of calls.
    """
    if bounds is None:
        return []
    lo, hi = seq_range(trace, "api", g0 - LOOKBACK_NS, g1, bounds)
    rows = trace.query(
        """SELECT s.value, count(*), sum(min(a.end, :g1) - max(a.start, :g0)) AS overlap
           FROM api a JOIN strings s ON s.id = a.name_id
           WHERE a.seq BETWEEN :lo AND :hi AND a.start < :g1 AND a.end > :g0
           GROUP BY a.name_id ORDER BY overlap DESC LIMIT 3""",
        {"g0": g0, "g1": g1, "lo": lo, "hi": hi},
    )
    return [{"name": strip_api_version(n), "calls": int(c), "overlap_ns": int(o)} for n, c, o in rows]


def _buckets(trace: Trace, w0: int, w1: int, n: int) -> tuple[dict[int, list[int]], dict[str, Any]]:
    """Idle ns per equal time bucket of the window and device, and the busy fractions for the report."""
    width = max(1, -(-(w1 - w0) // n))
    ranges = [(w0 + b * width, min(w1, w0 + (b + 1) * width)) for b in range(n) if w0 + b * width < w1]
    if not ranges:  # an empty window
        ranges = [(w0, w0 + 1)]
    idle = {d: _idle_ranges(trace, d, ranges) for d in _devices(trace)}
    busy_fraction = {str(d): [round(1.0 - i / (hi - lo), 4) for i, (lo, hi) in zip(series, ranges, strict=True)]
                     for d, series in idle.items()}
    return idle, {"start_ns": w0, "bucket_ns": width, "busy_fraction": busy_fraction}


def strip_api_version(name: str) -> str:
    """`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`, exactly as nsys's cuda_api_sum names them."""
    if name and len(name) > 6 and name[-6:-4] == "_v":
        return name[:-6]
    return name
