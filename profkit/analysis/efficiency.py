"""How far the GPU's work is from what the hardware can do: achieved FLOP/s and bytes/s as shares of the GPU's
peak (MFU, MBU), and the peaks themselves.

Busy is not efficient: a GPU busy 96 % of the time can do a small fraction of its peak arithmetic (decode reads
every weight once per step for a few tokens) or be near its memory bandwidth. Two estimates, over the benchmark:

* vLLM's own counters, where the run had them (`--enable-mfu-metrics`, vLLM 0.26:
  `vllm:estimated_flops_per_gpu_total`, `vllm:estimated_read_bytes_per_gpu_total`,
  `vllm:estimated_write_bytes_per_gpu_total`, increased once per engine step by that step's estimate from the
  model's config; v1/metrics/perf.py). They read 0 without the flag: only a non-zero change counts.
* the model's shape (its config.json) and the tokens the run processed: 2 x the weights multiplied per token, plus
  attention; every weight read once per engine step, each generated token reading its context's KV cache
  (the same terms as vLLM's estimate, and as the Databricks MBU definition: bytes moved / time / peak bandwidth).

Peaks come from `gpu_peaks.json` (NVIDIA's dense figures, by GPU name; their sources listed there); FLOPs are
compared with the peak of the precision the GEMMs run in (FP8 weights: the FP8 peak).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.evidence.model_config import DTYPE_BYTES, ModelShape
from profkit.numbers import json_number

PEAKS = Path(__file__).resolve().parent / "gpu_peaks.json"
# The memory bandwidth a GPU can have (bytes/s): a figure outside, from an export's GPU row, is not used.
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e11, 1e14
FP8_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head")
# Quantization methods whose weights are 8-bit floats (the FP8 tensor-core peak applies) or fewer bits.
EIGHT_BIT = ("fp8", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "fbgemm_fp8", "modelopt", "mxfp8",
             "compressed-tensors")
FOUR_BIT = ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto_gptq", "auto_awq", "mxfp4", "modelopt_fp4",
            "nvfp4_per_token", "bitsandbytes")


@lru_cache(maxsize=1)
def _table() -> list[dict[str, Any]]:
    return json.loads(PEAKS.read_text(encoding="utf-8"))["gpus"]


def _gpu_row(name: str | None) -> dict[str, Any] | None:
    """The peak table's row for a GPU's reported name (`NVIDIA H100 80GB HBM3`): lowercased, 'nvidia ' dropped, the
    first row that matches."""
    if not name:
        return None
    key = name.lower().strip().removeprefix("nvidia ").strip()
    # a row's own name too: `--gpu` resolves to it (nvidia-smi's spelling, the matches', can differ: A100-SXM4-80GB)
    return next((row for row in _table() if key == row["name"].lower().removeprefix("nvidia ")
                 or any((key == m) if row.get("exact") else (m in key) for m in row["match"])), None)


def known_gpu(text: str) -> str:
    """The peak table's name for a GPU a user names (`--gpu`): a reported name (`NVIDIA H100 80GB HBM3`), or words
    of one row's name (`H200 NVL`, `l40s`); ProfkitError listing the rows on a miss or where several match."""
    row = _gpu_row(text)
    if row is not None:
        return str(row["name"])
    words = text.lower().removeprefix("nvidia ").split()
    found = [r["name"] for r in _table() if words and all(w in r["name"].lower() for w in words)]
    if len(found) == 1:
        return str(found[0])
    known = "; ".join(r["name"].removeprefix("NVIDIA ") for r in _table())
    if found:
        raise ProfkitError(f"--gpu {text!r} names several GPUs ({'; '.join(found)}): say which")
    raise ProfkitError(f"--gpu {text!r} is not in profkit's peak table (it knows: {known})")


def gpu_peak(name: str | None) -> dict[str, Any] | None:
    """The GPU's dense peaks by its reported name, or None when not in the table."""
    row = _gpu_row(name)
    return None if row is None else {"name": row["name"], "bf16_tflops": row["bf16_tflops"],
                                     "fp8_tflops": row["fp8_tflops"], "bandwidth_tbs": row["bandwidth_tbs"],
                                     "source": row["source"]}


def gpu_memory_bytes(name: str | None) -> float | None:
    """The GPU's memory by its reported name (the peak table's, decimal GB), or None when not in the table."""
    row = _gpu_row(name)
    return row["memory_gb"] * 1e9 if row and row.get("memory_gb") else None


