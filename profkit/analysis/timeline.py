"""GPU busy/idle from the union of kernel and memory-operation intervals, per device.

Every idle gap of every device comes from one read of the GPU operations (`analysis.gaps`: sorted numpy
arrays with a prefix sum). Everything else (utilization of any window, the gap list, phases for the
automatic window, utilization over time) is binary searches over those arrays: the idle time of a range
is the gaps starting in it plus the one gap reaching into it from before (a device's gaps never overlap).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from profkit.analysis.gaps import GpuGaps, gpu_gaps
from profkit.analysis.sections import GapClass, GapClasses
from profkit.analysis.seq import seq_bounds, seq_span
from profkit.analysis.window import PHASE_GAP_NS, Window
from profkit.traces.schema import Trace


class ListedGap(NamedTuple):
    gid: int
    device: int
    gap_start: int
    gap_end: int
    start: int  # clipped to the window
    end: int


# Idle time is reported by gap size class: the upper bounds of `GapClasses`' fields, in order. Gaps under 20 us
# are the launch-to-launch spacing of back-to-back kernels; 1 ms and more is host-side work between GPU steps.
GAP_UPPER_BOUNDS = (20_000, 1_000_000, 100_000_000, None)


def phases(trace: Trace, split_ns: int = PHASE_GAP_NS) -> list[dict[str, Any]]:
    """GPU-active phases of the whole trace (all devices), split at gaps >= split_ns."""
    gaps = gpu_gaps(trace)
    first, last = gaps.first, gaps.last
    # A gap splits phases only where every device is idle; with one device that is every gap.
    if len(gaps.devices) == 1:
        (d,) = gaps.devices.values()
        long = np.flatnonzero(d.end - d.start >= split_ns)
        cuts = list(zip(d.start[long].tolist(), d.end[long].tolist(), strict=True))
    else:
        cuts = _common_idle(gaps, split_ns)
    bounds, cursor = [], first
    for gap_start, gap_end in cuts:
        bounds.append((cursor, gap_start))
        cursor = gap_end
    bounds.append((cursor, last))
    lo = np.array([b[0] for b in bounds], dtype=np.int64)
    hi = np.array([b[1] for b in bounds], dtype=np.int64)
    idle = [d.idle_in(lo, hi) for d in gaps.devices.values()]
    result = []
    for i, (start, end) in enumerate(bounds):
        busy = sum(max(0, (end - start) - int(series[i])) for series in idle)
        result.append({"start_ns": start, "end_ns": end, "busy_ns": busy})
    return result


def _common_idle(gaps: GpuGaps, split_ns: int) -> list[tuple[int, int]]:
    """Where every device sits in a gap >= split_ns at once: a sweep over the (few) long gaps."""
    events = []
    for d in gaps.devices.values():
        long = np.flatnonzero(d.end - d.start >= split_ns)
        events += [(int(t), 1) for t in d.start[long]] + [(int(t), -1) for t in d.end[long]]
    events.sort()  # at equal times a gap's end (-1) comes before another's start (+1)
    level, out, opened = 0, [], None
    for t, step in events:
        level += step
        if level == len(gaps.devices) and opened is None:
            opened = t
        elif level < len(gaps.devices) and opened is not None:
            if t - opened >= split_ns:
                out.append((opened, t))
            opened = None
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
    gap_classes: GapClasses = field(default_factory=GapClasses)
    buckets: dict[str, Any] = field(default_factory=dict)


def gpu_timeline(trace: Trace, window: Window, gap_threshold_ns: int = 100_000, max_gaps: int = 50,
                 n_buckets: int = 100) -> Timeline:
    """Busy/idle, gap list and utilization-over-time of `window` (from the GPU's gaps, computed once per trace)."""
    w0, w1 = window.start_ns, window.end_ns
    gaps = gpu_gaps(trace)
    # The buckets partition the window, so their idle times add up to the window's.
    bucket_idle, buckets = _buckets(gaps, w0, w1, n_buckets)
    idle = {d: sum(series) for d, series in bucket_idle.items()}
    length = max(1, w1 - w0)
    devices = [
        {"device": d, "busy_ns": length - idle.get(d, 0), "idle_ns": idle.get(d, 0),
         "utilization": (length - idle.get(d, 0)) / length}
        for d in sorted(gaps.devices)
    ]
    idle_total = sum(idle.get(d, 0) for d in gaps.devices)
    busy = length * len(gaps.devices) - idle_total
    return Timeline(
        window_ns=length,
        devices=devices,
        busy_ns=busy,
        idle_ns=idle_total,
        utilization=busy / max(1, busy + idle_total),
        gaps=_gap_list(trace, gaps, w0, w1, gap_threshold_ns, max_gaps),
        gap_classes=_gap_classes(gaps, w0, w1),
        buckets=buckets,
    )


def _gap_classes(gaps: GpuGaps, w0: int, w1: int) -> GapClasses:
    """Idle time by gap size class. Gaps inside the window count by their duration; the few that cross
    a window edge are clipped."""
    bounds, lower = [], 0
    for i, upper in enumerate(GAP_UPPER_BOUNDS):
        bounds.append((i, lower, upper))
        lower = upper or 0
    out = [{"count": 0, "idle_ns": 0} for _ in bounds]
    for d in gaps.devices.values():
        a = np.searchsorted(d.start, w0, side="left")
        b = np.searchsorted(d.start, w1, side="left")
        length = d.end[a:b] - d.start[a:b]
        inside = d.end[a:b] <= w1
        for i, lo, hi in bounds:  # masks, no copies: a window can hold millions of gaps
            mask = inside & (length >= lo) if hi is None else inside & (length >= lo) & (length < hi)
            out[i]["count"] += int(np.count_nonzero(mask))
            out[i]["idle_ns"] += int(np.sum(length, where=mask))
        # At most one gap crosses each window edge.
        crossing = []
        if a > 0 and d.end[a - 1] > w0:
            crossing.append(min(int(d.end[a - 1]), w1) - max(int(d.start[a - 1]), w0))
        crossing += [min(int(e), w1) - int(s) for s, e in zip(d.start[a:b][~inside], d.end[a:b][~inside],
                                                              strict=True)]
        for dur in crossing:
            i = next(k for k, lo, hi in bounds if dur >= lo and (hi is None or dur < hi))
            out[i]["count"] += 1
            out[i]["idle_ns"] += int(dur)
    return GapClasses(*(GapClass(**c) for c in out))


def _gap_list(trace: Trace, all_gaps: GpuGaps, w0: int, w1: int, threshold: int,
              limit: int) -> list[dict[str, Any]]:
    rows = []
    for d in all_gaps.devices.values():
        a = max(0, int(np.searchsorted(d.start, w0, side="left")) - 1)  # the gap reaching in from before
        b = int(np.searchsorted(d.start, w1, side="left"))
        at = a + np.flatnonzero(d.end[a:b] - d.start[a:b] >= threshold)  # few: most gaps are microseconds
        gs, ge = d.start[at], d.end[at]
        cs, ce = np.maximum(gs, w0), np.minimum(ge, w1)
        keep = np.flatnonzero((ge > w0) & (gs < w1) & (ce - cs >= threshold))
        # this device's `limit` longest (clipped), longest first, ties by start: Python sees those alone
        top = keep[np.lexsort((cs[keep], -(ce[keep] - cs[keep])))[:limit]]
        rows += [(int(e - s), d.device, int(g0), int(g1), int(s), int(e))
                 for g0, g1, s, e in zip(gs[top], ge[top], cs[top], ce[top], strict=True)]
    rows.sort(key=lambda r: (-r[0], r[1], r[4]))
    rows = rows[:limit]
    trace.conn.executescript("DROP TABLE IF EXISTS temp.top_gaps;"
                             "CREATE TEMP TABLE top_gaps (device INTEGER, gap_start INTEGER, gap_end INTEGER, "
                             "start INTEGER, end INTEGER);")
    trace.conn.executemany("INSERT INTO temp.top_gaps VALUES (?, ?, ?, ?, ?)", [r[1:] for r in rows])
    gaps = [ListedGap(*row) for row in trace.query(
        "SELECT rowid AS gid, device, gap_start, gap_end, start, end FROM top_gaps ORDER BY rowid")]
    if not gaps:
        return []
    api_bounds, kernel_bounds = seq_bounds(trace, "api"), seq_bounds(trace, "kernels")
    by_gap = {int(g.gid): _host_api_during(trace, int(g.start), int(g.end), api_bounds)
              for g in gaps}
    neighbours = _neighbours(trace, gaps, kernel_bounds)
    out = []
    for g in gaps:
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


def _neighbours(trace: Trace, gaps: list[ListedGap], kernel_bounds: tuple[int, int] | None) -> dict:
    """(before, after) names per listed gap: the operation that ended at the gap's start and the one
    that started at its end (a memory operation where one sits exactly there, else a kernel)."""
    # One scan of the memory operations for the listed gaps' ends (a join would index every memory operation
    # first); where several touch a gap, the last in the relation's order, as a join over it gives.
    ended = {(d, t): op for d, t, op in trace.query(
        "SELECT device, end, operation FROM memops WHERE end IN (SELECT gap_start FROM top_gaps)")}
    started = {(d, t): op for d, t, op in trace.query(
        "SELECT device, start, operation FROM memops WHERE start IN (SELECT gap_end FROM top_gaps)")}
    out = {}
    for g in gaps:
        gid, g0, g1 = int(g.gid), int(g.gap_start), int(g.gap_end)
        before = ended.get((int(g.device), g0))
        after = started.get((int(g.device), g1))
        if kernel_bounds and before is None:
            lo, hi = seq_span(trace, "kernels", g0 - LOOKBACK_NS, g0, kernel_bounds)
            row = trace.query("SELECT s.value FROM kernels k JOIN strings s ON s.id = k.name_id WHERE k.seq "
                              "BETWEEN ? AND ? AND k.device = ? AND k.end = ? LIMIT 1", (lo, hi, int(g.device), g0))
            before = row[0][0] if row else None
        if kernel_bounds and after is None:
            lo, hi = seq_span(trace, "kernels", g1, g1, kernel_bounds)
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
    lo, hi = seq_span(trace, "api", g0 - LOOKBACK_NS, g1, bounds)
    rows = trace.query(
        """SELECT s.value, count(*), sum(min(a.end, :g1) - max(a.start, :g0)) AS overlap
           FROM api a JOIN strings s ON s.id = a.name_id
           WHERE a.seq BETWEEN :lo AND :hi AND a.start < :g1 AND a.end > :g0
           GROUP BY a.name_id ORDER BY overlap DESC LIMIT 3""",
        {"g0": g0, "g1": g1, "lo": lo, "hi": hi},
    )
    return [{"name": strip_api_version(n), "calls": int(c), "overlap_ns": int(o)} for n, c, o in rows]


def _buckets(gaps: GpuGaps, w0: int, w1: int, n: int) -> tuple[dict[int, list[int]], dict[str, Any]]:
    """Idle ns per equal time bucket of the window and device, and the busy fractions for the report."""
    width = max(1, -(-(w1 - w0) // n))
    ranges = [(w0 + b * width, min(w1, w0 + (b + 1) * width)) for b in range(n) if w0 + b * width < w1]
    if not ranges:  # an empty window
        ranges = [(w0, w0 + 1)]
    lo = np.array([r[0] for r in ranges], dtype=np.int64)
    hi = np.array([r[1] for r in ranges], dtype=np.int64)
    idle = {dev: [int(x) for x in d.idle_in(lo, hi)] for dev, d in sorted(gaps.devices.items())}
    busy_fraction = {str(d): [round(1.0 - i / (hi - lo), 4) for i, (lo, hi) in zip(series, ranges, strict=True)]
                     for d, series in idle.items()}
    return idle, {"start_ns": w0, "bucket_ns": width, "busy_fraction": busy_fraction}


def strip_api_version(name: str) -> str:
    """`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`, exactly as nsys's cuda_api_sum names them."""
    if name and len(name) > 6 and name[-6:-4] == "_v":
        return name[:-6]
    return name
