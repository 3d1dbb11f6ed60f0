"""The one read of an nsys export's kernel and CUDA API tables, and what each analysis takes from it (issue 41).

Where the export's large tables were opened with their checks deferred (traces/scan.py), each is read once, a chunk
at a time, and every analysis that needs its rows takes them from that read:
- kernels (`KernelScan`, before the window is chosen): the GPU gaps; the kernel summary's histogram and short names
  per GPU-active segment (the stretches between idle times >= PHASE_GAP_NS on every GPU at once), so that the
  window `auto` picks (a phase: whole segments) or `all` is a merge of segments; an explicit window is filtered on
  the read itself; the eager kernels' (correlation, pid, start), spilled to a temporary file for launch latency,
  whose sample stride is known only once the window is; the engine-step marker kernels;
- CUDA API calls (`ApiScan`, once the window and the launch sample's stride are known): the API summary's
  histogram and the launch sample's calls.
Each product equals what the analysis's own read gives, row for row. Where one cannot be given (a window that is
no whole segments, an id the packing cannot hold) the analysis reads as before.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profkit.analysis.gaps import GapSweep, memops_in_start_order
from profkit.analysis.seq import SEQ_INDEX, SPARSE
from profkit.analysis.stats import Rows, _pairs
from profkit.analysis.window import PHASE_GAP_NS, Window
from profkit.traces.columns import NULL_INT
from profkit.traces.schema import OneRead, Trace

KERNEL_SCAN = "kernel scan"  # the trace cache's keys
API_SCAN = "api scan"
# Rows of merged histogram parts a slot holds before merging them again: memory stays the distinct pairs.
MERGE_ROWS = 1 << 18
ID_BITS = 31  # name and short-name ids packed in pairs: string ids of real exports are far below


class Histogram:
    """(id, value) -> count and graph count, added a batch at a time; parts are merged whenever they hold more than
    MERGE_ROWS rows, so memory stays the distinct pairs. `parts` is None once a batch could not be packed (a negative
    id or value, too many bits): the analysis's own read counts then."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] | None = []
        self.rows = 0

    def add(self, key: np.ndarray, value: np.ndarray, graph: np.ndarray) -> None:
        if self.parts is None or not len(key):
            return
        part = None if key.min() < 0 or value.min() < 0 else _pairs(key, value, [graph])
        if part is None:
            self.parts = None
            return
        self.parts.append((part[0], part[1], part[2], part[3][0]))
        self.rows += len(part[0])
        if self.rows > MERGE_ROWS and len(self.parts) > 1:
            merged = _merge(self.parts)
            self.parts, self.rows = ([merged], len(merged[0])) if merged is not None else (None, 0)


@dataclass
class Slot:
    """The kernels of one GPU-active segment (or of an explicit window): the histogram of (name id, duration) with
    the graph-launched count, the (name id, short-name id) pairs, and the last kernel held apart (it alone can start
    at the segment's end, which a window that ends there leaves out)."""

    start: int
    end: int = 0
    histogram: Histogram = field(default_factory=Histogram)
    shorts: set[int] = field(default_factory=set)
    last: tuple[int, ...] | None = None  # name id, duration, graph, short id, start

    @property
    def ok(self) -> bool:
        return self.histogram.parts is not None

    def add(self, name: np.ndarray, dur: np.ndarray, graph: np.ndarray, short: np.ndarray, start: np.ndarray) -> None:
        if not self.ok or not len(name):
            return
        if self.last is not None:
            held = self.last
            name, dur = np.r_[held[0], name], np.r_[held[1], dur]
            graph, short, start = np.r_[held[2], graph], np.r_[held[3], short], np.r_[held[4], start]
        self.last = (int(name[-1]), int(dur[-1]), int(graph[-1]), int(short[-1]), int(start[-1]))
        self.count(name[:-1], dur[:-1], graph[:-1], short[:-1])

    def count(self, name: np.ndarray, dur: np.ndarray, graph: np.ndarray, short: np.ndarray) -> None:
        if not len(name) or not self.ok:
            return
        if short.min() < 0 or max(name.max(), short.max()) >> ID_BITS:
            self.histogram.parts = None  # the analysis's own read handles what the packing cannot
            return
        self.histogram.add(name, dur, graph)
        if self.ok:
            self.shorts.update(np.unique((name << ID_BITS) | short).tolist())