def weight_bits(model: ModelShape | None, quantization: Any) -> int | None:
    """Bits per weight the GEMMs read: the run's --quantization, else the checkpoint's, else its dtype."""
    method = quantization if isinstance(quantization, str) and quantization else (model.quantization if model
                                                                                  else None)
    if method:
        return 8 if method in EIGHT_BIT else 4 if method in FOUR_BIT else None
    if model is None or model.dtype is None:
        return None
    size = DTYPE_BYTES.get(model.dtype)
    return 8 * size if size else None


def kv_bytes(kv_cache_dtype: Any, model: ModelShape | None) -> int | None:
    """Bytes per KV-cache element: --kv-cache-dtype, `auto` meaning the model's dtype."""
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype in FP8_DTYPES:
        return 1
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype in ("bfloat16", "float16"):
        return 2
    return DTYPE_BYTES.get(model.dtype) if model and model.dtype else None


def _delta(metrics: dict[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return value if isinstance(value, (int, float)) else None


def efficiency_section(gpu_name: str | None, model: ModelShape | None, config: dict[str, Any],
                       counters: dict[str, float], seconds: float | None, requests: float | None,
                       gpu_metrics: dict[str, Any] | None = None,
                       export_bandwidth: Any = None, steps: dict[str, Any] | None = None,
                       request_tokens: tuple[float, float] | None = None) -> dict[str, Any] | None:
    """The report's `efficiency` section (None when neither a peak, a model nor GPU metrics are known).

    `config`: the run's effective settings (`{name: {value, source}}`); `counters`: /metrics counters over the
    benchmark; `seconds`: the benchmark's duration; `requests`: requests it completed; `export_bandwidth`: the
    trace's TARGET_INFO_GPU.memoryBandwidth (bytes/s), the bandwidth peak of a GPU not in the table; `steps`: the
    trace's engine steps (analysis/steps.py), whose per-phase work gives MFU and MBU per phase; `request_tokens`:
    the benchmark's mean prompt and output tokens per request (the decode context where the step annotations do
    not carry it)."""
    peak = gpu_peak(gpu_name)
    withheld: list[str] = []
    export_bandwidth = json_number(export_bandwidth)
    # bounded on both sides before any use: a 0 would be divided by, a negative shown as the GPU's peak
    if export_bandwidth is not None and not MIN_BANDWIDTH < export_bandwidth < MAX_BANDWIDTH:
        withheld.append(f"the export's GPU row gives a memory bandwidth of {export_bandwidth / 1e9:,.1f} GB/s, outside "
                        "any GPU's (100 GB/s to 100 TB/s): not used")
    elif export_bandwidth is not None:
        if peak is None:
            peak = {"name": gpu_name, "bf16_tflops": None, "fp8_tflops": None,
                    "bandwidth_tbs": export_bandwidth / 1e12, "source": "the trace's TARGET_INFO_GPU.memoryBandwidth"}
        else:
            peak["export_bandwidth_tbs"] = export_bandwidth / 1e12  # the table's figure, checked by the export
    value = {k: (v or {}).get("value") for k, v in config.items()}
    # with data parallelism the counters and tokens are every engine's, summed (vLLM labels each engine's): a GPU's
    # share is 1/dp of them (a DP=2 run read 97 % MFU against one GPU's peak where each GPU did 49 %)
    tp, dp, not_counts = _gpu_split(value)
    bits = weight_bits(model, value.get("quantization"))
    kv = kv_bytes(value.get("kv_cache_dtype"), model)
    compute_peak = None
    if peak and peak["bf16_tflops"]:
        compute_peak = peak["fp8_tflops"] if bits is not None and bits <= 8 and peak["fp8_tflops"] else \
            peak["bf16_tflops"]
    if peak is None and model is None and not gpu_metrics:
        return None
    out: dict[str, Any] = {
        "gpu": {"name": gpu_name, **(peak or {})} if peak else {"name": gpu_name, "source": None},
        "precision": {"weight_bits": bits, "kv_cache_bytes": kv, "compute_peak_tflops": compute_peak,
                      "peak_is": "fp8" if compute_peak and peak and compute_peak == peak["fp8_tflops"] else "bf16"},
        "model": None, "vllm_counters": None, "model_shape": None, "gpu_metrics": gpu_metrics,
    }
    if model is not None:
        out["model"] = {"path": model.path, "architecture": model.architecture, "matmul_params": model.matmul_params,
                        "weight_bytes": model.matmul_params * bits // 8 // tp if bits else None,
                        "kv_bytes_per_token": model.kv_bytes_per_token(kv) // tp if kv else None,
                        "dense": model.dense, "layers": model.layers}
    secs = seconds if seconds is not None and seconds > 0 else None
    flops, read, write = (_delta(counters, f"vllm:estimated_{k}_per_gpu_total")
                          for k in ("flops", "read_bytes", "write_bytes"))
    if secs and flops and read is not None:  # 0 without --enable-mfu-metrics: only a change counts
        read, write = read / dp, (write or 0.0) / dp
        out["vllm_counters"] = _rates(flops / dp, read + write, secs, compute_peak, peak)
        out["vllm_counters"].update(read_bytes=read, write_bytes=write)
    shape = _shape_estimate(model, counters, requests, bits, kv, tp * dp) if secs and model and model.dense \
        else None
    if shape and secs:
        out["model_shape"] = {**shape, **_rates(shape["flops"], shape["bytes"], secs, compute_peak, peak)}
    out["phases"] = phase_estimates(model, steps, bits, kv, tp, compute_peak, peak,
                                    _decode_context(counters, requests, request_tokens))
    if not_counts:  # a share of one GPU cannot be said: every estimate's figures withheld, the estimates kept
        for est in (out["vllm_counters"], out["model_shape"], *((out["phases"] or {}).get("rows") or [])):
            if est:
                _clear(est, "flops", "bytes", "tflops", "tbs", "mfu", "mbu", "intensity", "attention_pairs", "parts")
        withheld.append(f"{not_counts}: not a count of GPUs, so no figure per GPU (MFU, MBU) is given")
    withheld += _withhold_impossible(out, from_export=bool(peak and "TARGET_INFO_GPU" in str(peak.get("source"))))
    if withheld:
        out["withheld"] = withheld
    best = out["vllm_counters"] or out["model_shape"]
    out["window"] = {"seconds": seconds, "from": "vLLM's counters" if out["vllm_counters"] else
                     "the model's shape" if out["model_shape"] else None,
                     **({k: best[k] for k in ("tflops", "tbs", "mfu", "mbu", "intensity")} if best else {})}
    return out


def _gpu_split(value: dict[str, Any]) -> tuple[int, int, str]:
    """The run's tensor and data parallel sizes (1 where not set), and those that are not a count of GPUs (a
    hostile manifest's `--data-parallel-size -2`), as the flags were written."""
    sizes, not_counts = [], []
    for key in ("tensor_parallel_size", "data_parallel_size"):
        size = value.get(key)
        count = size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 1)
        sizes.append(size if count and size is not None else 1)
        if not count:
            not_counts.append(f"--{key.replace('_', '-')} {size}")
    return sizes[0], sizes[1], ", ".join(not_counts)


def _withhold_impossible(out: dict[str, Any], from_export: bool) -> list[str]:
    """Physics as the bound: MFU and MBU are shares of the peak (0..1) and FLOPs, bytes and times are never
    negative. A figure outside (and the rates it came from) comes from inconsistent inputs: it is set to None
    here, never printed, and the returned line names the inputs it came from."""
    peak_from = "the export's GPU row" if from_export else "profkit's peak table"
    estimates = [(out.get("vllm_counters"), "vLLM's own counters", "vLLM's estimated FLOP and byte counters"),
                 (out.get("model_shape"), "the model's shape", "the model config's shape or vLLM's token counters")]
    estimates += [(row, f"the {row['phase']} steps", "the step annotations or the model config")
                  for row in (out.get("phases") or {}).get("rows") or []]
    lines = []
    for est, label, inputs in estimates:
        if not est:
            continue
        amounts = [est.get("flops"), est.get("bytes"), est.get("seconds"), est.get("attention_pairs"),
                   *(est.get("parts") or {}).values()]
        if any(isinstance(v, (int, float)) and (v < 0 or not math.isfinite(v)) for v in amounts):
            _clear(est, "flops", "bytes", "tflops", "tbs", "mfu", "mbu", "intensity", "attention_pairs", "parts")
            lines.append(f"{label}: every figure (a negative amount of work: {inputs} are inconsistent)")
            continue
        over = [name for key, name in (("mfu", "MFU"), ("mbu", "MBU"))
                if est.get(key) is not None and not 0 <= est[key] <= 1]
        if over:
            if "MFU" in over:
                _clear(est, "flops", "tflops", "mfu", "intensity")
            if "MBU" in over:
                _clear(est, "bytes", "tbs", "mbu", "intensity", "parts")
            lines.append(f"{label}: {' and '.join(over)} and the rates behind {'them' if len(over) > 1 else 'it'} "
                         f"(above the GPU's peak: {inputs} or {peak_from} are inconsistent)")
    return lines


def _clear(est: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if key in est:
            est[key] = None


def _rates(flops: float, moved: float, seconds: float, compute_peak: float | None,
           peak: dict[str, Any] | None) -> dict[str, Any]:
    tflops, tbs = flops / seconds / 1e12, moved / seconds / 1e12
    return {"flops": flops, "bytes": moved, "tflops": tflops, "tbs": tbs,
            "mfu": tflops / compute_peak if compute_peak else None,
            "mbu": tbs / peak["bandwidth_tbs"] if peak and peak.get("bandwidth_tbs") else None,
            "intensity": flops / moved if moved else None}


def _shape_estimate(model: ModelShape, counters: dict[str, float], requests: float | None, bits: int | None,
                    kv: int | None, gpus: int) -> dict[str, Any] | None:
    """FLOPs and bytes of the run from the model's shape and vLLM's token and step counters:
    steps (`vllm:iteration_tokens_total` histogram count), prompt tokens computed (`prompt_tokens` less those
    served from the prefix cache) and generated tokens, requests, preemptions. A preempted request is recomputed
    (vLLM 0.26 preempts by recomputation): its prompt and what it had generated, half its output on average; the
    token counters count them once. `gpus`: the GPUs the work is spread over (tensor x data
    parallel): the figures are one GPU's share."""
    steps = _delta(counters, "vllm:iteration_tokens_total_count")
    prompt = _delta(counters, "vllm:prompt_tokens_total")
    cached = _delta(counters, "vllm:prompt_tokens_cached_total") or 0.0
    generated = _delta(counters, "vllm:generation_tokens_total")
    done = _delta(counters, "vllm:request_success_total") or requests
    preempted = _delta(counters, "vllm:num_preemptions_total") or 0.0
    if not (steps and prompt is not None and generated and done and bits and kv):
        return None
    computed = max(0.0, prompt - cached)
    prompt_len, out_len = prompt / done, generated / done  # per request, on average
    kv_token = model.kv_bytes_per_token(kv) / gpus
    recomputed = preempted * (prompt_len + out_len / 2)
    # attention: a prompt's computed tokens over the prompt (causal: half of it on average), each generated
    # token over its context
    attention = (model.attention_flops(computed, prompt_len / 2)
                 + done * model.attention_flops(out_len, prompt_len + out_len / 2)
                 + model.attention_flops(recomputed, (prompt_len + out_len / 2) / 2))
    flops = (2.0 * model.matmul_params * (computed + generated + recomputed) + attention) / gpus
    weights = steps * model.matmul_params * bits / 8 / gpus
    kv_read = done * (out_len * prompt_len + out_len * out_len / 2) * kv_token
    kv_write = (computed + generated + recomputed) * kv_token
    # each GEMM reads its input and writes its output once per token (fused kernels move less, unfused more)
    activations = (computed + generated + recomputed) * model.activation_bytes_per_token() / gpus
    return {"steps": steps, "tokens": {"prompt_computed": computed, "generated": generated, "requests": done,
                                       "recomputed": recomputed},
            "flops": flops, "bytes": weights + kv_read + kv_write + activations,
            "parts": {"weights_bytes": weights, "kv_read_bytes": kv_read, "kv_write_bytes": kv_write,
                      "activation_bytes": activations}}


PHASES = (("prefill-bearing", "prefill"), ("decode-only", "decode"))


def _decode_context(counters: dict[str, float], requests: float | None,
                    request_tokens: tuple[float, float] | None) -> float | None:
    """The KV tokens a generated token attends to, on average over the run: its prompt and half its output
    (vLLM's token counters per request, else the benchmark's own means)."""
    prompt = _delta(counters, "vllm:prompt_tokens_total")
    generated = _delta(counters, "vllm:generation_tokens_total")
    done = _delta(counters, "vllm:request_success_total") or requests
    if prompt is not None and generated and done:
        return prompt / done + generated / done / 2
    if request_tokens and all(isinstance(v, (int, float)) and v >= 0 for v in request_tokens):
        return request_tokens[0] + request_tokens[1] / 2
    return None


def phase_estimates(model: ModelShape | None, steps: dict[str, Any] | None, bits: int | None, kv: int | None,
                    tp: int, compute_peak: float | None, peak: dict[str, Any] | None,
                    decode_context: float | None) -> dict[str, Any] | None:
    """MFU and MBU per phase of the engine steps (prefill-bearing, decode-only), from what vLLM's step annotations
    say each step processed and the model's shape; the time is the steps' own (each from its start to the next
    step's). None without a dense model, a precision or steps; `{"note": why}` when the steps say no tokens.

    Per step, as `_shape_estimate` over the run: 2 x the multiplied weights per token, plus attention over each
    (query, key) pair; every weight read once, each request's cached KV read once (its sequence less the tokens
    just scheduled), each scheduled token's KV written once, each GEMM's activations in and out. The detailed
    annotation gives the pairs exactly (a request of q new tokens and sequence s: q x s - q^2/2 + q/2, causal);
    the short one gives tokens only: a prompt's chunk is taken to start its prompt and a decode token to attend
    to the run's mean context."""
    if steps is None or model is None or not model.dense or not bits or not kv:
        return None
    work = {name: (steps.get(key) or {}) for name, key in PHASES}
    if not any(w.get("work") for w in work.values()):
        return {"note": f"the steps ({steps.get('source')}) say no token counts: per-phase MFU/MBU needs vLLM's "
                        "step annotations (profkit capture records them: --profiler-config "
                        '\'{"profiler": "cuda", "detailed_trace_annotation": true}\' and --profile)'}
    detailed = all(w["work"]["generation_seq"] is not None for w in work.values() if w.get("work"))
    if not detailed and decode_context is None:
        return {"note": "the step annotations give tokens without sequence lengths, and the run's mean context is "
                        "unknown (no token counters, no benchmark result)"}
    kv_token = model.kv_bytes_per_token(kv) / tp
    rows = []
    for name, _ in PHASES:
        summary = work[name]
        w = summary.get("work")
        seconds = (summary.get("cycle_ns") or 0) / 1e9
        if not w or seconds <= 0:
            continue
        ctx, gen = w["context_tokens"], w["generation_tokens"]
        tokens = ctx + gen
        if detailed:
            pairs = (w["context_qk"] - w["context_qq"] / 2 + ctx / 2) + (w["generation_qk"] - w["generation_qq"] / 2
                                                                         + gen / 2)
            cached = (w["context_seq"] - ctx) + (w["generation_seq"] - gen)
        else:
            per_request = ctx / w["context_requests"] if w["context_requests"] else 0.0
            pairs = ctx * (per_request + 1) / 2 + gen * decode_context
            cached = gen * decode_context
        flops = (2.0 * model.matmul_params * tokens + model.attention_flops(pairs, 1.0)) / tp
        parts = {"weights_bytes": summary["count"] * model.matmul_params * bits / 8 / tp,
                 "kv_read_bytes": cached * kv_token, "kv_write_bytes": tokens * kv_token,
                 "activation_bytes": tokens * model.activation_bytes_per_token() / tp}
        rows.append({"phase": name, "steps": summary["count"], "seconds": seconds,
                     "gpu_share": summary.get("gpu_share"),
                     "tokens": {"context": ctx, "generation": gen}, "attention_pairs": pairs, "parts": parts,
                     **_rates(flops, sum(parts.values()), seconds, compute_peak, peak)})
    return {"from": "vLLM's step annotations" + (" (detailed: each phase's sequence lengths)" if detailed else
                                                  f" (tokens; a decode token's context: the run's mean, "
                                                  f"{decode_context:,.0f})"),
            "rows": rows}


def export_bandwidth(source: dict[str, Any]) -> Any:
    """The memory bandwidth of a trace export's GPU row (TARGET_INFO_GPU) for the GPU that ran the kernels
    (`source.gpu`), not of a row for a device that ran none."""
    rows = [g for g in source.get("gpus") or [] if isinstance(g, dict)]
    ran = [g for g in rows if g.get("name") == source.get("gpu")]
    return next((g.get("memory_bandwidth") for g in ran or rows), None)
