"""One trace's sections: open -> window -> analyses (`TraceSections`), before vLLM's evidence, facts and rules."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from profkit import units
from profkit.analysis import api as api_analysis
from profkit.analysis import timeline
from profkit.analysis.categories import category_breakdown
from profkit.analysis.communication import DeviceKernels, per_device
from profkit.analysis.cpu import cpu_op_summary
from profkit.analysis.gaps import gpu_gaps
from profkit.analysis.gpu_metrics import trace_gpu_metrics
from profkit.analysis.kernels import kernel_summary
from profkit.analysis.launch import api_sample_rows, launch_latency, sample_step
from profkit.analysis.nvtx import nvtx_summary
from profkit.analysis.scans import KERNEL_SCAN, api_scan, kernel_scan
from profkit.analysis.sched import process_cpu
from profkit.analysis.sections import GpuSection, Rank, RankPart, Sections, TraceSections, WindowSection
from profkit.analysis.steps import engine_steps, marker_ids
from profkit.analysis.transfers import memop_summary, memory_kinds
from profkit.analysis.window import Window, choose_window, with_seq_ranges
from profkit.analysis.workload import trace_mentions_vllm
from profkit.errors import TraceError
from profkit.traces import Trace, open_trace
from profkit.traces.scan import Unverified

Progress = Callable[[str], None]
STAT_RENAMES = {"total": "total_ns", "avg": "avg_ns", "median": "median_ns", "min": "min_ns",
                "max": "max_ns", "stddev": "stddev_ns"}
KERNEL_FIELDS = ["name", "short_name", "label", "category", "count", "total_ns", "share", "avg_ns", "median_ns",
                 "min_ns", "max_ns", "stddev_ns", "graph_count", "short_count"]


def trace_sections(path: str | os.PathLike, window: str, gap_threshold_ns: int, buckets: int,
                   step: Progress | None = None, ranks: bool = False) -> TraceSections:
    """The trace's sections. `ranks`: give the per-device part even for a single GPU (the trace is one rank of
    several)."""
    try:
        try:
            return _build(path, window, gap_threshold_ns, buckets, step or (lambda _name: None), ranks, defer=True)
        except Unverified:  # a check left to a table's one read failed: open it with the SQL checks, which say why
            return _build(path, window, gap_threshold_ns, buckets, step or (lambda _name: None), ranks, defer=False)
    except sqlite3.DatabaseError as exc:
        # A truncated or corrupt export can open fine and fail deep inside a query.
        raise TraceError(f"{path}: damaged or unreadable trace database ({exc})") from None


def _window_meets_the_work(path: str | os.PathLike, win: Window, gaps: Any) -> None:
    """A window given by hand that misses the GPU's work entirely is a mistake (its units, another trace's times), not
    an idle GPU: one line, where the report would have said 0 % busy and fired low-utilization."""
    if win.end_ns <= gaps.first or win.start_ns >= gaps.last:
        raise TraceError(f"{path}: --window {win.start_ns}ns:{win.end_ns}ns holds none of the trace's GPU work, "
                         f"which runs over {gaps.first}ns:{gaps.last}ns ({units.ns(gaps.last - gaps.first)}; the "
                         "trace's own timestamps)")


def _build(path: str | os.PathLike, window: str, gap_threshold_ns: int, buckets: int,
           step: Progress, ranks: bool = False, defer: bool = False) -> TraceSections:
    step("open trace")
    with open_trace(path, defer=defer) as trace:
        step("GPU timeline")
        auto = window.strip() == "auto"
        # The kernel table's one read, where its checks were left to it: the gaps, and what the window's analyses
        # take (analysis/scans.py). An explicit window is known before it; `auto` and `all` are whole segments.
        if trace.deferred:
            known = None if window.strip() in ("auto", "all") else choose_window(trace, window)
            kernel_scan(trace, known, [i for i in marker_ids(trace).values() if isinstance(i, int)])
        phases: list[dict[str, Any]] = []
        if auto:  # the automatic window needs the GPU's gaps first (its phases split at long ones)
            phases = timeline.phases(trace)
        win = with_seq_ranges(trace, choose_window(trace, window, phases))
        if win.how == "explicit":  # before the analyses: a window that misses the work is one line, at once
            _window_meets_the_work(path, win, gpu_gaps(trace))
        # The per-table summaries are independent scans: run them on their own connections while
        # this one builds the timeline (sqlite3 releases the GIL while a query runs).
        with ThreadPoolExecutor(max_workers=2) as pool:
            gpu_side = pool.submit(_gpu_side, trace, win)
            host_side = pool.submit(_host_side, trace, win, _launch_step(trace, win))
            gpu_gaps(trace)  # computed once, on this connection, and cached for the analyses below
            steps = engine_steps(trace, win)
            gpu_metrics = trace_gpu_metrics(trace, win)  # nsys --gpu-metrics-devices: by phase and kernel category
            step("kernels")
            kernels, memops, kinds, nvtx = gpu_side.result()
            step("CUDA API")
            api, sync, cpu_ops = host_side.result()
        # after the CUDA API table's one read: its index of starts finds the host calls around each listed gap
        tl = timeline.gpu_timeline(trace, win, gap_threshold_ns=gap_threshold_ns, n_buckets=buckets)
        sched = process_cpu(trace, win)  # after the scans: its sort of every context switch is the report's peak
        launch = launch_latency(trace, win, sum(k["count"] - k["graph"] for k in kernels))
        devices = per_device(trace, win, kernels) if ranks or len(tl.devices) > 1 else None
        source = {"path": str(Path(path)), "kind": trace.kind, **trace.meta,
                  "vllm_names": trace_mentions_vllm(trace)}
    sections = Sections(
        window=WindowSection(win.start_ns, win.end_ns, win.duration_ns, win.how, win.detail, phases),
        gpu=GpuSection(tl.busy_ns, tl.idle_ns, tl.utilization, tl.devices),
        timeline=tl.buckets,
        kernels=_kernel_records(kernels),
        categories=category_breakdown(kernels),
        memops=[_stat_record(m, first="operation") for m in memops],
        memory_kinds=kinds,
        api=[_stat_record(a, first="name") for a in api],
        sync=sync,
        nvtx=[_stat_record({"range": n.pop("name"), **n}, first="range") for n in nvtx],
        cpu_ops=[_stat_record(c, first="name") for c in cpu_ops],
        gaps=tl.gaps,
        gap_classes=tl.gap_classes,
        steps=steps,
        sched=sched,
        launch=launch,
    )
    return TraceSections(
        source=source,
        sections=sections,
        ranks=_rank_parts(source, devices, tl.devices, win.duration_ns) if devices is not None else None,
        gpu_metrics=gpu_metrics,
    )


def _rank_parts(source: dict[str, Any], devices: dict[int, DeviceKernels], busy: list[dict[str, Any]],
                window_ns: int) -> list[RankPart]:
    """One part per device (a rank): its public entry, with the collectives it ran kept beside for the join."""
    gpus = {g.get("id"): g.get("name") for g in source.get("gpus") or [] if isinstance(g, dict)}
    by_device = {d["device"]: d for d in busy}
    single = len(devices) == 1 and source.get("rank") is not None
    parts = []
    for device, dev in sorted(devices.items()):
        b = by_device.get(device, {})
        entry = Rank(rank=source["rank"] if single else device, source=source["path"], device=device,
                     gpu={"name": gpus.get(device) or source.get("gpu"), "busy_ns": b.get("busy_ns"),
                          "idle_ns": b.get("idle_ns"), "utilization": b.get("utilization")},
                     kernels={"count": dev.count, "total_ns": dev.total_ns}, categories=dev.categories,
                     communication=dev.communication())
        parts.append(RankPart(entry, dev.comm_starts, dev.comm_names, window_ns))
    return parts


def _gpu_side(main: Trace, win: Window) -> tuple:
    with main.reopen() as trace:
        return kernel_summary(trace, win), memop_summary(trace, win), memory_kinds(trace, win), nvtx_summary(trace, win)


def _launch_step(trace: Trace, win: Window) -> int | None:
    """The launch sample's stride where the kernel table's one read knows the window's eager kernels, else None."""
    scan = trace.cache.get(KERNEL_SCAN)
    hist = scan.summary(win) if scan is not None else None
    return None if hist is None else sample_step(sum(c - g for _k, _v, c, g in hist))


def _host_side(main: Trace, win: Window, launch_step: int | None) -> tuple:
    with main.reopen() as trace:
        # the CUDA API table's one read: its summary and the launch sample's calls (analysis/scans.py)
        api_scan(trace, win, launch_step, api_sample_rows(trace, win) if launch_step else None)
        return (api_analysis.api_summary(trace, win), api_analysis.sync_summary(trace, win),
                cpu_op_summary(trace, win))


def _stat_record(row: dict[str, Any], first: str) -> dict[str, Any]:
    """A summary row as the report writes it: `first` first, nanosecond statistics named *_ns, sizes `bytes`."""
    renames = {**STAT_RENAMES, "bytes_total": "bytes"}
    out = {first: row[first]}
    out.update((renames.get(k, k), v) for k, v in row.items() if k not in (first, "name_id"))
    return out


def _kernel_records(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grand = sum(k["total"] for k in kernels)
    renames = {**STAT_RENAMES, "graph": "graph_count", "short": "short_count"}
    out = []
    for k in kernels:
        row = {renames.get(key, key): v for key, v in k.items()}
        row["share"] = row["total_ns"] / grand if grand else None
        out.append({f: row[f] for f in KERNEL_FIELDS})
    return out
