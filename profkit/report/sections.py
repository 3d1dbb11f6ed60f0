"""The run's sections, read downward from its inputs: the traces' analyses (or the ranks'), and the analyses of its
evidence (vLLM's figures, the host samples, the efficiency against the GPU's peaks, the workload). Nothing here
judges: facts, rules and the model come after (`profkit.report.judgement`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profkit.analysis.communication import rank_imbalance
from profkit.analysis.efficiency import efficiency_section, known_gpu
from profkit.analysis.host import host_section
from profkit.analysis.sections import Imbalance, Rank, Sections, TraceSections
from profkit.analysis.vllm import VllmSection, vllm_run_evidence, vllm_section
from profkit.analysis.workload import workload_section
from profkit.errors import ProfkitError, TraceError
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.record import Evidence
from profkit.report.options import ReportOptions
from profkit.report.trace_part import trace_sections
from profkit.vllm.command import UserCommand

Progress = Callable[[str], None]
TraceInput = str | os.PathLike | Sequence[str | os.PathLike] | None


@dataclass(frozen=True)
class RunSections:
    """Everything the analyses say of one run, before any judgement."""

    source: dict[str, Any]  # where the report came from: the trace's meta, or the evidence
    sections: Sections  # the (first) trace's; empty without a trace
    trace_part: TraceSections | None
    evidence: Evidence
    command: UserCommand | None  # the run's own command(s), from the manifest, --vllm-args or vLLM's log
    shown: list[str]  # what shows the run is vLLM's (empty: nothing does)
    gpu: str | None  # the GPU that ran it, resolved once: --gpu, the trace's, the manifest's, NVML's
    vllm: VllmSection
    host: dict[str, Any] | None
    efficiency: dict[str, Any] | None
    workload: dict[str, Any]
    ranks: list[Rank] | None
    imbalance: Imbalance | None

    @property
    def environment(self) -> dict[str, Any] | None:
        manifest = self.evidence.manifest
        return manifest.environment if manifest and manifest.environment else None


def run_sections(traces: TraceInput, evidence: Evidence, options: ReportOptions,
                 progress: Progress | None = None) -> RunSections:
    """The run's sections: its traces analysed (one, the ranks of several, or a capture folder's, whose evidence fills
    in what `evidence` lacks) and its evidence analysed."""
    paths = ([Path(p) for p in traces] if isinstance(traces, (list, tuple)) else [] if traces is None
             else [Path(traces)])  # type: ignore[arg-type]
    for p in paths:
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
    folder = CaptureFolder(paths[0]) if len(paths) == 1 and paths[0].is_dir() else None
    if folder:
        evidence = evidence.over(folder)
        paths = folder.traces()
    if not paths and evidence.is_empty():
        where = f"{folder.path}: folder holds no trace and no vLLM evidence" if folder else "nothing to report"
        raise ProfkitError(f"{where} (give a trace, a capture folder, or --bench/--vllm-log/--metrics/--vllm-args)")
    given_gpu = known_gpu(evidence.gpu) if evidence.gpu else None  # a name the peak table lacks: one line, now
    part = _trace_part(paths, options, progress or (lambda _name: None))
    source = _source(part, folder)
    bench = evidence.bench
    host = host_section(evidence.host, bench.elapsed_s if bench else None) if evidence.host is not None else None
    command = evidence.run_command()
    shown = vllm_run_evidence(bench, evidence.log, evidence.metrics, evidence.flags(), command is not None,
                              bool(source.get("vllm_names")))
    manifest_gpu = (evidence.manifest.environment or {}).get("gpu") if evidence.manifest else None
    # Some of vLLM's defaults depend on the GPU: the one the user names, else the trace's, else the manifest's.
    gpu = given_gpu or source.get("gpu") or manifest_gpu
    vllm = vllm_section(bench, evidence.log, evidence.metrics, evidence.flags(), gpu, is_vllm=bool(shown))
    gpu = gpu or next(iter((host or {}).get("gpus") or []), None)  # NVML's name: peaks only, not vLLM's defaults
    sections = part.sections if part is not None else Sections()
    rank_parts = part.ranks if part is not None and part.ranks and len(part.ranks) > 1 else None
    bench_cmd = (command.role("client") or command.role("offline")) if command else None
    return RunSections(
        source=source, sections=sections, trace_part=part, evidence=evidence, command=command, shown=shown, gpu=gpu,
        vllm=vllm, host=host,
        efficiency=_efficiency(gpu, evidence, vllm, part),
        workload=workload_section(bench_cmd, bench),
        ranks=[p.entry for p in rank_parts] if rank_parts else None,
        imbalance=rank_imbalance(rank_parts) if rank_parts else None)


def _trace_part(paths: list[Path], options: ReportOptions, step: Progress) -> TraceSections | None:
    if len(paths) > 1:
        from profkit.report.ranks import build_ranks

        return build_ranks(paths, options, step)
    if paths:
        return trace_sections(paths[0], options.window, options.gap_threshold_ns, options.buckets, step)
    return None


def _source(part: TraceSections | None, folder: CaptureFolder | None) -> dict[str, Any]:
    if part is None:
        return {"path": str(folder.path) if folder else None, "kind": "evidence"}
    if folder and part.source.get("path"):
        return {**part.source, "path": str(folder.path)}
    return part.source


def _efficiency(gpu: str | None, evidence: Evidence, vllm: VllmSection, part: TraceSections | None
                ) -> dict[str, Any] | None:
    """How far the run is from the GPU's peaks, over the benchmark (or the live window)."""
    bench, live = evidence.bench, vllm.live or {}  # a live window (profkit attach) is the run's time without one
    sections = part.sections if part is not None else None
    return efficiency_section(gpu, evidence.model, vllm.config, vllm.metrics_delta or {},
                              bench.elapsed_s if bench else live.get("seconds"),
                              bench.num_requests if bench else live.get("requests"),
                              gpu_metrics=gpu_metrics_of(part, evidence.gpu_metrics),
                              export_bandwidth=_export_bandwidth(part.source if part is not None else {}),
                              steps=sections.steps if sections is not None else None,
                              request_tokens=bench.request_tokens() if bench else None)


def gpu_metrics_of(part: TraceSections | None, export: Path | None) -> dict[str, Any] | None:
    """The GPU's own counters: the trace's (with engine steps and kernels to split them by), else the capture's
    GPU metrics `export` (the benchmark's whole span)."""
    if part is not None and part.gpu_metrics is not None:
        return part.gpu_metrics
    if export is None:
        return None
    from profkit.analysis.gpu_metrics import metrics_section
    from profkit.traces.gpu_metrics import open_gpu_metrics

    return metrics_section(open_gpu_metrics(export), source=str(export))


def _export_bandwidth(source: dict[str, Any]) -> Any:
    """The memory bandwidth of the export's GPU row for the GPU that ran the kernels (`source.gpu`), not of a row
    for a device that ran none."""
    rows = [g for g in source.get("gpus") or [] if isinstance(g, dict)]
    ran = [g for g in rows if g.get("name") == source.get("gpu")]
    return next((g.get("memory_bandwidth") for g in ran or rows), None)
