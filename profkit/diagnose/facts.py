"""Flatten the analyses into the fact namespace rules read (`gpu.utilization`, `launch.api_share`, ...).

Every fact is a plain number (or None when the trace cannot tell), derived only from the report's
sections: a rule never recomputes a metric, and this module never reads the trace.
"""

from __future__ import annotations

import re
from typing import Any

from profkit.analysis.api import GRAPH_LAUNCH_APIS, LAUNCH_APIS, SYNC_APIS
from profkit.analysis.categories import categories
from profkit.analysis.host import HOST_FACT_DOCS, host_facts
from profkit.analysis.steps import STEP_FACT_DOCS, step_facts
from profkit.analysis.vllm import VLLM_DEFAULTS, vllm_facts

# What each fact means, for `profkit rules explain` and for validating rule files.
FACT_DOCS: dict[str, str] = {
    "window.duration_ns": "length of the analysed window",
    "gpu.utilization": "share of the window some kernel or memory operation ran (union over streams; "
                       "mean over devices)",
    "gpu.idle_share": "1 - gpu.utilization",
    "gpu.busy_ns": "GPU busy time in the window (summed over devices)",
    "gpu.idle_ns": "GPU idle time in the window (summed over devices)",
    "gpu.devices": "number of GPUs with activity",
    "kernels.count": "kernels that started in the window",
    "kernels.total_ns": "summed kernel durations",
    "kernels.distinct": "distinct kernel names",
    "kernels.avg_ns": "mean kernel duration",
    "kernels.short_share": "share of kernels shorter than 10 us",
    "kernels.graph_share": "share of kernels replayed from CUDA graphs",
    "launch.calls": "kernel launch API calls (cudaLaunchKernel, cuLaunchKernelEx, ...)",
    "launch.api_ns": "host time inside kernel launch API calls",
    "launch.api_share": "launch API host time as a share of the window",
    "launch.graph_launches": "cudaGraphLaunch calls",
    "launch.latency_median_ns": "median launch call start -> kernel start (eager kernels)",
    "launch.latency_p90_ns": "90th percentile launch call start -> kernel start",
    "gaps.launch_idle_share": "GPU idle in gaps < 20 us (launch spacing) as a share of the window",
    "gaps.sub_ms_idle_share": "GPU idle in gaps < 1 ms (between back-to-back launches) as a share of the window",
    "gaps.mid_idle_share": "GPU idle in gaps of 20 us - 1 ms as a share of the window",
    "gaps.host_idle_share": "GPU idle in gaps >= 1 ms as a share of the window",
    "gaps.long_idle_share": "GPU idle in gaps >= 100 ms as a share of the window",
    "gaps.count_ge_1ms": "number of GPU gaps of 1 ms or more",
    "gaps.max_ns": "longest GPU gap in the window",
    "gaps.listed_host_api_share": "for the listed gaps, the mean share of the gap covered by CUDA API calls",
    "sync.calls": "synchronizing API calls (cudaDeviceSynchronize, cudaStreamSynchronize, ...)",
    "sync.api_ns": "host time inside synchronizing API calls",
    "sync.api_share": "synchronizing API host time as a share of the window",
    "sync.records": "CUPTI synchronization records",
    "memops.count": "memory operations (copies and memsets)",
    "memops.total_ns": "summed memory operation durations",
    "memops.share": "memory operation time as a share of the window",
    "memops.htod_bytes": "bytes copied host to device",
    "memops.dtoh_bytes": "bytes copied device to host",
    "memops.pageable_count": "copies from or to pageable (unpinned) host memory",
    "memops.pageable_bytes": "bytes copied from or to pageable host memory",
    "memops.pageable_ns": "GPU time of copies from or to pageable host memory",
    "memops.pageable_share": "pageable copy time as a share of the window",
    "memops.pageable_copy_share": "pageable copy time as a share of all copy time",
    "nvtx.ranges": "NVTX ranges in the window",
}


