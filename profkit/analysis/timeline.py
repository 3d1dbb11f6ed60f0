"""GPU busy/idle from the union of kernel and memory-operation intervals, per device.

One window-function pass over all GPU operations (sorted by start per device) writes every idle
gap into a TEMP table; everything else (utilization of any window, the gap list, phases for the
automatic window, utilization over time) is read from that much smaller table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

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
        CREATE TEMP TABLE gpu_gaps AS
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
    # Idle per phase and device in one pass over the gaps (a phase lookup per gap by index), not
    # one scan per phase: a whole-process trace has dozens of phases and millions of gaps.
    trace.conn.executescript(
        "DROP TABLE IF EXISTS temp.phase_bounds;"
        "CREATE TEMP TABLE phase_bounds (p INTEGER PRIMARY KEY, start INTEGER, end INTEGER);"
    )
    trace.conn.executemany("INSERT INTO temp.phase_bounds VALUES (?, ?, ?)",
                           [(i, s, e) for i, (s, e) in enumerate(bounds)])
    trace.conn.execute("CREATE INDEX temp.phase_bounds_start ON phase_bounds (start)")
    idle = trace.query(
        """SELECT (SELECT p FROM phase_bounds WHERE start <= g.start ORDER BY start DESC LIMIT 1) AS p,
                  g.device, sum(g.end - g.start)
           FROM gpu_gaps g WHERE g.end - g.start < :split GROUP BY p, g.device""",
        {"split": split_ns},
    )
    idle_by = {(int(p), int(d)): int(v) for p, d, v in idle if p is not None}
    spans = trace.query("SELECT device, first_start, last_end FROM gpu_spans")
    result = []
    for i, (start, end) in enumerate(bounds):
        busy = 0
        for d, first_d, last_d in spans:
            outside = max(0, min(first_d, end) - start) + max(0, end - max(last_d, start))
            busy += max(0, (end - start) - idle_by.get((i, int(d)), 0) - outside)
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


def _idle_in(trace: Trace, w0: int, w1: int) -> dict[int, int]:
    """Idle ns per device inside [w0, w1]: gaps clipped to the window plus time outside the span."""
    rows = trace.query(
        """SELECT s.device,
                  coalesce((SELECT sum(min(g.end, :w1) - max(g.start, :w0)) FROM gpu_gaps g
                            WHERE g.device = s.device AND g.end > :w0 AND g.start < :w1), 0)
                  + max(0, min(s.first_start, :w1) - :w0) + max(0, :w1 - max(s.last_end, :w0))
           FROM gpu_spans s""",
        {"w0": w0, "w1": w1},
    )
    return {int(d): min(int(v), w1 - w0) for d, v in rows}


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
    idle = _idle_in(trace, w0, w1)
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
        buckets=_buckets(trace, w0, w1, n_buckets),
    )


def _gap_classes(trace: Trace, w0: int, w1: int) -> dict[str, dict[str, int]]:
    """Idle time by gap size class. Gaps inside the window are counted with FILTER aggregates over the
    raw duration (3x cheaper than clipping every row); the few crossing a window edge are clipped."""
    bounds, lower = [], 0
    for upper, label in GAP_CLASSES:
        bounds.append((label, lower, upper))
        lower = upper or 0
    aggs = []
    for _, lo, hi in bounds:
        cond = f"end - start >= {lo}" + (f" AND end - start < {hi}" if hi else "")
        aggs.append(f"count(*) FILTER (WHERE {cond}), coalesce(sum(end - start) FILTER (WHERE {cond}), 0)")
    inside = trace.conn.execute(
        f"SELECT {', '.join(aggs)} FROM gpu_gaps WHERE start >= :w0 AND end <= :w1", {"w0": w0, "w1": w1}
    ).fetchone()
    out = {label: {"count": int(inside[2 * i]), "idle_ns": int(inside[2 * i + 1])}
           for i, (label, _, _) in enumerate(bounds)}
    crossing = trace.query(
        "SELECT min(end, :w1) - max(start, :w0) FROM gpu_gaps "
        "WHERE end > :w0 AND start < :w1 AND (start < :w0 OR end > :w1)", {"w0": w0, "w1": w1})
    for (d,) in crossing:
        label = next(lb for lb, lo, hi in bounds if d >= lo and (hi is None or d < hi))
        out[label]["count"] += 1
        out[label]["idle_ns"] += int(d)
    return out


def _gap_list(trace: Trace, w0: int, w1: int, threshold: int, limit: int) -> list[dict[str, Any]]:
    trace.conn.executescript("DROP TABLE IF EXISTS temp.top_gaps;")
    trace.conn.execute(
        """CREATE TEMP TABLE top_gaps AS
           SELECT g.device, g.start AS gap_start, g.end AS gap_end,
                  max(g.start, :w0) AS start, min(g.end, :w1) AS end
           FROM gpu_gaps g
           WHERE g.end > :w0 AND g.start < :w1 AND min(g.end, :w1) - max(g.start, :w0) >= :t
           ORDER BY min(g.end, :w1) - max(g.start, :w0) DESC LIMIT :n""",
        {"w0": w0, "w1": w1, "t": threshold, "n": limit},
    )
    gaps = pd.read_sql_query(
        "SELECT rowid AS gid, device, gap_start, gap_end, start, end FROM top_gaps ORDER BY end - start DESC",
        trace.conn,
    )
    if gaps.empty:
        return []
    api_bounds, kernel_bounds = _seq_bounds(trace, "api"), _seq_bounds(trace, "kernels")
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
            "host_api_share": (api[0]["overlap_ns"] / dur) if api else 0.0,
        })
    return out


# API calls (and the kernel before a gap) that began this long before the gap are not looked at: a
# bound that keeps each lookup to the events around the gap instead of a scan of a whole table.
LOOKBACK_NS = 100_000_000
# Rows scanned either side of the binary-searched bounds, in case the export is not strictly sorted.
SEQ_MARGIN = 256


def _seq_bounds(trace: Trace, relation: str) -> tuple[int, int] | None:
    # Two ORDER BY ... LIMIT 1 seeks: min(seq), max(seq) in one query would scan the table.
    first = trace.query(f"SELECT seq FROM {relation} ORDER BY seq LIMIT 1")
    last = trace.query(f"SELECT seq FROM {relation} ORDER BY seq DESC LIMIT 1")
    return (int(first[0][0]), int(last[0][0])) if first and last else None


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
            lo = _first_seq_at(trace, g0 - LOOKBACK_NS, kernel_bounds, "kernels") - SEQ_MARGIN
            hi = _first_seq_at(trace, g0, kernel_bounds, "kernels") + SEQ_MARGIN
            row = trace.query("SELECT s.value FROM kernels k JOIN strings s ON s.id = k.name_id WHERE k.seq "
                              "BETWEEN ? AND ? AND k.device = ? AND k.end = ? LIMIT 1", (lo, hi, int(g.device), g0))
            before = row[0][0] if row else None
        if kernel_bounds and after is None:
            at = _first_seq_at(trace, g1, kernel_bounds, "kernels")
            row = trace.query("SELECT s.value FROM kernels k JOIN strings s ON s.id = k.name_id WHERE k.seq "
                              "BETWEEN ? AND ? AND k.device = ? AND k.start = ? LIMIT 1",
                              (at - SEQ_MARGIN, at + SEQ_MARGIN, int(g.device), g1))
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
    lo = _first_seq_at(trace, g0 - LOOKBACK_NS, bounds, "api") - SEQ_MARGIN
    hi = _first_seq_at(trace, g1, bounds, "api") + SEQ_MARGIN
    rows = trace.query(
        """SELECT s.value, count(*), sum(min(a.end, :g1) - max(a.start, :g0)) AS overlap
           FROM api a JOIN strings s ON s.id = a.name_id
           WHERE a.seq BETWEEN :lo AND :hi AND a.start < :g1 AND a.end > :g0
           GROUP BY a.name_id ORDER BY overlap DESC LIMIT 3""",
        {"g0": g0, "g1": g1, "lo": lo, "hi": hi},
    )
    return [{"name": strip_api_version(n), "calls": int(c), "overlap_ns": int(o)} for n, c, o in rows]


def _first_seq_at(trace: Trace, t: int, bounds: tuple[int, int], relation: str) -> int:
    """Smallest seq of `relation` whose event starts at or after t (binary search over row ids)."""
    lo, hi = bounds[0], bounds[1] + 1
    while lo < hi:
        mid = (lo + hi) // 2
        row = trace.query(f"SELECT seq, start FROM {relation} WHERE seq >= ? ORDER BY seq LIMIT 1", (mid,))
        if not row:
            hi = mid
        elif row[0][1] < t:
            lo = int(row[0][0]) + 1
        else:
            hi = mid
    return lo


def _buckets(trace: Trace, w0: int, w1: int, n: int) -> dict[str, Any]:
    """Busy fraction per equal time bucket of the window, per device."""
    width = max(1, -(-(w1 - w0) // n))
    trace.conn.executescript(
        "DROP TABLE IF EXISTS temp.buckets; CREATE TEMP TABLE buckets (b INTEGER PRIMARY KEY);"
    )
    trace.conn.executemany("INSERT INTO temp.buckets VALUES (?)", [(i,) for i in range(n)])
    # Idle per bucket from the gaps (each clipped to the window, split across the buckets it spans),
    # plus the time before a device's first and after its last operation.
    # Most gaps sit inside one bucket: a plain GROUP BY. The rest (long gaps, window edges, time
    # before the first / after the last operation) are split across buckets with a range join.
    params = {"w0": w0, "w1": w1, "bw": width}
    single = "start >= :w0 AND end <= :w1 AND (start - :w0) / :bw = (end - 1 - :w0) / :bw"
    rows = trace.query(
        f"SELECT device, (start - :w0) / :bw AS b, sum(end - start) FROM gpu_gaps WHERE {single} "
        "GROUP BY device, b", params)
    rows += trace.query(
        f"""WITH idle AS (
               SELECT device, max(start, :w0) AS s, min(end, :w1) AS e FROM gpu_gaps
               WHERE end > :w0 AND start < :w1 AND NOT ({single})
               UNION ALL SELECT device, :w0, min(first_start, :w1) FROM gpu_spans WHERE first_start > :w0
               UNION ALL SELECT device, max(last_end, :w0), :w1 FROM gpu_spans WHERE last_end < :w1
           )
           SELECT i.device, b.b,
                  sum(min(i.e, :w0 + (b.b + 1) * :bw) - max(i.s, :w0 + b.b * :bw)) AS idle
           FROM idle i JOIN buckets b ON b.b BETWEEN (i.s - :w0) / :bw AND (i.e - 1 - :w0) / :bw
           GROUP BY i.device, b.b""",
        params,
    )
    idle: dict[tuple[int, int], int] = {}
    for d, b, v in rows:
        idle[(int(d), int(b))] = idle.get((int(d), int(b)), 0) + int(v)
    per_device = {}
    for d in _devices(trace):
        series = []
        for b in range(n):
            lo, hi = w0 + b * width, min(w1, w0 + (b + 1) * width)
            if hi <= lo:
                break
            series.append(round(1.0 - idle.get((d, b), 0) / (hi - lo), 4))
        per_device[str(d)] = series
    return {"start_ns": w0, "bucket_ns": width, "busy_fraction": per_device}


def strip_api_version(name: str) -> str:
    """`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`, exactly as nsys's cuda_api_sum names them."""
    if name and len(name) > 6 and name[-6:-4] == "_v":
        return name[:-6]
    return name
