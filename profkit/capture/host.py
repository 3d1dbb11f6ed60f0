"""Per-process CPU (and NVML GPU utilization) while the benchmark runs: the capture folder's `host.json`.

vLLM splits a server into processes it names (`VLLM::EngineCore`, `VLLM::APIServer_N`, workers);
with one API server the `vllm serve` process itself serves HTTP. The GPU trace cannot say which of them
holds the GPU back; their CPU time can: a single-threaded Python process tops out at one core.

Sampling at ~10 Hz reads each process's CPU times (psutil) and, on the GPU box, NVML's utilization:
well under 1 % of a core. Format (`profkit.host/1`):

    {"schema": "profkit.host/1", "interval_s": 0.1, "cores": 16, "duration_s": 31.2,
     "processes": [{"pid", "ppid", "name", "role", "tree", "cpu": [[t_s, cores_used], ...]}],
     "gpus": [{"index", "name", "util": [[t_s, 0..1], ...], "pids": [...], "visible": bool}]}

`role` is api_server | engine_core | worker | bench_client | frontend (offline benchmarks) | profiler |
other; `tree` is the root it was found under (server, client, offline); `cores_used` is CPU seconds
per second (1.0 = one core busy). A GPU's `pids` are the processes NVML saw holding it (read every 10th sample) and
`visible` whether the server's CUDA_VISIBLE_DEVICES names it (absent when unset): on a machine shared with other
runs, the report's GPU utilization is the run's GPUs' only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

SCHEMA = "profkit.host/1"
# the roles whose title is read again now and then: a launcher that execs vLLM, a child not yet titled by vLLM
RETITLED = ("profiler", "other")
HOLDERS_EVERY = 10  # samples between two reads of each GPU's processes (NVML lists them: a few ms)


def role_of(name: str, tree: str, is_root: bool) -> str:
    """vLLM's process titles say what each process is. The server's root is taken for the API server (it is
    one when there is one); `analysis.host.host_section` relabels it when VLLM::APIServer_N children exist."""
    low = name.lower()
    if "nsys" in low or "nsight" in low:
        return "profiler"
    if "apiserver" in low or "api_server" in low:
        return "api_server"
    if "enginecore" in low or "engine_core" in low:
        return "engine_core"
    if "worker" in low:
        return "worker"
    if tree == "client":
        return "bench_client" if is_root or "vllm" in low or "python" in low else "other"
    if tree == "offline":  # `vllm bench throughput|latency`: the LLM front end and the bench loop in one process
        return "frontend" if is_root or ("vllm" in low and "bench" in low) else "other"
    if is_root or ("vllm" in low and "serve" in low):
        return "api_server"
    return "other"


class HostSampler:
    """Samples the process trees under `roots` ({"server": pid, "client": pid}) until `stop()`."""

    def __init__(self, interval_s: float = 0.1, nvml: bool = True, processes: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`processes`: psutil, or a stand-in with its `Process` and `Error` (tests read CPU times they chose, on
        `clock`, a fake one: no test depends on how much CPU its machine gives a process)."""
        if processes is None:
            import psutil  # the GPU box has it (vLLM depends on it); `profkit report` never imports it

            processes = psutil
        self.psutil = processes
        self.clock = clock
        self.interval = interval_s
        self.roots: dict[str, int] = {}
        self.procs: dict[int, dict[str, Any]] = {}
        self.handles: dict[int, Any] = {}
        self.last: dict[int, tuple[float, float]] = {}
        self.gpus: list[dict[str, Any]] = []
        self.nvml = self._init_nvml() if nvml else None
        self.t0 = clock()
        self._ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="profkit-host-sampler", daemon=True)

    def _init_nvml(self) -> Any:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                self.gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                                  "util": [], "_handle": h, "_pids": set()})
            return pynvml
        except Exception:  # noqa: BLE001 - no NVML here: CPU sampling still works
            return None

    def watch(self, tree: str, pid: int) -> None:
        self.roots[tree] = pid

    def start(self) -> HostSampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        ps = self.psutil
        now = self.clock() - self.t0
        for tree, root in list(self.roots.items()):
            try:
                top = self.handles.get(root) or ps.Process(root)
                family = [top, *top.children(recursive=True)]
            except ps.Error:
                continue
            for proc in family:
                try:
                    if proc.pid not in self.handles:
                        self.handles[proc.pid] = proc
                        title = " ".join(proc.cmdline())[:200] or proc.name()
                        self.procs[proc.pid] = {"pid": proc.pid, "ppid": proc.ppid(), "name": title, "tree": tree,
                                                "role": role_of(title, tree, proc.pid == root), "cpu": []}
                    elif self.procs[proc.pid]["role"] in RETITLED and self._ticks % HOLDERS_EVERY == 0:
                        # nsys's launcher execs the profiled command (vLLM) in place: the same pid, a new title; a
                        # spawned child titles itself after it starts (`vllm bench throughput`'s engine core)
                        self._retitle(proc, tree, root)
                    times = self.handles[proc.pid].cpu_times()
                except ps.Error:
                    continue
                used = times.user + times.system
                prev = self.last.get(proc.pid)
                self.last[proc.pid] = (now, used)
                if prev and now > prev[0]:
                    self.procs[proc.pid]["cpu"].append([round(now, 3), round((used - prev[1]) / (now - prev[0]), 4)])
        holders = self._ticks % HOLDERS_EVERY == 0
        self._ticks += 1
        if self.nvml:
            for g in self.gpus:
                try:
                    util = self.nvml.nvmlDeviceGetUtilizationRates(g["_handle"]).gpu
                    g["util"].append([round(now, 3), util / 100])
                    if holders:  # which processes hold the GPU: the run's GPUs on a machine shared with others
                        g["_pids"].update(p.pid for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(g["_handle"]))
                except Exception:  # noqa: BLE001, S112 - a sample missed is not a failure
                    continue

    def _retitle(self, proc: Any, tree: str, root: int) -> None:
        """A process's title and role read again: one that exec'd another program (nsys's launcher becoming the
        profiled vLLM) is the new program from then on."""
        title = " ".join(proc.cmdline())[:200] or proc.name()
        entry = self.procs[proc.pid]
        if title != entry["name"]:
            entry["name"], entry["role"] = title, role_of(title, tree, proc.pid == root)

    def stop(self) -> dict[str, Any]:
        visible = self._visible()  # before the server is stopped
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.nvml:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
        return {
            "schema": SCHEMA, "interval_s": self.interval, "cores": usable_cores(),
            "duration_s": round(self.clock() - self.t0, 3),
            "processes": [p for p in self.procs.values() if p["cpu"]],
            "gpus": [{**{k: v for k, v in g.items() if not k.startswith("_")}, "pids": sorted(g["_pids"]),
                      **({"visible": g["index"] in visible} if visible is not None else {})} for g in self.gpus],
        }

    def _visible(self) -> set[int] | None:
        """The GPU indices the server's CUDA_VISIBLE_DEVICES names (numbers, or NVML UUIDs); None when unset."""
        root = self.roots.get("server") or self.roots.get("offline")
        try:
            value = self.psutil.Process(root).environ().get("CUDA_VISIBLE_DEVICES") if root else None
        except self.psutil.Error:
            return None
        if value is None:
            return None
        out = set()
        for word in (w.strip() for w in value.split(",") if w.strip()):
            if word.isdigit():
                out.add(int(word))
            elif self.nvml:
                for g in self.gpus:
                    with contextlib.suppress(Exception):
                        uuid = self.nvml.nvmlDeviceGetUUID(g["_handle"])
                        if (uuid.decode() if isinstance(uuid, bytes) else uuid) == word:
                            out.add(g["index"])
        return out


def start_sampler(interval_s: float = 0.1) -> HostSampler | None:
    """A sampler started (watch its trees with `.watch`), or None without psutil: sampling never fails a run."""
    try:
        return HostSampler(interval_s).start()
    except ImportError:
        return None


def usable_cores() -> int | None:
    """The CPU cores this process (and the server and client it starts) may run on: its affinity where the platform
    says it (a run pinned with taskset to 16 of 32 cores had 16), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
