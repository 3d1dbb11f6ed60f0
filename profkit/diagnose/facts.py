"""The facts rules read (`gpu.utilization`, `launch.api_share`, ...): each declared ONCE here, with its doc and
unit, and derived here from the report's sections and vLLM's evidence.

Every fact is a plain number (or None when the inputs cannot tell), derived only from sections and records (the
typed sections' attributes: `profkit.analysis.sections`): a rule never recomputes a metric, and this module never
reads a trace or a file. `profkit rules facts` lists `FACTS`; rule files are validated against it, and
tests/test_facts.py checks that each declared fact is computed for some recorded run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from profkit.analysis.api import GRAPH_LAUNCH_APIS, LAUNCH_APIS, SYNC_APIS
from profkit.analysis.categories import categories
from profkit.analysis.sections import GapClass, Imbalance, Rank, Sections
from profkit.analysis.vllm import VllmSection
from profkit.vllm.options import VLLM_DEFAULTS

# Units: what a value counts. `share` is 0..1 of what the doc says; `value` a flag's value as vLLM reads it.
UNITS = {
    "ns": "nanoseconds", "ms": "milliseconds", "share": "0..1", "count": "count", "bytes": "bytes",
    "cores": "CPU cores (1.0 = one core busy)", "req/s": "requests per second", "tok/s": "tokens per second",
    "tokens": "tokens", "rank": "a rank's label", "value": "the flag's value", "text": "text",
    "bool": "true or false", "bits": "bits", "s": "seconds",
}


@dataclass(frozen=True)
class Fact:
    name: str
    unit: str
    doc: str


def category_key(category: str) -> str:
    """`activation/elementwise` -> `activation_elementwise`: fact names are dotted identifiers."""
    return re.sub(r"\W", "_", category)


def _declare() -> dict[str, Fact]:
    rows: list[tuple[str, str, str]] = [
        ("window.duration_ns", "ns", "length of the analysed window"),
        ("gpu.utilization", "share", "share of the window some kernel or memory operation ran (union over streams; "
                                     "mean over devices)"),
        ("gpu.idle_share", "share", "1 - gpu.utilization"),
        ("gpu.busy_ns", "ns", "GPU busy time in the window (summed over devices)"),
        ("gpu.idle_ns", "ns", "GPU idle time in the window (summed over devices)"),
        ("gpu.devices", "count", "number of GPUs with activity"),
        ("kernels.count", "count", "kernels that started in the window"),
        ("kernels.total_ns", "ns", "summed kernel durations"),
        ("kernels.distinct", "count", "distinct kernel names"),
        ("kernels.avg_ns", "ns", "mean kernel duration"),
        ("kernels.short_share", "share", "share of kernels shorter than 10 us"),
        ("kernels.graph_share", "share", "share of kernels replayed from CUDA graphs"),
        ("launch.calls", "count", "kernel launch API calls (cudaLaunchKernel, cuLaunchKernelEx, ...)"),
        ("launch.api_ns", "ns", "host time inside kernel launch API calls"),
        ("launch.api_share", "share", "launch API host time as a share of the window"),
        ("launch.graph_launches", "count", "cudaGraphLaunch calls"),
        ("launch.latency_median_ns", "ns", "median launch call start -> kernel start (eager kernels)"),
        ("launch.latency_p90_ns", "ns", "90th percentile launch call start -> kernel start"),
        ("gaps.launch_idle_share", "share", "GPU idle in gaps < 20 us (launch spacing) as a share of the window"),
        ("gaps.sub_ms_idle_share", "share", "GPU idle in gaps < 1 ms (between back-to-back launches) as a share of "
                                            "the window"),
        ("gaps.mid_idle_share", "share", "GPU idle in gaps of 20 us - 1 ms as a share of the window"),
        ("gaps.host_idle_share", "share", "GPU idle in gaps >= 1 ms as a share of the window"),
        ("gaps.long_idle_share", "share", "GPU idle in gaps >= 100 ms as a share of the window"),
        ("gaps.count_ge_1ms", "count", "number of GPU gaps of 1 ms or more"),
        ("gaps.max_ns", "ns", "longest GPU gap in the window"),
        ("gaps.listed_host_api_share", "share", "for the listed gaps, the mean share of the gap covered by CUDA API "
                                                "calls"),
        ("sync.calls", "count", "synchronizing API calls (cudaDeviceSynchronize, cudaStreamSynchronize, ...)"),
        ("sync.api_ns", "ns", "host time inside synchronizing API calls"),
        ("sync.api_share", "share", "synchronizing API host time as a share of the window"),
        ("sync.records", "count", "CUPTI synchronization records"),
        ("memops.count", "count", "memory operations (copies and memsets)"),
        ("memops.total_ns", "ns", "summed memory operation durations"),
        ("memops.share", "share", "memory operation time as a share of the window"),
        ("memops.htod_bytes", "bytes", "bytes copied host to device"),
        ("memops.dtoh_bytes", "bytes", "bytes copied device to host"),
        ("memops.pageable_count", "count", "copies from or to pageable (unpinned) host memory"),
        ("memops.pageable_bytes", "bytes", "bytes copied from or to pageable host memory"),
        ("memops.pageable_ns", "ns", "GPU time of copies from or to pageable host memory"),
        ("memops.pageable_share", "share", "pageable copy time as a share of the window"),
        ("memops.pageable_copy_share", "share", "pageable copy time as a share of all copy time"),
        ("nvtx.ranges", "count", "NVTX ranges in the window"),
    ]
    rows += [(f"category.{category_key(c)}.share", "share", f"share of kernel time in {c} kernels")
             for c in dict.fromkeys(categories())]
    rows += [
        ("vllm.requests_per_second", "req/s", "benchmark request throughput (--bench)"),
        ("vllm.num_requests", "count", "requests the benchmark completed (--bench)"),
        ("vllm.failed_requests", "count", "requests the benchmark sent that failed (--bench, serve)"),
        ("vllm.failed_share", "share", "failed requests as a share of those sent (--bench, serve)"),
        ("vllm.output_throughput", "tok/s", "benchmark output tokens/s (--bench)"),
        ("vllm.ttft_mean_ms", "ms", "mean time to first token (--bench, serve)"),
        ("vllm.ttft_p99_ms", "ms", "p99 time to first token (--bench, serve)"),
        ("vllm.tpot_mean_ms", "ms", "mean time per output token (--bench, serve)"),
        ("vllm.tpot_p99_ms", "ms", "p99 time per output token (--bench, serve)"),
        ("vllm.itl_mean_ms", "ms", "mean inter-token latency (--bench, serve)"),
        ("vllm.itl_p99_ms", "ms", "p99 inter-token latency (--bench, serve)"),
        ("vllm.preemptions", "count", "requests preempted for lack of KV cache (metrics counter delta, else the log)"),
        ("vllm.kv_cache_usage_max", "share", "peak GPU KV cache usage, 0..1 (log, live scrapes, or a lone "
                                             "scrape)"),
        ("vllm.waiting_max", "count", "peak requests waiting (log, live scrapes, or a lone scrape)"),
        ("vllm.running_max", "count", "peak requests running (log; else the benchmark client's peak in flight; else "
                                      "a lone scrape)"),
        ("vllm.running_mean", "count", "mean requests running over the log's stats lines (or a live window's "
                                       "scrapes)"),
        ("live.seconds", "s", "the span of a live window's scrapes (profkit attach)"),
        ("live.requests", "count", "requests finished in a live window (vllm:request_success_total's change)"),
        ("vllm.prefix_cache_hit_rate", "share", "prefix cache hits / queries, 0..1"),
        ("vllm.prompt_token_share", "share", "prompt tokens / all tokens processed (log throughput lines, else "
                                             "token counters)"),
        ("vllm.kv_cache_tokens", "tokens", "KV cache capacity in tokens (log, else /metrics' cache_config_info)"),
        ("vllm.spec_drafts", "count", "drafts speculative decoding proposed over the run (/metrics counter delta)"),
        ("vllm.spec_acceptance", "share", "draft tokens accepted / draft tokens proposed (/metrics)"),
        ("vllm.generation_tokens", "tokens", "tokens generated over the run (/metrics counter delta)"),
        ("vllm.gpu_free_memory_bytes", "bytes", "free GPU memory when the engine started (log, runs with "
                                                "--kv-cache-memory-bytes)"),
        ("vllm.kv_cache_memory_bytes", "bytes", "GPU memory the KV cache got (log: reserved or available KV cache "
                                                "memory)"),
        ("vllm.model_memory_bytes", "bytes", "GPU memory the model weights took (log)"),
        ("workload.tokens_per_request", "tokens", "prompt and output tokens of a request, on average (benchmark "
                                                  "result, else its command's random lengths)"),
        ("workload.prompt_tokens", "tokens", "prompt tokens of a request, on average (benchmark result, else its "
                                             "command's random lengths where they add up to the result's tokens)"),
        ("workload.output_tokens", "tokens", "output tokens of a request, on average (as workload.prompt_tokens)"),
        ("workload.max_tokens_per_request", "tokens", "the most tokens a request of the benchmark needs (random "
                                                      "dataset: (input + output) x (1 + range ratio))"),
        ("workload.asked_prompt_tokens", "tokens", "prompt tokens a request of the benchmark's command asks for, on "
                                                   "average (the random dataset's --random-input-len)"),
        ("workload.length_spread", "share", "the random dataset's --random-range-ratio: each request's input and "
                                            "output lengths drawn evenly within this share either side"),
        ("vllm.kv_capacity_requests", "count", "requests the KV cache holds at once at the workload's tokens per "
                                               "request (vllm.kv_cache_tokens / workload.tokens_per_request)"),
        ("efficiency.mfu", "share", "achieved FLOP/s over the GPU's dense peak for the GEMMs' precision, over the "
                                    "benchmark (vLLM's counters, else the model's shape)"),
        ("efficiency.mbu", "share", "achieved memory bytes/s over the GPU's peak bandwidth, over the benchmark "
                                    "(vLLM's counters, else the model's shape)"),
        ("efficiency.prefill_mfu", "share", "MFU of the prefill-bearing engine steps (vLLM's step annotations and "
                                            "the model's shape, over those steps' time)"),
        ("efficiency.prefill_mbu", "share", "MBU of the prefill-bearing engine steps"),
        ("efficiency.decode_mfu", "share", "MFU of the decode-only engine steps"),
        ("efficiency.decode_mbu", "share", "MBU of the decode-only engine steps: how near decode is to the memory "
                                           "bandwidth limit"),
        ("efficiency.counters_mbu", "share", "MBU from vLLM's own counters (--enable-mfu-metrics)"),
        ("efficiency.shape_mbu", "share", "MBU from the model's shape (config.json) and the tokens and steps run"),
        ("model.weight_bits", "bits", "bits per weight the GEMMs read (--quantization, the checkpoint's, else its "
                                      "dtype)"),
        ("gpu.fp8", "bool", "the GPU has FP8 tensor cores (Hopper, Ada, Blackwell: the peak table)"),
        ("gpu.count", "count", "GPUs on the machine that ran the benchmark (NVML samples, else the trace)"),
        ("gpu_metrics.sm_active", "share", "SMs active over the window (nsys GPU metrics, sample mean)"),
        ("gpu_metrics.tensor_active", "share", "tensor pipes active over the window (nsys GPU metrics, sample "
                                               "mean): busy, not the share of the peak"),
        ("gpu_metrics.dram_bandwidth", "share", "DRAM read + write bandwidth over the window, of the peak (nsys "
                                                "GPU metrics)"),
        ("gpu_metrics.prefill_tensor_active", "share", "tensor pipes active during prefill-bearing engine steps"),
        ("gpu_metrics.decode_dram_bandwidth", "share", "DRAM bandwidth during decode-only engine steps"),
        ("workload.shared_prefixes", "bool", "whether the benchmark's prompts share prefixes (False: the random "
                                             "dataset without --random-prefix-len; None: not told)"),
        ("vllm.default_max_num_seqs", "count", "vLLM 0.26's --max-num-seqs for this GPU when not given (1024 on "
                                               "H100/H200, else 256)"),
        ("ranks.count", "count", "GPUs (ranks) reported apart: the devices of a multi-GPU trace, or one per rank "
                                 "trace"),
        ("communication.share_max", "share", "the largest share of a GPU's kernel time in communication kernels, "
                                             "over ranks"),
        ("communication.overlap_share_min", "share", "the smallest share of a GPU's communication time overlapped by "
                                                     "compute (HTA's comm/comp overlap), over ranks with "
                                                     "communication"),
        ("imbalance.busy_spread", "share", "(max - min) / max of the ranks' GPU busy time"),
        ("imbalance.wait_share_max", "share", "the largest share of a rank's window spent waiting in collectives for "
                                              "the last rank to arrive (start spread of matched communication "
                                              "kernels)"),
        ("imbalance.straggler_last_share", "share", "share of collectives the straggler (the rank most often last) "
                                                    "arrived last"),
        ("imbalance.collectives", "count", "collectives matched across ranks"),
        ("imbalance.straggler", "rank", "the rank that arrived last in most collectives (None when no rank does)"),
        ("host.api_server_cpu", "cores", "mean CPU of the busiest API-server process, in cores (1.0 = one core) "
                                         "(host.json)"),
        ("host.api_server_saturated_share", "share", "share of samples the busiest API server used >= 90 % of a "
                                                     "core"),
        ("host.api_server_count", "count", "API-server processes seen (the vllm serve process itself when there is "
                                           "one)"),
        ("host.api_server_busiest_share", "share", "the busiest API server's share of the API servers' CPU (1 with "
                                                   "one; 1/N where N share the load evenly)"),
        ("host.engine_core_cpu", "cores", "mean CPU of the engine-core process, in cores"),
        ("host.engine_core_saturated_share", "share", "share of samples the engine core used >= 90 % of a core"),
        ("host.worker_count", "count", "vLLM worker processes sampled (VLLM::Worker: the `mp` executor, as data and "
                                       "tensor parallelism run; 0 with none). The engine core waits on theirs by "
                                       "spinning, so its CPU then says nothing of its work"),
        ("host.drain_s", "s", "seconds no GPU was busy before the benchmark ended (NVML; the client's last second "
                                    "left out): the frontend still streaming"),
        ("host.drain_api_server_cpu", "cores", "the busiest API server's mean CPU over host.drain_s"),
        ("host.client_cpu", "cores", "mean CPU of the benchmark client (vllm bench serve), in cores"),
        ("host.client_saturated_share", "share", "share of samples the benchmark client used >= 90 % of a core"),
        ("host.frontend_cpu", "cores", "mean CPU of an offline benchmark's front-end process, in cores"),
        ("host.frontend_saturated_share", "share", "share of samples the offline front end used >= 90 % of a core"),
        ("host.cores", "count", "CPU cores of the machine"),
        ("host.gpu_util_mean", "share", "mean NVML GPU utilization over the benchmark, 0..1 (host.json)"),
        ("steps.count", "count", "engine steps in the window (vLLM's step annotations, else its per-step kernels)"),
        ("steps.gpu_share", "share", "GPU busy time inside the steps / their total cycle time"),
        ("steps.wait_share", "share", "share of step time the GPU waited at a step's start for the host to submit "
                                      "work"),
        ("steps.cycle_p50_ns", "ns", "median step cycle (one step's start to the next one's)"),
        ("steps.decode_cycle_p50_ns", "ns", "median cycle of decode-only steps"),
        ("steps.prefill_share", "share", "share of steps that carry prefill (context) tokens"),
        ("gpu.busy", "share", "share of the run the GPU was busy: NVML samples (host.json) if taken, else "
                              "gpu.utilization"),
        ("vllm.speculative_decoding", "bool", "the run speculates (--speculative-config given or logged); false "
                                              "where vLLM's default (none) applies"),
    ]
    for key in VLLM_DEFAULTS:
        rows.append((f"config.{key}", "value", f"the run's --{key.replace('_', '-')} (given, logged, or the vLLM "
                                               "default)"))
        rows.append((f"config_source.{key}", "text", f"where config.{key} came from: given, vLLM log, vLLM 0.26 "
                                                     "default, unknown"))
    out = {}
    for name, unit, doc in rows:
        assert unit in UNITS and name not in out, name
        out[name] = Fact(name, unit, doc)
    return out


FACTS: dict[str, Fact] = _declare()
FACT_DOCS: dict[str, str] = {name: f.doc for name, f in FACTS.items()}


def known_fact_names() -> set[str]:
    return set(FACTS)


def _only_declared(facts: dict[str, Any]) -> dict[str, Any]:
    unknown = set(facts) - FACTS.keys()
    assert not unknown, f"facts not declared in FACTS: {sorted(unknown)}"
    return facts


# --- derived from the sections ------------------------------------------------------------------------------------

def compute_facts(sections: Sections | None, vllm: VllmSection | None, host: dict[str, Any] | None,
                  ranks: list[Rank] | None, imbalance: Imbalance | None, workload: dict[str, Any] | None = None,
                  efficiency: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every declared fact: from one trace's sections (None: the run has no trace), the `vllm` section (a
    `profkit.analysis.vllm.VllmSection`), the host section, the ranks and what the benchmark command says of
    its workload (`workload.*`). Unknown ones are None."""
    workload = {f"workload.{k}": v for k, v in (workload or {}).items()}
    workload.update(efficiency_facts(efficiency, vllm, workload, host, sections))
    if sections is None or sections.window is None or sections.gpu is None:  # no trace: vLLM's evidence alone
        facts: dict[str, Any] = {k: None for k in FACTS if not k.startswith(("vllm.", "config", "host.", "steps."))}
        facts.update(workload)
        facts.update(vllm_facts(vllm))
        facts.update(_config_sources(vllm))
        return _with_host(facts, None, host)
    win = sections.window.duration_ns or 1
    gpu = sections.gpu
    facts = {
        "window.duration_ns": sections.window.duration_ns,
        "gpu.utilization": gpu.utilization,
        "gpu.idle_share": 1.0 - gpu.utilization,
        "gpu.busy_ns": gpu.busy_ns,
        "gpu.idle_ns": gpu.idle_ns,
        "gpu.devices": len(gpu.devices),
    }
    facts.update(_kernel_facts(sections))
    facts.update(_launch_facts(sections, win))
    facts.update(_gap_facts(sections, win))
    facts.update(_memop_facts(sections, win))
    facts["nvtx.ranges"] = sum(r["count"] for r in sections.nvtx)
    facts.update(_rank_facts(sections, ranks, imbalance))
    facts.update(workload)
    facts.update(vllm_facts(vllm))
    facts.update(_config_sources(vllm))
    return _with_host(facts, sections.steps, host)


