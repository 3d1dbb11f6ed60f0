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
from profkit.analysis.efficiency import efficiency_section, export_bandwidth, known_gpu
from profkit.analysis.gpu_metrics import run_gpu_metrics
from profkit.analysis.host import host_section
from profkit.analysis.sections import Imbalance, Rank, Sections, TraceSections
from profkit.analysis.vllm import VllmSection, vllm_run_evidence, vllm_section
from profkit.analysis.workload import workload_section
from profkit.errors import ProfkitError, TraceError
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.metrics import metrics_window
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
    session = None
    if folder and folder.is_session():
        folder, session = folder.median_run()
    if folder:
        evidence = evidence.over(folder)
        paths = folder.traces()
    if not paths and evidence.is_empty():
        replicates = folder.replicates() if folder else []
        if folder and replicates:  # replicates without the session's record: a run each, or all of them to diff
            names = ", ".join(r.path.name for r in replicates[:6]) + (", ..." if len(replicates) > 6 else "")
            raise ProfkitError(f"{folder.path}: a folder of {len(replicates)} capture folders ({names}): report one "
                               f"of them (e.g. {replicates[0].path}), or profkit diff reads them as replicates")
        where = f"{folder.path}: folder holds no trace and no vLLM evidence" if folder else "nothing to report"
        raise ProfkitError(f"{where} (give a trace, a capture folder, or --bench/--vllm-log/--metrics/--vllm-args)")
    # the evidence record read first, each piece once; then the analyses, over it and over the traces
    scrapes = metrics_window(evidence.metrics)
    command = evidence.run_command()
    flags = evidence.flags()
    bench, log = evidence.bench, evidence.log
    manifest_gpu = (evidence.manifest.environment or {}).get("gpu") if evidence.manifest else None
    given_gpu = known_gpu(evidence.gpu) if evidence.gpu else None  # a name the peak table lacks: one line, now
    part = _trace_part(paths, options, progress or (lambda _name: None))
    source = _source(part, folder) | ({"session": session} if session else {})
    host = host_section(evidence.host, bench.elapsed_s if bench else None) if evidence.host is not None else None
    shown = vllm_run_evidence(bench, log, scrapes, flags, command is not None, bool(source.get("vllm_names")))
    # Some of vLLM's defaults depend on the GPU: the one the user names, else the trace's, else the manifest's.
    gpu = given_gpu or source.get("gpu") or manifest_gpu
    vllm = vllm_section(bench, log, scrapes, flags, gpu, is_vllm=bool(shown))
    gpu = gpu or next(iter((host or {}).get("gpus") or []), None)  # NVML's name: peaks only, not vLLM's defaults
    live = vllm.live or {}  # a live window (profkit attach) is the run's time where no benchmark timed one
    sections = part.sections if part is not None else Sections()
    rank_parts = part.ranks if part is not None and part.ranks and len(part.ranks) > 1 else None
    bench_cmd = (command.role("client") or command.role("offline")) if command else None
    return RunSections(
        source=source, sections=sections, trace_part=part, evidence=evidence, command=command, shown=shown, gpu=gpu,
        vllm=vllm, host=host,
        efficiency=efficiency_section(
            gpu, evidence.model, vllm.config, vllm.metrics_delta or {},
            bench.elapsed_s if bench else live.get("seconds"), bench.num_requests if bench else live.get("requests"),
            gpu_metrics=run_gpu_metrics(part.gpu_metrics if part is not None else None, evidence.gpu_metrics),
            export_bandwidth=export_bandwidth(source), steps=sections.steps if part is not None else None,
            request_tokens=bench.request_tokens() if bench else None),
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
    if folder and part.source.get("path"):  # the folder given, and the trace read in it (a folder may hold more)
        return {"traces": [part.source["path"]], **part.source, "path": str(folder.path)}
    return part.source
