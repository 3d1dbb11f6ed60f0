"""The model of the run against measured (run, change) pairs: every pair recorded in tests/data (H100s and H200s),
each baseline replicate's report calibrating the model, its prediction of the changed configuration compared with
what the changed configuration measured (the mean of its replicates).

    python scripts/validate_model.py            # the table, Markdown, on stdout
    python scripts/validate_model.py --json     # one row per (pair, baseline replicate, metric)
    python scripts/validate_model.py --write    # the rows profkit ships (profkit/model/validation.json): each
                                                # prediction's range takes the held-out errors of its classes

Provenance: a pair is in-sample where a constant of the model was read off its recordings (P1-P9: the FP8 factors,
the host's CPU constants; P19: the eager launch cost) or its miss shaped the model (Q3: the engine core's ceiling),
held-out otherwise.

The tiny model's folders and h100_host/ctl have no config.json: make_model.py's shapes are written here (the
fixtures' README names them).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "torch_dtype": "bfloat16"}
# make_model.py's 14B shape (the folders of h100_host/ctl have no config.json)
BIG = {**TINY, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40}
GIB = 1 << 30

# id, what changes, limit class, archive, baseline folders, changed folders, changes, changed side quoted
LAYOUTS = {"tp2": {"tensor_parallel_size": 2, "data_parallel_size": 1},
           "dp2": {"tensor_parallel_size": 1, "data_parallel_size": 2}}
LOADS = {"T": ("throughput-bound, 800 at once (14B, 2 H200)", (11, 12, 13)),
         "L": ("latency-bound, 4 in flight (14B, 2 H200)", (21, 22, 23))}


def _layout_pair(pid: str, load: str, before: str, after: str) -> tuple:
    """A TP=2 / DP=2 pair of tests/data/h200_tp2: each layout's 3 replicates of one load."""
    limit, seeds = LOADS[load]
    runs = [[f"h200_tp2/ab/{side}/{load}_s{s}" for s in seeds] for side in (before, after)]
    return (pid, f"{before.upper()[:2]}=2 -> {after.upper()[:2]}=2", limit, "h200_tp2.tar.xz", *runs, LAYOUTS[after])


# replicates of a configuration of tests/data/h200_model_led where not 3 (B's FP8 pair: the third did not finish;
# lease 3 ran 2 a configuration; its api1 ran out of device time after 1)
REPLICATES = {"B/fp8pair": 2, "A3/tune/runs/01-baseline": 2, "A3/tune/runs/03-model": 2, "A3/tune/runs/05-model": 2,
              "api1": 1, "api/api4": 1, "api/api1_14b": 2, "api/api4_14b": 2}


def _led_pair(pid: str, change: str, limit: str, before: str, after: str | tuple[str, ...], changes: dict) -> tuple:
    """A pair of tests/data/h200_model_led: a start or configuration against another, every replicate of each (`after`
    several folders where the configuration ran on several servers)."""
    runs = [[f"h200_model_led/{folder}/r{i}" for folder in ((side,) if isinstance(side, str) else side)
             for i in range(1, REPLICATES.get(folder, 3) + 1)] for side in (before, after)]
    return (pid, change, limit, "h200_model_led.tar.xz", *runs, changes)


