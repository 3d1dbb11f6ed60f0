"""What the model refuses to predict, in one line each: a run it was not built for, or a change it has no grounds
for. `predict`, `--search`, `--frontier`, the prescription and tune share these (a refused change is never
prescribed or tried; a refused run gets no prediction at all).

A run: more than a twentieth of its requests failed (the benchmark's figures are the others'), a mixture-of-experts
model (the simulation's layers are dense), weights of fewer than 8 bits, tensor parallelism past what was validated,
speculative decoding, a config.json that is not the model that ran (its weights or KV bytes per
token against what vLLM's log says it allocated). A change: a flag the model does not know (alone or beside others)
and a lever whose effect the run's evidence cannot say (the GPU's memory, the API servers' host samples, FP8 tensor
cores), both the levers' table's (`levers.refusal`); a quantization other than FP8, a KV cache dtype other than FP8,
a --max-model-len shorter than the workload's requests, and a parallel layout past what was validated (the run's own
GPUs split between tensor and data parallelism, tensor parallel 1-2: a TP=2 run predicted for TP=4 said 54.5 req/s
where the TP=4 capture measured 31.05; one GPU's run predicted for data parallelism on two said x1.98-1.99 where two
shapes measured x1.78 and x1.84, outside its ranges)."""

from __future__ import annotations

import math
from typing import Any

from profkit.model.simulate import Infeasible

GIB = float(1 << 30)
WEIGHTS_AGREE = (0.67, 1.5)  # config.json's weights over vLLM's "Model loading took" (recordings: 0.90-0.99)
KV_AGREE = (0.8, 1.25)  # config.json's KV bytes per token over the log's (recordings: 1.00)
# Failed requests past which the completed ones are not the run's workload (vllm bench serve's figures leave the failed
# out; a request failing mid-stream took GPU time the model would not see). Lease 27's first start: 37-40 % failed, a
# tokenizer without the ids the model emitted; its third: 1.5-2 %, 400s (requests refused before any work)
FAILED_LIMIT = 0.05
FIT_LIMIT = 0.25  # |log(simulated / measured)| past which the model does not reproduce its own run (x1.28)
VLLM_SIXTEEN_BIT_KV = ("auto", "bfloat16", "float16")  # vLLM's --kv-cache-dtype choices that keep 16 bits
SIXTEEN_BIT = (*VLLM_SIXTEEN_BIT_KV, "half")  # KV cache dtypes that keep the model's 16 bits
# FP8 KV caches of one byte an element, scaled per tensor (fp8_inc is Gaudi's, fp8_ds_mla MLA's, the per-token-head
# kinds scale otherwise: none measured)
FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")
VALIDATED_TP = 2  # tensor parallel sizes measured against the model's prediction (tests/data/h200_tp2)
# Adding GPUs by data parallelism, measured against the model's prediction made first (tests/data/h200_model_led,
# lease 21: the 14B and 8B shapes, 1 GPU -> 2): its range missed both. Not vLLM's worker process (lease 22: the same
# with the worker in the engine core, `--distributed-executor-backend uni`); each GPU idled seconds at the run's ends
# while one API server streamed its last tokens, a cost the model lacks
SCALE_OUT_MEASURED = ("1 GPU -> --data-parallel-size 2 measured x1.78-1.84 on two shapes (x1.82 with "
                      "--distributed-executor-backend uni, x1.86 on twice the requests) where it predicted x1.97-1.99")


class Refused(Infeasible):
    """A change the model does not predict (the search passes over it as it does an infeasible one)."""


