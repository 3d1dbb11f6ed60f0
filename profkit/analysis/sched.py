"""Per-process CPU time from the OS scheduler's context switches an nsys trace recorded (`--cpuctxsw`,
`profkit capture --cpu-switches`): exact time on a CPU per thread inside the window, summed per process —
the trace's own answer to "which process is at a full core", beside host.json's 10 Hz samples.

A thread is on a CPU from a switch-in to its next switch-out; a thread whose first event in the window is
a switch-out was on a CPU since the window's start, and one still switched in at the end stays till it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from profkit.analysis.window import Window
from profkit.traces import Trace
from profkit.traces.columns import read_columns

TOP = 10  # processes listed
SOURCE = "nsys context switches (SCHED_EVENTS)"


def process_cpu(trace: Trace, win: Window) -> dict[str, Any] | None:
    """{"window_ns", "processes": [{pid, name, cores, threads, busiest_thread_cores, busiest_tid}]}, busiest
    first; None without context-switch data.

    The window's switches are read once as columns and sorted by (thread, time); each switch-in lasts to the
    thread's next event (or the window's end), a thread whose first event is a switch-out was on a CPU since the
    window's start; per-thread sums by bincount, per process the same (no SQL window function over millions)."""
    if "sched" not in trace.present:
        return None
    a, b = win.start_ns, win.end_ns  # `all` too: CPU over the same span as the GPU figures
    if b <= a:
        return None
    rows = trace.query("SELECT count(*) FROM sched")[0][0]  # its size picks the reader (Arrow for millions)
    ev = read_columns(trace, "sched", {"tid": "tid", "pid": "pid", "start": "start", "sin": "sched_in"},
                      where=f"start >= {int(a)} AND start < {int(b)}", rows_hint=rows)
    if not len(ev["start"]):
        return {"source": SOURCE, "window_ns": b - a, "processes": []}
    # Millions of rows: each column is let go as soon as its sorted copy is made (this sort is the report's peak).
    tid, start, sin, pid = ev.pop("tid"), ev.pop("start"), ev.pop("sin"), ev.pop("pid")
    # by (thread, time): a stable sort by thread alone where the switches come in time order, as nsys writes them
    in_time = bool(np.all(start[1:] >= start[:-1]))
    order = np.argsort(tid, kind="stable") if in_time else np.lexsort((start, tid))
    tid = tid[order]
    start = start[order]
    sin = sin[order] != 0
    new = np.concatenate([[True], tid[1:] != tid[:-1]])  # each thread's first event
    firsts = np.flatnonzero(new)
    t_tid, t_pid = tid[firsts], pid[order[firsts]]
    del order, tid, pid
    nxt = np.concatenate([np.where(new[1:], b, start[1:]), [b]])  # the same thread's next event, else the end
    nxt -= start
    on = np.where(sin, np.maximum(nxt, 0), 0)
    del nxt
    on += np.where(new & ~sin, start - a, 0)
    del start, sin
    thread = np.cumsum(new) - 1
    per_thread = np.bincount(thread, weights=on).astype(np.int64)
    pids, p_index = np.unique(t_pid, return_inverse=True)
    p_ns = np.bincount(p_index, weights=per_thread).astype(np.int64)
    p_threads = np.bincount(p_index)
    # the busiest thread of each process: threads by (process, time on CPU descending), the first of each
    by = np.lexsort((-per_thread, p_index))
    first = by[np.concatenate([[True], p_index[by][1:] != p_index[by][:-1]])]
    top = np.argsort(-p_ns, kind="stable")[:TOP]
    names = dict(trace.query("SELECT pid, name FROM processes"))
    span = b - a
    return {"source": SOURCE, "window_ns": span, "processes": [
        {"pid": int(pids[i]), "name": str(names.get(int(pids[i])) or ""), "cores": int(p_ns[i]) / span,
         "threads": int(p_threads[i]), "busiest_thread_cores": int(per_thread[first[i]]) / span,
         "busiest_tid": int(t_tid[first[i]]) & 0xFFFFFF}
        for i in top.tolist()]}
