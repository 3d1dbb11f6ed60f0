"""A vLLM server or engine log -> `VllmLog`: the periodic stats lines (max and mean over the run) and the
start-up facts (KV cache size, memory, the "non-default args" the run set).

Line by line, each pattern anchored on a literal and bounded: any line costs linear time; a line longer than
vLLM's longest (the engine config line, a few KB) is not vLLM's and is skipped."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import msgspec

from profkit.inputs import read_text
from profkit.numbers import parse_float, parse_int

# One periodic stats line of vLLM V1's LoggingStatLogger, e.g.
# "Engine 000: Avg prompt throughput: 5325.0 tokens/s, Avg generation throughput: 1218.6 tokens/s,
#  Running: 7 reqs, Waiting: 148 reqs, Preemptions: 3, GPU KV cache usage: 85.8%, Prefix cache hit rate: 0.0%"
STAT_FIELDS = {
    "prompt_throughput": r"Avg prompt throughput: ?(\d{1,12}(?:\.\d{1,6})?)\b",
    "generation_throughput": r"Avg generation throughput: ?(\d{1,12}(?:\.\d{1,6})?)\b",
    "running": r"Running: ?(\d{1,9}) reqs",
    "waiting": r"Waiting: ?(\d{1,9}) reqs",
    "preemptions": r"Preemptions: ?(\d{1,12})\b",
    "kv_cache_usage": r"GPU KV cache usage: ?(\d{1,3}(?:\.\d{1,6})?)%",
    "prefix_cache_hit_rate": r"Prefix cache hit rate: ?(\d{1,3}(?:\.\d{1,6})?)%",
}
_KV_TOKENS = re.compile(r"GPU KV cache size:\s*([0-9][0-9,.]{0,60}) tokens")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([0-9][0-9,]{0,60}) tokens per request:"
                              r"\s*([0-9][0-9.,]{0,60})x")
_BATCHED_TOKENS = re.compile(r"max_num_batched_tokens=([0-9]{1,60})")
_GPU_MEM_UTIL = re.compile(r"Desired GPU memory utilization is \(([0-9][0-9.]{0,60})")
# Memory at start-up (vLLM 0.26 gpu_worker.py): with --kv-cache-memory-bytes it logs "Initial free memory
# 78.66 GiB, reserved 0.28 GiB memory for KV Cache as specified by kv_cache_memory_bytes config"; without,
# "Available KV cache memory: 69.54 GiB". model_runner.py: "Model loading took 2.06 GiB".
_FREE_MEMORY = re.compile(r"Initial free memory ([0-9][0-9.,]{0,60}) GiB")
_KV_RESERVED = re.compile(r"reserved ([0-9][0-9.,]{0,60}) GiB memory for KV Cache"
                          r"|Available KV cache memory: ([0-9][0-9.,]{0,60}) GiB")
_MODEL_MEMORY = re.compile(r"Model loading took ([0-9][0-9.,]{0,60}) GiB")
# gpu_worker.py, sizing the cache by --gpu-memory-utilization: "Free memory on device (78.66/79.18 GiB) on startup":
# the GPU's memory as vLLM saw it (a run sized by --kv-cache-memory-bytes does not log it).
_DEVICE_MEMORY = re.compile(r"Free memory on device \([0-9][0-9.,]{0,60}/([0-9][0-9.,]{0,60}) GiB\)")
GIB = 1 << 30
_STARTUP_NUMBERS = {"kv_cache_tokens": _KV_TOKENS, "max_concurrency": _MAX_CONCURRENCY,
                    "logged_max_num_batched_tokens": _BATCHED_TOKENS, "logged_gpu_memory_utilization": _GPU_MEM_UTIL,
                    "gpu_free_memory_bytes": _FREE_MEMORY, "kv_cache_memory_bytes": _KV_RESERVED,
                    "model_memory_bytes": _MODEL_MEMORY, "gpu_total_memory_bytes": _DEVICE_MEMORY}
# "non-default args: {'tokenizer': '/tmp/tiny', 'max_model_len': 2048, ...}": the flags the run set.
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_STARTUP_KEYS = ("GPU KV cache size", "Maximum concurrency", "max_num_batched_tokens=", "Desired GPU memory",
                 "Initial free memory", "Available KV cache memory", "Model loading took", "non-default args",
                 "LLM engine (v", "Free memory on device")
_VERSION = re.compile(r"Initializing a V\d+ LLM engine \(v([0-9][\w.+-]{0,40})\)")
_LITERAL_ARG = re.compile(r"'(\w+)': ('[^']*'|-?[\d.]+(?:e-?\d+)?|True|False|None)(?=[,}])")
MAX_LINE = 16384


class VllmLog(msgspec.Struct, omit_defaults=True, frozen=True):
    """What a vLLM log says; a field the log does not tell is None (left out of the report's JSON)."""

    stats_lines: int
    skipped_lines: int
    prompt_throughput_max: float | None = None
    prompt_throughput_mean: float | None = None
    generation_throughput_max: float | None = None
    generation_throughput_mean: float | None = None
    running_max: float | None = None
    running_mean: float | None = None
    waiting_max: float | None = None
    waiting_mean: float | None = None
    preemptions_max: float | None = None
    preemptions_mean: float | None = None
    kv_cache_usage_max: float | None = None  # percent, as the log prints it
    kv_cache_usage_mean: float | None = None
    prefix_cache_hit_rate_max: float | None = None
    prefix_cache_hit_rate_mean: float | None = None
    # Some vLLM versions log the preemptions of each logging interval; their sum is the run's total. vLLM 0.26
    # never prints the field (a real run with 29 preemptions in /metrics logged none), so its absence says
    # nothing: only the metrics counter is authoritative.
    preemptions_total: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    logged_max_num_batched_tokens: int | None = None
    logged_gpu_memory_utilization: float | None = None
    gpu_free_memory_bytes: int | None = None
    kv_cache_memory_bytes: int | None = None
    model_memory_bytes: int | None = None
    gpu_total_memory_bytes: int | None = None  # the GPU's memory as vLLM's start-up saw it
    non_default_args: dict[str, Any] | None = None  # literal values only, never evaluated
    vllm_version: str | None = None  # "Initializing a V1 LLM engine (v0.26.0)"


def parse_log(text: str) -> VllmLog:
    stats: dict[str, list[float]] = {k: [] for k in STAT_FIELDS}
    lines = skipped = 0
    startup: list[str] = []
    for line in text.splitlines():
        if len(line) > MAX_LINE:
            skipped += 1
            continue
        if "Avg prompt throughput" not in line:
            if len(startup) < 2000 and any(k in line for k in _STARTUP_KEYS):
                startup.append(line)
            continue
        lines += 1
        for key, pattern in STAT_FIELDS.items():
            m = re.search(pattern, line)
            if m and (value := parse_float(m.group(1))) is not None:
                stats[key].append(value)
    text = "\n".join(startup)
    out: dict[str, Any] = {"stats_lines": lines, "skipped_lines": skipped}
    for key, values in stats.items():
        if values:
            out[f"{key}_max"] = max(values)
            out[f"{key}_mean"] = sum(values) / len(values)
    if stats["preemptions"]:
        out["preemptions_total"] = int(sum(stats["preemptions"]))
    # Start-up facts: each through the one text-to-number parser (an odd number, "1..2" or 5,000 digits, is
    # not a number and the fact stays unknown).
    found = {key: pattern.search(text) for key, pattern in _STARTUP_NUMBERS.items()}
    if (m := found["kv_cache_tokens"]) and (v := parse_int(m.group(1))) is not None:
        out["kv_cache_tokens"] = v
    if (m := found["max_concurrency"]) and (f := parse_float(m.group(2))) is not None:
        out["max_concurrency"] = f
    if (m := found["logged_max_num_batched_tokens"]) and (v := parse_int(m.group(1))) is not None:
        out["logged_max_num_batched_tokens"] = v
    if (m := found["logged_gpu_memory_utilization"]) and (f := parse_float(m.group(1))) is not None:
        out["logged_gpu_memory_utilization"] = f
    for key in ("gpu_free_memory_bytes", "kv_cache_memory_bytes", "model_memory_bytes", "gpu_total_memory_bytes"):
        if (m := found[key]) and (f := parse_float(m.group(1) or m.group(m.lastindex or 1))) is not None:
            out[key] = int(f * GIB)
    if m := _VERSION.search(text):
        out["vllm_version"] = m.group(1)
    if m := _NON_DEFAULT.search(text):
        # Only literal values (objects such as ProfilerConfig(...) are skipped).
        out["non_default_args"] = {k: _literal(v) for k, v in _LITERAL_ARG.findall(m.group(1))}
    return VllmLog(**out)


def _literal(text: str) -> Any:
    """One value of the logged dict, as Python wrote it: a quoted string, a number, True/False/None.
    (The pattern above admits nothing else, and a malformed number such as '1.2.3' stays text.)"""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def read_log(path: Path) -> VllmLog:
    return parse_log(read_text(Path(path), "vLLM log"))


# A Python exception as vLLM's processes print it, after their prefixes ("(EngineCore_DP0 pid=12) ", "ERROR 11-26
# 12:00:00 [core.py:700] "): "RuntimeError: CUDA error: ..." or a bare "KeyboardInterrupt".
_LINE_PREFIX = re.compile(r"^(?:\(\w[\w-]{0,40} pid=\d{1,10}\)\s*){0,4}"
                          r"(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                          r"\[[^\]]{0,200}\]\s?)?")
_EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w{0,60}\.){0,6}[A-Za-z_]\w{0,60}(?:Error|Exception|Exit|Interrupt))"
                        r"(?::\s?(.*))?$")
# vLLM's own "see above" wrappers: they name no cause
_CASCADE = ("Engine core initialization failed", "EngineCore encountered an issue",
            "WorkerProc initialization failed", "Worker failed with error", "Engine core proc")
TAIL_BYTES = 4 << 20  # the end of a server log: a start-up's traceback is there, not in a gigabyte of stats lines


def first_exception(text: str) -> str | None:
    """The first exception a traceback in the log ends with, as `Type: message` (the root cause: the workers'
    errors come before the engine's and the API server's "see above" wrappers)."""
    in_traceback = False
    for raw in text.splitlines():
        if len(raw) > MAX_LINE:
            continue
        line = _LINE_PREFIX.sub("", raw, count=1).rstrip()
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            continue
        if not in_traceback or line.startswith((" ", "\t")) or not line:
            continue
        m = _EXCEPTION.match(line)
        if m is None:
            continue
        in_traceback = False
        message = (m.group(2) or "").strip()
        if any(c in message for c in _CASCADE):
            continue
        if len(message) > 240:  # a cuBLAS call's whole signature: the status names the error
            message = message[:239] + "…"
        return f"{m.group(1)}: {message}" if message else m.group(1)
    return None


def start_failure(path: Path) -> str | None:
    """Why a server died before it was healthy, from its log: the first exception, and for a known class
    (profkit.vllm.start_failures) the cause and the flag that avoids it. None when the log says nothing."""
    from profkit.vllm.start_failures import classify

    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    exception, known = first_exception(text), classify(text)
    parts = [exception] if exception else []
    if known is not None:
        parts.append(f"{known.cause}; try {known.remedy}")
    return "; ".join(parts) or None
