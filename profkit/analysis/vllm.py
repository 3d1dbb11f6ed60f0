"""vLLM's own evidence beside the trace: benchmark JSON, engine log, Prometheus metrics, server flags.

Each parser takes text (or a path) and returns plain dicts; `vllm_evidence` joins them into the
report's `vllm` section. Nothing here reads the trace.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.inputs import read_text

# vLLM 0.26 defaults for the flags rules talk about, used (and labelled as defaults) when the run's
# own flags are unknown. gpu_memory_utilization and max_num_batched_tokens are what vLLM 0.26 logs
# for a run that did not set them (the fixture's log: "Desired GPU memory utilization is (0.92, ...)",
# "Chunked prefill is enabled with max_num_batched_tokens=16384" for the offline LLM entry point).
VLLM_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "max_num_seqs": None,  # by GPU: default_max_num_seqs()
    "max_num_batched_tokens": None,  # depends on the entry point (8192 serve / 16384 offline on H100)
    "gpu_memory_utilization": 0.92,
    "max_model_len": None,  # the model's own context length
    "enforce_eager": False,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "kv_cache_dtype": "auto",
    "kv_cache_memory_bytes": None,
    "cpu_offload_gb": 0,
    "async_scheduling": True,
    "api_server_count": 1,  # data_parallel_size when not given
    "stream_interval": 1,
}
BOOL_FLAGS = {"enforce_eager", "enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"}
# vLLM 0.26 sizes --max-num-seqs by the GPU (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args):
# 1024 on GPUs with 70 GiB or more that are not A100s (H100, H200, MI300x, ...), 256 elsewhere.
BIG_GPU_MAX_NUM_SEQS, SMALL_GPU_MAX_NUM_SEQS = 1024, 256
_BIG_GPUS = ("h100", "h200", "gh200", "b200", "gb200", "mi300", "mi325", "mi355")


def default_max_num_seqs(gpu: str | None) -> int | None:
    """vLLM 0.26's --max-num-seqs when not given, for this GPU (None when the GPU is not known)."""
    if not gpu:
        return None
    name = gpu.lower()
    if "a100" in name:
        return SMALL_GPU_MAX_NUM_SEQS
    size = re.search(r"(\d+)\s*gb", name)
    if any(g in name for g in _BIG_GPUS) or (size and int(size.group(1)) >= 75):
        return BIG_GPU_MAX_NUM_SEQS
    return SMALL_GPU_MAX_NUM_SEQS

# One periodic stats line of vLLM V1's LoggingStatLogger, e.g.
# "Engine 000: Avg prompt throughput: 5325.0 tokens/s, Avg generation throughput: 1218.6 tokens/s,
#  Running: 7 reqs, Waiting: 148 reqs, Preemptions: 3, GPU KV cache usage: 85.8%, Prefix cache hit rate: 0.0%"
_STAT_FIELDS = {
    "prompt_throughput": r"Avg prompt throughput: ?(\d{1,12}(?:\.\d{1,6})?)\b",
    "generation_throughput": r"Avg generation throughput: ?(\d{1,12}(?:\.\d{1,6})?)\b",
    "running": r"Running: ?(\d{1,9}) reqs",
    "waiting": r"Waiting: ?(\d{1,9}) reqs",
    "preemptions": r"Preemptions: ?(\d{1,12})\b",
    "kv_cache_usage": r"GPU KV cache usage: ?(\d{1,3}(?:\.\d{1,6})?)%",
    "prefix_cache_hit_rate": r"Prefix cache hit rate: ?(\d{1,3}(?:\.\d{1,6})?)%",
}
_KV_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+) tokens")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x")
_BATCHED_TOKENS = re.compile(r"max_num_batched_tokens=(\d+)")
_GPU_MEM_UTIL = re.compile(r"Desired GPU memory utilization is \(([\d.]+)")
# Memory at start-up (vLLM 0.26 gpu_worker.py): with --kv-cache-memory-bytes it logs "Initial free memory
# 78.66 GiB, reserved 0.28 GiB memory for KV Cache as specified by kv_cache_memory_bytes config"; without,
# "Available KV cache memory: 69.54 GiB". model_runner.py: "Model loading took 2.06 GiB".
_FREE_MEMORY = re.compile(r"Initial free memory ([\d.]+) GiB")
_KV_RESERVED = re.compile(r"reserved ([\d.]+) GiB memory for KV Cache|Available KV cache memory: ([\d.]+) GiB")
_MODEL_MEMORY = re.compile(r"Model loading took ([\d.]+) GiB")
GIB = 1 << 30
# "non-default args: {'tokenizer': '/tmp/tiny', 'max_model_len': 2048, ...}": the flags the run set.
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_STARTUP_KEYS = ("GPU KV cache size", "Maximum concurrency", "max_num_batched_tokens=", "Desired GPU memory",
                 "Initial free memory", "Available KV cache memory", "Model loading took", "non-default args")
