"""What the model needs of a measured run, read from its report document (`profkit.report/1`): the workload, the
engine's settings, the memory the KV cache got and what else holds the GPU's memory, the hardware's peaks, the
model's bytes and FLOPs per token, the measured figures, and the host's CPU. Reading the document (the contract
every format renders) keeps the model independent of how the report was assembled.

`observe(doc)` returns an `Observation`, or raises `Unobservable` naming what the run lacks (a benchmark result,
the KV cache's size, the model's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profkit.analysis.efficiency import gpu_memory_bytes
from profkit.model.refusals import run_refusal
from profkit.numbers import json_number

GIB = 1 << 30


class Unobservable(ValueError):
    """The run lacks what the model is calibrated on."""


@dataclass(frozen=True)
class Measured:
    request_throughput: float  # req/s
    output_throughput: float  # tok/s
    ttft_mean_s: float | None
    tpot_mean_s: float | None
    elapsed_s: float
    preemptions: float | None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None


@dataclass(frozen=True)
class Memory:
    """Bytes of one GPU's memory: the KV cache's, the weights', and what vLLM's start-up measured besides."""

    kv_bytes: float  # the KV cache vLLM allocated
    kv_tokens: int  # its capacity in tokens
    weights_bytes: float | None  # "Model loading took"
    total_bytes: float | None  # the GPU's memory (the start-up line, else the peak table)
    utilization: float | None  # --gpu-memory-utilization in force
    kv_given: bool  # the KV cache's size was set with --kv-cache-memory-bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_bytes / self.kv_tokens


@dataclass(frozen=True)
class Observation:
    requests: int
    prompt_tokens: int
    output_tokens: int
    request_rate: float | None
    max_concurrency: int | None
    config: dict[str, Any]  # effective settings: {dest: value}
    memory: Memory
    measured: Measured
    bandwidth_bps: float  # the GPU's peak memory bandwidth, bytes/s
    compute_flops: float  # its dense peak for the GEMMs' precision, FLOP/s
    fp8_flops: float | None  # its FP8 peak (for --quantization fp8)
    matmul_params: float  # weights every token multiplies (per GPU)
    weight_bits: int
    layers_heads_dim: float  # layers x attention heads x head dim (per GPU): attention FLOPs per pair / 4
    layers: int | None  # the model's layers (config.json)
    gpu: str | None
    phase_mfu: float | None = None  # the run's own prefill-bearing steps' MFU (vLLM's step annotations)
    phase_mbu: float | None = None  # its decode-only steps' MBU
    decode_step_s: float | None = None  # its decode-only steps' mean time
    host: dict[str, float] = field(default_factory=dict)  # the host samples' facts (host.*: cores, saturated shares)
    gpu_busy: float | None = None  # share of the benchmark the GPU was busy (NVML, else the trace)
    default_max_num_seqs: int | None = None  # vLLM's default for this GPU (what removing the flag gives)
    tensor_parallel: int = 1  # GPUs per engine (--tensor-parallel-size)
    data_parallel: int = 1  # engines (--data-parallel-size)
    hidden: float | None = None  # the model's hidden size (the activations each all-reduce carries per token)
    allreduce_s: float | None = None  # the trace's mean all-reduce kernel time on the first GPU (tensor parallel)
    length_spread: float = 0.0  # the benchmark's --random-range-ratio: lengths drawn within this share of the mean
    notes: list[str] = field(default_factory=list)
    offline: bool = False  # `vllm bench throughput`: every request handed to the engine at once, no client
    vllm_version: str | None = None  # what the run's log says it was


def _num(value: Any) -> float | None:
    v = json_number(value)
    return None if v is None else float(v)


def observe(doc: dict[str, Any]) -> Observation:
    """The model's inputs from a report document; `Unobservable` names the first thing missing."""
    vllm = doc.get("vllm") or {}
    bench = vllm.get("bench") or _live_as_bench(vllm.get("live") or {})
    facts = doc.get("facts") or {}
    config = {k: (v or {}).get("value") for k, v in (vllm.get("config") or {}).items()}
    eff = doc.get("efficiency") or {}
    n, elapsed = _num(bench.get("num_requests")), _num(bench.get("elapsed_s"))
    rps, inp, out = (_num(bench.get(k)) for k in ("requests_per_second", "input_tokens", "output_tokens"))
    if n and (inp is None or not out):  # `vllm bench throughput`: the totals from its command's lengths (facts)
        prompt, output = _num(facts.get("workload.prompt_tokens")), _num(facts.get("workload.output_tokens"))
        inp, out = (prompt * n, output * n) if prompt is not None and output else (inp, out)
    if not (n and elapsed and rps):
        raise Unobservable("no benchmark result with its requests and duration (--bench: the JSON of vllm bench "
                           "serve --save-result or vllm bench throughput --output-json)")
    if inp is None or not out:
        raise Unobservable("the benchmark's prompt and output tokens are unknown (vllm bench serve's JSON has them; "
                           "for vllm bench throughput, the command's --random-input-len and --random-output-len "
                           "must add up to its total_num_tokens)")
    model, gpu, prec = eff.get("model") or {}, eff.get("gpu") or {}, eff.get("precision") or {}
    kv_tokens, kv_bytes = facts.get("vllm.kv_cache_tokens"), _num(facts.get("vllm.kv_cache_memory_bytes"))
    if kv_tokens and not kv_bytes and _num(model.get("kv_bytes_per_token")):
        kv_bytes = kv_tokens * _num(model.get("kv_bytes_per_token"))  # no log (a live server): tokens x bytes each
    if not kv_tokens or not kv_bytes:
        raise Unobservable("the KV cache's size is unknown (vLLM's log: 'GPU KV cache size', 'KV cache memory')")
    params, bits = _num(model.get("matmul_params")), prec.get("weight_bits")
    if not params or not bits:
        raise Unobservable("the model's shape or precision is unknown (the model's config.json: --model-config)")
    if (refused := run_refusal(doc)) is not None:
        raise Unobservable(refused)
    bandwidth, bf16 = _num(gpu.get("bandwidth_tbs")), _num(gpu.get("bf16_tflops"))
    if not bandwidth or not bf16:
        raise Unobservable(f"the GPU's peaks are unknown: {gpu['name']} is not in profkit's peak table (give --gpu "
                           "with the GPU it is most like)" if gpu.get("name") else
                           "the GPU's peaks are unknown: the run's evidence names no GPU (give --gpu NAME)")
    tp = config.get("tensor_parallel_size") or 1
    fp8 = _num(gpu.get("fp8_tflops"))
    compute = fp8 if bits <= 8 and fp8 else bf16
    memory = Memory(kv_bytes=kv_bytes, kv_tokens=int(kv_tokens),
                    weights_bytes=_num(facts.get("vllm.model_memory_bytes")),
                    total_bytes=_total_memory(vllm, gpu), utilization=_num(config.get("gpu_memory_utilization")),
                    kv_given=config.get("kv_cache_memory_bytes") is not None)
    def ms(key: str) -> float | None:
        value = _num(bench.get(key))
        return None if value is None else value / 1e3

    measured = Measured(request_throughput=rps, output_throughput=_num(bench.get("output_throughput")) or out / elapsed,
                        ttft_mean_s=ms("ttft_mean_ms"), tpot_mean_s=ms("tpot_mean_ms"), elapsed_s=elapsed,
                        preemptions=_num(facts.get("vllm.preemptions")), ttft_p99_s=ms("ttft_p99_ms"),
                        tpot_p99_s=ms("tpot_p99_ms"))
    phases = {row.get("phase"): row for row in (eff.get("phases") or {}).get("rows") or []}
    steps = (doc.get("steps") or {}).get("decode-only") or {}
    decode_step = (_num(steps.get("cycle_ns")) or 0) / max(steps.get("count") or 0, 1) / 1e9 or None
    peak_in_flight = _num(bench.get("peak_concurrent_requests"))
    concurrency = _num(bench.get("max_concurrency"))
    if concurrency is None and peak_in_flight and peak_in_flight < n:
        concurrency = peak_in_flight  # a rate-limited or capped client: what it kept in flight at most
    return Observation(
        requests=int(n), prompt_tokens=round(inp / n), output_tokens=max(1, round(out / n)),
        request_rate=_num(bench.get("request_rate")), max_concurrency=int(concurrency) if concurrency else None,
        config=config, memory=memory, measured=measured, bandwidth_bps=bandwidth * 1e12,
        compute_flops=compute * 1e12, fp8_flops=fp8 * 1e12 if fp8 else None, matmul_params=params / tp,
        weight_bits=int(bits), layers_heads_dim=_attention_width(eff, doc) / tp,
        layers=int(_num(model.get("layers")) or 0) or None, gpu=gpu.get("name"),
        phase_mfu=_num((phases.get("prefill-bearing") or {}).get("mfu")),
        phase_mbu=_num((phases.get("decode-only") or {}).get("mbu")), decode_step_s=decode_step,
        host={k.removeprefix("host."): float(v) for k, v in facts.items()
              if k.startswith("host.") and _num(v) is not None},
        gpu_busy=_num(facts.get("host.gpu_util_mean")) or _num(facts.get("gpu.utilization")),
        default_max_num_seqs=facts.get("vllm.default_max_num_seqs"),
        length_spread=min(max(_num(facts.get("workload.length_spread")) or 0.0, 0.0), 1.0),
        tensor_parallel=int(tp), data_parallel=int(_num(config.get("data_parallel_size")) or 1),
        hidden=_attention_width(eff, doc) / layers if (layers := int(_num(model.get("layers")) or 0)) else None,
        allreduce_s=_allreduce_s(doc) if tp > 1 else None,
        offline=not vllm.get("live") and bench.get("ttft_mean_ms") is None
        and bench.get("tokens_per_second") is not None,
        vllm_version=(vllm.get("log") or {}).get("vllm_version"))


