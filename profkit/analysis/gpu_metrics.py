"""What the GPU's own counters say (the trace's `gpu_metrics`, read by `profkit.traces.gpu_metrics`), over time
ranges and kernels.

Statistics are plain sample statistics, unweighted, as NVIDIA's recipe `gpu_metric_util_sum` computes them: at a
fixed sampling rate each sample stands for the same time, so the mean of the samples is the time mean. A sample
belongs to a time range when its timestamp falls inside it, ends included ("binary inclusion", the recipe's
`--per-kernel` rule); a sample inside several overlapping ranges counts once.

Everything here is sorted-array work (searchsorted, prefix maxima, bincount) over the series' numpy columns:
no Python loop over samples or kernels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from profkit.analysis.categories import categorize
from profkit.analysis.steps import step_spans
from profkit.analysis.window import Window
from profkit.traces.columns import read_columns
from profkit.traces.gpu_metrics import GpuMetrics, MetricSeries, open_gpu_metrics, read_gpu_metrics
from profkit.traces.schema import GPU_COUNTERS, Trace

MEMORY_OPERATION = "memory copy/set"  # trace_gpu_metrics: samples under a memcpy/memset
NO_KERNEL = "no kernel"  # samples taken while no kernel of the device ran (by_category)
P90 = 90


def stats(values: np.ndarray) -> dict[str, float | int | None]:
    """samples, mean, median, p90 of `values` (percentiles interpolated linearly, as pandas and numpy do)."""
    if len(values) == 0:
        return {"samples": 0, "mean": None, "median": None, "p90": None}
    return {"samples": int(len(values)), "mean": float(np.mean(values)), "median": float(np.median(values)),
            "p90": float(np.percentile(values, P90))}


def summary(metrics: GpuMetrics, device: int) -> dict[str, dict[str, float | int | str | None]]:
    """{metric: {name, samples, mean, median, p90}} for every metric profkit reads, on GPU `device`; a metric the
    export did not record has name None and 0 samples."""
    out: dict[str, dict[str, float | int | str | None]] = {}
    for metric in GPU_COUNTERS:
        series = metrics.get(device, metric)
        values = series.values if series is not None else np.empty(0)
        out[metric] = {"name": series.name if series is not None else None, **stats(values)}
    return out


def inside(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Boolean mask: which of `times` fall inside at least one [start, end] (ends included; ranges may overlap,
    come in any order; a range whose end precedes its start holds nothing).

    Over the ranges sorted by start, the latest end among those starting at or before t tells whether any of them
    still covers t: one prefix maximum and one binary search per time."""
    times = np.asarray(times, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(starts) == 0 or len(times) == 0:
        return np.zeros(len(times), dtype=bool)
    order = np.argsort(starts, kind="stable")
    sorted_starts = starts[order]
    latest_end = np.maximum.accumulate(ends[order])
    last_started = np.searchsorted(sorted_starts, times, side="right") - 1
    covered = latest_end[np.clip(last_started, 0, None)] >= times
    return (last_started >= 0) & covered


def within(metrics: GpuMetrics, starts: np.ndarray, ends: np.ndarray, device: int | None = None) -> GpuMetrics:
    """`metrics` restricted to the samples inside the ranges [starts[i], ends[i]] (see `inside`): every GPU's, or
    only `device`'s. `summary(within(m, kernel_starts, kernel_ends, gpu), gpu)` is the recipe's per-kernel view
    pooled over all kernels."""
    series: dict[int, dict[str, MetricSeries]] = {}
    for gpu, by_metric in metrics.series.items():
        if device is not None and gpu != device:
            continue
        series[gpu] = {}
        for metric, s in by_metric.items():
            keep = inside(s.timestamps, starts, ends)
            series[gpu][metric] = MetricSeries(name=s.name, timestamps=s.timestamps[keep], values=s.values[keep])
    return replace(metrics, series=series)


def running_kernel(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each of `times`, the index (into `starts`) of the kernel running then, ends included; where kernels
    run concurrently, the one that started last (equal starts: the later in the arrays); -1 where none runs.

    With the kernels sorted by start, the answer for t is the last kernel starting at or before t whose end is
    at or after t. A max-tree over the ends (level k: the latest end in each aligned block of 2^k kernels, 2n
    values in all) finds it for all times at once: walk left from t's last-started kernel over the aligned
    blocks that make up [0, i] (the largest first: at most log n of them) until one holds an end >= t, then
    descend into that block, right child first. Both loops run log n vectorised steps, whatever the overlap."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    times = np.asarray(times, dtype=np.int64)
    found = np.full(len(times), -1, dtype=np.int64)
    if len(starts) == 0 or len(times) == 0:
        return found
    order = np.argsort(starts, kind="stable")
    sorted_ends = ends[order]
    last_started = np.searchsorted(starts[order], times, side="right") - 1
    ok = last_started >= 0
    # most samples settle at once: the last-started kernel still runs, or no kernel started before runs at all
    runs = ok.copy()
    runs[ok] = sorted_ends[last_started[ok]] >= times[ok]
    found[runs] = order[last_started[runs]]
    any_runs = ok.copy()
    any_runs[ok] = np.maximum.accumulate(sorted_ends)[last_started[ok]] >= times[ok]
    query = np.flatnonzero(any_runs & ~runs)  # an earlier, longer kernel runs: search the max-tree
    if len(query) == 0:
        return found
    levels = [sorted_ends]
    while len(levels[-1]) > 1:
        below = levels[-1]
        if len(below) % 2:  # a padding end before every time: it never answers
            below = np.append(below, np.iinfo(np.int64).min)
        levels.append(np.maximum(below[0::2], below[1::2]))
    offsets = np.cumsum([0] + [len(level) for level in levels])
    tree = np.concatenate(levels)  # level k's block b is tree[offsets[k] + b]

    pos, t = last_started[query] - 1, times[query]  # the last-started one does not run
    block_level = np.full(len(query), -1, dtype=np.int64)
    block = np.zeros(len(query), dtype=np.int64)
    active = np.flatnonzero(pos >= 0)
    while len(active):  # the aligned blocks covering [0, pos], right to left
        p = pos[active]
        lowbit = (p + 1) & -(p + 1)  # the largest aligned block ending at p has lowbit(p + 1) kernels
        k = np.frexp(lowbit.astype(np.float64))[1].astype(np.int64) - 1  # exact: lowbit is a power of two
        hit = tree[offsets[k] + (p >> k)] >= t[active]
        block_level[active[hit]] = k[hit]
        block[active[hit]] = p[hit] >> k[hit]
        pos[active[~hit]] = p[~hit] - lowbit[~hit]
        active = active[~hit & (pos[active] >= 0)]
    active = np.flatnonzero(block_level > 0)
    while len(active):  # into the block, the right child when it holds an end >= t
        k = block_level[active] - 1
        right = 2 * block[active] + 1
        go_right = tree[offsets[k] + right] >= t[active]
        block[active] = np.where(go_right, right, right - 1)
        block_level[active] = k
        active = active[k > 0]
    answered = block_level == 0
    found[query[answered]] = order[block[answered]]
    return found


def by_category(metrics: GpuMetrics, device: int, starts: np.ndarray, ends: np.ndarray,
                category_codes: np.ndarray, category_names: Sequence[str]) -> dict[str, dict[str, dict]]:
    """{category: {metric: {samples, mean}}}: each sample of GPU `device` given to the category of the kernel
    running then (`running_kernel`; kernel i's category is category_names[category_codes[i]]), samples with no
    kernel running to NO_KERNEL. The kernels must be that device's. Categories without a sample are absent."""
    codes = np.asarray(category_codes, dtype=np.int64)
    labels = [*category_names, NO_KERNEL]
    idle = len(category_names)
    out: dict[str, dict[str, dict]] = {}
    for metric in GPU_COUNTERS:
        series = metrics.get(device, metric)
        if series is None or len(series) == 0:
            continue
        kernel = running_kernel(starts, ends, series.timestamps)
        sample_codes = np.where(kernel >= 0, codes[np.clip(kernel, 0, None)], idle) if len(codes) else \
            np.full(len(kernel), idle)
        counts = np.bincount(sample_codes, minlength=len(labels))
        sums = np.bincount(sample_codes, weights=series.values, minlength=len(labels))
        for code in np.flatnonzero(counts):
            out.setdefault(labels[code], {})[metric] = {"samples": int(counts[code]),
                                                         "mean": float(sums[code] / counts[code])}
    return out


def metrics_section(metrics: GpuMetrics | None, source: str | None = None, device: int | None = None,
                    phases: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                    kernels: tuple[np.ndarray, np.ndarray, np.ndarray, Sequence[str]] | None = None
                    ) -> dict[str, Any] | None:
    """The report's GPU-metrics section (None without metrics), plain JSON values:

    - `window`: {metric: mean %} over every sample read, the GPUs pooled (or GPU `device`'s alone): at one
      sampling rate each GPU weighs the same, so a tensor-parallel run reads as the average of its GPUs;
    - `gpus`: [{gpu, name, metrics: summary()}] per GPU;
    - `phases`: [{phase, metric: mean %, samples: {metric: n}}] for named time ranges of GPU `device` (the first
      GPU when None), e.g. {"prefill-bearing": (starts, ends), "decode-only": (starts, ends)} of engine steps;
    - `categories`: by_category() for `kernels` = (starts, ends, category codes, category names) of that GPU;
    - `left_out`, `said`: the rows the reader could not use."""
    if metrics is None:
        return None
    gpus = [g for g in metrics.gpus if device is None or g == device]
    window: dict[str, float | None] = {}
    for metric in GPU_COUNTERS:
        pooled = [s.values for g in gpus if (s := metrics.get(g, metric)) is not None]
        window[metric] = stats(np.concatenate(pooled) if pooled else np.empty(0))["mean"]
    phase_gpu = device if device is not None else (gpus[0] if gpus else None)
    phase_rows = []
    for phase, (starts, ends) in (phases or {}).items():
        if phase_gpu is None:
            break
        inside_phase = summary(within(metrics, starts, ends, phase_gpu), phase_gpu)
        phase_rows.append({"phase": phase, **{m: s["mean"] for m, s in inside_phase.items()},
                           "samples": {m: s["samples"] for m, s in inside_phase.items()}})
    categories = (by_category(metrics, phase_gpu, *kernels) if kernels is not None and phase_gpu is not None
                  else None)
    return {"source": source, "window": window,
            "gpus": [{"gpu": g, "name": metrics.gpu_names.get(g), "metrics": summary(metrics, g)} for g in gpus],
            "phases": phase_rows, "categories": categories, "left_out": dict(metrics.left_out),
            "said": metrics.said(), "start_ns": metrics.start_ns, "end_ns": metrics.end_ns}


def trace_gpu_metrics(trace: Trace, win: Window) -> dict[str, Any] | None:
    """The report's GPU-metrics section from a trace that sampled the GPU's counters (nsys
    `--gpu-metrics-devices`; None without them): the samples of the window, split by engine-step phase
    (prefill-bearing / decode-only, where the trace shows steps) and by the category of the kernel running at each
    sample, on the first GPU with kernels."""
    if not trace.has("gpu_metrics"):
        return None
    lo, hi = (win.start_ns, win.end_ns) if win.bounded else (None, None)
    metrics = read_gpu_metrics(trace.conn, lo, hi)
    if metrics is None:
        return None
    spans = step_spans(trace, win)
    devices = [d for (d,) in trace.query(f"SELECT DISTINCT device FROM kernels WHERE {win.where('kernels')}",
                                         win.params)]
    cuda = spans[0] if spans else min(devices) if devices else None
    if cuda is None:
        return metrics_section(metrics, source=str(trace.path))
    # the kernels' CUDA device is the process's; the metrics are keyed by the GPU (CUDA_VISIBLE_DEVICES renumbers)
    by_process = {(pid, c): g for pid, c, g in trace.query("SELECT pid, cuda_device, gpu FROM cuda_devices")}
    gpu_of = {c: g for (_pid, c), g in by_process.items()}
    gpu = gpu_of.get(cuda, cuda)
    gpu = gpu if gpu in metrics.gpus else (metrics.gpus[0] if metrics.gpus else None)
    where = f"{win.where('kernels')} AND device = {int(cuda)}"
    cols = read_columns(trace, "kernels", {"s": "start", "e": "end", "n": "name_id"}, where, win.params)
    ids, inverse = np.unique(cols["n"], return_inverse=True)
    names = trace.strings(int(i) for i in ids)
    by_id = [categorize(names.get(int(i)) or "") for i in ids]
    # memory copies and sets hold the GPU too (a device-to-device copy reads and writes DRAM at full rate)
    ops = trace.query(f"SELECT start, end FROM memops WHERE {win.where('memops')} AND device = {int(cuda)}",
                      win.params) if "memops" in trace.present else []
    categories = sorted(set(by_id) | ({MEMORY_OPERATION} if ops else set()))
    codes = np.array([categories.index(c) for c in by_id], dtype=np.int64)[inverse] if len(ids) else \
        np.empty(0, np.int64)
    starts, ends = cols["s"], cols["e"]
    if ops:
        o = np.array(ops, dtype=np.int64).reshape(-1, 2)
        starts, ends = np.concatenate([starts, o[:, 0]]), np.concatenate([ends, o[:, 1]])
        codes = np.concatenate([codes, np.full(len(o), categories.index(MEMORY_OPERATION), np.int64)])
        order = np.argsort(starts, kind="stable")
        starts, ends, codes = starts[order], ends[order], codes[order]
    kernels = (starts, ends, codes, categories)
    section = metrics_section(metrics, source=str(trace.path), device=None,
                              phases=spans[1] if spans else None, kernels=kernels if gpu is not None else None)
    if section is not None:
        section["device"] = {"cuda": int(cuda), "gpu": gpu}
    return section


def run_gpu_metrics(trace_metrics: dict[str, Any] | None, export: Path | None) -> dict[str, Any] | None:
    """The GPU's own counters over the run: the trace's (split by engine step and kernel), else a capture folder's
    GPU metrics `export` (the benchmark's whole span)."""
    if trace_metrics is not None:
        return trace_metrics
    if export is None:
        return None
    return metrics_section(open_gpu_metrics(export), source=str(export))