def _config_sources(vllm: VllmSection | None) -> dict[str, Any]:
    return {f"config_source.{key}": entry["source"] for key, entry in (vllm.config if vllm else {}).items()}


def _with_host(facts: dict[str, Any], steps: dict[str, Any] | None, host: dict[str, Any] | None) -> dict[str, Any]:
    facts.update(step_facts(steps))
    facts.update(host_facts(host))
    # How busy the GPU was: NVML's samples over the benchmark when the capture took them, else the trace.
    nvml = facts.get("host.gpu_util_mean")
    facts["gpu.busy"] = nvml if nvml is not None else facts.get("gpu.utilization")
    for name in FACTS:  # every fact a rule may name exists; unknown ones are None (a run not shown to be
        facts.setdefault(name, None)  # vLLM's has no config.* at all)
    return _only_declared(facts)


def _devices(sections: Sections) -> int:
    """The GPUs the trace's window saw busy or idle (0 without a trace)."""
    return len(sections.gpu.devices) if sections.gpu is not None else 0


def _rank_facts(sections: Sections, ranks: list[Rank] | None, imbalance: Imbalance | None) -> dict[str, Any]:
    if not ranks:
        return {"ranks.count": _devices(sections)}
    comm = [r.communication for r in ranks]
    shares = [c.share for c in comm if c.share is not None]
    overlaps = [c.overlap_share for c in comm if c.overlap_share is not None]
    coll = imbalance.collectives if imbalance is not None else None
    waits = [r["wait_share"] for r in coll.ranks if r["wait_share"] is not None] if coll is not None else []
    straggler = coll.straggler if coll is not None else None
    return {
        "ranks.count": len(ranks),
        "communication.share_max": max(shares) if shares else None,
        "communication.overlap_share_min": min(overlaps) if overlaps else None,
        "imbalance.busy_spread": imbalance.busy_ns.spread_share if imbalance is not None else None,
        "imbalance.wait_share_max": max(waits) if waits else None,
        "imbalance.straggler_last_share": straggler.last_share if straggler is not None else None,
        "imbalance.collectives": coll.collectives if coll is not None else None,
        "imbalance.straggler": straggler.rank if straggler is not None else None,
    }