def category_key(category: str) -> str:
    """`activation/elementwise` -> `activation_elementwise`: fact names are dotted identifiers."""
    return re.sub(r"\W", "_", category)


for _c in categories():
    FACT_DOCS[f"category.{category_key(_c)}.share"] = f"share of kernel time in {_c} kernels"

VLLM_FACT_DOCS = {
    "vllm.requests_per_second": "benchmark request throughput (--bench)",
    "vllm.output_throughput": "benchmark output tokens/s (--bench)",
    "vllm.ttft_mean_ms": "mean time to first token (--bench, serve)",
    "vllm.ttft_p99_ms": "p99 time to first token (--bench, serve)",
    "vllm.tpot_mean_ms": "mean time per output token (--bench, serve)",
    "vllm.tpot_p99_ms": "p99 time per output token (--bench, serve)",
    "vllm.itl_mean_ms": "mean inter-token latency (--bench, serve)",
    "vllm.itl_p99_ms": "p99 inter-token latency (--bench, serve)",
    "vllm.preemptions": "requests preempted for lack of KV cache (metrics counter delta, else the log)",
    "vllm.kv_cache_usage_max": "peak GPU KV cache usage, 0..1 (log or metrics)",
    "vllm.waiting_max": "peak requests waiting (log or metrics)",
    "vllm.running_max": "peak requests running (log; else the benchmark client's peak in flight; else metrics)",
    "vllm.running_mean": "mean requests running over the log's stats lines",
    "vllm.prefix_cache_hit_rate": "prefix cache hits / queries, 0..1",
    "vllm.prompt_token_share": "prompt tokens / all tokens processed (log throughput lines, else token counters)",
    "vllm.kv_cache_tokens": "KV cache capacity in tokens (log)",
    "vllm.gpu_free_memory_bytes": "free GPU memory when the engine started (log, runs with --kv-cache-memory-bytes)",
    "vllm.kv_cache_memory_bytes": "GPU memory the KV cache got (log: reserved or available KV cache memory)",
    "vllm.model_memory_bytes": "GPU memory the model weights took (log)",
    "vllm.default_max_num_seqs": "vLLM 0.26's --max-num-seqs for this GPU when not given (1024 on H100/H200, else 256)",
}
RANK_FACT_DOCS = {
    "ranks.count": "GPUs (ranks) reported apart: the devices of a multi-GPU trace, or one per rank trace",
    "communication.share_max": "the largest share of a GPU's kernel time in communication kernels, over ranks",
    "communication.overlap_share_min": "the smallest share of a GPU's communication time overlapped by compute "
                                       "(HTA's comm/comp overlap), over ranks with communication",
    "imbalance.busy_spread": "(max - min) / max of the ranks' GPU busy time",
    "imbalance.wait_share_max": "the largest share of a rank's window spent waiting in collectives for the "
                                "last rank to arrive (start spread of matched communication kernels)",
    "imbalance.straggler_last_share": "share of collectives the straggler (the rank most often last) arrived last",
    "imbalance.collectives": "collectives matched across ranks",
    "imbalance.straggler": "the rank that arrived last in most collectives (None when no rank does)",
}
FACT_DOCS.update(VLLM_FACT_DOCS)
FACT_DOCS.update(RANK_FACT_DOCS)
FACT_DOCS.update(HOST_FACT_DOCS)
FACT_DOCS.update(STEP_FACT_DOCS)
FACT_DOCS["gpu.busy"] = "share of the run the GPU was busy: NVML samples (host.json) if taken, else gpu.utilization"
for _k in VLLM_DEFAULTS:
    FACT_DOCS[f"config.{_k}"] = f"the run's --{_k.replace('_', '-')} (given, logged, or the vLLM default)"
    FACT_DOCS[f"config_source.{_k}"] = f"where config.{_k} came from: given, vLLM log, vLLM 0.26 default, unknown"


