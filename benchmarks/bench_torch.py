"""profkit vs HTA (Holistic Trace Analysis) on torch.profiler traces, side by side in one run.

The traces are the real vLLM worker trace of the fixtures (8.5 MB of JSON) and copies of it grown
by replicating its events with shifted timestamps and correlation / External ids (gzip-compressed,
as torch.profiler writes them). Each tool runs in its own process tree, timed for wall time, with
peak memory as the RSS summed over the tree (profkit's decoding workers included):

* profkit: `profkit report TRACE --window all --format json` (every analysis, rules included);
* HTA: `TraceAnalysis(trace_dir)` (load) + `get_temporal_breakdown` + `get_idle_time_breakdown`
  + `get_gpu_kernel_breakdown` (the idle/kernel breakdown profkit's report contains).

    python benchmarks/bench_torch.py [--copies 1,60] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURE = next((REPO / "tests" / "data" / "fixtures" / "h100_vllm" / "torch_profile").glob("rank0.*.json.gz"),
                       None)
HTA_SCRIPT = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
ta.get_temporal_breakdown(visualize=False)
ta.get_idle_time_breakdown(visualize=False, show_idle_interval_stats=False)
ta.get_gpu_kernel_breakdown(visualize=False)
"""


def replicate(src: Path, copies: int, out: Path) -> int:
    """Write `copies` back-to-back copies of the trace's events; returns the uncompressed size."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    size = 0
    with gzip.open(out, "wt", compresslevel=1) as f:
        head = json.dumps(header)[:-1] + ', "traceEvents": ['
        f.write(head)
        size += len(head)
        first = True
        for k in range(copies):
            for e in events:
                if k and e.get("ph") == "M":
                    continue  # process/thread names once
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                if k and "args" in e2 and isinstance(e2["args"], dict):
                    args = dict(e2["args"])
                    for key in ("correlation", "External id"):
                        if isinstance(args.get(key), int):
                            args[key] += k * 10_000_000
                    e2["args"] = args
                if k and e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] += k * 10_000_000
                # Kineto's own layout: one event per block, "},\n  {" between events.
                line = ("\n  " if first else ",\n  ") + json.dumps(e2)
                first = False
                f.write(line)
                size += len(line)
        f.write("\n  ]\n}")
    return size


def _tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*"):
            with contextlib.suppress(OSError):
                pids += [int(c) for c in (task / "children").read_text().split()]
        i += 1
    return pids


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak memory (MiB) of a command: the RSS summed over its whole process tree
    (profkit decodes in worker processes), sampled every 20 ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_rss_kib(p) for p in _tree(proc.pid)))
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, peak / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--copies", default="1,60")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="profkit-bench-torch-"))
    rows = []
    for copies in (int(c) for c in args.copies.split(",")):
        d = work / f"x{copies}"
        d.mkdir(parents=True, exist_ok=True)
        trace = d / "rank0.pt.trace.json.gz"
        size = replicate(args.fixture, copies, trace)
        ours = timed([sys.executable, "-m", "profkit.cli", "report", str(trace), "--window", "all", "--format",
                      "json", "-o", str(work / "r.json"), "--no-progress"])
        hta = timed([sys.executable, "-c", HTA_SCRIPT, str(d)])
        rows.append((copies, size / 1e6, trace.stat().st_size / 1e6, *ours, *hta))
        print(f"x{copies}: profkit {ours[0]:.1f} s / HTA {hta[0]:.1f} s", file=sys.stderr)
    print("| copies | JSON MB | .gz MB | profkit s | profkit RSS MiB | HTA s | HTA RSS MiB | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for copies, mb, gz, t1, m1, t2, m2 in rows:
        print(f"| {copies} | {mb:.0f} | {gz:.0f} | {t1:.2f} | {m1:.0f} | {t2:.2f} | {m2:.0f} | {t2 / t1:.1f}x |")


if __name__ == "__main__":
    main()