def _kernel_facts(sections: Sections) -> dict[str, Any]:
    ks = sections.kernels
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
    shares = {c["category"]: c["share"] for c in sections.categories}
    for c in categories():
        out[f"category.{category_key(c)}.share"] = shares.get(c, 0.0)
    return out


def _api_total(sections: Sections, names: tuple[str, ...]) -> tuple[int, int]:
    # nsys keeps 7-character version suffixes (`cudaLaunchKernelExC_v11060`): match on the base name.
    rows = [a for a in sections.api if re.sub(r"_v\d+$", "", a["name"]) in names]
    return sum(a["count"] for a in rows), sum(a["total_ns"] for a in rows)


def _launch_facts(sections: Sections, win: int) -> dict[str, Any]:
    calls, ns = _api_total(sections, LAUNCH_APIS)
    graph_calls, _ = _api_total(sections, GRAPH_LAUNCH_APIS)
    sync_calls, sync_ns = _api_total(sections, SYNC_APIS)
    has_api = bool(sections.api)
    launch = sections.launch
    return {
        "launch.calls": calls if has_api else None,
        "launch.api_ns": ns if has_api else None,
        "launch.api_share": ns / win if has_api else None,
        "launch.graph_launches": graph_calls if has_api else None,
        "launch.latency_median_ns": launch.median_ns,
        "launch.latency_p90_ns": launch.p90_ns,
        "sync.calls": sync_calls if has_api else None,
        "sync.api_ns": sync_ns if has_api else None,
        "sync.api_share": sync_ns / win if has_api else None,
        "sync.records": sum(s["count"] for s in sections.sync),
    }