def _live_as_bench(live: dict[str, Any]) -> dict[str, Any]:
    """A live window (profkit attach) as the benchmark result the model reads: the requests finished over the
    window, its tokens, and vLLM's own latency histograms. The traffic is taken as open-loop arrivals at the rate
    requests arrived (those finished plus the change in those running or waiting)."""
    n, seconds = _num(live.get("requests")), _num(live.get("seconds"))
    if not n or not seconds:
        return {}
    inp, out = _num(live.get("prompt_tokens_per_request")), _num(live.get("output_tokens_per_request"))
    ms = {f"{key}_{stat}_ms": (live.get(f"{key}_ms") or {}).get(stat) for key in ("ttft", "tpot")
          for stat in ("mean", "p99")}
    return {"num_requests": n, "elapsed_s": seconds, "requests_per_second": n / seconds,
            "input_tokens": inp * n if inp is not None else None, "output_tokens": out * n if out else None,
            "output_throughput": out * n / seconds if out else None,
            "request_rate": _num(live.get("arrival_rate")) or n / seconds,
            **{k: v for k, v in ms.items() if v is not None}}


def _allreduce_s(doc: dict[str, Any]) -> float | None:
    """The mean time of one communication kernel on the first GPU of a tensor-parallel trace (its all-reduces)."""
    ranks = doc.get("ranks") or []
    comm = (ranks[0].get("communication") or {}) if ranks else {}
    count, total = _num(comm.get("count")), _num(comm.get("total_ns"))
    return total / count / 1e9 if count and total else None


