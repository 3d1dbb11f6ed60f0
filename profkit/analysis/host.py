"""The host side of a run (`host.json`, written by capture): which process was busy, and how busy.

A process at one core is saturated: vLLM's API server, engine core and the benchmark client are
single-threaded Python (the GIL), so one of them near 100 % of a core while the GPU waits is the limit.

Only the benchmark itself counts. The sampler runs from the client's start to its exit, and `vllm bench
serve` spends a while before the benchmark building its prompts (34 of 67 s on the H100 run of 1000
random 1024-token prompts: the client at one core, the server idle) and a moment after it writing results.
Averaged over all of it, an API server that was at a full core for the whole benchmark read 0.48 cores.
The benchmark's own duration (bench.json), ending when the client's last sample was taken, is the window.
"""

from __future__ import annotations

import math
from typing import Any

from profkit.evidence.host import HostSamples, ProcessSamples

SATURATED = 0.9  # of one core: a single-threaded Python process cannot use more than one
ROLES = ("api_server", "engine_core", "worker", "bench_client", "frontend")
WINDOW_SLACK_S = 1.0  # the client prints and saves its results after the measured duration


def host_section(samples: HostSamples, bench_seconds: float | None = None) -> dict[str, Any]:
    """The report's `host` section: per role, CPU use (cores) and how often a process was saturated.

    `bench_seconds` (the benchmark's measured duration) narrows the samples to the benchmark: the last
    `bench_seconds` (+ slack) before the client's last sample."""
    window = bench_window(samples.processes, bench_seconds)
    procs = []
    for p in samples.processes:
        values = [v for t, v in p.cpu if window is None or window[0] <= t <= window[1]]
        if not values:
            continue
        ordered = sorted(values)
        procs.append({"pid": p.pid, "role": p.role, "name": p.name,
                      "cpu_mean": sum(values) / len(values), "cpu_p90": ordered[int(0.9 * (len(ordered) - 1))],
                      "cpu_max": ordered[-1], "saturated_share": sum(c >= SATURATED for c in values) / len(values),
                      "samples": len(values)})
    # The sampler calls the `vllm serve` root an API server when it first sees it (before any children). With
    # several API servers (VLLM::APIServer_N) that root is their manager, not one of them.
    named = [p for p in procs if p["role"] == "api_server" and "apiserver" in p["name"].lower().replace("_", "")]
    if named:
        for p in procs:
            if p["role"] == "api_server" and p not in named:
                p["role"] = "other"
    gpu = [v for t, v in samples.gpu_util if window is None or window[0] <= t <= window[1]]
    roles: dict[str, Any] = {}
    for role in ROLES:
        mine = [p for p in procs if p["role"] == role]
        if mine:
            top = max(mine, key=lambda p: p["cpu_mean"])
            roles[role] = {"count": len(mine), "cpu_mean": top["cpu_mean"], "cpu_p90": top["cpu_p90"],
                           "saturated_share": top["saturated_share"],
                           "cpu_total_mean": sum(p["cpu_mean"] for p in mine)}
    return {"file": samples.path, "cores": samples.cores, "duration_s": samples.duration_s,
            "interval_s": samples.interval_s, "window_s": list(window) if window else None, "processes": procs,
            "roles": roles, "gpu_util_mean": sum(gpu) / len(gpu) if gpu else None,
            "skipped_samples": samples.skipped_samples, "gpus": samples.gpu_names}


def bench_window(processes: list[ProcessSamples], bench_seconds: float | None) -> tuple[float, float] | None:
    """[start, end] of the benchmark in host.json's clock: its measured duration (+ slack) ending at the
    client's (or offline front end's) last sample. None (every sample) when either is unknown."""
    if not isinstance(bench_seconds, (int, float)) or not math.isfinite(bench_seconds) or bench_seconds <= 0:
        return None
    ends = [t for p in processes if p.role in ("bench_client", "frontend") for t, _ in p.cpu]
    if not ends:
        return None
    end = max(ends)
    return (max(0.0, end - bench_seconds - WINDOW_SLACK_S), end)