def known_fact_names() -> set[str]:
    return set(FACT_DOCS)


def compute_facts(report: dict[str, Any]) -> dict[str, float | int | None]:
    if report.get("gpu") is None:  # no trace: only vLLM's evidence (and the host samples) are known
        facts: dict[str, Any] = {k: None for k in FACT_DOCS
                                 if not k.startswith(("vllm.", "config", "host.", "steps."))}
        facts.update(vllm_facts(report.get("vllm") or {}))
        for key, entry in (report.get("vllm") or {}).get("config", {}).items():
            facts[f"config_source.{key}"] = entry["source"]
        return _with_host(facts, report)
    win = report["window"]["duration_ns"] or 1
    gpu = report["gpu"]
    facts = {
        "window.duration_ns": report["window"]["duration_ns"],
        "gpu.utilization": gpu["utilization"],
        "gpu.idle_share": 1.0 - gpu["utilization"],
        "gpu.busy_ns": gpu["busy_ns"],
        "gpu.idle_ns": gpu["idle_ns"],
        "gpu.devices": len(gpu["devices"]),
    }
    facts.update(_kernel_facts(report))
    facts.update(_launch_facts(report, win))
    facts.update(_gap_facts(report, win))
    facts.update(_memop_facts(report, win))
    facts["nvtx.ranges"] = sum(r["count"] for r in report["nvtx"])
    facts.update(_rank_facts(report))
    facts.update(vllm_facts(report.get("vllm") or {}))
    for key, entry in (report.get("vllm") or {}).get("config", {}).items():
        facts[f"config_source.{key}"] = entry["source"]
    return _with_host(facts, report)


