"""What a capture runs, as data: options in, exact command lines out (no side effects; `--dry-run`).

The profiler flags are the part people get wrong, so they live here, in one place:
nsys traces CUDA, NVTX and OS runtime calls without CPU sampling or context switches (small, fast
files), follows vLLM's worker processes across fork+exec, and records each kernel of a CUDA graph
replay (`--cuda-graph-trace=node`) so graph-replayed kernels are visible by name.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

NSYS_TRACE_FLAGS = ["-t", "cuda,nvtx,osrt", "--sample=none", "--cpuctxsw=none", "--trace-fork-before-exec=true",
                    "--cuda-graph-trace=node"]
OFFLINE_BENCHES = ("throughput", "latency")
NSYS_FLUSH_MS = 500  # serve under nsys: CUDA buffers saved this often (nsys --cuda-flush-interval)


@dataclass
class Step:
    """One process to run: its name (for the manifest and errors), argv, and where its output goes."""

    name: str
    argv: list[str]
    log: str
    timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclass
class CaptureOptions:
    out: Path
    tool: str = "nsys"  # nsys | torch | both | none (no profiler: the benchmark's own figures and logs)
    nsys: str = "nsys"
    vllm: str = "vllm"
    capture_range: bool = False  # nsys records only between vLLM's cudaProfilerStart/Stop (--profile)
    delay_s: float | None = None
    duration_s: float | None = None
    # nsys also records the OS scheduler's context switches of the process tree: each process's CPU time,
    # exact, in the trace (SCHED_EVENTS); off by default as vLLM's threads switch often
    cpu_switches: bool = False
    timeout_s: float = 3600.0
    # offline: the `vllm bench throughput|latency ...` command after `--`
    bench_cmd: list[str] = field(default_factory=list)
    # serve
    model: str | None = None
    server_args: list[str] = field(default_factory=list)
    bench_args: list[str] = field(default_factory=list)
    port: int = 8000
    health_timeout_s: float = 600.0


@dataclass
class Plan:
    kind: str  # "offline" | "serve"
    out: Path
    runs: list[list[Step]]  # offline: one list of steps per profiler run
    server: Step | None = None  # serve: the long-running server (under nsys when asked)
    bench: Step | None = None
    exports: list[Step] = field(default_factory=list)
    vllm_args: list[str] = field(default_factory=list)
    port: int | None = None
    health_timeout_s: float = 600.0
    vllm_exe: str = "vllm"
    nsys_exe: str | None = None  # set when nsys records
    # The user's own commands, without the profiler or the folder's output arguments: what a report
    # quotes back with flag changes applied (offline: the bench; serve: the server, then its benchmark).
    user_commands: list[list[str]] = field(default_factory=list)

    def commands(self) -> list[str]:
        """Every command line, in order, exactly as it will run."""
        lines = [s.shell() for run in self.runs for s in run]
        if self.server:
            lines.append(self.server.shell() + "   # until /health answers; stopped with SIGINT after the bench")
        if self.bench:
            lines.append(self.bench.shell())
        lines += [s.shell() for s in self.exports]
        return lines


def _nsys_profile(opts: CaptureOptions, output: Path, flush_ms: int | None = None) -> list[str]:
    flags = [("--cpuctxsw=process-tree" if f == "--cpuctxsw=none" and opts.cpu_switches else f)
             for f in NSYS_TRACE_FLAGS]
    flush = [f"--cuda-flush-interval={flush_ms}"] if flush_ms else []
    argv = [opts.nsys, "profile", *flush, *flags, "--force-overwrite=true", "-o", str(output)]
    if opts.capture_range:
        argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    if opts.delay_s is not None:
        argv += ["--delay", f"{opts.delay_s:g}"]
    if opts.duration_s is not None:
        argv += ["--duration", f"{opts.duration_s:g}"]
    return argv


def _export(opts: CaptureOptions, rep: Path) -> Step:
    sqlite = rep.with_suffix(".sqlite")
    return Step("nsys export", [opts.nsys, "export", "--type", "sqlite", "--force-overwrite=true", "--output",
                                str(sqlite), str(rep)], log="export.log", timeout_s=opts.timeout_s)


def _torch_profile_flags(out: Path) -> list[str]:
    config = {"profiler": "torch", "torch_profiler_dir": str((out / "torch").resolve())}
    return ["--profile", "--profiler-config", json.dumps(config)]


def plan_offline(opts: CaptureOptions) -> Plan:
    """`vllm bench throughput|latency` under nsys and/or torch.profiler."""
    cmd = list(opts.bench_cmd)
    if cmd[:1] == ["vllm"]:
        cmd = cmd[1:]
    if len(cmd) < 2 or cmd[0] != "bench" or cmd[1] not in OFFLINE_BENCHES:
        raise ValueError("expected `-- vllm bench throughput|latency ARGS...` (use `profkit capture serve` to serve)")
    out = opts.out
    bench_args = cmd[2:]
    base = [opts.vllm, "bench", cmd[1], *bench_args]
    runs: list[list[Step]] = []
    exports: list[Step] = []
    if opts.tool == "none":  # an unprofiled run: only the benchmark's result, logs and flags
        runs.append([Step("vllm bench", [*base, "--output-json", str(out / "bench.json")], log="bench.log",
                          timeout_s=opts.timeout_s)])
    if opts.tool in ("nsys", "both"):
        rep = out / "trace.nsys-rep"
        extra = ["--profile", "--profiler-config", json.dumps({"profiler": "cuda"})] if opts.capture_range else []
        json_out = ["--output-json", str(out / "bench.json")]
        runs.append([Step("vllm bench under nsys", [*_nsys_profile(opts, out / "trace"), *base, *extra, *json_out],
                          log="bench.log", timeout_s=opts.timeout_s)])
        exports.append(_export(opts, rep))
    if opts.tool in ("torch", "both"):
        name = "bench-torch.json" if opts.tool == "both" else "bench.json"
        runs.append([Step("vllm bench with torch.profiler",
                          [*base, *_torch_profile_flags(out), "--output-json", str(out / name)],
                          log="bench-torch.log" if opts.tool == "both" else "bench.log", timeout_s=opts.timeout_s)])
    plan = Plan(kind="offline", out=out, runs=runs, exports=exports, vllm_args=bench_args, vllm_exe=opts.vllm,
                nsys_exe=opts.nsys if exports else None, user_commands=[base])
    # nsys export runs right after its profile run, before a torch run.
    if exports:
        plan.runs[0].append(exports[0])
        plan.exports = []
    return plan


def plan_serve(opts: CaptureOptions) -> Plan:
    """`vllm serve` (under nsys when asked), `vllm bench serve` against it, /metrics before and after."""
    if not opts.model:
        raise ValueError("capture serve needs --model")
    out = opts.out
    server = [opts.vllm, "serve", opts.model, *opts.server_args, "--port", str(opts.port)]
    if opts.tool == "torch":
        server += _torch_profile_flags(out)[1:]  # the server takes the config; `bench serve --profile` starts it
    elif opts.tool == "both":
        raise ValueError("capture serve records one profiler at a time: --tool nsys or --tool torch")
    exports = []
    if opts.tool == "nsys":
        # A served vLLM is stopped, not left to exit: CUDA records still buffered then are lost (on the H100 a
        # 10 s benchmark kept only its first 0.2 s). Buffers saved every NSYS_FLUSH_MS, and a wait of three
        # such intervals after the benchmark (run.py), keep the whole run.
        server = [*_nsys_profile(opts, out / "trace", flush_ms=NSYS_FLUSH_MS), *server]
        exports.append(_export(opts, out / "trace.nsys-rep"))
    bench = [opts.vllm, "bench", "serve", "--backend", "vllm", "--model", opts.model, "--port", str(opts.port),
             *opts.bench_args, "--save-result", "--result-dir", str(out), "--result-filename", "bench.json"]
    if opts.tool == "torch":
        bench.append("--profile")  # asks the server to start/stop its torch profiler around the run
    user_server = [opts.vllm, "serve", opts.model, *opts.server_args, "--port", str(opts.port)]
    user_bench = [opts.vllm, "bench", "serve", "--backend", "vllm", "--model", opts.model, "--port", str(opts.port),
                  *opts.bench_args]
    return Plan(kind="serve", out=out, runs=[],
                server=Step("vllm serve", server, log="server.log", timeout_s=None),
                bench=Step("vllm bench serve", bench, log="bench.log", timeout_s=opts.timeout_s),
                exports=exports, vllm_args=[*opts.server_args, "--port", str(opts.port)], port=opts.port,
                health_timeout_s=opts.health_timeout_s, vllm_exe=opts.vllm,
                nsys_exe=opts.nsys if opts.tool == "nsys" else None, user_commands=[user_server, user_bench])
