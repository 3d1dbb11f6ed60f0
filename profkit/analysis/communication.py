"""Per GPU: kernel time, communication share, compute/communication overlap, and the collectives it ran.

One question per function, over the window's kernels read as columns in start-ordered chunks:

* `per_device`: for each device, kernel count and time, communication kernels (the `communication`
  category: NCCL/RCCL, vLLM's custom all-reduce, ...) count and time, and their overlap with compute:
  the time a communication kernel runs while a compute kernel runs on the same GPU, over the time
  communication kernels run (both merged into intervals first). That is HTA's `get_comm_comp_overlap`
  (which calls a kernel communication when its name holds "nccl"); memory operations are neither.
* `collective_imbalance`: across devices (one trace with several GPUs, or one trace per rank), the k-th
  communication kernel of each device is the same collective (tensor-parallel ranks run the same
  all-reduces in the same order). The spread of its start times is the wait: the last device to arrive
  holds the others, which sit inside the collective until it comes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profkit.analysis.categories import OTHER, category_breakdown
from profkit.analysis.sections import BusySpread, CollectiveWait, Communication, Imbalance, RankPart, Straggler
from profkit.analysis.seq import seq_bounds
from profkit.analysis.stats import CHUNK_ROWS
from profkit.analysis.window import Window
from profkit.traces.columns import read_columns
from profkit.traces.schema import Trace

COMMUNICATION = "communication"


@dataclass
class DeviceKernels:
    """One device's kernels in the window: totals, communication, and its collectives in start order."""

    device: int
    count: int = 0
    total_ns: int = 0
    comm_count: int = 0
    comm_total_ns: int = 0
    comm_busy_ns: int = 0  # communication kernels merged into intervals (concurrent ones counted once)
    overlap_ns: int = 0  # of those intervals, the time a compute kernel runs too
    categories: list[dict[str, Any]] = field(default_factory=list)  # as the report's `categories`
    comm_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    comm_names: list[str] = field(default_factory=list)

    def communication(self) -> Communication:
        return Communication(count=self.comm_count, total_ns=self.comm_total_ns,
                             share=self.comm_total_ns / self.total_ns if self.total_ns else None,
                             busy_ns=self.comm_busy_ns, overlap_ns=self.overlap_ns,
                             overlap_share=self.overlap_ns / self.comm_busy_ns if self.comm_busy_ns else None)



def per_device(trace: Trace, window: Window, kernels: list[dict[str, Any]],
               chunk_rows: int = CHUNK_ROWS) -> dict[int, DeviceKernels]:
    """Each device's kernels in `window`; `kernels` is the kernel summary (its rows' name_id and category)."""
    category_of = {row["name_id"]: row["category"] for row in kernels}
    comm_ids = np.array(sorted(i for i, c in category_of.items() if c == COMMUNICATION), dtype=np.int64)
    names = {row["name_id"]: row["name"] for row in kernels if row["category"] == COMMUNICATION}
    span = seq_bounds(trace, "kernels")
    out: dict[int, DeviceKernels] = {}
    comm_parts: dict[int, list[tuple[np.ndarray, ...]]] = {}
    comp_parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    if span is None:
        return out
    by_name: dict[int, dict[int, list[int]]] = {}  # device -> name id -> [count, total ns]
    for lo in range(span[0], span[1] + 1, chunk_rows):
        hi = min(span[1], lo + chunk_rows - 1)
        cols = read_columns(trace, "kernels", {"d": "device", "s": "start", "e": "end", "n": "name_id"},
                            where=f"({window.where('kernels')}) AND seq >= {lo} AND seq <= {hi}",
                            params=window.params, seq_span=(lo, hi))
        d, s, e, n = cols["d"], cols["s"], cols["e"], cols["n"]
        dur = e - s
        is_comm = np.isin(n, comm_ids)
        for device in np.unique(d).tolist():
            on = d == device
            entry = out.setdefault(device, DeviceKernels(device))
            entry.count += int(on.sum())
            entry.total_ns += int(dur[on].sum())
            ids, inverse, counts = np.unique(n[on], return_inverse=True, return_counts=True)
            sums = np.bincount(inverse, weights=dur[on]).tolist()
            for i, c, ns in zip(ids.tolist(), counts.tolist(), sums, strict=True):
                name = by_name.setdefault(device, {}).setdefault(i, [0, 0])
                name[0] += c
                name[1] += int(ns)
            c, p = on & is_comm, on & ~is_comm
            comm_parts.setdefault(device, []).append((s[c], e[c], n[c]))
            comp_parts.setdefault(device, []).append(merge_intervals(s[p], e[p]))  # merged: few rows kept
    for device, entry in out.items():
        entry.categories = category_breakdown([{"category": category_of.get(i, OTHER), "count": c, "total": ns}
                                               for i, (c, ns) in by_name[device].items()])
        cs = np.concatenate([part[0] for part in comm_parts[device]])
        ce = np.concatenate([part[1] for part in comm_parts[device]])
        cn = np.concatenate([part[2] for part in comm_parts[device]])
        order = np.argsort(cs, kind="stable")
        entry.comm_count = len(cs)
        entry.comm_total_ns = int((ce - cs).sum())
        entry.comm_starts = cs[order]
        entry.comm_names = [names.get(i, "?") for i in cn[order].tolist()]
        comm = merge_intervals(cs, ce)
        comp = merge_intervals(np.concatenate([part[0] for part in comp_parts[device]]),
                               np.concatenate([part[1] for part in comp_parts[device]]))
        entry.comm_busy_ns = int((comm[1] - comm[0]).sum())
        entry.overlap_ns = overlap_ns(comm, comp)
    return out


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as disjoint sorted intervals."""
    if not len(starts):
        return starts.copy(), ends.copy()
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], reach[last]


def overlap_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of the intersection of two unions of disjoint intervals (a sweep: +1/-1 for a, +2/-2 for b;
    where the running sum is 3 both are on)."""
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    if not len(times):
        return 0
    steps = np.concatenate([np.full(len(a[0]), 1), np.full(len(a[1]), -1),
                            np.full(len(b[0]), 2), np.full(len(b[1]), -2)])
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(steps[order])
    return int((np.diff(times)[running[:-1] == 3]).sum())