def _with_host(facts: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    facts.update(step_facts(report.get("steps")))
    facts.update(host_facts(report.get("host")))
    # How busy the GPU was: NVML's samples over the benchmark when the capture took them, else the trace.
    nvml = facts.get("host.gpu_util_mean")
    facts["gpu.busy"] = nvml if nvml is not None else facts.get("gpu.utilization")
    for name in FACT_DOCS:  # every fact a rule may name exists; unknown ones are None (a run not shown to be
        facts.setdefault(name, None)  # vLLM's has no config.* at all)
    return facts


def _rank_facts(report: dict[str, Any]) -> dict[str, Any]:
    ranks = report.get("ranks") or []
    if not ranks:
        return {"ranks.count": len(report["gpu"]["devices"])}
    comm = [r["communication"] for r in ranks]
    shares = [c["share"] for c in comm if c["share"] is not None]
    overlaps = [c["overlap_share"] for c in comm if c["overlap_share"] is not None]
    imbalance = report.get("imbalance") or {}
    coll = imbalance.get("collectives") or {}
    waits = [r["wait_share"] for r in coll.get("ranks", []) if r["wait_share"] is not None]
    return {
        "ranks.count": len(ranks),
        "communication.share_max": max(shares) if shares else None,
        "communication.overlap_share_min": min(overlaps) if overlaps else None,
        "imbalance.busy_spread": (imbalance.get("busy_ns") or {}).get("spread_share"),
        "imbalance.wait_share_max": max(waits) if waits else None,
        "imbalance.straggler_last_share": (coll.get("straggler") or {}).get("last_share"),
        "imbalance.collectives": coll.get("collectives"),
        "imbalance.straggler": (coll.get("straggler") or {}).get("rank"),
    }


def _kernel_facts(report: dict[str, Any]) -> dict[str, Any]:
    ks = report["kernels"]
    count = sum(k["count"] for k in ks)
    total = sum(k["total_ns"] for k in ks)
    out: dict[str, Any] = {
        "kernels.count": count,
        "kernels.total_ns": total,
        "kernels.distinct": len(ks),
        "kernels.avg_ns": total / count if count else None,
        "kernels.short_share": sum(k["short_count"] for k in ks) / count if count else None,
        "kernels.graph_share": sum(k["graph_count"] for k in ks) / count if count else None,
    }
    shares = {c["category"]: c["share"] for c in report["categories"]}
    for c in categories():
        out[f"category.{category_key(c)}.share"] = shares.get(c, 0.0)
    return out


def _api_total(report: dict[str, Any], names: tuple[str, ...]) -> tuple[int, int]:
    # nsys keeps 7-character version suffixes (`cudaLaunchKernelExC_v11060`): match on the base name.
    rows = [a for a in report["api"] if re.sub(r"_v\d+$", "", a["name"]) in names]
    return sum(a["count"] for a in rows), sum(a["total_ns"] for a in rows)


def _launch_facts(report: dict[str, Any], win: int) -> dict[str, Any]:
    calls, ns = _api_total(report, LAUNCH_APIS)
    graph_calls, _ = _api_total(report, GRAPH_LAUNCH_APIS)
    sync_calls, sync_ns = _api_total(report, SYNC_APIS)
    has_api = bool(report["api"])
    launch = report["launch"]
    return {
        "launch.calls": calls if has_api else None,
        "launch.api_ns": ns if has_api else None,
        "launch.api_share": ns / win if has_api else None,
        "launch.graph_launches": graph_calls if has_api else None,
        "launch.latency_median_ns": launch.get("median_ns"),
        "launch.latency_p90_ns": launch.get("p90_ns"),
        "sync.calls": sync_calls if has_api else None,
        "sync.api_ns": sync_ns if has_api else None,
        "sync.api_share": sync_ns / win if has_api else None,
        "sync.records": sum(s["count"] for s in report["sync"]),
    }


def _gap_facts(report: dict[str, Any], win: int) -> dict[str, Any]:
    classes = report["gap_classes"]
    devices = max(1, len(report["gpu"]["devices"]))

    def share(*labels: str) -> float:
        return sum(classes[label]["idle_ns"] for label in labels) / (win * devices)

    listed = report["gaps"]
    return {
        "gaps.launch_idle_share": share("lt_20us"),
        "gaps.sub_ms_idle_share": share("lt_20us", "20us_1ms"),
        "gaps.mid_idle_share": share("20us_1ms"),
        "gaps.host_idle_share": share("1ms_100ms", "ge_100ms"),
        "gaps.long_idle_share": share("ge_100ms"),
        "gaps.count_ge_1ms": classes["1ms_100ms"]["count"] + classes["ge_100ms"]["count"],
        "gaps.max_ns": max((g["duration_ns"] for g in listed), default=0),
        "gaps.listed_host_api_share": (sum(g["host_api_share"] for g in listed) / len(listed)) if listed else None,
    }


def _memop_facts(report: dict[str, Any], win: int) -> dict[str, Any]:
    ops = report["memops"]
    kinds = report["memory_kinds"]
    pageable = [k for k in kinds if "Pageable" in (k["src_kind"], k["dst_kind"])]
    copy_ns = sum(k["total_ns"] for k in kinds)
    pageable_ns = sum(k["total_ns"] for k in pageable)

    def bytes_of(op: str) -> int:
        return sum(o["bytes"] for o in ops if o["operation"] == op)

    return {
        "memops.count": sum(o["count"] for o in ops),
        "memops.total_ns": sum(o["total_ns"] for o in ops),
        "memops.share": sum(o["total_ns"] for o in ops) / win,
        "memops.htod_bytes": bytes_of("[CUDA memcpy Host-to-Device]"),
        "memops.dtoh_bytes": bytes_of("[CUDA memcpy Device-to-Host]"),
        "memops.pageable_count": sum(k["count"] for k in pageable),
        "memops.pageable_bytes": sum(k["bytes"] for k in pageable),
        "memops.pageable_ns": pageable_ns,
        "memops.pageable_share": pageable_ns / win,
        "memops.pageable_copy_share": pageable_ns / copy_ns if copy_ns else 0.0,
    }