def _gap_facts(sections: Sections, win: int) -> dict[str, Any]:
    c = sections.gap_classes
    devices = max(1, _devices(sections))

    def share(*classes: GapClass | None) -> float:
        return sum(g.idle_ns for g in classes if g is not None) / (win * devices)

    def count(*classes: GapClass | None) -> int:
        return sum(g.count for g in classes if g is not None)

    listed = sections.gaps
    return {
        "gaps.launch_idle_share": share(c.lt_20us),
        "gaps.sub_ms_idle_share": share(c.lt_20us, c.from_20us_to_1ms),
        "gaps.mid_idle_share": share(c.from_20us_to_1ms),
        "gaps.host_idle_share": share(c.from_1ms_to_100ms, c.ge_100ms),
        "gaps.long_idle_share": share(c.ge_100ms),
        "gaps.count_ge_1ms": count(c.from_1ms_to_100ms, c.ge_100ms),
        "gaps.max_ns": max((g["duration_ns"] for g in listed), default=0),
        "gaps.listed_host_api_share": (sum(g["host_api_share"] for g in listed) / len(listed)) if listed else None,
    }


def _memop_facts(sections: Sections, win: int) -> dict[str, Any]:
    ops = sections.memops
    kinds = sections.memory_kinds
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


def vllm_facts(vllm: VllmSection | None) -> dict[str, Any]:
    """`vllm.*` and `config.*` from the `vllm` section (None: no vLLM evidence)."""
    facts: dict[str, Any] = {}
    bench = vllm.bench if vllm is not None else None
    for key in ("requests_per_second", "num_requests", "failed_requests", "output_throughput", "ttft_mean_ms",
                "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms", "itl_mean_ms", "itl_p99_ms"):
        facts[f"vllm.{key}"] = getattr(bench, key) if bench is not None else None
    failed, done = facts["vllm.failed_requests"], facts["vllm.num_requests"]
    sent = failed + done if failed is not None and done is not None else 0.0
    facts["vllm.failed_share"] = failed / sent if sent else None
    live = (vllm.live or {}) if vllm is not None else {}
    if bench is None and live:  # a live window: the server's own counters and histograms
        window = live.get("seconds") or 0.0
        gen = (live.get("output_tokens_per_request") or 0.0) * (live.get("requests") or 0.0)
        for key, value in (("requests_per_second", live.get("request_rate")), ("num_requests", live.get("requests")),
                           ("output_throughput", gen / window if window > 0 and gen else None),
                           ("ttft_mean_ms", (live.get("ttft_ms") or {}).get("mean")),
                           ("ttft_p99_ms", (live.get("ttft_ms") or {}).get("p99")),
                           ("tpot_mean_ms", (live.get("tpot_ms") or {}).get("mean")),
                           ("tpot_p99_ms", (live.get("tpot_ms") or {}).get("p99")),
                           ("itl_mean_ms", (live.get("itl_ms") or {}).get("mean")),
                           ("itl_p99_ms", (live.get("itl_ms") or {}).get("p99"))):
            facts[f"vllm.{key}"] = value
    log = vllm.log if vllm is not None else None
    metrics = (vllm.metrics_delta or vllm.metrics or {}) if vllm is not None else {}
    # A scrape's gauges stand in for a peak only where it is the one scrape: of a pair around the benchmark the last
    # was taken after it, the server idle (0 running, 0 waiting, the cache empty). Runs with several API servers
    # (whose log has no stats lines) read "peak KV usage 0.0 %" from it, their cache full.
    gauges = (vllm.metrics or {}) if vllm is not None and not vllm.metrics_delta else {}

    series = (vllm.series or {}) if vllm is not None else {}

    def logged(key: str) -> Any:
        """The log's stats lines, else a live window's scrapes (`profkit attach`)."""
        value = getattr(log, key) if log is not None else None
        if value is None and key in series:
            return series[key] * 100 if key.startswith("kv_cache_usage") else series[key]
        return value

    preempt = metrics.get("vllm:num_preemptions_total")
    facts["vllm.preemptions"] = int(preempt) if preempt is not None else logged("preemptions_total")
    usage = gauges.get("vllm:kv_cache_usage_perc", gauges.get("vllm:gpu_cache_usage_perc"))
    log_usage = logged("kv_cache_usage_max")
    facts["vllm.kv_cache_usage_max"] = (log_usage / 100 if log_usage is not None else usage)
    waiting = logged("waiting_max")
    facts["vllm.waiting_max"] = waiting if waiting is not None else gauges.get("vllm:num_requests_waiting")
    # With --api-server-count > 1 vLLM logs no stats lines, and /metrics after the run reads 0 running: the
    # client's peak of requests in flight says the server was loaded.
    running = logged("running_max")
    if running is None and bench is not None:
        running = bench.peak_concurrent_requests
    facts["vllm.running_max"] = running if running is not None else gauges.get("vllm:num_requests_running")
    facts["vllm.running_mean"] = logged("running_mean")
    facts["live.seconds"] = series.get("seconds")
    finished = metrics.get("vllm:request_success_total") if series else None
    facts["live.requests"] = int(finished) if finished is not None else None
    hits, queries = metrics.get("vllm:prefix_cache_hits_total"), metrics.get("vllm:prefix_cache_queries_total")
    if hits is not None and queries:
        facts["vllm.prefix_cache_hit_rate"] = hits / queries
    else:
        rate = logged("prefix_cache_hit_rate_mean")
        facts["vllm.prefix_cache_hit_rate"] = rate / 100 if rate is not None else None
    prompt, gen = logged("prompt_throughput_mean"), logged("generation_throughput_mean")
    if prompt is None or not gen:  # no stats lines: the token counters' change over the run
        prompt, gen = metrics.get("vllm:prompt_tokens_total"), metrics.get("vllm:generation_tokens_total")
    facts["vllm.prompt_token_share"] = prompt / (prompt + gen) if prompt is not None and gen and prompt + gen else None
    cache = (vllm.cache or {}) if vllm is not None else {}
    logged_tokens = logged("kv_cache_tokens")
    facts["vllm.kv_cache_tokens"] = logged_tokens if logged_tokens is not None else cache.get("kv_cache_size_tokens")
    spec_run = (vllm.spec_decode or {}) if vllm is not None else {}
    facts["vllm.spec_drafts"] = spec_run.get("drafts")
    facts["vllm.spec_acceptance"] = spec_run.get("acceptance_rate")
    facts["vllm.generation_tokens"] = metrics.get("vllm:generation_tokens_total")
    for key in ("gpu_free_memory_bytes", "kv_cache_memory_bytes", "model_memory_bytes"):
        facts[f"vllm.{key}"] = logged(key)
    for key, entry in (vllm.config if vllm is not None else {}).items():
        facts[f"config.{key}"] = entry["value"]
    facts["vllm.default_max_num_seqs"] = (vllm.defaults or {}).get("max_num_seqs") if vllm is not None else None
    spec = (vllm.config if vllm is not None else {}).get("speculative_config") or {}
    known = spec.get("source") not in (None, "unknown")
    facts["vllm.speculative_decoding"] = (spec.get("value") is not None) if known else None
    return facts


