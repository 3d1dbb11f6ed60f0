"""Build the `profkit.report/1` document once: evidence -> trace sections -> facts -> rules -> suggested command.

This is the library entry point behind `profkit report`; everything here is usable from Python:

    from profkit.report import build_report
    report = build_report("run.sqlite", window="auto")
    report.gpu["utilization"], report.findings[0].title, report.document()  # the JSON contract
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profkit import __version__
from profkit.analysis.communication import rank_imbalance
from profkit.analysis.efficiency import efficiency_section
from profkit.analysis.host import host_section
from profkit.analysis.sections import TraceSections
from profkit.diagnose.engine import evaluate
from profkit.diagnose.facts import compute_facts
from profkit.diagnose.priority import order_findings
from profkit.diagnose.rule_files import load_rules
from profkit.diagnose.suggestion import suggest, user_command
from profkit.diagnose.vllm_run import NOT_VLLM_NOTE, vllm_run_evidence, vllm_section
from profkit.errors import ProfkitError, TraceError
from profkit.evidence.bench import BenchResult, read_bench
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.host import read_host
from profkit.evidence.metrics import read_metrics
from profkit.evidence.model_config import read_model_config
from profkit.evidence.vllm_log import read_log
from profkit.report.model import SCHEMA, Report, RunSection
from profkit.report.trace_part import trace_sections
from profkit.vllm.command import UserCommand, VllmCommand

Progress = Callable[[str], None]


def build_report(path: str | os.PathLike | list | tuple | None, window: str = "auto",
                 gap_threshold_ns: int = 100_000, buckets: int = 100, progress: Progress | None = None,
                 bench: Path | None = None, vllm_log: Path | None = None, metrics: list[Path] | None = None,
                 vllm_args: str | None = None, rules_dirs: list[Path] | None = None, host: Path | None = None,
                 jobs: int | None = None, dask: str | None = None, model_config: Path | None = None) -> Report:
    """Analyse one trace (or capture folder), join vLLM's evidence, run the rules; return the report.

    `path` may also be a list of traces (one per rank of a multi-GPU run), or a folder holding several: one
    report with a section per rank (`ranks`) and the cross-rank `imbalance`; the traces are analysed on
    `jobs` local processes (default: the cores), or as tasks on the Dask cluster at `dask`.
    Without a trace (`path` None, or a capture folder of an unprofiled run) the report holds the vLLM
    evidence alone: its facts, and the findings whose facts are known (the rest in `rules_skipped`)."""
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [] if path is None else [Path(path)]
    for p in paths:
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
    folder = CaptureFolder(paths[0]) if len(paths) == 1 and paths[0].is_dir() else None
    # The evidence first (each reader fails with one line naming its file), in the order a capture folder lists it.
    manifest = folder.manifest() if folder else None
    from_folder = folder.user_command() if folder else None
    traces = folder.traces() if folder else paths
    bench_rec = read_bench(bench) if bench else folder.bench() if folder else None
    log_rec = read_log(vllm_log) if vllm_log else folder.log() if folder else None
    scrapes = [read_metrics(p) for p in metrics] if metrics else folder.metrics() if folder else []
    args_text = vllm_args or (manifest.vllm_args if manifest else None)
    try:
        flags = VllmCommand.parse(args_text).flags() if args_text else {}
        given = UserCommand([VllmCommand.parse(vllm_args)], "--vllm-args") if vllm_args else from_folder
    except ValueError as exc:  # shlex: an unclosed quote
        raise ProfkitError(f"--vllm-args: {exc}") from None
    host_file = host or (folder.host_path if folder else None)
    model = read_model_config(model_config) if model_config else folder.model_config() if folder else None
    folder_evidence = folder is not None and bool(
        folder.bench_path or folder.log_path or folder.host_path or folder.metrics_paths
        or (manifest and (manifest.vllm_args or from_folder or manifest.environment is not None)))
    if not traces and not (bench or vllm_log or metrics or vllm_args or host or folder_evidence):
        where = f"{folder.path}: folder holds no trace and no vLLM evidence" if folder else "nothing to report"
        raise ProfkitError(f"{where} (give a trace, a capture folder, or --bench/--vllm-log/--metrics/--vllm-args)")
    host_part = (host_section(read_host(Path(host_file)), bench_rec.elapsed_s if bench_rec else None)
                 if host_file else None)
    rules = load_rules(rules_dirs)  # validate the rules before spending time on the trace
    step = progress or (lambda _name: None)

    if len(traces) > 1:
        from profkit.report.ranks import build_ranks

        part: TraceSections | None = build_ranks(traces, window, gap_threshold_ns, buckets, step, jobs=jobs,
                                                 dask=dask)
    elif traces:
        part = trace_sections(traces[0], window, gap_threshold_ns, buckets, step)
    else:
        part = None
    source: dict[str, Any] = ({"path": str(folder.path) if folder else None, "kind": "evidence"} if part is None
                              else {**part.source, "path": str(folder.path)} if folder and part.source.get("path")
                              else part.source)
    rank_parts = part.ranks if part is not None and part.ranks and len(part.ranks) > 1 else None
    environment = manifest.environment if manifest and manifest.environment else None

    command = user_command(given, log_rec.non_default_args if log_rec else None,
                           offline=bench_rec is not None and bench_rec.requests_per_second is not None
                           and bench_rec.ttft_mean_ms is None)
    shown = vllm_run_evidence(bench_rec, log_rec, scrapes, flags, command is not None,
                              bool(source.get("vllm_names")))
    # Some of vLLM's defaults depend on the GPU (the trace's, else the capture manifest's).
    vllm = vllm_section(bench_rec, log_rec, scrapes, flags, source.get("gpu") or (environment or {}).get("gpu"),
                        is_vllm=bool(shown))
    ranks = [p.entry for p in rank_parts] if rank_parts else None
    imbalance = rank_imbalance(rank_parts) if rank_parts else None
    bench_cmd = (command.role("client") or command.role("offline")) if command else None
    workload = _workload(bench_cmd, bench_rec)
    gpu_name = source.get("gpu") or (environment or {}).get("gpu") or next(iter((host_part or {}).get("gpus") or []),
                                                                          None)
    efficiency = efficiency_section(gpu_name, model, vllm.config, vllm.metrics_delta or {},
                                    bench_rec.elapsed_s if bench_rec else None,
                                    bench_rec.num_requests if bench_rec else None,
                                    gpu_metrics=gpu_metrics_section(part, folder),
                                    export_bandwidth=next((g.get("memory_bandwidth") for g in source.get("gpus") or []
                                                           if isinstance(g, dict)), None),
                                    steps=part.steps if part is not None else None,
                                    request_tokens=_request_tokens(bench_rec))
    facts = compute_facts(part, vllm, host_part, ranks, imbalance, workload, efficiency)
    # Not shown to be vLLM's: the findings say what the trace shows, and no vLLM flag is proposed.
    findings, skipped = evaluate(rules, facts, propose_changes=bool(shown))
    findings = order_findings(findings, vllm.defaults.get("gpu"))  # the user's missteps first, then the gain
    suggestion = suggest(command, [c for f in findings for c in f.changes])
    empty: dict[str, Any] = {"timeline": [], "kernels": [], "categories": [], "memops": [], "memory_kinds": [],
                             "api": [], "sync": [], "nvtx": [], "cpu_ops": [], "gaps": [], "gap_classes": {},
                             "steps": None, "sched": None, "launch": {}}
    sections = empty if part is None else {k: getattr(part, k) for k in empty}
    extra: dict[str, Any] = {}
    if ranks:
        extra.update(ranks=ranks, imbalance=imbalance)
    if environment:
        extra["environment"] = environment
    return Report(
        schema=SCHEMA, profkit_version=__version__, source=source,
        window=None if part is None else part.window, gpu=None if part is None else part.gpu,
        **sections,
        vllm=vllm,
        findings=suggestion.annotated(findings),
        **extra,
        run=RunSection(shown) if shown else RunSection(shown, note=NOT_VLLM_NOTE),
        host=host_part,
        efficiency=efficiency,
        facts=facts,
        rules_skipped=skipped,
        command=suggestion.section(),
        suggested_command=suggestion.text(),
    )


def _workload(bench_cmd: VllmCommand | None, bench: BenchResult | None) -> dict[str, Any]:
    """What the benchmark's command and result say of its workload (`workload.*` facts)."""
    lengths = bench_cmd.prompt_lengths() if bench_cmd else None
    per_request = None
    if (mean := _request_tokens(bench)) is not None:
        per_request = mean[0] + mean[1]
    elif lengths:
        per_request = float(lengths[0] + lengths[1])
    return {"shared_prefixes": bench_cmd.shared_prefixes() if bench_cmd else None,
            "tokens_per_request": per_request,
            "max_tokens_per_request": int((lengths[0] + lengths[1]) * (1 + lengths[2])) if lengths else None}


def _request_tokens(bench: BenchResult | None) -> tuple[float, float] | None:
    """The benchmark's mean prompt and output tokens per request."""
    if bench is None or bench.input_tokens is None or bench.output_tokens is None or not bench.num_requests:
        return None
    return bench.input_tokens / bench.num_requests, bench.output_tokens / bench.num_requests


def gpu_metrics_section(part: TraceSections | None, folder: CaptureFolder | None) -> dict[str, Any] | None:
    """The GPU's own counters: the trace's (with engine steps and kernels to split them by), else the capture's
    GPU metrics export (the benchmark's whole span)."""
    if part is not None and part.gpu_metrics is not None:
        return part.gpu_metrics
    path = folder.gpu_metrics_path if folder else None
    if path is None:
        return None
    from profkit.analysis.gpu_metrics import metrics_section
    from profkit.traces.gpu_metrics import open_gpu_metrics

    return metrics_section(open_gpu_metrics(path), source=str(path))
