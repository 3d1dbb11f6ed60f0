"""Every GPU idle gap of a trace, per device, as sorted numpy arrays: one read of the GPU operations.

A device is idle between two operations when the next one starts after every earlier one has ended: over
the operations (kernels and memory operations) sorted by start, a gap runs from the running maximum of
the ends to the next start. The gaps of a device never overlap and are kept sorted by start with a prefix
sum of their lengths, so the idle time of any time range is two binary searches and a subtraction
(`idle_in`), for one range or for a thousand at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from profkit.traces.columns import read_columns
from profkit.traces.schema import Trace


@dataclass
class DeviceGaps:
    device: int
    first: int  # first operation's start
    last: int  # latest operation end
    start: np.ndarray  # gap starts, ascending
    end: np.ndarray
    cum: np.ndarray = field(repr=False)  # cum[i]: total length of gaps [0, i)

    def idle_in(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Idle ns in each [lo, hi): the gaps clipped to it, and the time before the device's first and
        after its last operation, at most hi - lo."""
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        a = np.searchsorted(self.start, lo, side="left")
        b = np.searchsorted(self.start, hi, side="left")
        n = len(self.start)
        inside = self.cum[b] - self.cum[a]
        # only the last gap starting inside can reach past hi (gaps never overlap)
        last_end = self.end[np.clip(b - 1, 0, max(n - 1, 0))] if n else np.zeros_like(lo)
        inside = inside - np.where(b > a, np.maximum(0, last_end - hi), 0)
        # the gap starting before lo may reach into the range
        prev_end = self.end[np.clip(a - 1, 0, max(n - 1, 0))] if n else np.zeros_like(lo)
        before = np.where(a > 0, np.maximum(0, np.minimum(prev_end, hi) - lo), 0)
        outside = np.maximum(0, np.minimum(self.first, hi) - lo) + np.maximum(0, hi - np.maximum(self.last, lo))
        return np.minimum(inside + before + outside, np.maximum(0, hi - lo))


@dataclass
class GpuGaps:
    devices: dict[int, DeviceGaps]

    @property
    def first(self) -> int:
        return min(d.first for d in self.devices.values())

    @property
    def last(self) -> int:
        return max(d.last for d in self.devices.values())


def gpu_gaps(trace: Trace) -> GpuGaps:
    """The gaps of `trace` (computed once, then shared by the trace's analyses)."""
    if "gaps" not in trace.cache:
        trace.cache["gaps"] = _compute(trace)
    return trace.cache["gaps"]


# GPU operations per read: memory stays a chunk's columns plus the gaps found so far.
CHUNK_ROWS = 1 << 19


def _compute(trace: Trace, chunk_rows: int = CHUNK_ROWS) -> GpuGaps:
    """The kernels are read in seq ranges (seq order is start order: the readers guarantee it) and the memory
    operations (few) at once; each range is merged with the memory operations that start no later than its
    last kernel, and the running maximum of the ends carries from range to range, per device."""
    from profkit.analysis.seq import seq_bounds

    cols = {"start": "start", "end": "end", "device": "device"}
    sweep = GapSweep(memops_in_start_order(trace))
    span = seq_bounds(trace, "kernels")
    if span is not None:
        for lo in range(span[0], span[1] + 1, chunk_rows):
            hi = min(span[1], lo + chunk_rows - 1)
            sweep.add(read_columns(trace, "kernels", cols, where=f"seq >= {lo} AND seq <= {hi}", seq_span=(lo, hi)))
    return sweep.result()


def memops_in_start_order(trace: Trace, arrow: bool = False) -> dict[str, np.ndarray]:
    """Every memory operation's start, end and device, sorted by start (stable). `arrow`: read through Arrow
    whatever their number (its driver already loaded: a serve trace's 340k memory operations as Python rows cost
    ~40 MB at the report's peak)."""
    rows = trace.query("SELECT count(*) FROM memops")[0][0] if arrow and trace.has("memops") else 0
    m = read_columns(trace, "memops", {"start": "start", "end": "end", "device": "device"}, rows_hint=rows,
                     arrow=rows > 0)
    order = np.argsort(m["start"], kind="stable")
    return {k: v[order] for k, v in m.items()}


class GapSweep:
    """The gaps found so far, fed kernels in start order a chunk at a time; each chunk is merged with the memory
    operations that start no later than its last kernel (those after the last chunk at the end)."""

    def __init__(self, memops: dict[str, np.ndarray]) -> None:
        self.memops, self.taken = memops, 0
        self.state: dict[int, _Sweep] = {}

    def add(self, kernels: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Fold a chunk of kernels in; returns the operations folded (kernels first, then memory operations)."""
        if not len(kernels["start"]):
            return None
        m = self.memops
        upto = int(np.searchsorted(m["start"], kernels["start"][-1], side="right"))
        ops = {c: np.concatenate([kernels[c], m[c][self.taken:upto]]) for c in ("start", "end", "device")}
        self.taken = upto
        _sweep(self.state, ops)
        return ops

    def rest(self) -> dict[str, np.ndarray] | None:
        """Fold in the memory operations after the last kernel; returns them."""
        if self.taken >= len(self.memops["start"]):
            return None
        ops = {c: v[self.taken:] for c, v in self.memops.items()}
        self.taken = len(self.memops["start"])
        _sweep(self.state, ops)
        return ops

    def result(self) -> GpuGaps:
        self.rest()
        return GpuGaps({d: sw.result(d) for d, sw in sorted(self.state.items())})


@dataclass
class _Sweep:
    """One device's pass so far: its first start, the latest end, and the gaps found."""

    first: int
    reach: int
    starts: list[np.ndarray] = field(default_factory=list)
    ends: list[np.ndarray] = field(default_factory=list)

    def result(self, device: int) -> DeviceGaps:
        g0 = np.concatenate(self.starts) if self.starts else np.zeros(0, dtype=np.int64)
        g1 = np.concatenate(self.ends) if self.ends else np.zeros(0, dtype=np.int64)
        return DeviceGaps(device, self.first, self.reach, g0, g1,
                          np.concatenate([[0], np.cumsum(g1 - g0)]).astype(np.int64))


def _sweep(state: dict[int, _Sweep], ops: dict[str, np.ndarray]) -> None:
    """Fold a batch of operations (each starting no earlier than any of an earlier batch) into `state`."""
    devices = np.unique(ops["device"])
    for d in devices.tolist():
        if len(devices) > 1:
            mask = ops["device"] == d
            s, e = ops["start"][mask], ops["end"][mask]
        else:
            s, e = ops["start"], ops["end"]
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        sw = state.get(d)
        if sw is None:
            sw = state[d] = _Sweep(first=int(s[0]), reach=int(s[0]))
        reach = np.maximum(np.maximum.accumulate(e), sw.reach)  # the latest end so far, this batch included
        before = np.concatenate([[sw.reach], reach[:-1]])  # for each operation: the latest end before it
        opens = s > before
        sw.starts.append(before[opens])
        sw.ends.append(s[opens])
        sw.reach = int(reach[-1])