def efficiency_facts(eff: dict[str, Any] | None, vllm: VllmSection | None, workload: dict[str, Any],
                     host: dict[str, Any] | None, sections: Sections | None) -> dict[str, Any]:
    """How far from the hardware's peak, and what the GPU and the model are (see analysis/efficiency.py)."""
    eff = eff or {}
    window = eff.get("window") or {}
    metrics = ((eff.get("gpu_metrics") or {}).get("window")) or {}
    sampled = {p["phase"]: p for p in (eff.get("gpu_metrics") or {}).get("phases") or []}  # nsys GPU metrics

    def share(d: dict[str, Any], key: str) -> float | None:
        value = d.get(key)
        return value / 100 if isinstance(value, (int, float)) else None

    dram = [share(metrics, k) for k in ("dram_read", "dram_write")]
    decode = sampled.get("decode-only") or {}
    decode_dram = [share(decode, k) for k in ("dram_read", "dram_write")]
    kv_tokens = (vllm.log.kv_cache_tokens if vllm is not None and vllm.log is not None else None)
    per_request = workload.get("workload.tokens_per_request")
    gpus = [g for g in ((host or {}).get("gpus") or [])]
    estimated = {row["phase"]: row for row in (eff.get("phases") or {}).get("rows") or []}  # step annotations
    prefill, decode_steps = estimated.get("prefill-bearing") or {}, estimated.get("decode-only") or {}
    return {
        "efficiency.prefill_mfu": prefill.get("mfu"), "efficiency.prefill_mbu": prefill.get("mbu"),
        "efficiency.decode_mfu": decode_steps.get("mfu"), "efficiency.decode_mbu": decode_steps.get("mbu"),
        "vllm.kv_capacity_requests": kv_tokens / per_request if kv_tokens and per_request else None,
        "efficiency.mfu": window.get("mfu"), "efficiency.mbu": window.get("mbu"),
        "efficiency.counters_mbu": (eff.get("vllm_counters") or {}).get("mbu"),
        "efficiency.shape_mbu": (eff.get("model_shape") or {}).get("mbu"),
        "model.weight_bits": (eff.get("precision") or {}).get("weight_bits"),
        "gpu.fp8": bool((eff.get("gpu") or {}).get("fp8_tflops")) if (eff.get("gpu") or {}).get("source") else None,
        "gpu.count": len(gpus) or (_devices(sections) if sections is not None else None) or None,
        "gpu_metrics.sm_active": share(metrics, "sm_active"),
        "gpu_metrics.tensor_active": share(metrics, "tensor_active"),
        "gpu_metrics.dram_bandwidth": sum(dram) if None not in dram else None,
        "gpu_metrics.prefill_tensor_active": share(sampled.get("prefill-bearing") or {}, "tensor_active"),
        "gpu_metrics.decode_dram_bandwidth": sum(decode_dram) if None not in decode_dram else None,
    }


