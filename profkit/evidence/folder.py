"""The capture folder: the ONE place that knows its files, in the manner of sqlite-utils' `Database`.

    folder = CaptureFolder(path)
    folder.manifest(), folder.bench(), folder.log(), folder.metrics(), folder.host()   # typed records
    folder.traces(), folder.user_command(), folder.vllm_args()

A folder holds `manifest.json` (what ran, when, how it ended, GPU and software), the traces (`trace.nsys-rep`
and its export `trace.sqlite`, torch.profiler's `torch/*.pt.trace.json.gz`), the benchmark's `bench.json`, the
logs (`server.log`, `bench.log`), the /metrics scrapes (`metrics-before.txt`, `metrics-after.txt`), the host
samples (`host.json`) and, after `profkit tune`, the run's `report.json`. Reading goes through the evidence
readers (a report takes them as one record: `profkit.evidence.record.Evidence.over`); writing (the samples, the
scrapes, the report) through the methods here; the manifest as a capture goes is `profkit.capture.manifest`'s.
A failed or interrupted capture still leaves a folder that says what happened and keeps every file written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from functools import cached_property
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.evidence.bench import BenchResult, read_bench
from profkit.evidence.host import HostSamples, read_host
from profkit.evidence.manifest import CaptureManifest, read_manifest
from profkit.evidence.metrics import MetricsScrape, read_metrics, read_series
from profkit.evidence.model_config import ModelShape, read_model_config
from profkit.evidence.vllm_log import VllmLog, read_log
from profkit.vllm.command import UserCommand, VllmCommand

MANIFEST = "manifest.json"
TRACE_BASE = "trace"  # nsys -o trace: trace.nsys-rep, exported to trace.sqlite
NSYS_REPORT = "trace.nsys-rep"
TRACE = "trace.sqlite"
TORCH_DIR = "torch"
BENCH = "bench.json"
BENCH_TORCH = "bench-torch.json"  # --tool both: the torch.profiler run's own result
SERVER_LOG = "server.log"
BENCH_LOG = "bench.log"
BENCH_TORCH_LOG = "bench-torch.log"
EXPORT_LOG = "export.log"
METRICS_BEFORE = "metrics-before.txt"
METRICS_AFTER = "metrics-after.txt"
METRICS_SERIES = "metrics-series.jsonl"  # profkit attach: the scrapes between the first and the last
HOST = "host.json"
REPORT = "report.json"
MODEL_CONFIG = "model-config.json"  # the served model's config.json, copied (its shape: FLOPs and bytes per token)
# The GPU's own counters (nsys --gpu-metrics-devices) sampled while the benchmark ran, device-wide, without tracing
# the server: an nsys export of the benchmark client with `-t none`.
GPU_METRICS_BASE = "gpu-metrics"
GPU_METRICS = "gpu-metrics.sqlite"
# A server lifetime with several benchmark runs (replicates): its own record and the warm-up batch's result; each
# run is a capture folder of its own inside it (r1, r2, ...), so the session folder is a folder of replicates.
SESSION = "session.json"
WARMUP = "warmup.json"
WARMUP_LOG = "warmup.log"
# The files an output must never replace when the folder itself is the input.
PROTECTED = (TRACE, MANIFEST, BENCH, GPU_METRICS)
REPLICATE = re.compile(r"r[1-9][0-9]*")  # a session's runs: `replicate_name`'s names
# What `profkit capture` adds to the user's commands for the profiler and the folder, taken off again when a
# report quotes the command back (older manifests recorded only the command lines as run).
PROFILER_ONLY_WITH_VALUE = ("--profiler-config",)
PROFILER_ONLY_FLAGS = ("--profile",)
RESULT_FILES = (BENCH, BENCH_TORCH)


class CaptureFolder:
    """A capture folder (or a folder of rank traces), read lazily: each record is parsed once."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"CaptureFolder({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    @staticmethod
    def recognise(path: str | os.PathLike) -> bool:
        """A capture folder: it has a manifest, a benchmark result or a trace export."""
        p = Path(path)
        return p.is_dir() and any((p / name).is_file() for name in (MANIFEST, BENCH, TRACE))

    # reading --------------------------------------------------------------------------------------------------
    def _existing(self, name: str) -> Path | None:
        p = self.path / name
        return p if p.is_file() else None

    @property
    def bench_path(self) -> Path | None:
        return self._existing(BENCH)

    @property
    def log_path(self) -> Path | None:
        """The vLLM log: the server's (serve), else the benchmark's (offline: the engine logs there)."""
        return self._existing(SERVER_LOG) or self._existing(BENCH_LOG)

    @property
    def metrics_paths(self) -> list[Path]:
        return [p for p in (self._existing(METRICS_BEFORE), self._existing(METRICS_AFTER)) if p]

    @property
    def host_path(self) -> Path | None:
        return self._existing(HOST)

    @property
    def model_config_path(self) -> Path | None:
        return self._existing(MODEL_CONFIG)

    @property
    def gpu_metrics_path(self) -> Path | None:
        return self._existing(GPU_METRICS)

    def manifest(self) -> CaptureManifest | None:
        return self._manifest

    @cached_property
    def _manifest(self) -> CaptureManifest | None:
        p = self._existing(MANIFEST)
        return read_manifest(p) if p else None

    def bench(self) -> BenchResult | None:
        return read_bench(self.bench_path) if self.bench_path else None

    def log(self) -> VllmLog | None:
        return read_log(self.log_path) if self.log_path else None

    def metrics(self) -> list[MetricsScrape]:
        """The scrapes in time order: before, the timed series (`profkit attach`: vLLM's samples of every scrape),
        after."""
        scrapes = [read_metrics(p) for p in self.metrics_paths]
        series = self._existing(METRICS_SERIES)
        if series is None or not scrapes:
            return scrapes
        # a window cut short (the server went away, profkit stopped) may have no after-scrape: its series still counts
        return [scrapes[0], *read_series(series), *scrapes[1:]]

    def host(self) -> HostSamples | None:
        return read_host(self.host_path) if self.host_path else None

    def model_config(self) -> ModelShape | None:
        return read_model_config(self.model_config_path) if self.model_config_path else None

    def traces(self) -> list[Path]:
        """The traces: trace.sqlite alone when it is there, else every nsys export, else every torch trace
        (torch.profiler writes one per rank: a folder of rank traces reads the same way). The GPU-metrics export
        of an unprofiled benchmark is not a trace (no CUDA activity): `gpu_metrics_path` reads it."""
        preferred = self.path / TRACE
        if preferred.is_file():
            return [preferred]
        exports = [p for p in sorted(self.path.glob("*.sqlite")) if p.name != GPU_METRICS]
        return (exports or sorted(self.path.glob("*.pt.trace.json*"))
                or sorted(self.path.glob(f"{TORCH_DIR}/*.pt.trace.json*")) or sorted(self.path.glob("*rank*.json*")))

    def user_command(self) -> UserCommand | None:
        m = self.manifest()
        return manifest_user_command(m) if m else None

    def vllm_args(self) -> str | None:
        """The flags vLLM ran with, as the manifest records them (a line the shell cannot split names the
        manifest, not an option the user never gave)."""
        m = self.manifest()
        if m is None or not m.vllm_args:
            return None
        try:
            shlex.split(m.vllm_args)
        except ValueError as exc:
            raise ProfkitError(f"{self.path / MANIFEST}: vllm_args: {exc}") from None
        return m.vllm_args

    # writing --------------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.path / MANIFEST).exists()

    @staticmethod
    def replicate_name(n: int) -> str:
        """The folder of a session's n-th run (1-based): r1, r2, ... The one place that names it."""
        return f"r{n}"

    def replicate(self, n: int) -> CaptureFolder:
        """This session folder's n-th run (1-based), written or to be written."""
        return CaptureFolder(self.path / self.replicate_name(n))

    def replicates(self) -> list[CaptureFolder]:
        """A session folder's runs (r1, r2, ...: capture folders of one server lifetime), in order."""
        found = [p for p in self.path.iterdir() if p.is_dir() and CaptureFolder.recognise(p)] \
            if self.path.is_dir() else []
        return [CaptureFolder(p) for p in sorted(found, key=lambda p: (len(p.name), p.name))]

    def is_session(self) -> bool:
        """A session folder (`profkit capture --replicates N`: one server, its runs in r1, r2, ...), not a run."""
        return (self.path / SESSION).is_file() and not CaptureFolder.recognise(self.path)

    def median_run(self) -> tuple[CaptureFolder, dict[str, Any]]:
        """The session's run a report reads, and what each of its runs measured: the run whose request throughput
        is the median of the finished runs' (an even count: the lower of the middle two), so that one replicate's
        noise does not speak for the configuration."""
        runs = [run for run in self.replicates() if REPLICATE.fullmatch(run.path.name)]  # not a folder put beside
        figures = [(run, bench.requests_per_second if run.bench_path and (bench := run.bench()) else None)
                   for run in runs]
        measured = [(run, rps) for run, rps in figures if rps is not None]
        if not measured:
            if (self.path / "sweep.json").is_file():
                raise ProfkitError(f"{self.path}: a sweep folder, one run per request rate: profkit sweep --show "
                                   f"{self.path} reads it (a report reads one of its runs, e.g. rate-R/r1)")
            names = ", ".join(run.path.name for run in runs) or "none"
            raise ProfkitError(f"{self.path}: a session folder whose runs ({names}) hold no benchmark result")
        ordered = sorted(measured, key=lambda m: m[1])
        chosen = ordered[(len(ordered) - 1) // 2][0]
        return chosen, {"path": str(self.path), "run": chosen.path.name,
                        "runs": [{"run": run.path.name, "request_throughput": rps} for run, rps in figures]}

    def write_host(self, data: dict[str, Any]) -> None:
        write_atomic(self.path / HOST, json.dumps(data) + "\n")

    def write_metrics(self, which: str, text: str) -> None:
        """`which`: before | after."""
        (self.path / {"before": METRICS_BEFORE, "after": METRICS_AFTER}[which]).write_text(text, encoding="utf-8")

    def write_model_config(self, model: str) -> bool:
        """Copy the served model's config.json (a local model folder's) into the folder; False when there is none
        to copy (a hub id: give `profkit report --model-config` the file)."""
        source = Path(model) / "config.json"
        if not source.is_file() or source.stat().st_size > 4 << 20:
            return False
        (self.path / MODEL_CONFIG).write_bytes(source.read_bytes())
        return True

    def write_report(self, text: str) -> Path:
        path = self.path / REPORT
        path.write_text(text, encoding="utf-8")
        return path


def manifest_user_command(m: CaptureManifest) -> UserCommand | None:
    """The user's commands: `user_commands` when the manifest has them, else its recorded command lines with
    what capture added for the profiler and the folder taken off."""
    if m.user_commands:
        cmds = [VllmCommand.find_in(c) for c in m.user_commands]
        if all(cmds):
            return UserCommand([c for c in cmds if c], "capture manifest")
    found = []
    for line in m.commands or []:
        try:
            argv = shlex.split(line, comments=True)
            cmd = VllmCommand.find_in(argv)
            if cmd is None and len(argv) > 1 and argv[1] in ("bench", "serve"):
                cmd = VllmCommand.find_in(["vllm", *argv[1:]])  # a wrapper script in vllm's place (/tmp/vllmw)
        except ValueError:
            continue
        if cmd:
            found.append(without_capture_args(cmd))
    return UserCommand(found, "capture manifest (recorded command lines, profiler arguments removed)") \
        if found else None


def without_capture_args(cmd: VllmCommand) -> VllmCommand:
    """Take off what `profkit capture` added for the profiler and the folder (--profile, --output-json X, ...)."""
    drop = [*PROFILER_ONLY_FLAGS, *PROFILER_ONLY_WITH_VALUE]
    output = cmd.given("--output-json")
    if output is not None and os.path.basename(output) in RESULT_FILES:
        drop.append("--output-json")
    if cmd.given("--result-filename") in RESULT_FILES:
        drop += ["--result-dir", "--result-filename", "--save-result"]
    return cmd.without(*drop)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` whole (a temporary file renamed): a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