_LITERAL_ARG = re.compile(r"'(\w+)': ('[^']*'|-?[\d.]+(?:e-?\d+)?|True|False|None)(?=[,}])")


MAX_LINE = 16384  # longer lines are not vLLM's (its longest, the engine config line, is a few KB): skipped


def parse_log(text: str) -> dict[str, Any]:
    """Periodic stats lines (max/mean over the run) and start-up facts from a vLLM log.

    Line by line, each pattern anchored on a literal and bounded: any line costs linear time."""
    stats: dict[str, list[float]] = {k: [] for k in _STAT_FIELDS}
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
        for key, pattern in _STAT_FIELDS.items():
            m = re.search(pattern, line)
            if m:
                stats[key].append(float(m.group(1)))
    text = "\n".join(startup)
    out: dict[str, Any] = {"stats_lines": lines, "skipped_lines": skipped}
    for key, values in stats.items():
        if values:
            out[f"{key}_max"] = max(values)
            out[f"{key}_mean"] = sum(values) / len(values)
    if stats["preemptions"]:
        # Some vLLM versions log the preemptions of each logging interval; their sum is the run's total.
        # vLLM 0.26 never prints the field (a real run with 29 preemptions in /metrics logged none), so
        # its absence says nothing: only the metrics counter is authoritative.
        out["preemptions_total"] = int(sum(stats["preemptions"]))
    if m := _KV_TOKENS.search(text):
        out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    if m := _MAX_CONCURRENCY.search(text):
        out["max_concurrency"] = float(m.group(2))
    if m := _BATCHED_TOKENS.search(text):
        out["logged_max_num_batched_tokens"] = int(m.group(1))
    if m := _GPU_MEM_UTIL.search(text):
        out["logged_gpu_memory_utilization"] = float(m.group(1))
    if m := _FREE_MEMORY.search(text):
        out["gpu_free_memory_bytes"] = int(float(m.group(1)) * GIB)
    if m := _KV_RESERVED.search(text):
        out["kv_cache_memory_bytes"] = int(float(m.group(1) or m.group(2)) * GIB)
    if m := _MODEL_MEMORY.search(text):
        out["model_memory_bytes"] = int(float(m.group(1)) * GIB)
    if m := _NON_DEFAULT.search(text):
        # Only literal values (objects such as ProfilerConfig(...) are skipped); never evaluated.
        out["non_default_args"] = {k: _coerce(v.strip("'")) if v != "None" else None
                                   for k, v in _LITERAL_ARG.findall(m.group(1))}
    return out


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text from vLLM's /metrics, summed over label sets: {'vllm:num_preemptions_total': 31.0, ...}.

    Histograms keep their `_sum` and `_count` samples (means come from them)."""
    from prometheus_client.parser import text_string_to_metric_families  # only runs that kept /metrics need it

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                    continue
                value = float(sample.value)
                if not math.isfinite(value):  # NaN/Inf samples say nothing a rule could use
                    continue
                out[sample.name] = out.get(sample.name, 0.0) + value
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ProfkitError(f"not Prometheus text format: {one_line(exc, 160)}") from None
    return out


def parse_bench(data: dict[str, Any]) -> dict[str, Any]:
    """`vllm bench throughput --output-json` or `vllm bench serve --save-result` JSON, normalised."""
    keys = {
        "requests_per_second": ("requests_per_second", "request_throughput"),
        "output_throughput": ("output_throughput",),
        "tokens_per_second": ("tokens_per_second", "total_token_throughput"),
        "elapsed_s": ("elapsed_time", "duration"),
        "num_requests": ("num_requests", "num_prompts", "completed"),
        "ttft_mean_ms": ("mean_ttft_ms",), "ttft_median_ms": ("median_ttft_ms",), "ttft_p99_ms": ("p99_ttft_ms",),
        "tpot_mean_ms": ("mean_tpot_ms",), "tpot_p99_ms": ("p99_tpot_ms",),
        "itl_mean_ms": ("mean_itl_ms",), "itl_p99_ms": ("p99_itl_ms",),
        "max_concurrency": ("max_concurrency",), "request_rate": ("request_rate",),
        "peak_concurrent_requests": ("max_concurrent_requests",),  # requests in flight, client side
    }
    out = {}
    for name, candidates in keys.items():
        for c in candidates:
            value = data.get(c)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value):
                out[name] = float(value)
                break
    return out


def _finite(value: float) -> bool:
    try:
        return math.isfinite(float(value)) and abs(float(value)) < 1e15
    except OverflowError:  # an int too large for a float
        return False


def parse_args(text: str) -> dict[str, Any]:
    """The flags of `vllm serve` / `vllm bench` as given (`--max-num-seqs 64 --enforce-eager ...`)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ProfkitError(f"--vllm-args: {exc}") from None
    flags: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            i += 1
            continue
        name, _, value = word[2:].partition("=")
        key = name.replace("-", "_")
        negated = key.startswith("no_") and key[3:] in BOOL_FLAGS
        if value:
            flags[key] = _coerce(value)
        elif negated:
            flags[key[3:]] = False
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            flags[key] = _coerce(words[i + 1])
            i += 1
        else:
            flags[key] = True
        i += 1
    return flags


