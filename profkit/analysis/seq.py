"""Time -> row lookups on the start-ordered relations (`kernels` and `api`: `seq` is the row order).

nsys writes its kernel and CUDA API tables sorted by start (every fixture export is, to the row),
and the torch reader builds them so. A time bound therefore becomes a seq bound by binary search:
a window or a gap reads the rows around it instead of scanning millions.
"""

from __future__ import annotations

import numpy as np

from profkit.traces.schema import Trace

# The trace cache's key for a relation's sparse index (seqs, starts) of every SPARSE-th row, and its stride.
SEQ_INDEX = "seq index {}"
SPARSE = 1024
# Rows read either side of a binary-searched bound, in case an export is not strictly sorted.
SEQ_MARGIN = 256


def seq_bounds(trace: Trace, relation: str) -> tuple[int, int] | None:
    """First and last seq of `relation`, or None when it is empty."""
    # Two ORDER BY ... LIMIT 1 seeks: min(seq), max(seq) in one query would scan the table.
    first = trace.query(f"SELECT seq FROM {relation} ORDER BY seq LIMIT 1")
    last = trace.query(f"SELECT seq FROM {relation} ORDER BY seq DESC LIMIT 1")
    return (int(first[0][0]), int(last[0][0])) if first and last else None


def first_seq_at(trace: Trace, t: int, bounds: tuple[int, int], relation: str) -> int:
    """Smallest seq of `relation` whose event starts at or after t (binary search over row ids).

    Where the relation's one read kept every SPARSE-th row's start (analysis/scans.py; it checked the rows
    run in start order with no hole), those narrow the search to one range of at most SPARSE rows: one query
    instead of ~20 seeks, each a round trip from Python (a report lists 50 gaps and looks up their
    neighbours and host calls: 5,000 queries, 0.5 s)."""
    index = trace.cache.get(SEQ_INDEX.format(relation))
    if index is not None:
        seqs, starts = index
        i = int(np.searchsorted(starts, t, side="left"))  # the first kept row starting at or after t
        lo = int(seqs[i - 1]) + 1 if i > 0 else bounds[0]
        hi = int(seqs[i]) if i < len(seqs) else bounds[1] + 1
        row = trace.query(f"SELECT seq FROM {relation} WHERE seq >= ? AND seq < ? AND start >= ? ORDER BY seq "
                          "LIMIT 1", (lo, hi, t))
        return int(row[0][0]) if row else hi
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


def seq_range(trace: Trace, relation: str, t0: int, t1: int,
              bounds: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """A seq range holding every row of `relation` that starts in [t0, t1), with SEQ_MARGIN either side.

    `bounds` (from `seq_bounds`) saves its two seeks when many ranges are looked up in a row."""
    bounds = bounds or seq_bounds(trace, relation)
    return None if bounds is None else seq_span(trace, relation, t0, t1, bounds)


def seq_span(trace: Trace, relation: str, t0: int, t1: int, bounds: tuple[int, int]) -> tuple[int, int]:
    """`seq_range` where the relation's bounds are known (it has rows)."""
    at0 = first_seq_at(trace, t0, bounds, relation)
    at1 = at0 if t1 == t0 else first_seq_at(trace, t1, bounds, relation)
    return at0 - SEQ_MARGIN, at1 + SEQ_MARGIN
