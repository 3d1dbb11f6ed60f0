"""What the run's vLLM evidence says, as the report's `vllm` section: the benchmark's figures, the log, the
/metrics scrapes (and their counters over the benchmark), the flags the command gave, vLLM's defaults for this
GPU, and each setting's effective value with where it came from. And whether the run is shown to be vLLM's
at all (vLLM flag changes need evidence that it is)."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from profkit.evidence.bench import BenchResult
from profkit.evidence.metrics import MetricsWindow
from profkit.evidence.vllm_log import VllmLog
from profkit.vllm.options import default_max_num_seqs, effective_config


class VllmSection(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    bench: BenchResult | None = None
    log: VllmLog | None = None
    metrics: dict[str, float] | None = None  # the last scrape
    metrics_delta: dict[str, float] | None = None  # counters over the benchmark (two scrapes)
    series: dict[str, float | int] | None = None  # a live window's scrapes: span, gauges' max and mean
    live: dict[str, Any] | None = None  # a live window's rates, mix and latency percentiles (profkit attach)
    spec_decode: dict[str, Any] | None = None  # speculative decoding's drafts and acceptance over the run (/metrics)
    ttft_split: dict[str, float] | None = None  # where the mean TTFT went: client, API server, queue, prefill
    cache: dict[str, Any] | None = None  # the KV cache as vLLM's cache_config_info gauge describes it (/metrics)
    flags: dict[str, Any]  # the settings the run's command gave
    defaults: dict[str, Any]  # vLLM's defaults that depend on the GPU, and the GPU
    config: dict[str, Any]  # every setting rules may name: {value, source}; empty for a run not shown to be vLLM's


def vllm_section(bench: BenchResult | None, log: VllmLog | None, metrics: MetricsWindow | None,
                 flags: dict[str, Any], gpu: str | None, is_vllm: bool) -> VllmSection:
    """The report's `vllm` section from the run's benchmark result, log and /metrics window (read once, downward)."""
    logged = {k: v for k, v in ((log.non_default_args if log else None) or {}).items() if v is not None}
    if log is not None:  # the values vLLM logs it chose
        logged.setdefault("max_num_batched_tokens", log.logged_max_num_batched_tokens)
        logged.setdefault("gpu_memory_utilization", log.logged_gpu_memory_utilization)
    gpu = gpu if is_vllm else None  # not vLLM's: its defaults say nothing about the run
    delta = metrics.delta if metrics else None
    return VllmSection(
        bench=bench, log=log,
        metrics=metrics.last if metrics else None,
        metrics_delta=delta,
        series=metrics.series if metrics else None,
        live=live_window(metrics) if metrics else None,
        spec_decode=spec_decode(delta) if delta is not None else None,
        ttft_split=ttft_split(delta, bench) if delta is not None else None,
        cache=cache_info(metrics.info) if metrics else None,
        flags=flags,
        defaults={"max_num_seqs": default_max_num_seqs(gpu), "gpu": gpu},
        config=effective_config(flags, logged, gpu) if is_vllm else {},
    )


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket that holds the q-th observation; in the +Inf
    bucket, the highest finite bound. None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total, lower, below = buckets[-1][1], 0.0, 0.0
    rank = q * total
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower



PER_POSITION = re.compile(r'vllm:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}')


def spec_decode(delta: dict[str, float]) -> dict[str, Any] | None:
    """Speculative decoding over the run from vLLM's counters: drafts proposed, draft tokens, tokens accepted, the
    acceptance rate (accepted / draft tokens), the mean accepted per draft (vLLM's mean acceptance length less
    one), and per draft position the share of drafts whose token there was accepted. None without the counters."""
    drafts = delta.get("vllm:spec_decode_num_drafts_total")
    if drafts is None:
        return None
    tokens, accepted = (delta.get(f"vllm:spec_decode_num_{k}_tokens_total") for k in ("draft", "accepted"))
    positions = sorted((int(m.group(1)), v) for k, v in delta.items() if (m := PER_POSITION.fullmatch(k)))
    return {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / tokens if accepted is not None and tokens else None,
            "accepted_per_draft": accepted / drafts if accepted is not None and drafts else None,
            "acceptance_by_position": [v / drafts for _, v in positions] if drafts and positions else None}


# vLLM 0.26's cache_config_info labels the report keeps (the KV cache's size, and how it was sized)
CACHE_LABELS = {"kv_cache_size_tokens": int, "num_gpu_blocks": int, "block_size": int,
                "gpu_memory_utilization": float, "kv_cache_memory_bytes": int, "cache_dtype": str,
                "enable_prefix_caching": str}


def cache_info(info: dict[str, dict[str, str]]) -> dict[str, Any] | None:
    """The KV cache as vLLM's cache_config_info gauge's labels (`MetricsScrape.info`) describe it."""
    labels = info.get("vllm:cache_config_info")
    if not labels:
        return None
    out: dict[str, Any] = {}
    for key, kind in CACHE_LABELS.items():
        try:
            value = kind(labels[key])
        except (KeyError, ValueError):
            continue  # absent, or "None"
        if kind is str or math.isfinite(value) and value >= 0:
            out[key] = value
    return out or None


# vLLM 0.26's request histograms (seconds): what each live latency is
LATENCIES = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
             "tpot": "vllm:request_time_per_output_token_seconds", "queue": "vllm:request_queue_time_seconds",
             "prefill": "vllm:request_prefill_time_seconds", "decode": "vllm:request_decode_time_seconds",
             "e2e": "vllm:e2e_request_latency_seconds"}


def ttft_split(delta: dict[str, float], bench: BenchResult | None) -> dict[str, float] | None:
    """Where the benchmark's mean TTFT went (ms), from vLLM's histograms over it (two scrapes): the engine's queue
    (arrived to scheduled) and prefill (scheduled to first token), the server's TTFT (its receipt to first token)
    less those two (the API server: tokenising, the hand-over to the engine core), and the client's mean TTFT less
    the server's (HTTP, the client's own loop). None without the histograms, where their counts differ, or where a
    count or sum went down between the scrapes (a server restarted, scrapes given in the wrong order)."""
    names = {k: LATENCIES[k] for k in ("ttft", "queue", "prefill")}
    counts = {delta.get(f"{n}_count") for n in names.values()}
    sums = {k: delta.get(f"{n}_sum") for k, n in names.items()}
    if len(counts) != 1 or (n := counts.pop()) is None or not n > 0 \
            or any(v is None or not math.isfinite(v) or v < 0 for v in sums.values()):
        return None
    mean = {k: v / n * 1e3 for k, v in sums.items()}  # type: ignore[operator]
    out = {"requests": n, "server_ttft_ms": mean["ttft"], "queue_ms": mean["queue"], "prefill_ms": mean["prefill"],
           "api_server_ms": mean["ttft"] - mean["queue"] - mean["prefill"]}
    if bench is not None and bench.ttft_mean_ms is not None:
        out["client_ttft_ms"] = bench.ttft_mean_ms
        out["client_ms"] = bench.ttft_mean_ms - mean["ttft"]
    return out


def live_window(window: MetricsWindow) -> dict[str, Any] | None:
    """What a live window's first and last scrapes say (a series of timed scrapes: `profkit attach`): requests
    finished and their rate, the mix (tokens per request), the prefix cache's hit rate, and each latency's mean and
    p50/p90/p99 (ms) from vLLM's histograms over the window."""
    if window.seconds is None or window.delta is None:
        return None
    seconds, delta = window.seconds, window.delta
    done = delta.get("vllm:request_success_total")
    out: dict[str, Any] = {"seconds": seconds, "requests": done,
                           "request_rate": done / seconds if done is not None and seconds > 0 else None}
    # Requests that arrived: those finished, and the change in those running or waiting (a backlog draining
    # finishes more than arrives).
    held = [sum(values.get(f"vllm:num_requests_{k}", math.nan) for k in ("running", "waiting"))
            for values in (window.first, window.last)]
    if done is not None and all(math.isfinite(h) for h in held):
        out["arrivals"] = max(0.0, done + held[1] - held[0])
        out["arrival_rate"] = out["arrivals"] / seconds if seconds > 0 else None
    prompt, gen = delta.get("vllm:prompt_tokens_total"), delta.get("vllm:generation_tokens_total")
    if done:
        out["prompt_tokens_per_request"] = prompt / done if prompt is not None else None
        out["output_tokens_per_request"] = gen / done if gen is not None else None
    hits, queries = delta.get("vllm:prefix_cache_hits_total"), delta.get("vllm:prefix_cache_queries_total")
    out["prefix_cache_hit_rate"] = hits / queries if hits is not None and queries else None
    for key, name in LATENCIES.items():
        count, total = delta.get(f"{name}_count"), delta.get(f"{name}_sum")
        if not count:
            continue
        buckets = window.buckets.get(name, [])
        out[f"{key}_ms"] = {"mean": total / count * 1e3 if total is not None else None, "count": count,
                            **{f"p{round(q * 100)}": (v * 1e3 if (v := quantile(buckets, q)) is not None else None)
                               for q in (0.5, 0.9, 0.99)}}
        # a percentile inside the lowest bucket is interpolated from 0 to its bound: it says only "at most that"
        if buckets and buckets[0][1] > 0 and math.isfinite(buckets[0][0]):
            out[f"{key}_ms"]["first_bucket"] = buckets[0][0] * 1e3
    return out


def vllm_run_evidence(bench: BenchResult | None, log: VllmLog | None, metrics: MetricsWindow | None,
                      flags: dict[str, Any], has_command: bool, trace_names: bool) -> list[str]:
    """What shows the run is vLLM's, in words (empty: nothing does)."""
    found = []
    if has_command:
        found.append("the run's vLLM command")
    for present, words in ((bench is not None and bool(msgspec.to_builtins(bench)), "a vLLM benchmark result"),
                           (log is not None, "a vLLM log"),
                           (bool(metrics and metrics.last), "vLLM /metrics"),
                           (bool(flags), "vLLM flags")):
        if present:
            found.append(words)
    if trace_names:
        found.append("vLLM kernel or annotation names in the trace")
    return found


NOT_VLLM_NOTE = ("no evidence this is a vLLM run (no vLLM command, log, benchmark, metrics or flags, and no "
                 "vLLM kernel or annotation names in the trace): the findings say what the trace shows; no "
                 "vLLM flags are suggested. Give --vllm-log or --vllm-args (or capture with profkit) for them.")