def _merge(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...] | None:
    """One histogram part of many, merged MERGE_ROWS rows at a time (memory: that many, not all parts at once)."""
    done: tuple[np.ndarray, ...] | None = None
    group: list[tuple[np.ndarray, ...]] = []
    held = 0
    for i, part in enumerate(parts):
        group.append(part)
        held += len(part[0])
        if held < MERGE_ROWS and i < len(parts) - 1:
            continue
        if done is not None:
            group.insert(0, done)
        k, v, c, g = (np.concatenate([p[j] for p in group]) for j in range(4))
        merged = _pairs(k, v, [g], weights=c)
        if merged is None:
            return None
        done, group, held = (merged[0], merged[1], merged[2], merged[3][0]), [], len(merged[0])
    return done


class KernelScan:
    """The kernel table's one read (see the module's doc). `window`: an explicit window known before the read (its
    kernels are counted on the read); None for `all` and `auto` (counted per segment)."""

    def __init__(self, trace: Trace, read: OneRead, window: Window | None, markers: list[int]) -> None:
        self.slots: list[Slot] = []  # one per GPU-active segment
        self.window_slot = Slot(start=window.start_ns, end=window.end_ns) if window is not None else None
        self.summaries: dict[Window, Rows | None] = {}  # asked twice: the launch stride, then the kernel summary
        self.marker_ids = np.array(sorted(markers), dtype=np.int64)
        marks: list[dict[str, np.ndarray]] = []
        self.spill = tempfile.TemporaryFile(prefix="profkit-launch-")  # noqa: SIM115 - closed with the trace
        self.spilled = 0
        sweep = GapSweep(memops_in_start_order(trace, arrow=True))
        self.reach: int | None = None  # the latest end of every operation so far, on any GPU
        sparse: list[tuple[np.ndarray, np.ndarray]] = []
        for chunk in read.chunks:
            sparse.append((chunk["seq"][::SPARSE].copy(), chunk["start"][::SPARSE].copy()))
            ops = sweep.add(chunk)
            if ops is not None:
                self._segments(chunk, ops)
            self._keep(chunk)
            if len(self.marker_ids):
                on = np.isin(chunk["name_id"], self.marker_ids)
                marks.append({k: chunk[k][on] for k in ("name_id", "start", "end", "device")})
        rest = sweep.rest()
        if rest is not None:
            self._segments(None, rest)
        self.gaps = sweep.result()
        self.sparse = _sparse(sparse)
        if self.slots and self.reach is not None:
            self.slots[-1].end = int(self.reach)
        self.markers = {k: np.concatenate([m[k] for m in marks]) for k in ("name_id", "start", "end", "device")} \
            if marks else None

    def _segments(self, chunk: dict[str, np.ndarray] | None, ops: dict[str, np.ndarray]) -> None:
        """Split the segments at idle times >= PHASE_GAP_NS of every GPU (the union of the operations), and give each
        kernel of `chunk` (the first rows of `ops`) its segment's slot."""
        order = np.argsort(ops["start"], kind="stable")
        s, e = ops["start"][order], ops["end"][order]
        first = self.reach is None
        carry = int(s[0]) if self.reach is None else self.reach
        reach = np.maximum(np.maximum.accumulate(e), carry)
        before = np.r_[carry, reach[:-1]]
        cut = s - before >= PHASE_GAP_NS
        if first:
            cut[0] = True
        cuts = np.flatnonzero(cut)
        segment = np.cumsum(cut) + len(self.slots) - 1  # each operation's slot index, in start order
        for i in cuts.tolist():
            if self.slots:
                self.slots[-1].end = int(before[i])
            self.slots.append(Slot(start=int(s[i])))
        self.reach = int(reach[-1])
        if chunk is None or self.window_slot is not None:
            return
        n = len(chunk["start"])
        of_row = np.empty(len(order), dtype=np.int64)
        of_row[order] = segment
        kernel_slot = of_row[:n]  # kernels are in start order: their slots never decrease
        bounds = np.flatnonzero(np.r_[True, kernel_slot[1:] != kernel_slot[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            self.slots[int(kernel_slot[a])].add(*self._fields(chunk, slice(a, b)))

    def _fields(self, chunk: dict[str, np.ndarray], rows: Any) -> tuple[np.ndarray, ...]:
        return (chunk["name_id"][rows], chunk["end"][rows] - chunk["start"][rows],
                (chunk["graph_node"][rows] != NULL_INT).astype(np.int64) if "graph_node" in chunk
                else np.zeros(len(chunk["start"][rows]), dtype=np.int64),
                chunk["short_id"][rows], chunk["start"][rows])

    def _keep(self, chunk: dict[str, np.ndarray]) -> None:
        """What the window and launch latency take later: an explicit window's kernels, the eager kernels."""
        if self.window_slot is not None:
            start = chunk["start"]
            inside = (start >= self.window_slot.start) & (start < self.window_slot.end)
            self.window_slot.count(*self._fields(chunk, inside)[:4])  # filtered: no last kernel held apart
        eager = chunk["correlation"] != NULL_INT if "correlation" in chunk else None
        if eager is None:
            return
        if "graph_node" in chunk:
            eager &= chunk["graph_node"] == NULL_INT
        pid = chunk.get("pid")
        rows = np.stack([chunk["correlation"][eager], pid[eager] if pid is not None else
                         np.full(int(eager.sum()), NULL_INT, dtype=np.int64), chunk["start"][eager]], axis=1)
        self.spill.write(np.ascontiguousarray(rows, dtype=np.int64).tobytes())
        self.spilled += len(rows)

    def summary(self, window: Window) -> Rows | None:
        """The window's (name id, duration, count, graph count) histogram rows in (name id, duration) order, as
        `stats.columnar_histogram` gives them; None where this read cannot give them."""
        if window not in self.summaries:
            self.summaries[window] = self._summary(window)
        return self.summaries[window]

    def _summary(self, window: Window) -> Rows | None:
        chosen = self._chosen(window)
        if chosen is None:
            return None
        parts = [p for s in chosen[0] for p in s.histogram.parts or ()]
        parts += [(np.array([n]), np.array([d]), np.array([1]), np.array([g])) for n, d, g, _, _ in chosen[1]]
        if not parts:
            return []
        merged = _merge(parts)
        if merged is None:
            return None
        k, v, c, g = merged
        return list(zip(k.tolist(), v.tolist(), c.tolist(), g.tolist(), strict=True))

    def short_pairs(self, window: Window) -> set[tuple[int, int]] | None:
        """The window's distinct (name id, short-name id) pairs."""
        chosen = self._chosen(window)
        if chosen is None:
            return None
        held = ((n << ID_BITS) | short for n, _, _, short, _ in chosen[1])
        packed = set().union(*(s.shorts for s in chosen[0]), held)
        mask = (1 << ID_BITS) - 1
        return {(p >> ID_BITS, p & mask) for p in packed}

    def _chosen(self, window: Window) -> tuple[list[Slot], list[tuple[int, ...]]] | None:
        """The slots that make up `window` exactly, and the last kernels they held apart that the window keeps (all
        but one starting at its end)."""
        if self.window_slot is not None:
            slot = self.window_slot
            same = window.bounded and (window.start_ns, window.end_ns) == (slot.start, slot.end)
            return ([slot], []) if same and slot.ok else None
        if not window.bounded:
            chosen = self.slots
        else:
            starts = [s.start for s in self.slots]
            if window.start_ns not in starts:
                return None
            i = starts.index(window.start_ns)
            ends = [j for j in range(i, len(self.slots)) if self.slots[j].end == window.end_ns]
            if not ends:
                return None
            chosen = self.slots[i:ends[0] + 1]
        if not all(s.ok for s in chosen):
            return None
        kept = [s.last for s in chosen if s.last is not None and not (window.bounded and s.last[4] >= window.end_ns)]
        return chosen, kept

    def launch_kernels(self, window: Window, step: int) -> dict[str, np.ndarray]:
        """The eager kernels in `window` whose correlation id is a multiple of `step` (launch latency's sample), in
        start order: {"c", "p", "s"}."""
        self.spill.flush()
        parts, block = [], 1 << 20
        for first in range(0, self.spilled, block):
            self.spill.seek(first * 24)
            rows = np.fromfile(self.spill, dtype=np.int64, count=3 * min(block, self.spilled - first)).reshape(-1, 3)
            keep = rows[:, 0] % step == 0
            if window.bounded:
                keep &= (rows[:, 2] >= window.start_ns) & (rows[:, 2] < window.end_ns)
            parts.append(rows[keep])
        rows = np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)
        return {"c": rows[:, 0].copy(), "p": rows[:, 1].copy(), "s": rows[:, 2].copy()}

    def marker_rows(self, names: list[int], device: int, lo: int, hi: int) -> dict[str, np.ndarray] | None:
        """The marker kernels of `names` on `device` starting in [lo, hi), in start order ({"n", "s", "e"}); None
        where the read did not keep those names."""
        if not set(names) <= set(self.marker_ids.tolist()):
            return None
        m = self.markers or {k: np.zeros(0, dtype=np.int64) for k in ("name_id", "start", "end", "device")}
        on = np.isin(m["name_id"], names) & (m["device"] == device) & (m["start"] >= lo) & (m["start"] < hi)
        return {"n": m["name_id"][on], "s": m["start"][on], "e": m["end"][on]}

    def close(self) -> None:
        self.spill.close()


def _sparse(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every SPARSE-th row's seq and start, for `seq.first_seq_at` (the read checked their order)."""
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def kernel_scan(trace: Trace, window: Window | None, markers: list[int]) -> KernelScan | None:
    """The kernel table's one read, made once per trace (its checks with it); None where its checks were not
    deferred (the analyses read as before)."""
    if KERNEL_SCAN not in trace.cache:
        read = trace.one_read("kernels")
        if read is None:
            return None
        scan = KernelScan(trace, read, window, markers)
        trace.cache[KERNEL_SCAN] = scan
        trace.cache["gaps"] = scan.gaps
        trace.cache[SEQ_INDEX.format("kernels")] = scan.sparse
    return trace.cache[KERNEL_SCAN]


@dataclass
class ApiScan:
    """The CUDA API table's one read for a window: its (name id, duration, count) histogram and the launch sample's
    calls (correlation id a multiple of `step`, in the seq range `rows`), {"c", "p", "s", "e"}."""

    window: Window
    step: int | None
    histogram: Rows | None
    launch: dict[str, np.ndarray] | None


def api_scan(trace: Trace, window: Window, step: int | None, rows: tuple[int, int] | None) -> ApiScan | None:
    """Read the CUDA API table once for `window` (its checks with it); None where its checks were not deferred."""
    if API_SCAN in trace.cache:
        return trace.cache[API_SCAN]
    read = trace.one_read("api")
    if read is None:
        return None
    counted = Histogram()
    sample, sparse = [], []
    for chunk in read.chunks:
        start, name = chunk["start"], chunk["name_id"]
        sparse.append((chunk["seq"][::SPARSE].copy(), start[::SPARSE].copy()))
        inside = (start >= window.start_ns) & (start < window.end_ns) if window.bounded else slice(None)
        k = name[inside]
        counted.add(k, chunk["end"][inside] - start[inside], np.zeros(len(k), dtype=np.int64))  # no graph launches
        if step is not None and "correlation" in chunk:
            c = chunk["correlation"]
            pick = (c != NULL_INT) & (c % step == 0)
            if rows is not None:
                pick &= (chunk["seq"] >= rows[0]) & (chunk["seq"] <= rows[1])
            pid = chunk.get("pid")
            sample.append({"c": c[pick], "p": pid[pick] if pid is not None else
                           np.full(int(pick.sum()), NULL_INT, dtype=np.int64),
                           "s": start[pick], "e": chunk["end"][pick]})
    histogram: Rows | None = None
    if counted.parts is not None:
        merged = _merge(counted.parts) if counted.parts else None
        if merged is not None:
            histogram = list(zip(merged[0].tolist(), merged[1].tolist(), merged[2].tolist(), strict=True))
        elif not counted.parts:
            histogram = []
    launch = {k: np.concatenate([s[k] for s in sample]) for k in ("c", "p", "s", "e")} if sample else None
    if step is not None and launch is None and "correlation" in read.columns:
        launch = {k: np.zeros(0, dtype=np.int64) for k in ("c", "p", "s", "e")}
    found = ApiScan(window, step, histogram, launch)
    trace.cache[SEQ_INDEX.format("api")] = _sparse(sparse)
    trace.cache[API_SCAN] = found
    return found
