"""What the run's vLLM evidence says, as the report's `vllm` section: the benchmark's figures, the log, the
/metrics scrapes (and their counters over the benchmark), the flags the command gave, vLLM's defaults for this
GPU, and each setting's effective value with where it came from. And whether the run is shown to be vLLM's
at all (vLLM flag changes need evidence that it is)."""

from __future__ import annotations

from typing import Any

import msgspec

from profkit.evidence.bench import BenchResult
from profkit.evidence.metrics import MetricsScrape, counter_delta
from profkit.evidence.vllm_log import VllmLog
from profkit.vllm.options import default_max_num_seqs, effective_config


class VllmSection(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    bench: BenchResult | None = None
    log: VllmLog | None = None
    metrics: dict[str, float] | None = None  # the last scrape
    metrics_delta: dict[str, float] | None = None  # counters over the benchmark (two scrapes)
    flags: dict[str, Any]  # the settings the run's command gave
    defaults: dict[str, Any]  # vLLM's defaults that depend on the GPU, and the GPU
    config: dict[str, Any]  # every setting rules may name: {value, source}; empty for a run not shown to be vLLM's


def vllm_section(bench: BenchResult | None, log: VllmLog | None, metrics: list[MetricsScrape],
                 flags: dict[str, Any], gpu: str | None, is_vllm: bool) -> VllmSection:
    logged = {k: v for k, v in ((log.non_default_args if log else None) or {}).items() if v is not None}
    if log is not None:  # the values vLLM logs it chose
        logged.setdefault("max_num_batched_tokens", log.logged_max_num_batched_tokens)
        logged.setdefault("gpu_memory_utilization", log.logged_gpu_memory_utilization)
    gpu = gpu if is_vllm else None  # not vLLM's: its defaults say nothing about the run
    return VllmSection(
        bench=bench, log=log,
        metrics=metrics[-1].values if metrics else None,
        metrics_delta=counter_delta(metrics[0], metrics[-1]) if len(metrics) > 1 else None,
        flags=flags,
        defaults={"max_num_seqs": default_max_num_seqs(gpu), "gpu": gpu},
        config=effective_config(flags, logged, gpu) if is_vllm else {},
    )


def vllm_run_evidence(bench: BenchResult | None, log: VllmLog | None, metrics: list[MetricsScrape],
                      flags: dict[str, Any], has_command: bool, trace_names: bool) -> list[str]:
    """What shows the run is vLLM's, in words (empty: nothing does)."""
    found = []
    if has_command:
        found.append("the run's vLLM command")
    for present, words in ((bench is not None and bool(msgspec.to_builtins(bench)), "a vLLM benchmark result"),
                           (log is not None, "a vLLM log"),
                           (bool(metrics and metrics[-1].values), "vLLM /metrics"),
                           (bool(flags), "vLLM flags")):
        if present:
            found.append(words)
    if trace_names:
        found.append("vLLM kernel or annotation names in the trace")
    return found


NOT_VLLM_NOTE = ("no evidence this is a vLLM run (no vLLM command, log, benchmark, metrics or flags, and no "
                 "vLLM kernel or annotation names in the trace): the findings say what the trace shows; no "
                 "vLLM flags are suggested. Give --vllm-log or --vllm-args (or capture with profkit) for them.")
