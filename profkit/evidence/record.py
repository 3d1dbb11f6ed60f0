"""A run's evidence as one record: everything a report reads besides the traces.

    evidence = Evidence.read(bench=Path("run/bench.json"), log=Path("run/server.log"))  # the files named
    evidence.over(CaptureFolder(path))  # and each piece it lacks from the capture folder

The record is built from the files the options name (`Evidence.read`) or from a capture folder, and the two are
merged by one rule (`Evidence.over`): an explicit option beats the folder. `Evidence.is_empty` is the one test of
whether there is anything but traces to report on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from profkit.errors import ProfkitError
from profkit.evidence.bench import BenchResult, read_bench
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.host import HostSamples, read_host
from profkit.evidence.manifest import CaptureManifest
from profkit.evidence.metrics import MetricsScrape, read_metrics
from profkit.evidence.model_config import ModelShape, read_model_config
from profkit.evidence.vllm_log import VllmLog, read_log
from profkit.vllm.command import UserCommand, VllmCommand, from_non_default_args


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """What the run left besides its traces, each piece read and checked once; None (or empty) where it left no
    such piece. The fields are in the order a capture folder's pieces are read."""

    manifest: CaptureManifest | None = None  # a capture folder's: what ran, its GPU and software
    bench: BenchResult | None = None
    log: VllmLog | None = None  # vLLM's own log (the server's; offline, the benchmark's)
    metrics: list[MetricsScrape] = []  # /metrics scrapes: before and after the benchmark give counter deltas
    vllm_args: str | None = None  # the flags vLLM ran with, as one shell-quoted line
    command: UserCommand | None = None  # the user's own vLLM command(s)
    model: ModelShape | None = None  # the served model's config.json: its shape
    host: HostSamples | None = None  # per-process CPU and NVML samples over the benchmark
    gpu_metrics: Path | None = None  # a capture folder's GPU metrics export (read by the analysis, not here)
    gpu: str | None = None  # the GPU the user says the run used (`--gpu`): beats the trace's and the manifest's name

    @classmethod
    def read(cls, *, bench: Path | None = None, log: Path | None = None, metrics: Sequence[Path] = (),
             vllm_args: str | None = None, model_config: Path | None = None, host: Path | None = None,
             gpu: str | None = None) -> Evidence:
        """The evidence in the files given (`profkit report --bench --vllm-log --metrics --vllm-args
        --model-config --host --gpu`): each read and checked, a bad one failing with one line that names it (a GPU
        name is checked against the peak table by the report)."""
        bench_result = read_bench(bench) if bench else None
        log_record = read_log(log) if log else None
        scrapes = [read_metrics(p) for p in metrics]
        with _bad_vllm_args():
            command = UserCommand([VllmCommand.parse(vllm_args)], "--vllm-args") if vllm_args else None
        return cls(bench=bench_result, log=log_record, metrics=scrapes, vllm_args=vllm_args or None, command=command,
                   model=read_model_config(model_config) if model_config else None,
                   host=read_host(host) if host else None, gpu=gpu.strip() if gpu and gpu.strip() else None)

    def over(self, folder: CaptureFolder) -> Evidence:
        """This evidence over the capture folder's: an explicit option beats the folder. Each piece this record
        holds stays; each it lacks is read from the folder, in field order (a folder file an option replaces is
        never read)."""
        from_folder: dict[str, Callable[[], Any]] = {
            "manifest": folder.manifest, "bench": folder.bench, "log": folder.log, "metrics": folder.metrics,
            "vllm_args": folder.vllm_args, "command": folder.user_command, "model": folder.model_config,
            "host": folder.host, "gpu_metrics": lambda: folder.gpu_metrics_path, "gpu": lambda: None,
        }
        return Evidence(**{name: getattr(self, name) or from_folder[name]() for name in self.__struct_fields__})

    def is_empty(self) -> bool:
        """Nothing of the run but its traces: no benchmark result, log, scrapes, host samples, vLLM flags or
        command, and no capture environment (a model's config or a GPU metrics export alone say nothing of
        the run)."""
        return not (self.bench is not None or self.log is not None or self.metrics or self.host is not None
                    or self.vllm_args or self.command is not None
                    or (self.manifest is not None and self.manifest.environment is not None))

    def run_command(self) -> UserCommand | None:
        """The best-known command of the run: the user's own (the capture manifest's, else --vllm-args), else one
        rebuilt from vLLM's log's "non-default args" line (said as such); what it rebuilds depends on whether the
        benchmark was an offline one (`vllm bench throughput|latency`: a result without TTFT)."""
        if self.command:
            return self.command
        logged = self.log.non_default_args if self.log else None
        if not logged:
            return None
        bench = self.bench
        offline = bench is not None and bench.requests_per_second is not None and bench.ttft_mean_ms is None
        return from_non_default_args(logged, offline)

    def flags(self) -> dict[str, Any]:
        """The settings the run's vLLM flags give ({} without flags)."""
        with _bad_vllm_args():
            return VllmCommand.parse(self.vllm_args).flags() if self.vllm_args else {}


@contextmanager
def _bad_vllm_args() -> Iterator[None]:
    try:
        yield
    except ValueError as exc:  # shlex: an unclosed quote
        raise ProfkitError(f"--vllm-args: {exc}") from None