def _total_memory(vllm: dict[str, Any], gpu: dict[str, Any]) -> float | None:
    """The GPU's memory as vLLM saw it at start-up, else the peak table's (decimal GB)."""
    logged = _num((vllm.get("log") or {}).get("gpu_total_memory_bytes"))
    if logged:
        return logged
    return gpu_memory_bytes(gpu.get("name"))


def _attention_width(eff: dict[str, Any], doc: dict[str, Any]) -> float:
    """Layers x attention heads x head dim: attention's FLOPs per (query, key) pair are 4x this. From the phases'
    own figures where they exist (FLOPs over pairs), else the matmul weights' share of a Llama-shaped layer."""
    for row in (eff.get("phases") or {}).get("rows") or []:
        pairs, flops, tokens = _num(row.get("attention_pairs")), _num(row.get("flops")), row.get("tokens") or {}
        params = _num((eff.get("model") or {}).get("matmul_params"))
        total = sum(v for v in tokens.values() if isinstance(v, (int, float)))
        if pairs and flops and params and total:
            width = (flops - 2.0 * params * total) / (4.0 * pairs)
            if width > 0:
                return width
    params = _num((eff.get("model") or {}).get("matmul_params")) or 0.0
    shape = (eff.get("model") or {}).get("shape") or {}
    if shape.get("layers") and shape.get("heads") and shape.get("head_dim"):
        return float(shape["layers"] * shape["heads"] * shape["head_dim"])
    # A Llama-like proportion: params ~ 12 x layers x hidden^2 and heads x head dim = hidden, at hidden 4096.
    return params / 12.0 / 4096.0
