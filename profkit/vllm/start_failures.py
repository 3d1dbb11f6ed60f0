"""Why a vLLM server died before it was healthy: the classes of start-up failure profkit knows, each with the
text of vLLM 0.26.0 that names it and the flag that avoids it.

A class matches when every one of its patterns is found in the log (case-sensitive regular expressions, each
bounded). The first class that matches wins; the list runs from the most specific."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FailureClass:
    name: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    remedy: str  # what to change, with the flag as a user writes it


def _c(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


KNOWN: tuple[FailureClass, ...] = (
    # vllm/v1/worker/utils.py: request_memory
    FailureClass(
        "memory-held-by-others",
        _c(r"Free memory on device [^\n]{0,200} on startup is less than desired GPU memory utilization"),
        "other processes hold part of the GPU's memory, below what --gpu-memory-utilization asks for",
        "free the GPU (another vLLM still running?) or lower --gpu-memory-utilization"),
    # vllm/v1/core/kv_cache_utils.py: _check_enough_kv_cache_memory
    FailureClass(
        "kv-cache-below-one-request",
        _c(r"KV cache is needed, which is larger than the available KV cache memory"),
        "the KV cache left after the weights cannot hold one request of --max-model-len",
        "lower --max-model-len (the log gives the estimated maximum) or raise --gpu-memory-utilization"),
    FailureClass(
        "no-kv-cache-memory",
        _c(r"No available memory for the cache blocks"),
        "the weights and activations leave no memory for the KV cache",
        "raise --gpu-memory-utilization, use more GPUs (--tensor-parallel-size) or a smaller model or precision"),
    FailureClass(
        "out-of-memory",
        _c(r"(?:torch\.OutOfMemoryError|CUDA out of memory)"),
        "the GPU ran out of memory during start-up",
        "lower --gpu-memory-utilization or --max-num-batched-tokens, or use more GPUs (--tensor-parallel-size)"),
    # vLLM enables the all-reduce + RMS-norm fusion (FlashInfer's all-reduce) with TP > 1 on Hopper and Blackwell
    # (vllm/config/vllm.py: enable_allreduce_rms_fusion); on a machine without NVLink multicast its workers die in
    # profile_run (CUBLAS_STATUS_EXECUTION_FAILED, then an illegal memory access) and the server hangs. Recorded on 2
    # H200s: tests/data/h200_tp2 (tp2_default/server.log).
    FailureClass(
        "allreduce-rms-fusion",
        _c(r"Initialized FlashInfer Allreduce norm fusion workspace|Auto-selected flashinfer allreduce backend",
           r"CUBLAS_STATUS_[A-Z_]{1,40}|illegal memory access|Engine core initialization failed"),
        "the all-reduce + RMS-norm fusion (FlashInfer's all-reduce, on by default with tensor parallelism on Hopper "
        "and Blackwell) failed on this machine",
        "--compilation-config '{\"pass_config\": {\"fuse_allreduce_rms\": false}}'"),
    FailureClass(
        "port-in-use",
        _c(r"(?:[Aa]ddress already in use)"),
        "the port is taken by another process",
        "pick another --port"),
)


def classify(log: str) -> FailureClass | None:
    """The known class of a start-up failure whose log (or its tail) is `log`, or None."""
    for known in KNOWN:
        if all(p.search(log) for p in known.patterns):
            return known
    return None