FP8 = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
# recorded on H200s after the model led the decisions (tests/data/h200_model_led.README.md): held-out
LED = [
    ("Q1", "A: caps and eager undone, FP8 weights, 2 API servers", "API-server-bound (8B, 256/768)",
     "A/tune/runs/01-baseline", "A/tune/runs/04-model",
     {"max_num_seqs": None, "enforce_eager": False, "quantization": "fp8", "api_server_count": 2}),
    ("Q2", "A: as Q1, 4 API servers, FP8 KV cache", "API-server-bound (8B, 256/768)", "A/tune/runs/01-baseline",
     "A/tune/runs/07-model", {"max_num_seqs": None, "enforce_eager": False, "api_server_count": 4, **FP8}),
    ("Q3", "A2: FP8 weights, 2 API servers", "API-server-bound (8B, 256/768)", "A2/defaults", "A2/prescribed",
     {"api_server_count": 2, "quantization": "fp8"}),
    ("Q4", "A2: FP8 weights and KV cache", "API-server-bound (8B, 256/768)", "A2/defaults", "A2/fp8pair", FP8),
    ("Q5", "B: 32,768 batched tokens, memory to the default, FP8 pair", "KV capacity (8B, 3,072/128)",
     "B/tune/runs/01-baseline", "B/tune/runs/04-model",
     {"max_num_batched_tokens": 32768, "gpu_memory_utilization": None, **FP8}),
    ("Q6", "B: FP8 weights and KV cache", "KV capacity (8B, 3,072/128)", "B/tune/runs/01-baseline", "B/prescribed",
     FP8),
    ("Q7", "B defaults: FP8 weights and KV cache", "GPU-bound (8B, 3,072/128)", "B/defaults", "B/fp8pair", FP8),
    ("Q8", "B: memory and batched tokens to the defaults", "KV capacity (8B, 3,072/128)", "B/tune/runs/01-baseline",
     "B/defaults", {"gpu_memory_utilization": None, "max_num_batched_tokens": None}),
    ("Q9", "C: cap lifted, FP8 pair", "batch cap at 30 req/s (14B, 512/512 mixed)", "C/tune/runs/01-baseline",
     "C/tune/runs/04-model", {"max_num_seqs": None, **FP8}),
    ("Q10", "C: caps to the defaults", "batch cap at 30 req/s (14B, 512/512 mixed)", "C/tune/runs/01-baseline",
     "C/defaults", {"max_num_seqs": None, "max_num_batched_tokens": None}),
    # lease 3 (one H200, 16 cores): start A at 800 prompts, tuned; FP8 weights at one API server
    ("Q11", "A3: caps and eager undone, FP8 weights, 2 API servers", "API-server-bound (8B, 256/768, 800)",
     "A3/tune/runs/01-baseline", "A3/tune/runs/03-model",
     {"max_num_seqs": None, "enforce_eager": False, "quantization": "fp8", "api_server_count": 2}),
    ("Q12", "A3's best + FP8 KV cache", "API-server-bound (8B, 256/768, 800)", "A3/tune/runs/03-model",
     "A3/tune/runs/05-model", {"kv_cache_dtype": "fp8"}),
    ("Q13", "FP8 weights: 1 -> 2 API servers", "API-server-bound (8B, 256/768, 800)", "api1",
     "A3/tune/runs/03-model", {"api_server_count": 2}),
    ("Q14", "FP8 weights: 2 -> 1 API server", "API-server-bound (8B, 256/768, 800)", "A3/tune/runs/03-model",
     "api1", {"api_server_count": 1}),
    # lease 4 (one H200, 16 cores), predicted before they ran: C's FP8 pair alone; FP8 weights at 4 API servers
    ("Q15", "C defaults: FP8 weights and KV cache", "KV capacity at 30 req/s (14B, 512/512 mixed)", "C/defaults",
     "C/fp8pair", FP8),
    ("Q16", "FP8 weights: 2 -> 4 API servers", "API-server-bound (8B, 256/768, 800)", "A3/tune/runs/03-model",
     "api/api4", {"api_server_count": 4}),
    ("Q17", "FP8 weights: 1 -> 4 API servers", "API-server-bound (8B, 256/768, 800)", "api1", "api/api4",
     {"api_server_count": 4}),
    # lease 5 (one H200, 16 cores): the API-server ladder's second model size, where the GPU sets the pace
    ("Q18", "14B defaults: 1 -> 4 API servers", "GPU-bound (14B, 256/768, 400)", "api/api1_14b", "api/api4_14b",
     {"api_server_count": 4}),
    # lease 6 (one H200, 16 cores): the API-server ladder's second shape, predicted from the 1-API-server runs before
    # the others were read (lease6-predicted; the 2-API-server runs ran out of device time there)
    ("Q20", "8B defaults: 1 -> 4 API servers", "API-server-bound (8B, 128/256, 2,000)", "api/s2_api1",
     "api/s2_api4", {"api_server_count": 4}),
    # lease 8 (one H200 and 16 cores of a 2-GPU host): the 2 API servers, predicted on the GPU box before they ran
    # (lease8-predicted); 4 API servers measured again, whose prediction validation.json held (Q20's) before they ran
    ("Q19", "8B defaults: 1 -> 2 API servers", "API-server-bound (8B, 128/256, 2,000)", "api/s2_api1",
     "api/s2_api2", {"api_server_count": 2}),
    ("Q21", "8B defaults: 1 -> 4 API servers, measured again", "API-server-bound (8B, 128/256, 2,000)",
     "api/s2_api1", "api/s2_api4b", {"api_server_count": 4}),
    # lease 9 (one H200 and 16 cores of a 2-GPU host each): the API-server ladder on a third shape and a second model
    # size, predicted on the GPU box by 9e4b3d9 from each configuration's 1-API-server runs before the others ran
    # (lease9-predicted); today's model, which dropped that commit's engine-core factor after these, was 66ba1f7's
    ("Q22", "8B at 64/512: 1 -> 4 API servers", "API-server-bound (8B, 64/512, 1,000)", "api/s3_api1",
     "api/s3_api4", {"api_server_count": 4}),
    ("Q23", "8B at 64/512: 1 -> 2 API servers", "API-server-bound (8B, 64/512, 1,000)", "api/s3_api1",
     "api/s3_api2", {"api_server_count": 2}),
    ("Q24", "1.1B at 128/256: 1 -> 4 API servers", "API-server-bound (1.1B, 128/256, 3,000)", "api/t1_api1",
     "api/t1_api4", {"api_server_count": 4}),
    ("Q25", "1.1B at 128/256: 1 -> 2 API servers", "API-server-bound (1.1B, 128/256, 3,000)", "api/t1_api1",
     "api/t1_api2", {"api_server_count": 2}),
    # lease 10 (2 H200s, 16 cores each, both at once): Q19's and Q20's configurations on a third box, predicted by
    # 6a072aa before they ran (lease10-predicted); the queued step's overlap and the engine core's CPU read off the
    # run were chosen after they ran
    ("Q26", "8B defaults: 1 -> 2 API servers, a third box", "API-server-bound (8B, 128/256, 2,000)", "api/s2_api1",
     "api/s2_api2c", {"api_server_count": 2}),
    ("Q27", "8B defaults: 1 -> 4 API servers, a third box", "API-server-bound (8B, 128/256, 2,000)", "api/s2_api1",
     "api/s2_api4c", {"api_server_count": 4}),
    # lease 12 (2 H200s, 16 cores each, both at once): 3 API servers, a count lease 11 ran once, predicted by c317a82
    # and 9b10439 from lease 6's runs before it ran (lease12-predicted); a fourth shape, its lengths spread, 1 -> 2
    # API servers predicted on the GPU box by 9b10439 from the 1-API-server runs before the 2 ran
    ("Q28", "8B defaults: 1 -> 3 API servers, a fourth box", "API-server-bound (8B, 128/256, 2,000)", "api/s2_api1",
     "api/s2_api3b", {"api_server_count": 3}),
    ("Q29", "8B at 512/128, lengths +-50 %: 1 -> 2 API servers", "GPU-bound (8B, 512/128 +-50 %, 2,400)",
     "api/s4_api1", "api/s4_api2", {"api_server_count": 2}),
    # lease 14 (2 H200s, 16 cores each, both at once; a fifth box): the fourth shape's prompt chunks a quarter of the
    # default, predicted from lease 12's 1-API-server runs by bda68c2 before the lease (lease14-predicted)
    ("Q30", "8B at 512/128, lengths +-50 %: --max-num-batched-tokens 2048, a fifth box", "GPU-bound (8B, 512/128 "
     "+-50 %, 2,400)", "api/s4_api1", "api/s4_mnbt2048", {"max_num_batched_tokens": 2048}),
    # lease 17 (2 H200s, 16 cores each; a sixth box): Q25's configuration again, 1 -> 2 API servers, the 2 on two
    # servers side by side (one a GPU), predicted on the GPU box by 62d33ec from the 1-API-server runs before either
    # started (lease17-predicted)
    ("Q31", "1.1B at 128/256: 1 -> 2 API servers, a sixth box", "API-server-bound (1.1B, 128/256, 3,000)",
     "api/t1b_api1", ("api/t1b_api2", "api/t1b_api2b"), {"api_server_count": 2}),
    # lease 23 (2 H200s, a seventh box): data parallelism's two engines with one API server, against lease 21's DP=2
    # with vLLM's default two (another box); predicted after the lease by 5c1913a's model, whose fixes since (the
    # spinning engine core, the default API-server count under DP) came from these runs: held-out, not counted as
    # recorded after the model
    ("Q32", "14B at 512/128 +-50 %, DP=2: 2 -> 1 API server, another box", "GPU-bound (14B, 512/128 +-50 %, DP=2, "
     "1,800)", "api/d2_14b", "api/e3_api1", {"api_server_count": 1}),
    ("Q33", "14B at 512/128 +-50 %, DP=2: 1 -> 2 API servers, another box", "GPU-bound (14B, 512/128 +-50 %, DP=2, "
     "1,800)", "api/e3_api1", "api/d2_14b", {"api_server_count": 2}),
    # lease 24 (2 H200s, an eighth box): the API servers' queue of 7a23ad0 (stream_end), which Q32's and Q33's misses
    # shaped, tested: Q34 predicted from lease 21's 8B before the lease (lease24-predicted), the rest on one box
    # after it by the same model; Q37 and Q38 are Q32's and Q33's configurations recorded again
    ("Q34", "8B at 1,024/128 +-50 %, DP=2: 2 -> 1 API server, another box", "GPU-bound (8B, 1,024/128 +-50 %, DP=2, "
     "1,800)", "api/d2_8b", "api/g_8b_api1", {"api_server_count": 1}),
    ("Q35", "8B at 1,024/128 +-50 %, DP=2: 2 -> 1 API server", "GPU-bound (8B, 1,024/128 +-50 %, DP=2, 1,800)",
     "api/g_8b_api2", "api/g_8b_api1", {"api_server_count": 1}),
    ("Q36", "8B at 1,024/128 +-50 %, DP=2: 1 -> 2 API servers", "GPU-bound (8B, 1,024/128 +-50 %, DP=2, 1,800)",
     "api/g_8b_api1", "api/g_8b_api2", {"api_server_count": 2}),
    ("Q37", "14B at 512/128 +-50 %, DP=2: 2 -> 1 API server, one box", "GPU-bound (14B, 512/128 +-50 %, DP=2, "
     "1,800)", "api/h_14b_api2", "api/h_14b_api1", {"api_server_count": 1}),
    ("Q38", "14B at 512/128 +-50 %, DP=2: 1 -> 2 API servers, one box", "GPU-bound (14B, 512/128 +-50 %, DP=2, "
     "1,800)", "api/h_14b_api1", "api/h_14b_api2", {"api_server_count": 2}),
    # lease 25 (2 H200s, a ninth box): CUDA graphs off and the scheduler's caps on lease 21's one-GPU 8B, predicted
    # from it by 3518ece before their runs were read (lease25-predicted), then on one box against its own defaults,
    # both ways, by the same model after it
    ("Q39", "8B at 1,024/128 +-50 %: --enforce-eager, another box", "KV capacity (8B, 1,024/128 +-50 %, 1,800)",
     "api/d1_8b", "api/k_8b_eager", {"enforce_eager": True}),
    ("Q40", "8B at 1,024/128 +-50 %: --max-num-seqs 64, another box", "KV capacity (8B, 1,024/128 +-50 %, 1,800)",
     "api/d1_8b", "api/k_8b_mns64", {"max_num_seqs": 64}),
    ("Q41", "8B at 1,024/128 +-50 %: --max-num-batched-tokens 2048, another box",
     "KV capacity (8B, 1,024/128 +-50 %, 1,800)", "api/d1_8b", "api/k_8b_mnbt2048", {"max_num_batched_tokens": 2048}),
    ("Q42", "8B at 1,024/128 +-50 %: --enforce-eager", "KV capacity (8B, 1,024/128 +-50 %, 1,800)",
     "api/k_8b_default", "api/k_8b_eager", {"enforce_eager": True}),
    ("Q43", "8B at 1,024/128 +-50 %: --max-num-seqs 64", "KV capacity (8B, 1,024/128 +-50 %, 1,800)",
     "api/k_8b_default", "api/k_8b_mns64", {"max_num_seqs": 64}),
    ("Q44", "8B at 1,024/128 +-50 %: --max-num-batched-tokens 2048", "KV capacity (8B, 1,024/128 +-50 %, 1,800)",
     "api/k_8b_default", "api/k_8b_mnbt2048", {"max_num_batched_tokens": 2048}),
    ("Q45", "8B at 1,024/128 +-50 %: --enforce-eager removed", "KV capacity, eager (8B, 1,024/128 +-50 %, 1,800)",
     "api/k_8b_eager", "api/k_8b_default", {"enforce_eager": False}),
    ("Q46", "8B at 1,024/128 +-50 %: --max-num-seqs 64 removed", "batch cap (8B, 1,024/128 +-50 %, 1,800)",
     "api/k_8b_mns64", "api/k_8b_default", {"max_num_seqs": None}),
    ("Q47", "8B at 1,024/128 +-50 %: --max-num-batched-tokens 2048 removed", "GPU-bound (8B, 1,024/128 +-50 %, 1,800)",
     "api/k_8b_mnbt2048", "api/k_8b_default", {"max_num_batched_tokens": None}),
    # lease 26 (2 H200s, a tenth box): the 8B as tensor parallelism on both GPUs, predicted by b17e3b1 from its DP=2
    # runs on two other boxes before the server started (lease26-predicted); the reverse, to both boxes' DP=2 runs,
    # by the same model after it
    ("Q48", "8B at 1,024/128 +-50 %: DP=2 -> TP=2, another box", "GPU-bound (8B, 1,024/128 +-50 %, DP=2, 1,800)",
     "api/d2_8b", "api/m_8b_tp2", {"tensor_parallel_size": 2, "data_parallel_size": 1}),
    ("Q49", "8B at 1,024/128 +-50 %: DP=2 -> TP=2, a third box", "GPU-bound (8B, 1,024/128 +-50 %, DP=2, 1,800)",
     "api/g_8b_api2", "api/m_8b_tp2", {"tensor_parallel_size": 2, "data_parallel_size": 1}),
    ("Q50", "8B at 1,024/128 +-50 %: TP=2 -> DP=2, two other boxes", "GPU-bound (8B, 1,024/128 +-50 %, TP=2, "
     "1,800)", "api/m_8b_tp2", ("api/d2_8b", "api/g_8b_api2"), {"tensor_parallel_size": 1, "data_parallel_size": 2}),
    # lease 27 (2 H200s, an eleventh box): a fifth shape (Qwen2-7B's layers: hidden 3584, 28 layers, GQA 28/4) and a
    # fifth workload (1,024/256 +-50 %, 1,000 at once), vLLM's defaults and half the GPU's memory side by side, the
    # change predicted by 8dbc6f4 from the defaults' runs before its own were read (lease27-predicted); the reverse
    # by the same model after
    ("Q51", "7B at 1,024/256 +-50 %: --gpu-memory-utilization 0.5", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q_base", "api/q_gmu05", {"gpu_memory_utilization": 0.5}),
    ("Q52", "7B at 1,024/256 +-50 %: --gpu-memory-utilization 0.5 removed", "KV capacity (7B, 1,024/256 +-50 %, "
     "1,000)", "api/q_gmu05", "api/q_base", {"gpu_memory_utilization": None}),
    # lease 29 (one H200, 16 cores, a thirteenth box): the three changes lease 27 predicted and never ran, on its shape
    # and workload, against this box's own vLLM defaults; predicted by 127e787 from those runs on the box before any
    # changed server started (lease29-predicted); the reverse by the same model after; then from lease 27's defaults
    # on another box (which 8dbc6f4 had predicted them from, lease27-predicted)
    ("Q53", "7B at 1,024/256 +-50 %: --kv-cache-dtype fp8", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q29_base", "api/q29_kvfp8", {"kv_cache_dtype": "fp8"}),
    ("Q54", "7B at 1,024/256 +-50 %: --max-num-seqs 128", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q29_base", "api/q29_mns128", {"max_num_seqs": 128}),
    ("Q55", "7B at 1,024/256 +-50 %: --enforce-eager", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q29_base", "api/q29_eager", {"enforce_eager": True}),
    ("Q56", "7B at 1,024/256 +-50 %: --kv-cache-dtype fp8 removed", "GPU-bound, FP8 KV (7B, 1,024/256 +-50 %, 1,000)",
     "api/q29_kvfp8", "api/q29_base", {"kv_cache_dtype": None}),
    ("Q57", "7B at 1,024/256 +-50 %: --max-num-seqs 128 removed", "batch cap (7B, 1,024/256 +-50 %, 1,000)",
     "api/q29_mns128", "api/q29_base", {"max_num_seqs": None}),
    ("Q58", "7B at 1,024/256 +-50 %: --enforce-eager removed", "GPU-bound, eager (7B, 1,024/256 +-50 %, 1,000)",
     "api/q29_eager", "api/q29_base", {"enforce_eager": False}),
    ("Q59", "7B at 1,024/256 +-50 %: --kv-cache-dtype fp8, another box", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q_base", "api/q29_kvfp8", {"kv_cache_dtype": "fp8"}),
    ("Q60", "7B at 1,024/256 +-50 %: --max-num-seqs 128, another box", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q_base", "api/q29_mns128", {"max_num_seqs": 128}),
    ("Q61", "7B at 1,024/256 +-50 %: --enforce-eager, another box", "GPU-bound (7B, 1,024/256 +-50 %, 1,000)",
     "api/q_base", "api/q29_eager", {"enforce_eager": True}),
]
# Q3: the engine core's ceiling was added after its miss (+32 %; since lease 10 its measured CPU goes into the step
# instead); no constant was read off it, but it shaped the model.
# Q12: the FP8 KV cache's middle cost per cached token went from 0.8x to the H100 measurement's 1.0x after its miss
# Q32, Q33: the API servers' queue (stream_end, 7a23ad0) was built after their misses (+7 to +14 %, -8 to -13 %)
IN_SAMPLE = {"P1", "P2", "P3", "P4", "P5", "P6", "P8", "P9", "P19", "Q3", "Q12", "Q32", "Q33"}
# recorded after the model predicted them (lease 4, the model of 1207f25: Q15's and Q16's predictions, made from the
# median baseline run before the runs, kept in tests/data/h200_model_led's lease4-predicted; lease 6, the model of
# 243a8c4: Q20's, made from the 1-API-server runs before the 4-API-server runs were read, in lease6-predicted;
# lease 8, the model of 93afb36: Q19's, on the GPU box, and Q21's, Q20's configuration run again; lease 9, the model
# of 9e4b3d9: Q22-Q25's, on the GPU box; lease 10, the model of 6a072aa: Q26's and Q27's; lease 12, the model of
# 9b10439: Q28's, here, and Q29's, on the GPU box; lease 14, the model of bda68c2: Q30's, here; lease 17, the model
# of 62d33ec: Q31's, on the GPU box; lease 24, the model of 7a23ad0: Q34's before it, Q35-Q38's after it, the model
# unchanged; lease 25, the model of 3518ece: Q39-Q41's before their runs were read, Q42-Q47's after, unchanged;
# lease 26, the model of b17e3b1: Q48's and Q49's before the server started, Q50's after; lease 27, the model of
# 8dbc6f4: Q51's before its runs were read, Q52's after; lease 29, the model of 127e787: Q53-Q55's before their
# servers started, Q56-Q61's after): held-out, counted apart too
AFTER_MODEL = {"Q15", "Q16", "Q17", "Q19", "Q20", "Q21", "Q22", "Q23", "Q24", "Q25", "Q26", "Q27", "Q28", "Q29",
               "Q30", "Q31", "Q34", "Q35", "Q36", "Q37", "Q38", *(f"Q{n}" for n in range(39, 62))}

PAIRS = [
    ("P1", "--kv-cache-memory-bytes 3e8 removed", "KV capacity (tiny)", "h100_tune.tar.xz",
     ["h100_tune/s1/runs/01-baseline", "h100_tune/s1/runs/02-baseline-replicate-1"],
     ["h100_tune/s1/runs/03-kv-preemption", "h100_tune/def_serve"], {"kv_cache_memory_bytes": None}),
    ("P2", "--kv-cache-memory-bytes 3e8 removed", "KV capacity (tiny, no host samples)", "vllm_serve_pair.tar.xz",
     ["before/r1", "before/r2", "before/r3"], ["after/r1"], {"kv_cache_memory_bytes": None}),
    ("P3", "--max-num-batched-tokens 16384", "frontend-bound (tiny)", "h100_tune.tar.xz",
     ["h100_tune/s1/runs/03-kv-preemption", "h100_tune/def_serve"], ["h100_tune/s1/runs/04-engine-core-bound"],
     {"max_num_batched_tokens": 16384}),
    ("P4", "--max-num-seqs 4 removed", "batch cap, engine-core-bound (tiny)", "h100_tune.tar.xz",
     ["h100_tune/s3/runs/01-baseline"], ["h100_tune/s3/runs/02-batch-cap"], {"max_num_seqs": 1024}),
    ("P5", "--api-server-count 3", "frontend-bound (tiny)", "h100_host.tar.xz",
     ["h100_host/t17/runs/01-baseline", "h100_host/t17/runs/02-baseline-replicate-1",
      "h100_host/t17/runs/03-baseline-replicate-2"],
     ["h100_host/t17/runs/04-frontend-bound", "h100_host/t17/runs/05-frontend-bound-replicate-1",
      "h100_host/t17/runs/06-frontend-bound-replicate-2"], {"api_server_count": 3}),
    ("P6", "--api-server-count 3", "frontend-bound (tiny)", "h100_host.tar.xz",
     ["h100_host/hand_def1", "h100_host/hand_def2", "h100_host/hand_def3"],
     ["h100_host/hand_api1", "h100_host/hand_api2", "h100_host/hand_api3"], {"api_server_count": 3}),
    ("P8", "--quantization fp8 --kv-cache-dtype fp8", "KV capacity, GPU-bound (14B)", "h100_phases/bf16.tar.xz",
     ["bf16"], [("h100_phases/fp8.tar.xz", "fp8")], {"quantization": "fp8", "kv_cache_dtype": "fp8"}),
    # recorded for the model's validation after it was written (tests/data/h100_model.README.md): out of sample
    ("P11", "--gpu-memory-utilization 0.6 -> 0.92", "KV capacity, GPU-bound (14B)", "h100_model.tar.xz",
     ["h100_model/gpu06/r1", "h100_model/gpu06/r2", "h100_model/gpu06/r3"],
     ["h100_model/default/r1", "h100_model/default/r2", "h100_model/default/r3"], {"gpu_memory_utilization": 0.92}),
    ("P12", "--kv-cache-dtype fp8", "KV capacity, GPU-bound (14B)", "h100_model.tar.xz",
     ["h100_model/default/r1", "h100_model/default/r2", "h100_model/default/r3"],
     ["h100_model/kvfp8/r1", "h100_model/kvfp8/r2", "h100_model/kvfp8/r3"], {"kv_cache_dtype": "fp8"}),
    ("P13", "--max-num-seqs 64", "batch cap, GPU-bound (14B)", "h100_model.tar.xz",
     ["h100_model/default/r1", "h100_model/default/r2", "h100_model/default/r3"],
     ["h100_model/seqs64/r1", "h100_model/seqs64/r2", "h100_model/seqs64/r3"], {"max_num_seqs": 64}),
    ("P14", "--max-num-seqs 64 removed", "batch cap, GPU-bound (14B)", "h100_model.tar.xz",
     ["h100_model/seqs64/r1", "h100_model/seqs64/r2", "h100_model/seqs64/r3"],
     ["h100_model/default/r1", "h100_model/default/r2", "h100_model/default/r3"], {"max_num_seqs": 1024}),
    ("P15", "--gpu-memory-utilization 0.6 -> --kv-cache-dtype fp8 at 0.92", "KV capacity, GPU-bound (14B)",
     "h100_model.tar.xz", ["h100_model/gpu06/r1", "h100_model/gpu06/r2", "h100_model/gpu06/r3"],
     ["h100_model/kvfp8/r1", "h100_model/kvfp8/r2", "h100_model/kvfp8/r3"],
     {"gpu_memory_utilization": 0.92, "kv_cache_dtype": "fp8"}),
    # recorded after tune was driven by the model (tests/data/h100_tune_model.README.md): out of sample
    ("P16", "tune's prescription: --gpu-memory-utilization 0.6 -> 0.9, FP8 weights and KV cache",
     "KV capacity, GPU-bound (14B)", "h100_tune_model.tar.xz",
     ["h100_tune_model/tune/runs/01-baseline/r1", "h100_tune_model/tune/runs/01-baseline/r2"],
     ["h100_tune_model/tune/runs/03-prescription/r1", "h100_tune_model/tune/runs/03-prescription/r2"],
     {"gpu_memory_utilization": 0.9, "quantization": "fp8", "kv_cache_dtype": "fp8"}),
    ("P17", "--gpu-memory-utilization 0.6 -> 0.92, FP8 weights and KV cache", "KV capacity, GPU-bound (14B)",
     "h100_tune_model.tar.xz",
     ["h100_tune_model/tune/runs/01-baseline/r1", "h100_tune_model/tune/runs/01-baseline/r2"],
     ["h100_tune_model/fp8_092/r1", "h100_tune_model/fp8_092/r2"],
     {"gpu_memory_utilization": 0.92, "quantization": "fp8", "kv_cache_dtype": "fp8"}),
    ("P18", "as P17, --max-num-batched-tokens 16384", "KV capacity, GPU-bound (14B)", "h100_tune_model.tar.xz",
     ["h100_tune_model/tune/runs/01-baseline/r1", "h100_tune_model/tune/runs/01-baseline/r2"],
     ["h100_tune_model/fp8_mbt16k/r1", "h100_tune_model/fp8_mbt16k/r2"],
     {"gpu_memory_utilization": 0.92, "quantization": "fp8", "kv_cache_dtype": "fp8",
      "max_num_batched_tokens": 16384}),
    ("P19", "--enforce-eager removed", "launch-bound (1.1B, 8 in flight)", "h100_tune_model.tar.xz",
     ["h100_tune_model/lb_eager/r1", "h100_tune_model/lb_eager/r2", "h100_tune_model/lb_eager/r3"],
     ["h100_tune_model/lb_graphs/r1", "h100_tune_model/lb_graphs/r2", "h100_tune_model/lb_graphs/r3"],
     {"enforce_eager": False}),
    # recorded on 2 H200s after the model learned tensor and data parallelism (tests/data/h200_tp2.README.md); the
    # all-reduce priors were read off the same machine's TP=2 capture, a different run
    *(_layout_pair(pid, load, before, after) for pid, load, before, after in (
        ("P20", "T", "tp2", "dp2"), ("P21", "T", "dp2", "tp2"),
        ("P22", "L", "tp2", "dp2"), ("P23", "L", "dp2", "tp2"))),
    *(_led_pair(*pair) for pair in LED),
    ("P9", "KV cache squeezed to 2.32 GiB", "KV capacity, GPU-bound (14B)", "h100_host.tar.xz",
     ["h100_host/ctl"], [("h100_gpu_bound.tar.xz", "h100_gpu_bound/small_kv")],
     {"kv_cache_memory_bytes": 2.32 * GIB}),
]


def _unpacked(archive: str, into: Path) -> Path:
    out = into / archive.replace("/", "_")
    if not out.exists():
        out.mkdir(parents=True)
        with tarfile.open(DATA / archive) as tar:
            tar.extractall(out, filter="data")
    return out


def _bench(folder: Path) -> dict[str, float]:
    from profkit.evidence.bench import read_bench

    b = read_bench(folder / "bench.json")
    return {"request_throughput": b.requests_per_second, "mean_ttft_ms": b.ttft_mean_ms,
            "mean_tpot_ms": b.tpot_mean_ms}


def imbalances(work: Path, at_rate: bool = False, root: Path | None = None) -> dict[str, float]:
    """Each recorded run's imbalance (`imbalances_by_count`'s, every count together)."""
    return {k: v for by in imbalances_by_count(work, at_rate, root).values() for k, v in by.items()}


def imbalances_by_count(work: Path, at_rate: bool = False, root: Path | None = None) -> dict[int, dict[str, float]]:
    """Each recorded run with several API servers at full load (request rate inf; tests/data/h200_model_led), or with
    `at_rate` each at a finite rate: how unevenly they shared the load, the busiest one's share of their CPU past an
    even split (`predict.busiest_share`'s API_SERVER_IMBALANCE, API_SERVER_IMBALANCE_AT_RATE). Apart: at a finite rate
    (lease 7's sweep) the API servers shared nearly evenly. `root`: the folder holding h200_model_led already unpacked
    (the tests' session copy); else it is unpacked into `work`."""
    from profkit.analysis.host import host_section
    from profkit.diagnose.facts import host_facts
    from profkit.evidence.bench import read_bench
    from profkit.evidence.host import read_host

    root = root or _unpacked("h200_model_led.tar.xz", work)
    out: dict[int, dict[str, float]] = {}
    for host in sorted(root.glob("h200_model_led/**/host.json")):
        if not (path := host.parent / "bench.json").is_file():
            continue
        bench = read_bench(path)
        if math.isfinite(bench.request_rate or math.inf) != at_rate:
            continue
        facts = host_facts(host_section(read_host(host), bench.elapsed_s))  # over the benchmark's window
        n, share = facts["host.api_server_count"], facts["host.api_server_busiest_share"]
        if n and n > 1 and share:
            out.setdefault(int(n), {})[f"h200_model_led.tar.xz:{host.parent.relative_to(root)}"] = \
                (share - 1 / n) / (1 - 1 / n)
    return out


def imbalance_constants(by_count: dict[int, list[float]]) -> tuple[dict[int, float], dict[int, tuple[float, float]]]:
    """`predict`'s API_SERVER_IMBALANCE and API_SERVER_IMBALANCE_ENDS from each count's runs: the median, and the
    90th and 10th percentiles (two decimals)."""
    cuts = {n: statistics.quantiles(v, n=10, method="inclusive") for n, v in by_count.items() if len(v) > 1}
    return ({n: round(statistics.median(by_count[n]), 2) for n in cuts},
            {n: (round(c[-1], 2), round(c[0], 2)) for n, c in cuts.items()})


def _configuration(recording: str) -> str:
    """A recording's configuration: its replicates (`.../r2`) are one."""
    head, _, tail = recording.rpartition("/r")
    return head if head and tail.isdigit() else recording


def validate(work: Path, only: set[str] | None = None) -> list[dict]:
    """Every pair's rows (`only`: those pairs alone). The API servers' imbalance each pair is predicted with (its
    median and 10th-90th percentiles) is read off the recorded runs less the pair's own (the constants profkit ships
    are those of them all: they are put back after)."""
    from profkit.model import predict as model

    kept = {name: getattr(model, name) for name in ("API_SERVER_IMBALANCE", "API_SERVER_IMBALANCE_ENDS")}
    try:
        return _validate(work, only)
    finally:
        for name, value in kept.items():
            setattr(model, name, value)


def _validate(work: Path, only: set[str] | None) -> list[dict]:
    from profkit.evidence.record import Evidence
    from profkit.model import predict as model
    from profkit.model.levers import families
    from profkit.model.observe import observe
    from profkit.model.predict import calibrate, predict
    from profkit.model.validation import HELD_OUT
    from profkit.report import build_report

    shares = imbalances_by_count(work)

    tiny, big = work / "tiny-config.json", work / "big-config.json"
    tiny.write_text(json.dumps(TINY))
    big.write_text(json.dumps(BIG))
    rows = []
    for pid, change, limit, archive, bases, changed, changes in PAIRS:
        if only is not None and pid not in only:
            continue
        root = _unpacked(archive, work)
        measured: dict[str, list[float]] = {}
        recordings = [f"{archive}:{b}" for b in bases] + [f"{c[0]}:{c[1]}" if isinstance(c, tuple) else
                                                         f"{archive}:{c}" for c in changed]
        own = {_configuration(r) for r in recordings}
        model.API_SERVER_IMBALANCE, model.API_SERVER_IMBALANCE_ENDS = imbalance_constants(
            {n: [v for k, v in by.items() if _configuration(k) not in own] for n, by in shares.items()})
        for c in changed:
            folder = _unpacked(c[0], work) / c[1] if isinstance(c, tuple) else root / c
            for k, v in _bench(folder).items():
                if v is not None:
                    measured.setdefault(k, []).append(v)
        for base in bases:
            folder = root / base
            config = None if (folder / "model-config.json").is_file() else big if "14B" in limit else tiny
            doc = build_report(folder, Evidence.read(model_config=config)).document()
            cal = calibrate(observe(doc))
            p = predict(cal, dict(changes), held_out=False)  # the model's own range: the band is built from these
            for metric, values in measured.items():
                m = p.metrics[metric]
                truth = statistics.fmean(values)
                rows.append({"pair": pid, "change": change, "limit": limit, "baseline": base, "metric": metric,
                             "families": list(families(changes)), "recordings": recordings,
                             "provenance": "in-sample" if pid in IN_SAMPLE else HELD_OUT,
                             "recorded_after_model": pid in AFTER_MODEL,
                             "before": m["before"], "predicted": m["predicted"], "low": m["low"], "high": m["high"],
                             "measured": truth, "replicates": len(values),
                             "error": m["predicted"] / truth - 1, "inside": m["low"] <= truth <= m["high"],
                             "fit": cal.fit_error, "limit_before": p.limit_before, "limit_after": p.limit_after,
                             "imbalance": dict(model.API_SERVER_IMBALANCE), **kinds(cal.observation)})
    return rows


def kinds(obs: Any) -> dict[str, str]:
    """The baseline run's GPU kind, model shape and workload kind, as the split tables group rows (printed, not
    shipped): the shape by its parameters (all GPUs'), the workload by its prompt-to-output ratio, lengths and
    arrivals."""
    gpu = next((k for k in ("H100", "H200") if k in (obs.gpu or "")), obs.gpu or "unknown")
    params = obs.matmul_params * obs.tensor_parallel / 1e9
    # the recordings' shapes by their layers (each shape's own count), as the fixtures' READMEs name them
    name = {16: "1.1B", 28: "7B", 32: "8B", 48: "14B"}.get(obs.layers or 0, "another")
    shape = f"{name} ({params:.1f}B weights a token multiplies)"
    prompt, output = obs.prompt_tokens, obs.output_tokens
    # bounds clear of the recorded shapes' ratios (1,024/256 is 4, 512/512 is 1) so that replicates fall together
    ratio = "decode-heavy (output >= 2x prompt)" if output >= 2 * prompt else \
        "prefill-heavy (prompt >= 3x output)" if prompt >= 3 * output else "mixed (between)"
    arrivals = "at a finite rate" if obs.request_rate and math.isfinite(obs.request_rate) else \
        "capped concurrency" if obs.max_concurrency else "all at once"
    lengths = "lengths varied" if obs.length_spread else "fixed lengths"
    return {"gpu_kind": gpu, "shape": shape, "workload_kind": f"{ratio}, {lengths}, {arrivals}"}


def with_coverage(rows: list[dict]) -> list[dict]:
    """Each row with whether its measurement fell inside the range built without its own recordings."""
    from profkit.model.validation import inside_held_out

    for r in rows:
        r["inside_held_out"] = inside_held_out(r, rows)
    return rows


def _summary(rows: list[dict], metric: str) -> str:
    errors = [abs(r["error"]) for r in rows if r["metric"] == metric]
    if not errors:
        return "none"
    inside = [r for r in rows if r["metric"] == metric]
    return (f"{len({r['pair'] for r in inside})} pairs, {len(errors)} predictions: median |error| "
            f"{statistics.median(errors) * 100:.1f}%, worst {max(errors) * 100:.1f}%; inside the model's own range "
            f"{sum(r['inside'] for r in inside)}/{len(inside)}, inside the held-out range "
            f"{sum(r['inside_held_out'] for r in inside)}/{len(inside)}")


def table(rows: list[dict]) -> str:
    from profkit.model.levers import LEVERS
    from profkit.model.validation import HELD_OUT

    out = ["| pair | change | limit class | baseline | metric | before | predicted (range) | measured (n) | error |",
           "|---|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['pair']} | {r['change']} | {r['limit']} | {r['baseline'].split('/')[-1]} | {r['metric']} | "
                   f"{r['before']:.4g} | {r['predicted']:.4g} ({r['low']:.4g}-{r['high']:.4g}) | "
                   f"{r['measured']:.4g} ({r['replicates']}) | {r['error'] * 100:+.1f}%"
                   f"{'' if r['inside'] else ' (outside)'} |")
    out.append("")
    for provenance in (HELD_OUT, "in-sample"):
        for metric in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms"):
            chosen = [r for r in rows if r["provenance"] == provenance]
            out.append(f"- {provenance}, {metric}: {_summary(chosen, metric)}")
    for metric in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms"):
        after = [r for r in rows if r["recorded_after_model"]]
        out.append(f"- recorded after the model predicted them, {metric}: {_summary(after, metric)}")
    out.append("")
    out.append("| class of change | held-out pairs | request throughput: median error | worst | inside the held-out "
               "range |")
    out.append("|---|---:|---:|---:|---:|")
    for family in dict.fromkeys(lever.family for lever in LEVERS):
        held = [r for r in rows if r["provenance"] == HELD_OUT and family in r["families"]
                and r["metric"] == "request_throughput"]
        if not held:
            out.append(f"| {family} | 0 | - | - | extrapolated |")
            continue
        errors = [abs(r["error"]) for r in held]
        out.append(f"| {family} | {len({r['pair'] for r in held})} | {statistics.median(errors) * 100:.1f}% | "
                   f"{max(errors) * 100:.1f}% | {sum(r['inside_held_out'] for r in held)}/{len(held)} |")
    for key, title in (("gpu_kind", "GPU"), ("shape", "model"), ("workload_kind", "workload")):
        out += ["", f"| {title} | held-out pairs | request throughput: median error | worst | inside the held-out "
                    "range |", "|---|---:|---:|---:|---:|"]
        held = [r for r in rows if r["provenance"] == HELD_OUT and r["metric"] == "request_throughput"]
        for value in sorted({r[key] for r in held}, key=_size_first):
            group = [r for r in held if r[key] == value]
            errors = [abs(r["error"]) for r in group]
            out.append(f"| {value} | {len({r['pair'] for r in group})} | {statistics.median(errors) * 100:.1f}% | "
                       f"{max(errors) * 100:.1f}% | {sum(r['inside_held_out'] for r in group)}/{len(group)} |")
    return "\n".join(out)


def _size_first(label: str) -> tuple[float, str]:
    """Labels ordered by a leading size ("8B (...)": 8), then as text; a label without one after those with."""
    head = label.split("B", 1)[0]
    return (float(head) if head.replace(".", "", 1).isdigit() else math.inf, label)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="write profkit/model/validation.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = with_coverage(validate(Path(tmp)))
    if args.write:
        from profkit.model.validation import ROWS, rows_text

        keep = ("pair", "change", "metric", "baseline", "families", "recordings", "provenance",
                "recorded_after_model", "predicted", "low", "high", "measured", "replicates", "inside_held_out")
        ROWS.write_text(rows_text("profkit.validation/1", [{k: r[k] for k in keep} for r in rows]))
    print(json.dumps(rows, indent=1, default=str) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
