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
from profkit.traces.model import Trace


@dataclass
class DeviceGaps:
    device: int
    first: int  # first operation's start
    last: int  # latest operation end
    start: np.ndarray  # gap starts, ascending
    end: np.ndarray
    cum: np.ndarray = field(repr=False)  # cum[i]: total length of gaps [0, i)

    @property
    def length(self) -> np.ndarray:
        return self.end - self.start

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

    def covering(self, t: int) -> int | None:
        """Index of the last gap starting at or before t, or None."""
        i = int(np.searchsorted(self.start, t, side="right")) - 1
        return i if i >= 0 else None


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


def _compute(trace: Trace) -> GpuGaps:
    from profkit.analysis.seq import seq_bounds

    cols = {"start": "start", "end": "end", "device": "device"}
    k = read_columns(trace, "kernels", cols, seq_span=seq_bounds(trace, "kernels"))
    m = read_columns(trace, "memops", cols)
    start = np.concatenate([k["start"], m["start"]])
    end = np.concatenate([k["end"], m["end"]])
    device = np.concatenate([k["device"], m["device"]])
    del k, m
    out = {}
    for d in np.unique(device):
        mask = device == d
        s, e = start[mask], end[mask]
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)  # the latest end so far
        opens = s[1:] > reach[:-1]
        g0, g1 = reach[:-1][opens], s[1:][opens]
        out[int(d)] = DeviceGaps(int(d), int(s[0]), int(reach[-1]), g0, g1,
                                 np.concatenate([[0], np.cumsum(g1 - g0)]).astype(np.int64))
    return GpuGaps(out)
