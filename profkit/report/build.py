"""Build the `profkit.report/1` document once: evidence -> trace sections -> facts -> rules -> suggested command.

This is the library entry point behind `profkit report`; everything here is usable from Python:

    from profkit.evidence.record import Evidence
    from profkit.report import ReportOptions, build_report
    report = build_report("run.sqlite")  # a trace, several, a capture folder; the default options
    report = build_report("run.sqlite", Evidence.read(bench=Path("run/bench.json")), ReportOptions(window="all"))
    report.sections.gpu.utilization, report.findings[0].title, report.document()  # the JSON contract
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from profkit import __version__
from profkit.analysis.communication import rank_imbalance
from profkit.analysis.efficiency import efficiency_section, known_gpu
from profkit.analysis.host import host_section
from profkit.analysis.sections import Sections, TraceSections
from profkit.diagnose.engine import evaluate
from profkit.diagnose.facts import compute_facts
from profkit.diagnose.prescription import prescribe
from profkit.diagnose.priority import order_findings
from profkit.diagnose.rule_files import load_rules
from profkit.diagnose.suggestion import suggest, user_command
from profkit.diagnose.vllm_run import NOT_VLLM_NOTE, vllm_run_evidence, vllm_section
from profkit.errors import ProfkitError, TraceError
from profkit.evidence.bench import BenchResult
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.record import Evidence
from profkit.report.model import SCHEMA, Report, RunSection
from profkit.report.options import ReportOptions
from profkit.report.trace_part import trace_sections
from profkit.vllm.command import VllmCommand, dest_of

Progress = Callable[[str], None]
TraceInput = str | os.PathLike | Sequence[str | os.PathLike] | None


def build_report(traces: TraceInput = None, evidence: Evidence | None = None, options: ReportOptions | None = None,
                 progress: Progress | None = None) -> Report:
    """Analyse the traces, join the run's evidence, run the rules; return the report.

    `traces`: one trace; several (one per rank of a multi-GPU run), or a folder of them: one report with a
    section per rank (`ranks`) and the cross-rank `imbalance`; a capture folder, whose evidence fills in what
    `evidence` lacks (an explicit option beats the folder: `Evidence.over`); or None. Without a trace (None, or
    a capture folder of an unprofiled run) the report holds the evidence alone: its facts, and the findings whose
    facts are known (the rest in `rules_skipped`). `evidence`: what the run left besides its traces (default:
    nothing); `options`: how to analyse them (default: `ReportOptions()`); `progress`: told each stage's name."""
    options = options or ReportOptions()
    paths = ([Path(p) for p in traces] if isinstance(traces, (list, tuple)) else [] if traces is None
             else [Path(traces)])
    for p in paths:
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
    folder = CaptureFolder(paths[0]) if len(paths) == 1 and paths[0].is_dir() else None
    evidence = evidence or Evidence()
    if folder:
        evidence = evidence.over(folder)
        paths = folder.traces()
    if not paths and evidence.is_empty():
        where = f"{folder.path}: folder holds no trace and no vLLM evidence" if folder else "nothing to report"
        raise ProfkitError(f"{where} (give a trace, a capture folder, or --bench/--vllm-log/--metrics/--vllm-args)")
    given_gpu = known_gpu(evidence.gpu) if evidence.gpu else None  # a name the peak table lacks: one line, now
    flags = evidence.flags()
    bench = evidence.bench
    host_part = (host_section(evidence.host, bench.elapsed_s if bench else None) if evidence.host is not None
                 else None)
    rules = load_rules(list(options.rules_dirs))  # validate the rules before spending time on the trace
    step = progress or (lambda _name: None)

    if len(paths) > 1:
        from profkit.report.ranks import build_ranks

        part: TraceSections | None = build_ranks(paths, options, step)
    elif paths:
        part = trace_sections(paths[0], options.window, options.gap_threshold_ns, options.buckets, step)
    else:
        part = None
    source: dict[str, Any] = ({"path": str(folder.path) if folder else None, "kind": "evidence"} if part is None
                              else {**part.source, "path": str(folder.path)} if folder and part.source.get("path")
                              else part.source)
    rank_parts = part.ranks if part is not None and part.ranks and len(part.ranks) > 1 else None
    manifest = evidence.manifest
    environment = manifest.environment if manifest and manifest.environment else None

    log = evidence.log
    command = user_command(evidence.command, log.non_default_args if log else None,
                           offline=bench is not None and bench.requests_per_second is not None
                           and bench.ttft_mean_ms is None)
    shown = vllm_run_evidence(bench, log, evidence.metrics, flags, command is not None,
                              bool(source.get("vllm_names")))
    # Some of vLLM's defaults depend on the GPU (the trace's, else the capture manifest's).
    vllm = vllm_section(bench, log, evidence.metrics, flags,
                        given_gpu or source.get("gpu") or (environment or {}).get("gpu"), is_vllm=bool(shown))
    ranks = [p.entry for p in rank_parts] if rank_parts else None
    imbalance = rank_imbalance(rank_parts) if rank_parts else None
    bench_cmd = (command.role("client") or command.role("offline")) if command else None
    workload = _workload(bench_cmd, bench)
    gpu_name = given_gpu or source.get("gpu") or (environment or {}).get("gpu") or \
        next(iter((host_part or {}).get("gpus") or []), None)
    sections = part.sections if part is not None else None
    live = vllm.live or {}  # a live window (profkit attach) is the run's time where no benchmark timed one
    efficiency = efficiency_section(gpu_name, evidence.model, vllm.config, vllm.metrics_delta or {},
                                    bench.elapsed_s if bench else live.get("seconds"),
                                    bench.num_requests if bench else live.get("requests"),
                                    gpu_metrics=gpu_metrics_section(part, evidence.gpu_metrics),
                                    export_bandwidth=_export_bandwidth(source),
                                    steps=sections.steps if sections is not None else None,
                                    request_tokens=_request_tokens(bench))
    facts = compute_facts(sections, vllm, host_part, ranks, imbalance, workload, efficiency)
    # Not shown to be vLLM's: the findings say what the trace shows, and no vLLM flag is proposed.
    findings, skipped = evaluate(rules, facts, propose_changes=bool(shown))
    findings = order_findings(findings, vllm.defaults.get("gpu"))  # the user's missteps first, then the gain
    prescription = None
    if shown:
        partial = msgspec.to_builtins({"vllm": vllm, "facts": facts, "efficiency": efficiency,
                                       "steps": sections.steps if sections is not None else None})
        prescription = prescribe(partial, findings)
    prescribed = [{"flag": c["flag"], "to": c["to"], "from_source": (vllm.config.get(dest_of(c["flag"])) or {})
                   .get("source")} for c in (prescription.changes if prescription else [])]
    # the command carries the prescription where there is one; else every finding's changes, most important first
    suggestion = suggest(command, prescribed) if prescribed else \
        suggest(command, [c for f in findings for c in f.changes])
    extra: dict[str, Any] = {}
    if ranks:
        extra.update(ranks=ranks, imbalance=imbalance)
    if environment:
        extra["environment"] = environment
    return Report(
        schema=SCHEMA, profkit_version=__version__, source=source,
        sections=sections if sections is not None else Sections(),
        vllm=vllm,
        findings=suggestion.annotated(findings, prescribed=bool(prescribed)),
        **extra,
        run=RunSection(shown) if shown else RunSection(shown, note=NOT_VLLM_NOTE),
        host=host_part,
        efficiency=efficiency,
        facts=facts,
        rules_skipped=skipped,
        command=suggestion.section(),
        suggested_command=suggestion.text(),
        prescription=prescription.document() if prescription else None,
    )