def host_facts(host: dict[str, Any] | None) -> dict[str, Any]:
    """`host.*` facts (None where the run has no host.json or the role did not appear)."""
    roles = (host or {}).get("roles") or {}
    facts: dict[str, Any] = {}
    for role, prefix in (("api_server", "host.api_server"), ("engine_core", "host.engine_core"),
                         ("bench_client", "host.client"), ("frontend", "host.frontend")):
        r = roles.get(role)
        facts[f"{prefix}_cpu"] = r["cpu_mean"] if r else None
        facts[f"{prefix}_saturated_share"] = r["saturated_share"] if r else None
    facts["host.api_server_count"] = roles["api_server"]["count"] if "api_server" in roles else None
    facts["host.worker_count"] = (roles["worker"]["count"] if "worker" in roles else 0) if roles else None
    drain = (host or {}).get("drain") or {}
    facts["host.drain_s"], facts["host.drain_api_server_cpu"] = drain.get("seconds"), drain.get("api_server_cpu")
    api = roles.get("api_server")
    facts["host.api_server_busiest_share"] = (api["cpu_mean"] / api["cpu_total_mean"] if api and api["count"] > 1
                                              and api["cpu_total_mean"] > 0 else 1.0 if api else None)
    facts["host.cores"] = (host or {}).get("cores")
    facts["host.gpu_util_mean"] = (host or {}).get("gpu_util_mean")
    return facts


def step_facts(steps: dict[str, Any] | None) -> dict[str, Any]:
    if not steps:
        return {k: None for k in FACTS if k.startswith("steps.")}
    return {"steps.count": steps["count"], "steps.gpu_share": steps["gpu_share"],
            "steps.wait_share": steps["wait_share"], "steps.cycle_p50_ns": steps["all"]["cycle_p50_ns"],
            "steps.decode_cycle_p50_ns": steps["decode"]["cycle_p50_ns"],
            "steps.prefill_share": steps["prefill"]["count"] / steps["count"]}