def rank_imbalance(parts: list[RankPart]) -> Imbalance:
    """The report's `imbalance`: busy time across the ranks, and the wait inside collectives."""
    busy = [p.entry.gpu["busy_ns"] or 0 for p in parts]
    collectives = {p.entry.rank: (p.comm_starts, p.comm_names) for p in parts}
    window_ns = {p.entry.rank: p.window_ns for p in parts}
    return Imbalance(BusySpread(min(busy), max(busy), (max(busy) - min(busy)) / max(busy) if max(busy) else None),
                     collective_imbalance(collectives, window_ns))


def collective_imbalance(collectives: dict[Any, tuple[np.ndarray, list[str]]],
                         window_ns: dict[Any, int]) -> CollectiveWait | None:
    """Cross-rank wait inside collectives: `collectives` maps a rank to its communication kernels' starts
    (sorted) and names; `window_ns` each rank's window length. The k-th collective of every rank is matched
    (the sequences are first aligned on their names where the counts differ, e.g. a window that cut one)."""
    ranks = [r for r, (starts, _) in collectives.items() if len(starts)]
    if len(ranks) < 2:
        return None
    ref = ranks[0]
    offsets = {r: _align(collectives[ref][1], collectives[r][1]) for r in ranks}
    begin = max(0, *(-o for o in offsets.values()))
    n = min(len(collectives[r][0]) - offsets[r] for r in ranks) - begin
    if n <= 0:
        return None
    starts = np.stack([collectives[r][0][offsets[r] + begin: offsets[r] + begin + n] for r in ranks])
    names = [collectives[r][1][offsets[r] + begin: offsets[r] + begin + n] for r in ranks]
    same_name = np.mean([all(nm[k] == names[0][k] for nm in names) for k in range(n)])
    arrival = starts.max(axis=0)
    spread = arrival - starts.min(axis=0)
    wait = (arrival[None, :] - starts).sum(axis=1)
    last = np.bincount(starts.argmax(axis=0), minlength=len(ranks))
    rows = [{"rank": r, "wait_ns": int(wait[i]), "wait_share": int(wait[i]) / window_ns[r] if window_ns[r] else None,
             "last_share": float(last[i] / n), "collectives": len(collectives[r][0])} for i, r in enumerate(ranks)]
    top = int(np.argmax(last))
    return CollectiveWait(
        collectives=int(n),
        names_agree=float(same_name),
        spread_ns={"median": float(np.median(spread)), "p90": float(np.quantile(spread, 0.9)),
                   "max": int(spread.max()), "total": int(spread.sum())},
        ranks=rows,
        # The rank that arrives last most often holds the others; named when that is more than chance.
        straggler=Straggler(ranks[top], float(last[top] / n)) if last[top] / n > max(0.5, 1.5 / len(ranks)) else None,
    )


def _align(ref: list[str], other: list[str], max_shift: int = 16) -> int:
    """The shift of `other` against `ref` (other[k + shift] ~ ref[k]) that makes most names agree."""
    if len(ref) == len(other) and ref == other:
        return 0
    best, best_shift = -1, 0
    for shift in range(-max_shift, max_shift + 1):
        lo = max(0, -shift)
        hi = min(len(ref), len(other) - shift)
        if hi - lo <= 0:
            continue
        agree = sum(ref[k] == other[k + shift] for k in range(lo, hi))
        if agree > best or (agree == best and abs(shift) < abs(best_shift)):
            best, best_shift = agree, shift
    return best_shift