def _workload(bench_cmd: VllmCommand | None, bench: BenchResult | None) -> dict[str, Any]:
    """What the benchmark's command and result say of its workload (`workload.*` facts)."""
    lengths = bench_cmd.prompt_lengths() if bench_cmd else None
    mean = _request_tokens(bench) or _offline_tokens(lengths, bench)
    per_request = mean[0] + mean[1] if mean else float(lengths[0] + lengths[1]) if lengths else None
    return {"shared_prefixes": bench_cmd.shared_prefixes() if bench_cmd else None,
            "tokens_per_request": per_request,
            "prompt_tokens": mean[0] if mean else None, "output_tokens": mean[1] if mean else None,
            "max_tokens_per_request": int((lengths[0] + lengths[1]) * (1 + lengths[2])) if lengths else None}


def _offline_tokens(lengths: tuple[int, int, float] | None, bench: BenchResult | None) -> tuple[float, float] | None:
    """`vllm bench throughput` writes only the total of prompt and output tokens: the command's random lengths split
    it where every request had them (no range ratio) and they add up to that total within 1 %."""
    if not lengths or lengths[2] or bench is None or not bench.num_requests or not bench.tokens_per_second \
            or not bench.elapsed_s:
        return None
    total = bench.tokens_per_second * bench.elapsed_s
    expected = bench.num_requests * (lengths[0] + lengths[1])
    return (float(lengths[0]), float(lengths[1])) if abs(total / expected - 1) <= 0.01 else None


def _request_tokens(bench: BenchResult | None) -> tuple[float, float] | None:
    """The benchmark's mean prompt and output tokens per request."""
    if bench is None or bench.input_tokens is None or bench.output_tokens is None or not bench.num_requests:
        return None
    return bench.input_tokens / bench.num_requests, bench.output_tokens / bench.num_requests


def gpu_metrics_section(part: TraceSections | None, export: Path | None) -> dict[str, Any] | None:
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
