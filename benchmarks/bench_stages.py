"""Where `profkit report` spends its time, stage by stage, on one trace: each analysis run alone, one thread, in
the order the report runs them (the report itself overlaps the summaries on three connections). The stages are
the one-read path's (issue 41): a trace whose kernel and CUDA API tables are too small for Arrow reads them as
before, inside the analyses.

    python benchmarks/bench_stages.py TRACE.sqlite [--repeat 2]

Imports are timed first (what the report path imports before it reads the trace; pyarrow and the ADBC driver
on first use by a large table, counted in the stage that first reads one). Each stage's best of `--repeat`
runs, each on a freshly opened trace where the stage depends on the gaps (they are cached on the trace)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

T0 = time.perf_counter()
from profkit.analysis import api as api_analysis  # noqa: E402 - imports are timed
from profkit.analysis import timeline  # noqa: E402
from profkit.analysis.cpu import cpu_op_summary  # noqa: E402
from profkit.analysis.kernels import kernel_summary  # noqa: E402
from profkit.analysis.launch import api_sample_rows, launch_latency, sample_step  # noqa: E402
from profkit.analysis.nvtx import nvtx_summary  # noqa: E402
from profkit.analysis.scans import api_scan, kernel_scan  # noqa: E402
from profkit.analysis.sched import process_cpu  # noqa: E402
from profkit.analysis.steps import engine_steps, marker_ids  # noqa: E402
from profkit.analysis.transfers import memop_summary, memory_kinds  # noqa: E402
from profkit.analysis.window import choose_window, with_seq_ranges  # noqa: E402
from profkit.diagnose.rule_files import load_rules  # noqa: E402
from profkit.report import ReportOptions, build_report  # noqa: E402
from profkit.traces import open_trace  # noqa: E402

IMPORTS = time.perf_counter() - T0


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def stages(path: str) -> dict[str, float]:
    """Each stage's seconds, as the report runs them: the export opened with the large tables' checks left to their
    one read (`defer`), the kernel table read once (gaps, segments' histograms, launch spill, step markers), the
    window, the analyses that take their rows from that read, the CUDA API table's one read, then the rest."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    trace = open_trace(path, defer=True)
    out["open (views; checks of the small tables)"] = time.perf_counter() - t0
    with trace:
        markers = [i for i in marker_ids(trace).values() if isinstance(i, int)]
        out["kernel table's one read (checks, gaps, histograms, launch spill)"] = timed(
            lambda: kernel_scan(trace, None, markers))
        win = with_seq_ranges(trace, choose_window(trace, "all"))
        out["timeline (idle, buckets, gap classes, gap list)"] = timed(
            lambda: (timeline.gpu_gaps(trace), timeline.gpu_timeline(trace, win, gap_threshold_ns=100_000,
                                                                            n_buckets=50)))
        out["engine steps"] = timed(lambda: engine_steps(trace, win))
        kernels: list = []
        out["kernel summary"] = timed(lambda: kernels.extend(kernel_summary(trace, win)))
        eager = sum(k["count"] - k["graph"] for k in kernels)
        out["memory operations"] = timed(lambda: (memop_summary(trace, win), memory_kinds(trace, win)))
        out["NVTX"] = timed(lambda: nvtx_summary(trace, win))
        out["CUDA API table's one read (checks, histogram, launch sample)"] = timed(
            lambda: api_scan(trace, win, sample_step(eager), api_sample_rows(trace, win)))
        out["CUDA API summary + sync"] = timed(lambda: (api_analysis.api_summary(trace, win),
                                                          api_analysis.sync_summary(trace, win)))
        out["launch latency"] = timed(lambda: launch_latency(trace, win, eager))
        out["context switches (per-process CPU)"] = timed(lambda: process_cpu(trace, win))
        out["CPU operators"] = timed(lambda: cpu_op_summary(trace, win))
    out["rules (load)"] = timed(load_rules)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, s in stages(args.trace).items():
            best[name] = min(s, best.get(name, s))
    everything = ReportOptions(window="all")
    whole = min(timed(lambda: build_report(args.trace, options=everything).document()) for _ in range(args.repeat))
    print("| stage | s |\n|---|---:|")
    print(f"| imports | {IMPORTS:.2f} |")
    for name, s in best.items():
        print(f"| {name} | {s:.2f} |")
    print(f"| sum of stages | {IMPORTS + sum(best.values()):.2f} |")
    print(f"| whole report in process (stages overlapped, + facts and rules) | {whole:.2f} |")


if __name__ == "__main__":
    main()
