"""What a capture runs, as data: the user's commands and the profiler options in, exact command lines out (no
side effects; `--dry-run`).

The profiler flags are the part people get wrong, so they live here, in one place: nsys traces CUDA, NVTX and
OS runtime calls without CPU sampling or context switches (small, fast files), follows vLLM's worker processes
across fork+exec, and records each kernel of a CUDA graph replay (`--cuda-graph-trace=node`) so
graph-replayed kernels are visible by name. The user's commands are the ones the run's report quotes back: the
profiler and the folder's output arguments are added here, never kept in them.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from profkit.errors import ProfkitError
from profkit.escape import shell, shell_word
from profkit.evidence import folder as files
from profkit.evidence.folder import CaptureFolder
from profkit.vllm.command import UserCommand, VllmCommand
from profkit.vllm.options import profiler_config_keys

NSYS_TRACE_FLAGS = ["-t", "cuda,nvtx,osrt", "--sample=none", "--cpuctxsw=none", "--trace-fork-before-exec=true",
                    "--cuda-graph-trace=node"]
OFFLINE_BENCHES = ("throughput", "latency")
NSYS_FLUSH_MS = 500  # serve under nsys: CUDA buffers saved this often (nsys --cuda-flush-interval)
# GPU metrics at 1 kHz: ~32k rows a second on an H100 (set gh100, nsys's default there); 10 kHz, nsys's own default,
# makes a minute of serving a 20M-row table.
GPU_METRICS_FLAGS = ["--gpu-metrics-devices=all", "--gpu-metrics-frequency=1000"]
MFU_FLAG = "--enable-mfu-metrics"  # vLLM >= 0.26: per-step FLOPs and bytes estimates as /metrics counters
# vLLM's profiler names each engine step it records (`execute_context_N(T)_generation_M(G)`: NVTX under the cuda
# profiler, a record_function under torch's); the detailed form adds each phase's KV lengths and attention pairs,
# what a step's FLOPs and bytes need (analysis/efficiency.py: MFU and MBU per phase).
DETAILED_STEPS = "detailed_trace_annotation"
DEFAULT_PORT = 8000


@dataclass
class Step:
    """One process to run: its name (for the manifest and errors), argv, and where its output goes."""

    name: str
    argv: list[str]
    log: str
    timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The command line exactly as it runs, on one line and safe on a terminal (profkit.escape.shell)."""
        env = " ".join(f"{k}={shell_word(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shell(self.argv)


@dataclass
class CaptureOptions:
    out: Path
    user: UserCommand  # what runs: `vllm bench throughput|latency ...`, or `vllm serve` and `vllm bench serve`
    tool: str = "nsys"  # nsys | torch | both | none (no profiler: the benchmark's own figures and logs)
    nsys: str = "nsys"
    capture_range: bool = False  # nsys records only between vLLM's cudaProfilerStart/Stop (--profile)
    delay_s: float | None = None
    duration_s: float | None = None
    # nsys also records the OS scheduler's context switches of the process tree: each process's CPU time,
    # exact, in the trace (SCHED_EVENTS); off by default as vLLM's threads switch often
    cpu_switches: bool = False
    # nsys samples the GPU's own counters (SM, tensor-core and DRAM activity) while the benchmark runs; unprofiled
    # serve runs record them around the benchmark client (`-t none`: no trace, no perturbed server)
    gpu_metrics: bool = False
    timeout_s: float = 3600.0
    health_timeout_s: float = 600.0


@dataclass
class Plan:
    kind: str  # "offline" | "serve"
    out: Path
    user: UserCommand  # the user's own commands, as the report quotes them back
    runs: list[list[Step]]  # offline: one list of steps per profiler run
    server: Step | None = None  # serve: the long-running server (under nsys when asked)
    bench: Step | None = None
    exports: list[Step] = field(default_factory=list)
    vllm_args: list[str] = field(default_factory=list)
    port: int | None = None
    health_timeout_s: float = 600.0
    vllm_exe: str = "vllm"
    nsys_exe: str | None = None  # set when nsys records
    client: VllmCommand | None = None  # serve: the benchmark client as the user gave it
    # serve: the server takes vLLM's profiler config (torch, or cuda under nsys: step annotations); each benchmark
    # starts and stops it (`vllm bench serve --profile`)
    vllm_profiler: str | None = None
    timeout_s: float | None = None
    gpu_metrics: str | None = None  # the nsys that samples GPU metrics around each benchmark (unprofiled serve)
    model: str | None = None  # the served model (its config.json goes into the folder)

    @property
    def folder(self) -> CaptureFolder:
        return CaptureFolder(self.out)

    def bench_step(self, folder: Path, seed: int | None = None, prompts: int | None = None,
                   name: str = "vllm bench serve", result: str = files.BENCH, log: str = files.BENCH_LOG,
                   rate: float | None = None) -> Step:
        """A `vllm bench serve` run against this plan's server, its result in `folder`: the user's client command,
        with its own `--seed` (replicates against one server must not send the same prompts twice: the prefix
        cache would serve them), and `--num-prompts` and `--request-rate` where given (a sweep's point)."""
        assert self.client is not None
        client = self.client_for(seed, prompts, rate)
        argv = [*client.argv(), "--save-result", "--result-dir", str(folder), "--result-filename", result]
        if self.vllm_profiler:
            argv.append("--profile")  # asks the server to start/stop its profiler around the run
        if self.gpu_metrics and result == files.BENCH:
            argv = [self.gpu_metrics, "profile", "-t", "none", "--sample=none", "--cpuctxsw=none", *GPU_METRICS_FLAGS,
                    "--force-overwrite=true", "-o", str(Path(folder) / files.GPU_METRICS_BASE), *argv]
        return Step(name, argv, log=log, timeout_s=self.timeout_s)

    def client_for(self, seed: int | None = None, prompts: int | None = None,
                   rate: float | None = None) -> VllmCommand:
        """The user's benchmark client with this run's seed, prompt count and request rate, where given."""
        assert self.client is not None
        client = self.client
        for flag, value in (("--seed", seed), ("--num-prompts", prompts), ("--request-rate", rate)):
            if value is not None:
                client = client.apply(flag, value)[0]
        return client

    def gpu_metrics_export(self, folder: Path) -> Step | None:
        """The export of a benchmark's GPU metrics to SQLite (None when the plan samples none)."""
        if not self.gpu_metrics:
            return None
        rep = Path(folder) / (files.GPU_METRICS_BASE + ".nsys-rep")
        return Step("nsys export (GPU metrics)", [self.gpu_metrics, "export", "--type", "sqlite",
                                                  "--force-overwrite=true", "--output",
                                                  str(Path(folder) / files.GPU_METRICS), str(rep)],
                    log=files.EXPORT_LOG, timeout_s=self.timeout_s)

    def session_commands(self, replicates: int) -> list[str]:
        """The command lines of `replicates` runs against one server lifetime (see capture.run.ServerSession):
        the server once, a warm-up batch, then each run with its own --seed into its own folder."""
        assert self.server is not None
        return [self.server.shell() + "   # once, until /health answers; stopped with SIGINT after the runs",
                self.warmup_step().shell() + "   # warm-up",
                *(self.bench_step(self.folder.replicate(i + 1).path, seed=self.seed() + i).shell()
                  for i in range(replicates))]

    def warmup_step(self) -> Step:
        """A warm-up batch before a session's runs: a tenth of the prompts, a seed none of the runs uses."""
        return self.bench_step(self.out, seed=self.seed() + 1000, prompts=self.warmup_prompts(), name="warm-up",
                               result=files.WARMUP, log=files.WARMUP_LOG)

    def seed(self) -> int:
        """The client's own --seed (`vllm bench serve`'s default is 0)."""
        value = self.client.value("--seed", 0) if self.client else 0
        return value if isinstance(value, int) else 0

    def warmup_prompts(self) -> int:
        """A warm-up batch: a tenth of the benchmark's prompts (8 to 100)."""
        n = self.client.value("--num-prompts", 1000) if self.client else 1000
        return max(8, min(100, (n if isinstance(n, int) else 1000) // 10))

    def commands(self) -> list[str]:
        """Every command line, in order, exactly as it will run."""
        lines = [s.shell() for run in self.runs for s in run]
        if self.server:
            lines.append(self.server.shell() + "   # until /health answers; stopped with SIGINT after the bench")
        if self.bench:
            lines.append(self.bench.shell())
            if (export := self.gpu_metrics_export(self.out)) is not None:
                lines.append(export.shell())
        lines += [s.shell() for s in self.exports]
        return lines


def commands_from_cli(command: list[str], model: str | None, server_args: str, bench_args: str, port: int,
                      vllm: str = "vllm", verb: str = "capture") -> UserCommand:
    """The run's commands from profkit's command line: `-- vllm bench throughput|latency ...`, or `serve` with
    --model, --server-args, --bench-args and --port (the server and its benchmark client)."""
    if command[:1] == ["serve"]:
        if not model:
            raise ProfkitError(f"{verb} serve needs --model")
        try:
            server_words, bench_words = shlex.split(server_args), shlex.split(bench_args)
        except ValueError as exc:
            raise ProfkitError(f"--server-args/--bench-args: {exc} (quote as in a shell)") from None
        server = VllmCommand([vllm], ["serve"], [model, *server_words, "--port", str(port)])
        client = VllmCommand([vllm], ["bench", "serve"],
                             ["--backend", "vllm", "--model", model, "--port", str(port), *bench_words])
        return UserCommand([server, client], f"{verb} command line")
    words = command[1:] if command[:1] == ["vllm"] else command
    if len(words) < 2 or words[0] != "bench" or words[1] not in OFFLINE_BENCHES:
        raise ProfkitError(f"expected `-- vllm bench throughput|latency ARGS...` (use `profkit {verb} serve` to serve)")
    return UserCommand([VllmCommand([vllm], words[:2], words[2:])], f"{verb} command line")


def plan(opts: CaptureOptions) -> Plan:
    """The plan for the user's commands: offline (one benchmark) or serve (a server and its benchmark)."""
    return plan_serve(opts) if opts.user.role("server") else plan_offline(opts)


def _nsys_profile(opts: CaptureOptions, output: Path, flush_ms: int | None = None) -> list[str]:
    flags = [("--cpuctxsw=process-tree" if f == "--cpuctxsw=none" and opts.cpu_switches else f)
             for f in NSYS_TRACE_FLAGS]
    flush = [f"--cuda-flush-interval={flush_ms}"] if flush_ms else []
    metrics = GPU_METRICS_FLAGS if opts.gpu_metrics else []
    argv = [opts.nsys, "profile", *flush, *flags, *metrics, "--force-overwrite=true", "-o", str(output)]
    if opts.capture_range:
        argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    if opts.delay_s is not None:
        argv += ["--delay", f"{opts.delay_s:g}"]
    if opts.duration_s is not None:
        argv += ["--duration", f"{opts.duration_s:g}"]
    return argv


def _export(opts: CaptureOptions, folder: CaptureFolder) -> Step:
    return Step("nsys export", [opts.nsys, "export", "--type", "sqlite", "--force-overwrite=true", "--output",
                                str(folder.file(files.TRACE)), str(folder.file(files.NSYS_REPORT))],
                log=files.EXPORT_LOG, timeout_s=opts.timeout_s)


def profiler_config(profiler: str, folder: CaptureFolder | None = None) -> list[str]:
    """`--profiler-config` for vLLM's own profiler: torch (its traces into the folder) or cuda (under nsys: the
    cudaProfilerStart/Stop a capture range waits for, and NVTX step annotations); detailed step annotations where
    this vLLM has them."""
    config: dict[str, object] = {"profiler": profiler}
    if profiler == "torch" and folder is not None:
        config["torch_profiler_dir"] = str(folder.file(files.TORCH_DIR).resolve())
    if DETAILED_STEPS in profiler_config_keys():
        config[DETAILED_STEPS] = True
    return ["--profiler-config", json.dumps(config)]


def _torch_profile_flags(folder: CaptureFolder) -> list[str]:
    return ["--profile", *profiler_config("torch", folder)]


def plan_offline(opts: CaptureOptions) -> Plan:
    """`vllm bench throughput|latency` under nsys and/or torch.profiler."""
    bench = opts.user.role("offline")
    if bench is None or bench.subcommand[1:] not in ([b] for b in OFFLINE_BENCHES):
        raise ProfkitError("expected `-- vllm bench throughput|latency ARGS...` (use `profkit capture serve` to serve)")
    folder = CaptureFolder(opts.out)
    base = bench.argv()
    runs: list[list[Step]] = []
    exports: list[Step] = []
    result = ["--output-json", str(folder.file(files.BENCH))]
    if opts.tool == "none":  # an unprofiled run: only the benchmark's result, logs and flags
        runs.append([Step("vllm bench", [*base, *result], log=files.BENCH_LOG, timeout_s=opts.timeout_s)])
    if opts.tool in ("nsys", "both"):
        extra = ["--profile", *profiler_config("cuda")] if opts.capture_range else []
        runs.append([Step("vllm bench under nsys", [*_nsys_profile(opts, folder.file(files.TRACE_BASE)), *base,
                                                    *extra, *result],
                          log=files.BENCH_LOG, timeout_s=opts.timeout_s)])
        exports.append(_export(opts, folder))
    if opts.tool in ("torch", "both"):
        both = opts.tool == "both"
        out = ["--output-json", str(folder.file(files.BENCH_TORCH if both else files.BENCH))]
        runs.append([Step("vllm bench with torch.profiler", [*base, *_torch_profile_flags(folder), *out],
                          log=files.BENCH_TORCH_LOG if both else files.BENCH_LOG, timeout_s=opts.timeout_s)])
    if exports:  # nsys export runs right after its profile run, before a torch run
        runs[0].append(exports.pop())
    return Plan(kind="offline", out=opts.out, user=opts.user, runs=runs, exports=exports, vllm_args=bench.args,
                vllm_exe=bench.program[0] if bench.program else "vllm",
                nsys_exe=opts.nsys if opts.tool in ("nsys", "both") else None, model=bench.model)


def plan_serve(opts: CaptureOptions) -> Plan:
    """`vllm serve` (under nsys when asked), `vllm bench serve` against it, /metrics before and after."""
    server, client = opts.user.role("server"), opts.user.role("client")
    if server is None or client is None:
        raise ProfkitError("a served capture needs the server's and the benchmark's commands")
    if opts.tool == "both":
        raise ProfkitError("capture serve records one profiler at a time: --tool nsys or --tool torch")
    folder = CaptureFolder(opts.out)
    argv = server.argv()
    spec = server.spec()
    if spec and MFU_FLAG in spec.options and not server.occurrences(MFU_FLAG):
        argv.append(MFU_FLAG)  # vLLM's own FLOPs and bytes estimates; not in the command the report quotes back
    # The server takes vLLM's profiler config and `bench serve --profile` starts and stops it around the run: torch
    # traces, or under nsys the step annotations (and the capture range's start and stop). A config of the user's
    # own stays theirs.
    profiler = {"torch": "torch", "nsys": "cuda"}.get(opts.tool)
    if profiler and server.occurrences("--profiler-config"):
        profiler = "user"
    elif profiler:
        argv += profiler_config(profiler, folder)
    exports = []
    if opts.tool == "nsys":
        # A served vLLM is stopped, not left to exit: CUDA records still buffered then are lost (on the H100 a
        # 10 s benchmark kept only its first 0.2 s). Buffers saved every NSYS_FLUSH_MS, and a wait of three
        # such intervals after the benchmark (run.py), keep the whole run.
        argv = [*_nsys_profile(opts, folder.file(files.TRACE_BASE), flush_ms=NSYS_FLUSH_MS), *argv]
        exports.append(_export(opts, folder))
    port = server.value("--port", DEFAULT_PORT)
    plan = Plan(kind="serve", out=opts.out, user=opts.user, runs=[],
                server=Step("vllm serve", argv, log=files.SERVER_LOG, timeout_s=None),
                exports=exports, vllm_args=server.args[1:], port=port if isinstance(port, int) else DEFAULT_PORT,
                health_timeout_s=opts.health_timeout_s, vllm_exe=server.program[0] if server.program else "vllm",
                nsys_exe=opts.nsys if opts.tool == "nsys" else None, client=client, vllm_profiler=profiler,
                timeout_s=opts.timeout_s, model=server.model,
                gpu_metrics=opts.nsys if opts.gpu_metrics and opts.tool == "none" else None)
    plan.bench = plan.bench_step(opts.out)
    return plan
