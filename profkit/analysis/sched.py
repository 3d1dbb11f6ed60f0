"""Per-process CPU time from the OS scheduler's context switches an nsys trace recorded (`--cpuctxsw`,
`profkit capture --cpu-switches`): exact time on a CPU per thread inside the window, summed per process —
the trace's own answer to "which process is at a full core", beside host.json's 10 Hz samples.

A thread is on a CPU from a switch-in to its next switch-out; a thread whose first event in the window is
a switch-out was on a CPU since the window's start, and one still switched in at the end stays till it.
"""

from __future__ import annotations

from typing import Any

from profkit.analysis.window import Window
from profkit.traces import Trace

TOP = 10  # processes listed

ON_CPU = """
WITH ev AS (
  SELECT tid, pid, start, sched_in,
         LEAD(start) OVER (PARTITION BY tid ORDER BY start) AS nxt,
         ROW_NUMBER() OVER (PARTITION BY tid ORDER BY start) AS rn
  FROM sched WHERE start >= :a AND start < :b),
spans AS (
  SELECT tid, pid, start AS s, coalesce(nxt, :b) AS e FROM ev WHERE sched_in
  UNION ALL
  SELECT tid, pid, :a, start FROM ev WHERE NOT sched_in AND rn = 1),
threads AS (
  SELECT pid, tid, ns, ROW_NUMBER() OVER (PARTITION BY pid ORDER BY ns DESC) AS rank
  FROM (SELECT pid, tid, sum(max(e - s, 0)) AS ns FROM spans GROUP BY tid))
SELECT pid, sum(ns), count(*), max(ns), max(CASE WHEN rank = 1 THEN tid & 16777215 END)
FROM threads GROUP BY pid ORDER BY sum(ns) DESC LIMIT :top
"""


def process_cpu(trace: Trace, win: Window) -> dict[str, Any] | None:
    """{"window_ns", "processes": [{pid, name, cores, threads, busiest_thread_cores, busiest_tid}]}, busiest
    first; None without context-switch data."""
    if "sched" not in trace.present:
        return None
    a, b = win.start_ns, win.end_ns  # `all` too: CPU over the same span as the GPU figures
    if b <= a:
        return None
    rows = trace.query(ON_CPU, {"a": a, "b": b, "top": TOP})
    names = dict(trace.query("SELECT pid, name FROM processes")) if rows else {}
    span = b - a
    return {"source": "nsys context switches (SCHED_EVENTS)", "window_ns": span, "processes": [
        {"pid": int(pid), "name": str(names.get(pid) or ""), "cores": ns / span, "threads": int(n),
         "busiest_thread_cores": top / span, "busiest_tid": int(tid)}
        for pid, ns, n, top, tid in rows]}