def _coerce(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def config_facts(flags: dict[str, Any], log: dict[str, Any], gpu: str | None = None) -> dict[str, dict[str, Any]]:
    """Every flag rules may name: its value and where it came from (given / logged / vLLM default)."""
    out = {}
    defaults = {**VLLM_DEFAULTS, "max_num_seqs": default_max_num_seqs(gpu)}
    logged = {k: v for k, v in (log.get("non_default_args") or {}).items() if v is not None}
    logged.setdefault("max_num_batched_tokens", log.get("logged_max_num_batched_tokens"))
    logged.setdefault("gpu_memory_utilization", log.get("logged_gpu_memory_utilization"))
    for key, default in defaults.items():
        if key in flags:
            out[key] = {"value": flags[key], "source": "given"}
        elif logged.get(key) is not None:
            out[key] = {"value": logged[key], "source": "vLLM log"}
        else:
            out[key] = {"value": default, "source": "vLLM 0.26 default" if default is not None else "unknown"}
    return out


def set_gpu_defaults(section: dict[str, Any], gpu: str | None) -> None:
    """The config facts again with the defaults of this GPU (vLLM sizes --max-num-seqs by the GPU)."""
    section["defaults"] = {"max_num_seqs": default_max_num_seqs(gpu), "gpu": gpu}
    section["config"] = config_facts(section.get("flags") or {}, section.get("log") or {}, gpu)


def vllm_evidence(bench: Path | None = None, log: Path | None = None, metrics: list[Path] | None = None,
                  args: str | None = None, gpu: str | None = None) -> dict[str, Any]:
    """The report's `vllm` section from whichever inputs exist."""
    section: dict[str, Any] = {}
    if bench:
        try:
            data = json.loads(read_text(Path(bench), "benchmark JSON"))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ProfkitError(f"{bench}: not a benchmark JSON ({one_line(exc, 120)})") from None
        if not isinstance(data, dict):
            raise ProfkitError(f"{bench}: not a benchmark JSON (expected an object, got a {type(data).__name__})")
        section["bench"] = parse_bench(data)
    log_info = parse_log(read_text(Path(log), "vLLM log")) if log else {}
    if log:
        section["log"] = log_info
    if metrics:
        snaps = []
        for p in metrics:
            text = read_text(Path(p), "metrics file")
            try:
                snaps.append(parse_metrics(text))
            except ProfkitError as exc:
                raise ProfkitError(f"{p}: {exc}") from None
        section["metrics"] = snaps[-1]
        if len(snaps) > 1:  # before/after scrapes: counters over the benchmark are the difference
            section["metrics_delta"] = {k: v - snaps[0].get(k, 0.0) for k, v in snaps[-1].items()}
    section["flags"] = parse_args(args) if args else {}
    set_gpu_defaults(section, gpu)
    return section


def vllm_facts(section: dict[str, Any]) -> dict[str, Any]:
    """Flatten the `vllm` section into `vllm.*` and `config.*` facts."""
    facts: dict[str, Any] = {}
    bench = section.get("bench", {})
    for key in ("requests_per_second", "output_throughput", "ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms",
                "tpot_p99_ms", "itl_mean_ms", "itl_p99_ms"):
        facts[f"vllm.{key}"] = bench.get(key)
    log = section.get("log", {})
    metrics = section.get("metrics_delta") or section.get("metrics") or {}
    gauges = section.get("metrics") or {}
    preempt = metrics.get("vllm:num_preemptions_total")
    facts["vllm.preemptions"] = int(preempt) if preempt is not None else log.get("preemptions_total")
    usage = gauges.get("vllm:kv_cache_usage_perc", gauges.get("vllm:gpu_cache_usage_perc"))
    log_usage = log.get("kv_cache_usage_max")
    facts["vllm.kv_cache_usage_max"] = (log_usage / 100 if log_usage is not None else usage)
    facts["vllm.waiting_max"] = log.get("waiting_max", gauges.get("vllm:num_requests_waiting"))
    # With --api-server-count > 1 vLLM logs no stats lines, and /metrics after the run reads 0 running: the
    # client's peak of requests in flight says the server was loaded.
    running = log.get("running_max", bench.get("peak_concurrent_requests"))
    facts["vllm.running_max"] = running if running is not None else gauges.get("vllm:num_requests_running")
    facts["vllm.running_mean"] = log.get("running_mean")
    hits, queries = metrics.get("vllm:prefix_cache_hits_total"), metrics.get("vllm:prefix_cache_queries_total")
    if hits is not None and queries:
        facts["vllm.prefix_cache_hit_rate"] = hits / queries
    else:
        rate = log.get("prefix_cache_hit_rate_mean")
        facts["vllm.prefix_cache_hit_rate"] = rate / 100 if rate is not None else None
    prompt, gen = log.get("prompt_throughput_mean"), log.get("generation_throughput_mean")
    if prompt is None or not gen:  # no stats lines: the token counters' change over the run
        prompt, gen = metrics.get("vllm:prompt_tokens_total"), metrics.get("vllm:generation_tokens_total")
    facts["vllm.prompt_token_share"] = prompt / (prompt + gen) if prompt is not None and gen and prompt + gen else None
    facts["vllm.kv_cache_tokens"] = log.get("kv_cache_tokens")
    for key in ("gpu_free_memory_bytes", "kv_cache_memory_bytes", "model_memory_bytes"):
        facts[f"vllm.{key}"] = log.get(key)
    for key, entry in section.get("config", {}).items():
        facts[f"config.{key}"] = entry["value"]
    facts["vllm.default_max_num_seqs"] = (section.get("defaults") or {}).get("max_num_seqs")
    return facts
