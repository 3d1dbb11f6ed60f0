"""The host side of a run from `host.json` (written by capture): which process was busy, and how busy.

A process at one core is saturated: vLLM's API server, engine core and the benchmark client are
single-threaded Python (the GIL), so one of them near 100 % of a core while the GPU waits is the limit.

Only the benchmark itself counts. The sampler runs from the client's start to its exit, and `vllm bench
serve` spends a while before the benchmark building its prompts (34 of 67 s on the H100 run of 1000
random 1024-token prompts: the client at one core, the server idle) and a moment after it writing results.
Averaged over all of it, an API server that was at a full core for the whole benchmark read 0.48 cores.
The benchmark's own duration (bench.json), ending when the client's last sample was taken, is the window.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.inputs import read_text

SCHEMA = "profkit.host/1"
SATURATED = 0.9  # of one core: a single-threaded Python process cannot use more than one
ROLES = ("api_server", "engine_core", "worker", "bench_client", "frontend")


WINDOW_SLACK_S = 1.0  # the client prints and saves its results after the measured duration


def read_host(path: Path, bench_seconds: float | None = None) -> dict[str, Any]:
    """host.json -> the `host` section: per role, CPU use (cores) and how often a process was saturated.

    `bench_seconds` (the benchmark's measured duration) narrows the samples to the benchmark: the last
    `bench_seconds` (+ slack) before the client's last sample."""
    try:
        data = json.loads(read_text(path, "host samples"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProfkitError(f"{path}: not JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProfkitError(f"{path}: not a {SCHEMA} document")
    procs = []
    skipped = 0
    listed = data.get("processes") if isinstance(data.get("processes"), list) else []
    window = bench_window(listed, bench_seconds)
    for p in listed:
        if not isinstance(p, dict) or not isinstance(p.get("role"), str):
            skipped += 1
            continue
        raw = p.get("cpu") if isinstance(p.get("cpu"), list) else []
        valid = [pair for pair in raw if _number_pair(pair) and pair[1] >= 0]
        skipped += len(raw) - len(valid)
        samples = [v for t, v in valid if window is None or window[0] <= t <= window[1]]
        if not samples:
            continue
        ordered = sorted(samples)
        procs.append({"pid": p.get("pid"), "role": p["role"], "name": str(p.get("name", ""))[:200],
                      "cpu_mean": sum(samples) / len(samples), "cpu_p90": ordered[int(0.9 * (len(ordered) - 1))],
                      "cpu_max": ordered[-1], "saturated_share": sum(c >= SATURATED for c in samples) / len(samples),
                      "samples": len(samples)})
    # The sampler calls the `vllm serve` root an API server when it first sees it (before any children). With
    # several API servers (VLLM::APIServer_N) that root is their manager, not one of them.
    named = [p for p in procs if p["role"] == "api_server" and "apiserver" in p["name"].lower().replace("_", "")]
    if named:
        for p in procs:
            if p["role"] == "api_server" and p not in named:
                p["role"] = "other"
    gpus = data.get("gpus") if isinstance(data.get("gpus"), list) else []
    gpu = [pair[1] for g in gpus if isinstance(g, dict) and isinstance(g.get("util"), list)
           for pair in g["util"] if _number_pair(pair) and 0 <= pair[1] <= 1
           and (window is None or window[0] <= pair[0] <= window[1])]
    roles: dict[str, Any] = {}
    for role in ROLES:
        mine = [p for p in procs if p["role"] == role]
        if mine:
            top = max(mine, key=lambda p: p["cpu_mean"])
            roles[role] = {"count": len(mine), "cpu_mean": top["cpu_mean"], "cpu_p90": top["cpu_p90"],
                           "saturated_share": top["saturated_share"],
                           "cpu_total_mean": sum(p["cpu_mean"] for p in mine)}
    cores = data.get("cores")
    return {"file": str(path), "cores": cores if isinstance(cores, int) and 0 < cores < 1 << 20 else None,
            "duration_s": data.get("duration_s"), "interval_s": data.get("interval_s"),
            "window_s": list(window) if window else None, "processes": procs,
            "roles": roles, "gpu_util_mean": sum(gpu) / len(gpu) if gpu else None,
            "skipped_samples": skipped}


def bench_window(processes: list[Any], bench_seconds: float | None) -> tuple[float, float] | None:
    """[start, end] of the benchmark in host.json's clock: its measured duration (+ slack) ending at the
    client's (or offline front end's) last sample. None (every sample) when either is unknown."""
    if not isinstance(bench_seconds, (int, float)) or not math.isfinite(bench_seconds) or bench_seconds <= 0:
        return None
    ends = [pair[0] for p in processes if isinstance(p, dict) and p.get("role") in ("bench_client", "frontend")
            and isinstance(p.get("cpu"), list) for pair in p["cpu"] if _number_pair(pair)]
    if not ends:
        return None
    end = max(ends)
    return (max(0.0, end - bench_seconds - WINDOW_SLACK_S), end)


def _number_pair(pair: Any) -> bool:
    """A sample: [seconds, value], both finite numbers."""
    return (isinstance(pair, list) and len(pair) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in pair))


def host_facts(host: dict[str, Any] | None) -> dict[str, Any]:
    """`host.*` facts (None where the run has no host.json or the role did not appear)."""
    roles = (host or {}).get("roles") or {}
    facts: dict[str, Any] = {}
    for role, prefix in (("api_server", "host.api_server"), ("engine_core", "host.engine_core"),
                         ("bench_client", "host.client"), ("frontend", "host.frontend")):
        r = roles.get(role)
        facts[f"{prefix}_cpu"] = r["cpu_mean"] if r else None
        facts[f"{prefix}_saturated_share"] = r["saturated_share"] if r else None
    facts["host.api_server_count"] = roles["api_server"]["count"] if "api_server" in roles else None
    facts["host.cores"] = (host or {}).get("cores")
    facts["host.gpu_util_mean"] = (host or {}).get("gpu_util_mean")
    return facts


HOST_FACT_DOCS = {
    "host.api_server_cpu": "mean CPU of the busiest API-server process, in cores (1.0 = one core) (host.json)",
    "host.api_server_saturated_share": "share of samples the busiest API server used >= 90 % of a core",
    "host.api_server_count": "API-server processes seen (the vllm serve process itself when there is one)",
    "host.engine_core_cpu": "mean CPU of the engine-core process, in cores",
    "host.engine_core_saturated_share": "share of samples the engine core used >= 90 % of a core",
    "host.client_cpu": "mean CPU of the benchmark client (vllm bench serve), in cores",
    "host.client_saturated_share": "share of samples the benchmark client used >= 90 % of a core",
    "host.frontend_cpu": "mean CPU of an offline benchmark's front-end process, in cores",
    "host.frontend_saturated_share": "share of samples the offline front end used >= 90 % of a core",
    "host.cores": "CPU cores of the machine",
    "host.gpu_util_mean": "mean NVML GPU utilization over the benchmark, 0..1 (host.json)",
}
