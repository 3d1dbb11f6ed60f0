"""The host side of a run (`host.json`, written by capture): which process was busy, and how busy.

A process at one core is saturated: vLLM's API server, engine core and the benchmark client are
single-threaded Python (the GIL), so one of them near 100 % of a core while the GPU waits is the limit.

Only the benchmark itself counts. The sampler runs from the client's start to its exit, and `vllm bench
serve` spends a while before the benchmark building its prompts (34 of 67 s on the H100 run of 1000
random 1024-token prompts: the client at one core, the server idle) and a moment after it writing results.
Averaged over all of it, an API server that was at a full core for the whole benchmark read 0.48 cores.
The benchmark's own duration (bench.json), ending when the client's last sample was taken, is the window.
A client that waits after the benchmark while the GPU and the API server idle (`--profile`: the profiler
stopping, 16 s for nsys's capture range on a 28 s H100 run, whose NVML mean read 45 % for a GPU busy throughout)
is not measuring: then the window is the benchmark's duration where the GPU and the API server did the most.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from profkit.evidence.host import HostSamples, ProcessSamples

SATURATED = 0.9  # of one core: a single-threaded Python process cannot use more than one
ROLES = ("api_server", "engine_core", "worker", "bench_client", "frontend")
WINDOW_SLACK_S = 1.0  # the client prints and saves its results after the measured duration
SERVING = 0.2  # cores: an API server above this is answering requests (an idle one reads 0-0.1)


COVERAGE = 0.5  # the share of the benchmark's duration the samples must span to describe it


def host_section(samples: HostSamples, bench_seconds: float | None = None) -> dict[str, Any]:
    """The report's `host` section: per role, CPU use (cores) and how often a process was saturated.

    `bench_seconds` (the benchmark's measured duration) narrows the samples to the benchmark: the last
    `bench_seconds` (+ slack) before the client's last sample."""
    window = bench_window(samples.processes, bench_seconds, samples.gpu_util, samples.interval_s)
    procs: list[dict[str, Any]] = []
    for sampled in samples.processes:
        values = [v for t, v in sampled.cpu if window is None or window[0] <= t <= window[1]]
        if not values:
            continue
        ordered = sorted(values)
        procs.append({"pid": sampled.pid, "role": sampled.role, "name": sampled.name,
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
    # the benchmark's window is placed by its client's samples: without them, the CPU figures are every sample's and
    # NVML's GPU utilization is not used (it would count the client's preparation, half of a serve run's samples)
    unplaced = window is None and isinstance(bench_seconds, (int, float)) and bench_seconds > 0
    gpu = [] if unplaced else [v for t, v in samples.gpu_util if window is None or window[0] <= t <= window[1]]
    # Samples that span less than half of the benchmark's measured duration (a sampler stopped early, a benchmark
    # result from elsewhere) do not describe it: no role's figures then, said in the note.
    times = [t for sampled in samples.processes for t, _ in sampled.cpu
             if window is None or window[0] <= t <= window[1]]
    span = max(times) - min(times) if times else 0.0
    short = isinstance(bench_seconds, (int, float)) and bench_seconds > 0 and span < COVERAGE * bench_seconds
    roles: dict[str, Any] = {}
    for role in ROLES if not short else ():
        mine = [p for p in procs if p["role"] == role]
        if mine:
            top = max(mine, key=lambda p: p["cpu_mean"])
            roles[role] = {"count": len(mine), "cpu_mean": top["cpu_mean"], "cpu_p90": top["cpu_p90"],
                           "saturated_share": top["saturated_share"],
                           "cpu_total_mean": sum(p["cpu_mean"] for p in mine)}
    servers = {p["pid"] for p in procs if p["role"] == "api_server"}
    drain = gpu_drain(window, samples.gpu_util, [p for p in samples.processes if p.pid in servers]) \
        if window and not short else None
    return {"file": samples.path, "cores": samples.cores, "duration_s": samples.duration_s,
            "interval_s": samples.interval_s, "window_s": list(window) if window else None, "processes": procs,
            "roles": roles, "gpu_util_mean": sum(gpu) / len(gpu) if gpu else None, "drain": drain,
            "skipped_samples": samples.skipped_samples, "gpus": samples.gpu_names,
            **({"left_out": dict(samples.left_out)} if samples.left_out else {}),
            **({"window_note": "no benchmark client was sampled to place the benchmark's window: CPU over every "
                               "sample, NVML's GPU utilization not used"} if unplaced else {}),
            **({"coverage_note": f"the samples span {span:.1f} s of the benchmark's {bench_seconds:.1f} s: no "
                                 "process's CPU is read off them"} if short else {}),
            **({"worker_note": _worker_note(roles["worker"]["count"])} if "worker" in roles else {}),
            **({"drain_note": _drain_note(drain, window)}
               if drain and window and drain_worth_saying(drain["seconds"], drain["api_server_cpu"],
                                                          window[1] - window[0]) else {})}


def gpu_drain(window: tuple[float, float], gpu_util: Sequence[tuple[float, float]],
              servers: Sequence[ProcessSamples]) -> dict[str, float] | None:
    """The benchmark's last seconds with no GPU busy (NVML; the client's WINDOW_SLACK_S after the benchmark left out)
    and the busiest API server's mean CPU over them: where every request was admitted at once, they all finish
    together, and an API server that falls behind streams on after the GPUs are done (lease 23: one API server for two
    engines at a full core over the last 32-37 % of the run, the GPUs idle 4-7 s before its end). None without NVML
    samples in the window."""
    start, end = window[0], window[1] - WINDOW_SLACK_S
    busy = [t for t, v in gpu_util if start <= t <= window[1] and v > 0]
    if not busy:
        return None
    last = max(busy)
    seconds = max(0.0, end - last)
    cpu = [[v for t, v in p.cpu if last < t <= end] for p in servers]
    return {"seconds": seconds, "api_server_cpu": max((sum(c) / len(c) for c in cpu if c), default=0.0)}


# A drain worth saying: at least this long and this share of the benchmark, the busiest API server at half a core
DRAIN_S, DRAIN_SHARE, DRAIN_CPU = 2.0, 0.05, 0.5


def drain_worth_saying(seconds: float, api_server_cpu: float, length: float) -> bool:
    """Whether a drain of `seconds` at the busiest API server's `api_server_cpu`, in a run `length` seconds long, is
    one the report (and `predict`) says."""
    return seconds >= DRAIN_S and seconds >= DRAIN_SHARE * length and api_server_cpu >= DRAIN_CPU


# A drain longer than this share of the benchmark is not a tail the steps left to the API servers: the GPUs idle over
# most of the run is a frontend-bound run's (its API server saturated from the start) or NVML samples that stopped
DRAIN_MAX_SHARE = 0.5


def gpu_seconds(length: float, drain_s: float) -> float:
    """The seconds of a benchmark `length` seconds long that the engine's steps took: less its drain (`gpu_drain`),
    where that is a tail (up to DRAIN_MAX_SHARE of the run)."""
    return length - drain_s if 0.0 < drain_s < DRAIN_MAX_SHARE * length else length


def _drain_note(drain: dict[str, float], window: tuple[float, float]) -> str:
    share = drain["seconds"] / (window[1] - window[0])
    return (f"the GPUs were done {drain['seconds']:.1f} s ({share:.0%}) before the benchmark ended while the busiest "
            f"API server was at {drain['api_server_cpu']:.2f} of a core: it was still streaming the last requests' "
            "tokens, a frontend cost at the run's end that more API servers share")


def _worker_note(workers: int) -> str:
    """Why an engine core that feeds worker processes reads busy: vLLM's `mp` executor (data and tensor parallelism)
    hands each step to them through a shared-memory queue whose reader spins for a second after each read (vLLM
    0.26.0's shm_broadcast.py). Lease 23 (tests/data/h200_model_led): one GPU with `mp` and with `uni` side by side,
    the same throughput, the engine core at a full core in 91-93 % and 28-42 % of the samples."""
    them = "them" if workers > 1 else "it"
    return (f"the engine core fed {workers} worker process{'es' if workers > 1 else ''} (vLLM's mp executor) and waits "
            f"on {them} by spinning: its time at a full core is not its work, and no engine-core-bound finding is read "
            "off it")


def bench_window(processes: list[ProcessSamples], bench_seconds: float | None,
                 gpu_util: Sequence[tuple[float, float]] = (), interval_s: Any = None) -> tuple[float, float] | None:
    """[start, end] of the benchmark in host.json's clock: its measured duration (+ slack) ending at the
    client's (or offline front end's) last sample. Where the GPU and the API server were both idle for longer
    than the slack before that (a profiler stopping), the stretch of that duration (+ one sampling interval) with
    the most GPU utilization and API-server CPU instead: the API server alone streams responses for a while after
    the GPU's last step (frontend-bound runs), and a torch profiler's engine core writes its trace with both idle.
    None (every sample) when either is unknown."""
    if not isinstance(bench_seconds, (int, float)) or not math.isfinite(bench_seconds) or bench_seconds <= 0:
        return None
    ends = [t for p in processes if p.role in ("bench_client", "frontend") for t, _ in p.cpu]
    if not ends:
        return None
    end, slack = max(ends), WINDOW_SLACK_S
    if gpu_util:  # NVML samples: the GPU's side of the benchmark is known
        served = [(t, v) for p in processes if p.role == "api_server" for t, v in p.cpu]
        busy = [t for t, v in gpu_util if v > 0] + [t for t, v in served if v >= SERVING]
        last = max((t for t in busy if t <= end), default=None)
        if last is not None and last < end - WINDOW_SLACK_S:
            given = isinstance(interval_s, (int, float)) and not isinstance(interval_s, bool)
            slack = interval_s if given and 0 < interval_s <= WINDOW_SLACK_S else 0.1
            end = _busiest_end(sorted((t, v) for t, v in [*gpu_util, *served] if t <= end), bench_seconds + slack)
    return (max(0.0, end - bench_seconds - slack), end)


def _busiest_end(samples: list[tuple[float, float]], length: float) -> float:
    """The end of the `length`-second stretch (ending at a sample) whose samples sum to the most; the earliest of
    equal ones. Prefix sums and a binary search per end: no scan per window."""
    times = [t for t, _ in samples]
    sums = list(accumulate((v for _, v in samples), initial=0.0))
    best, best_end = -1.0, times[-1]
    for i, t in enumerate(times):
        total = sums[i + 1] - sums[bisect_right(times, t - length)]
        if total > best + 1e-9:
            best, best_end = total, t
    return best_end
