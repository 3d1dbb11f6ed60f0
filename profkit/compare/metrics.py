"""What two runs are compared on: vLLM's outcome (named as in `vllm bench serve`'s JSON) and headline facts.

A run is a `profkit.report/1` document; everything here reads those documents, never a trace.
"""

from __future__ import annotations

from typing import Any

from profkit.units import is_share  # noqa: F401 - the naming convention's home is units
from profkit.vllm.command import dest_of
from profkit.vllm.options import flag_for

# name -> (where in the report's `vllm.bench` section, which direction is better)
# Higher is better for throughput; lower for latencies. The bench JSON of `vllm bench throughput` has
# only request and token throughput.
OUTCOME: dict[str, tuple[str, str]] = {
    "request_throughput": ("requests_per_second", "higher"),
    "output_throughput": ("output_throughput", "higher"),
    "total_token_throughput": ("tokens_per_second", "higher"),
    "mean_ttft_ms": ("ttft_mean_ms", "lower"),
    "median_ttft_ms": ("ttft_median_ms", "lower"),
    "p99_ttft_ms": ("ttft_p99_ms", "lower"),
    "mean_tpot_ms": ("tpot_mean_ms", "lower"),
    "p99_tpot_ms": ("tpot_p99_ms", "lower"),
    "mean_itl_ms": ("itl_mean_ms", "lower"),
    "p99_itl_ms": ("itl_p99_ms", "lower"),
}

# Other spellings a user may type (the report's own field names, the model's before 0.2): accepted, never written.
ALIASES: dict[str, str] = {"requests_per_second": "request_throughput", "tokens_per_second": "total_token_throughput",
                           **{f"{what}_{stat}_ms": f"{stat}_{what}_ms" for what in ("ttft", "tpot", "itl")
                              for stat in ("mean", "median", "p99")}}


def canonical(name: str) -> str:
    """A metric's one spelling (vLLM's bench JSON name): `ttft_mean_ms` -> `mean_ttft_ms`."""
    return ALIASES.get(name, name)


# Headline facts: rates and shares, so windows of different length compare (raw totals would not).
HEADLINE_FACTS: dict[str, str | None] = {
    "vllm.preemptions": "lower",
    "vllm.kv_cache_usage_max": None,
    "vllm.kv_cache_tokens": "higher",
    "gpu.utilization": "higher",
    "gpu.idle_share": "lower",
    "kernels.graph_share": None,
    "kernels.short_share": None,
    "launch.latency_median_ns": "lower",
    "launch.api_share": "lower",
    "gaps.sub_ms_idle_share": "lower",
    "gaps.host_idle_share": "lower",
    "gaps.long_idle_share": "lower",
    "sync.api_share": None,  # under CUDA graphs the host waits in syncs because the GPU is busy: describes only
    "memops.share": "lower",
    "memops.pageable_share": "lower",
}


def outcome(report: dict[str, Any]) -> dict[str, float]:
    """The benchmark's figures of one run, under vLLM's bench JSON names (only those the run has); a live window
    (`profkit attach`, no benchmark) gives the same names from the server's counters and histograms."""
    bench = (report.get("vllm") or {}).get("bench") or {}
    if not bench and (report.get("vllm") or {}).get("live"):
        facts = report.get("facts") or {}
        bench = {key: facts.get(f"vllm.{key}") for _, (key, _) in OUTCOME.items()}
    return {name: float(bench[key]) for name, (key, _) in OUTCOME.items()
            if isinstance(bench.get(key), (int, float)) and not isinstance(bench.get(key), bool)}


def headline(report: dict[str, Any]) -> dict[str, float]:
    """The headline facts of one run that are known (numbers only)."""
    facts = report.get("facts") or {}
    return {k: float(facts[k]) for k in HEADLINE_FACTS
            if isinstance(facts.get(k), (int, float)) and not isinstance(facts.get(k), bool)}


def run_metrics(report: dict[str, Any]) -> dict[str, float]:
    """Outcome and headline facts together: every number a diff, a gate or the history compares."""
    return {**outcome(report), **headline(report)}


def direction(name: str) -> str | None:
    """'higher' or 'lower' is better, or None where neither is (a share that only describes)."""
    if name in OUTCOME:
        return OUTCOME[name][1]
    return HEADLINE_FACTS.get(name)


def effective_flags(report: dict[str, Any]) -> dict[str, Any]:
    """The flags a run set: the log's non-default args, overridden by the flags given or in the manifest.

    Keys are spelled as on the command line (`--max-num-seqs`)."""
    vllm = report.get("vllm") or {}
    logged = ((vllm.get("log") or {}).get("non_default_args") or {})
    merged = {k: v for k, v in logged.items() if k not in ("model_tag", "tokenizer")}
    merged.update(vllm.get("flags") or {})
    return {flag_for(k): v for k, v in merged.items()}


def config_value(report: dict[str, Any], flag: str) -> tuple[Any, str] | None:
    """What the report knows of a flag the run did not set: (value, where from), vLLM's default for its version
    (`vllm.config`); None where it knows nothing."""
    entry = ((report.get("vllm") or {}).get("config") or {}).get(dest_of(flag))
    if not isinstance(entry, dict) or entry.get("source") in (None, "given", "unknown"):
        return None
    return entry.get("value"), str(entry["source"])


# A share that moves less than this (absolute) is never called better or worse, whatever its relative change:
# 0.0 % -> 0.1 % of the window is not "+10000 %".
SHARE_FLOOR = 0.005
