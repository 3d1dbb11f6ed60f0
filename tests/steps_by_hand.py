"""vLLM's annotated engine steps placed on the GPU's timeline, worked out in plain Python from a trace's own rows,
as ground truth for analysis/steps.py (one implementation for tests/test_steps.py, which reads torch traces, and
tests/test_phases.py, which reads nsys exports' raw tables)."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass


@dataclass
class Placed:
    starts: list[int]  # each annotation's start on the GPU
    ends: list[int]  # its range's end: the next one's start (the last: its work's end)
    kept: list[int]  # the annotations not cut by the trace, in order
    first: dict[int, int]  # an annotation's first GPU operation, where the trace holds one it launched


def place(marks: list[tuple[int, int]], calls: list[tuple[int, int]], ops: list[tuple[int, int, int]],
          span: tuple[int, int]) -> Placed:
    """`marks`: the annotations' host (start, end) in time order; `calls`: the annotating process's CUDA calls
    (start, correlation id); `ops`: its GPU operations (start, end, correlation id); `span`: the device's first
    operation's start and last operation's end in the trace. A step starts at the first operation its calls (from
    its annotation's start to the next one's) launched; one that launched nothing the trace kept at its host start
    moved by the median lag, between its known neighbours; every start at least the one before. Cut by the trace:
    a step holding the device's first or last operation, or launching nothing kept while the GPU worked."""
    hosts = [a for a, _ in marks]
    top = max(marks[-1][1], marks[-1][0] + 1)
    step_of = {c: bisect.bisect_right(hosts, a) - 1 for a, c in calls if hosts[0] <= a < top}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s, e, c in ops:
        if (i := step_of.get(c)) is not None:
            first[i], last[i] = min(first.get(i, s), s), max(last.get(i, e), e)
    lag = int(statistics.median(first[i] - hosts[i] for i in first))
    known = sorted(first)
    starts: list[int] = []
    for i, a in enumerate(hosts):
        if i in first:
            g = first[i]
        else:
            k = bisect.bisect_left(known, i)
            g = a + lag
            g = max(g, first[known[k - 1]]) if k > 0 else g
            g = min(g, first[known[k]]) if k < len(known) else g
        starts.append(g if not starts else max(starts[-1], g))
    ends = [max(starts[i + 1], starts[i] + 1) for i in range(len(hosts) - 1)]
    ends.append(max(starts[-1] + 1, last.get(len(hosts) - 1, marks[-1][1] + lag)))
    kept = [i for i in range(len(hosts)) if not (
        (first[i] <= span[0] or last[i] >= span[1]) if i in first else (starts[i] < span[1] and ends[i] > span[0]))]
    return Placed(starts, ends, kept, first)


def union(spans: list[tuple[int, int]]) -> int:
    """The length of the union of (start, end) spans."""
    total, cur = 0, None
    for s, e in sorted(spans):
        if cur is None or s > cur[1]:
            total += cur[1] - cur[0] if cur else 0
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0)