def run_refusal(doc: dict[str, Any]) -> str | None:
    """Why the model refuses the report document's run, or None."""
    model = (doc.get("efficiency") or {}).get("model") or {}
    facts = doc.get("facts") or {}
    failed = facts.get("vllm.failed_share")
    if failed is not None and failed > FAILED_LIMIT:
        sent = facts["vllm.failed_requests"] + facts["vllm.num_requests"]
        return (f"{facts['vllm.failed_requests']:,.0f} of {sent:,.0f} requests failed ({failed:.1%}): the completed "
                "ones are not the workload the benchmark asked for (the server's log says why)")
    if model.get("dense") is False:
        return "a mixture-of-experts model (its config.json names experts): the model simulates dense layers only"
    config = {k: (v or {}).get("value") for k, v in ((doc.get("vllm") or {}).get("config") or {}).items()}
    bits = ((doc.get("efficiency") or {}).get("precision") or {}).get("weight_bits")
    if isinstance(bits, int) and bits < 8:
        method = config.get("quantization") or "the checkpoint's"
        return (f"{bits}-bit weights ({method} quantization): the model knows 16-bit and FP8 weights only (a 4-bit "
                "GEMM's speed and a change of it were never measured)")
    tp = config.get("tensor_parallel_size")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > VALIDATED_TP:
        return (f"the run spans {tp} GPUs by tensor parallelism: the model's all-reduces were validated up to "
                f"{VALIDATED_TP} (a TP=2 run predicted TP=4 76 % above what it measured)")
    if config.get("speculative_config"):
        return ("the run decodes speculatively (--speculative-config): the model simulates one token a step per "
                "request, not drafts and their acceptance")
    weights, logged = model.get("weight_bytes"), facts.get("vllm.model_memory_bytes")
    if weights and logged and not WEIGHTS_AGREE[0] <= weights / logged <= WEIGHTS_AGREE[1]:
        return (f"the model's config.json gives {weights / GIB:.1f} GiB of weights a GPU where vLLM's log says "
                f"{logged / GIB:.1f} GiB: not the model that ran (give its config.json with --model-config)")
    per_token = model.get("kv_bytes_per_token")
    kv_bytes, kv_tokens = facts.get("vllm.kv_cache_memory_bytes"), facts.get("vllm.kv_cache_tokens")
    if per_token and kv_bytes and kv_tokens:
        logged_per_token = kv_bytes / kv_tokens
        if not KV_AGREE[0] <= per_token / logged_per_token <= KV_AGREE[1]:
            return (f"the model's config.json gives {per_token:,.0f} KV bytes a token where vLLM's log gives "
                    f"{logged_per_token:,.0f}: not the model that ran (give its config.json with --model-config)")
    return None


def change_refusal(obs: Any, changes: dict[str, Any]) -> str | None:
    """Why the model refuses `changes` ({vLLM dest: value}) on the observed run, or None; the levers' table's own
    refusals (a flag it does not know, a lever the run's evidence cannot read) are `levers.refusal`'s."""
    quant = changes.get("quantization")
    if quant is not None and str(quant).lower() != "fp8":
        return f"--quantization {quant}: the model knows FP8 weights only"
    kv = changes.get("kv_cache_dtype")
    if kv is not None and str(kv) not in SIXTEEN_BIT and str(kv) not in FP8_KV:
        return (f"--kv-cache-dtype {kv}: the model knows the 16-bit and FP8 KV caches only "
                f"({', '.join((*VLLM_SIXTEEN_BIT_KV, *FP8_KV))})")
    limit = changes.get("max_model_len")
    if limit is not None and obs.prompt_tokens + obs.output_tokens > int(limit):
        return (f"--max-model-len {limit} is shorter than the workload's requests ({obs.prompt_tokens:,} + "
                f"{obs.output_tokens:,} tokens): vLLM would refuse them")
    tp0, dp0 = obs.tensor_parallel, obs.data_parallel
    # a size removed (None) is vLLM's default, 1: not the run's own
    tp1, dp1 = (int(changes[dest] or 1) if dest in changes else own
                for dest, own in (("tensor_parallel_size", tp0), ("data_parallel_size", dp0)))
    if (tp1, dp1) != (tp0, dp0):
        if tp1 * dp1 != tp0 * dp0:
            measured = f" ({SCALE_OUT_MEASURED})" if dp1 > dp0 else ""
            return (f"{_gpus(tp1 * dp1)} where the run used {tp0 * dp0}: the model predicts only splits of the run's "
                    f"own GPUs{measured}")
        if max(tp0, tp1) > VALIDATED_TP:
            return (f"--tensor-parallel-size {tp0} -> {tp1}: validated up to {VALIDATED_TP} (a TP=2 run predicted "
                    "TP=4 76 % above what it measured)")
    return None


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def unreproduced(cal: Any) -> str | None:
    """What the calibrated model misses of its own run by more than FIT_LIMIT, in words; None when it reproduces
    it (a live window whose arrivals the fit cannot follow, a workload of lengths it does not simulate)."""
    for key, words in (("elapsed", "duration"), ("tpot", "time per output token")):
        err = cal.fit_error.get(key, 0.0)
        if err > FIT_LIMIT:
            return f"its simulated {words} is off by x{math.exp(err):.2f}"
    return None
