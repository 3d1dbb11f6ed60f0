"""Build the `profkit.report/1` document: open -> window -> analyses -> facts.

This is the library entry point behind `profkit report`; everything here is usable from Python:

    from profkit.report import build_report
    report = build_report("trace.sqlite", window="auto")
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from profkit import __version__
from profkit.analysis import api as api_analysis
from profkit.analysis import timeline
from profkit.analysis.categories import category_breakdown
from profkit.analysis.communication import DeviceKernels, per_device, rank_imbalance
from profkit.analysis.cpu import cpu_op_summary
from profkit.analysis.host import read_host
from profkit.analysis.kernels import kernel_summary
from profkit.analysis.launch import launch_latency
from profkit.analysis.nvtx import nvtx_summary
from profkit.analysis.sched import process_cpu
from profkit.analysis.steps import engine_steps
from profkit.analysis.transfers import memop_summary, memory_kinds
from profkit.analysis.vllm import set_gpu_defaults, vllm_evidence
from profkit.analysis.window import Window, choose_window, with_seq_ranges
from profkit.analysis.workload import NOT_VLLM_NOTE, trace_mentions_vllm, vllm_run_evidence
from profkit.diagnose.command import (
    UserCommand,
    annotate,
    from_manifest,
    parse_command_text,
    report_changes,
    suggest,
    user_command,
)
from profkit.diagnose.engine import evaluate, load_rules
from profkit.diagnose.facts import compute_facts
from profkit.errors import ProfkitError, TraceError
from profkit.escape import one_line
from profkit.inputs import read_text
from profkit.traces import Trace, open_trace
from profkit.traces.open import traces_in_folder

SCHEMA = "profkit.report/1"
STAT_RENAMES = {"total": "total_ns", "avg": "avg_ns", "median": "median_ns", "min": "min_ns",
                "max": "max_ns", "stddev": "stddev_ns"}

Progress = Callable[[str], None]


def build_report(path: str | os.PathLike | None, window: str = "auto", gap_threshold_ns: int = 100_000,
                 buckets: int = 100, progress: Progress | None = None, bench: Path | None = None,
                 vllm_log: Path | None = None, metrics: list[Path] | None = None, vllm_args: str | None = None,
                 rules_dirs: list[Path] | None = None, host: Path | None = None, jobs: int | None = None,
                 dask: str | None = None) -> dict[str, Any]:
    """Analyse one trace (or capture folder), join vLLM's evidence, run the rules; return the document.

    `path` may also be a list of traces (one per rank of a multi-GPU run), or a folder holding several: one
    report with a section per rank (`ranks`) and the cross-rank `imbalance`; the traces are analysed on
    `jobs` local processes (default: the cores), or as tasks on the Dask cluster at `dask`.
    Without a trace (`path` None, or a capture folder of an unprofiled run) the report holds the vLLM
    evidence alone: its facts, and the findings whose facts are known (the rest in `rules_skipped`)."""
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [] if path is None else [Path(path)]
    for p in paths:
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
    folder = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    inputs = capture_folder_inputs(folder) if folder else {}
    traces = traces_in_folder(folder) if folder else paths
    several = traces if len(traces) > 1 else None
    trace_path = traces[0] if len(traces) == 1 else None
    host_file = host or inputs.get("host")
    if not traces and not (bench or vllm_log or metrics or vllm_args or host or inputs):
        where = f"{folder}: folder holds no trace and no vLLM evidence" if folder else "nothing to report"
        raise ProfkitError(f"{where} (give a trace, a capture folder, or --bench/--vllm-log/--metrics/--vllm-args)")
    evidence = vllm_evidence(bench=bench or inputs.get("bench"), log=vllm_log or inputs.get("log"),
                             metrics=metrics or inputs.get("metrics"), args=vllm_args or inputs.get("args"))
    given = (UserCommand([parse_command_text(vllm_args)], "--vllm-args") if vllm_args
             else inputs.get("user_command"))
    host_section = (read_host(Path(host_file), (evidence.get("bench") or {}).get("elapsed_s"))
                    if host_file else None)
    rules = load_rules(rules_dirs)  # validate the rules before spending time on the trace
    if several:
        from profkit.ranks import build_ranks

        report = build_ranks(several, window, gap_threshold_ns, buckets, progress or (lambda _name: None),
                             jobs=jobs, dask=dask)
    elif trace_path is None:
        report = evidence_only_report(folder)
    else:
        report = build_trace_part(trace_path, window, gap_threshold_ns, buckets, progress or (lambda _name: None))
    if folder and report["source"].get("path"):
        report["source"]["path"] = str(folder)
    finish_ranks(report)
    if inputs.get("environment"):
        report["environment"] = inputs["environment"]
    report["vllm"] = evidence
    command = user_command(report, given)
    report["run"] = {"vllm": vllm_run_evidence(evidence, command is not None,
                                               bool(report["source"].get("vllm_names")))}
    if report["run"]["vllm"]:
        # Some of vLLM's defaults depend on the GPU (the trace's, else the capture manifest's).
        set_gpu_defaults(evidence, report["source"].get("gpu") or (inputs.get("environment") or {}).get("gpu"))
    else:  # not shown to be vLLM: vLLM's defaults say nothing about it, and no vLLM flag is proposed
        report["run"]["note"] = NOT_VLLM_NOTE
        evidence["config"] = {}
    report["host"] = host_section
    report["facts"] = compute_facts(report)
    report["findings"], report["rules_skipped"] = evaluate(rules, report["facts"])
    if not report["run"]["vllm"]:
        for finding in report["findings"]:
            finding["changes"] = []
    suggestion = suggest(command, report_changes(report))
    annotate(report, suggestion)
    report["command"] = suggestion.to_json()
    report["suggested_command"] = suggestion.text()
    return report


def capture_folder_inputs(folder: Path) -> dict[str, Any]:
    """The evidence files a capture folder holds beside its trace (see the design's capture folder)."""
    found: dict[str, Any] = {}
    if (folder / "bench.json").is_file():
        found["bench"] = folder / "bench.json"
    for name in ("server.log", "bench.log"):
        if (folder / name).is_file():
            found["log"] = folder / name
            break
    if (folder / "host.json").is_file():
        found["host"] = folder / "host.json"
    metrics = [folder / n for n in ("metrics-before.txt", "metrics-after.txt") if (folder / n).is_file()]
    if metrics:
        found["metrics"] = metrics
    manifest = folder / "manifest.json"
    if manifest.is_file():
        try:
            data = json.loads(read_text(manifest, "capture manifest"))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ProfkitError(f"{manifest}: not JSON ({one_line(exc, 120)})") from None
        if not isinstance(data, dict):
            raise ProfkitError(f"{manifest}: not a capture manifest (expected a JSON object)")
        args = data.get("vllm_args")
        if isinstance(args, list):
            args = shlex.join(str(a) for a in args)
        if isinstance(args, str) and args:
            found["args"] = args
        if user := from_manifest(data):
            found["user_command"] = user
        if isinstance(data.get("environment"), dict):
            found["environment"] = {k: v for k, v in data["environment"].items()  # Infinity/NaN make no JSON
                                    if isinstance(v, (str, int)) or isinstance(v, float) and math.isfinite(v)}
    return found


def evidence_only_report(folder: Path | None) -> dict[str, Any]:
    """The report of a run without a trace: every trace section empty, `gpu` and `window` None."""
    return {
        "schema": SCHEMA,
        "profkit_version": __version__,
        "source": {"path": str(folder) if folder else None, "kind": "evidence"},
        "window": None, "gpu": None, "timeline": [], "kernels": [], "categories": [], "memops": [],
        "memory_kinds": [], "api": [], "sync": [], "nvtx": [], "cpu_ops": [], "gaps": [], "gap_classes": {},
        "steps": None, "sched": None,
        "launch": {}, "vllm": {}, "findings": [],
    }


def build_trace_part(path: str | os.PathLike, window: str, gap_threshold_ns: int, buckets: int,
                     step: Progress | None = None, ranks: bool = False) -> dict[str, Any]:
    """The trace's sections of the report (before vLLM's evidence, facts and rules). `ranks`: give the
    per-device section even for a single GPU (the trace is one rank of several)."""
    try:
        return _build(path, window, gap_threshold_ns, buckets, step or (lambda _name: None), ranks)
    except sqlite3.DatabaseError as exc:
        # A truncated or corrupt export can open fine and fail deep inside a query.
        raise TraceError(f"{path}: damaged or unreadable trace database ({exc})") from None


def finish_ranks(report: dict[str, Any]) -> None:
    """The cross-rank imbalance from the per-rank collectives `_build` left beside its sections."""
    collectives = report.pop("_collectives", None)
    window_ns = report.pop("_window_ns", None)
    if collectives is not None and len(report.get("ranks") or []) > 1:
        report["imbalance"] = rank_imbalance(report["ranks"], collectives, window_ns)
    elif "ranks" in report and len(report["ranks"]) <= 1:
        del report["ranks"]  # one GPU: today's shape


def _build(path: str | os.PathLike, window: str, gap_threshold_ns: int, buckets: int,
           step: Progress, ranks: bool = False) -> dict[str, Any]:
    step("open trace")
    with open_trace(path) as trace:
        step("GPU timeline")
        auto = window.strip() == "auto"
        phases: list[dict[str, Any]] = []
        if auto:  # the automatic window needs the gap table first; other windows are known now
            timeline.build_gap_table(trace)
            phases = timeline.phases(trace)
        win = with_seq_ranges(trace, choose_window(trace, window, phases))
        # The per-table summaries are independent scans: run them on their own connections while
        # this one builds the timeline (sqlite3 releases the GIL while a query runs).
        with ThreadPoolExecutor(max_workers=2) as pool:
            gpu_side = pool.submit(_gpu_side, trace, win)
            host_side = pool.submit(_host_side, trace, win)
            if not auto:
                timeline.build_gap_table(trace)
            tl = timeline.gpu_timeline(trace, win, gap_threshold_ns=gap_threshold_ns, n_buckets=buckets)
            steps = engine_steps(trace, win)  # the gap table lives on this connection
            sched = process_cpu(trace, win)
            step("kernels")
            kernels, memops, kinds, nvtx, launch = gpu_side.result()
            step("CUDA API")
            api, sync, cpu_ops = host_side.result()
        devices = per_device(trace, win, kernels) if ranks or len(tl.devices) > 1 else None
        source = {"path": str(Path(path)), "kind": trace.kind, **trace.meta,
                  "vllm_names": trace_mentions_vllm(trace)}

    report: dict[str, Any] = {
        "schema": SCHEMA,
        "profkit_version": __version__,
        "source": source,
        "window": {**win.as_json(), "phases": phases},
        "gpu": {"busy_ns": tl.busy_ns, "idle_ns": tl.idle_ns, "utilization": tl.utilization,
                "devices": tl.devices},
        "timeline": tl.buckets,
        "kernels": _kernel_records(kernels),
        "categories": category_breakdown(kernels),
        "memops": [_stat_record(m, first="operation") for m in memops],
        "memory_kinds": kinds,
        "api": [_stat_record(a, first="name") for a in api],
        "sync": sync,
        "nvtx": [_stat_record({"range": n.pop("name"), **n}, first="range") for n in nvtx],
        "cpu_ops": [_stat_record(c, first="name") for c in cpu_ops],
        "gaps": tl.gaps,
        "gap_classes": tl.gap_classes,
        "steps": steps,
        "sched": sched,
        "launch": launch,
        "vllm": {},
        "findings": [],
    }
    if devices is not None:
        _add_ranks(report, devices, tl.devices, win.duration_ns)
    return report


def _add_ranks(report: dict[str, Any], devices: dict[int, DeviceKernels], busy: list[dict[str, Any]],
               window_ns: int) -> None:
    """`ranks`: one entry per device (a rank), with the collectives it ran kept beside for `finish_ranks`."""
    source = report["source"]
    gpus = {g.get("id"): g.get("name") for g in source.get("gpus") or [] if isinstance(g, dict)}
    by_device = {d["device"]: d for d in busy}
    single = len(devices) == 1 and source.get("rank") is not None
    report["ranks"], report["_collectives"], report["_window_ns"] = [], {}, {}
    for device, dev in sorted(devices.items()):
        rank = source["rank"] if single else device
        b = by_device.get(device, {})
        report["ranks"].append({
            "rank": rank, "source": source["path"], "device": device,
            "gpu": {"name": gpus.get(device) or source.get("gpu"), "busy_ns": b.get("busy_ns"),
                    "idle_ns": b.get("idle_ns"), "utilization": b.get("utilization")},
            "kernels": {"count": dev.count, "total_ns": dev.total_ns},
            "categories": dev.categories,
            "communication": dev.communication(),
        })
        report["_collectives"][rank] = (dev.comm_starts, dev.comm_names)
        report["_window_ns"][rank] = window_ns


def _gpu_side(main: Trace, win: Window) -> tuple:
    with main.reopen() as trace:
        kernels = kernel_summary(trace, win)
        memops = memop_summary(trace, win)
        kinds = memory_kinds(trace, win)
        nvtx = nvtx_summary(trace, win)
        eager = sum(k["count"] - k["graph"] for k in kernels)
        launch = launch_latency(trace, win, eager)
    return kernels, memops, kinds, nvtx, launch


def _host_side(main: Trace, win: Window) -> tuple:
    with main.reopen() as trace:
        return (api_analysis.api_summary(trace, win), api_analysis.sync_summary(trace, win),
                cpu_op_summary(trace, win))


def _stat_record(row: dict[str, Any], first: str) -> dict[str, Any]:
    """A summary row as the report writes it: `first` first, nanosecond statistics named *_ns, sizes `bytes`."""
    renames = {**STAT_RENAMES, "bytes_total": "bytes"}
    out = {first: row[first]}
    out.update((renames.get(k, k), v) for k, v in row.items() if k not in (first, "name_id"))
    return out


KERNEL_FIELDS = ["name", "short_name", "category", "count", "total_ns", "share", "avg_ns", "median_ns", "min_ns",
                 "max_ns", "stddev_ns", "graph_count", "short_count"]


def _kernel_records(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grand = sum(k["total"] for k in kernels)
    renames = {**STAT_RENAMES, "graph": "graph_count", "short": "short_count"}
    out = []
    for k in kernels:
        row = {renames.get(key, key): v for key, v in k.items()}
        row["share"] = row["total_ns"] / grand if grand else None
        out.append({f: row[f] for f in KERNEL_FIELDS})
    return out
