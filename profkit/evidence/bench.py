"""`vllm bench throughput --output-json` / `vllm bench serve --save-result` JSON -> `BenchResult`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeGuard

import msgspec

from profkit.errors import ProfkitError
from profkit.inputs import read_json


class BenchResult(msgspec.Struct, omit_defaults=True, frozen=True):
    """The benchmark's own figures, under one name whichever benchmark wrote them; a field the file does
    not hold (as a finite number) is None and left out of the report's JSON."""

    requests_per_second: float | None = None
    output_throughput: float | None = None
    tokens_per_second: float | None = None
    elapsed_s: float | None = None
    num_requests: float | None = None  # requests completed (vllm bench serve's `completed`, not its `num_prompts`)
    failed_requests: float | None = None  # requests sent that failed (vllm bench serve: HTTP errors, stream errors)
    ttft_mean_ms: float | None = None
    ttft_median_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_mean_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_mean_ms: float | None = None
    itl_p99_ms: float | None = None
    max_concurrency: float | None = None
    request_rate: float | None = None
    peak_concurrent_requests: float | None = None  # requests in flight, client side
    input_tokens: float | None = None  # all prompts' tokens (vllm bench serve)
    output_tokens: float | None = None  # all generated tokens

    def request_tokens(self) -> tuple[float, float] | None:
        """The mean prompt and output tokens per request (vllm bench serve's totals over its requests)."""
        if self.input_tokens is None or self.output_tokens is None or not self.num_requests:
            return None
        return self.input_tokens / self.num_requests, self.output_tokens / self.num_requests


# field -> the keys `vllm bench throughput` and `vllm bench serve` write it under, first found wins
KEYS: dict[str, tuple[str, ...]] = {
    "requests_per_second": ("requests_per_second", "request_throughput"),
    "output_throughput": ("output_throughput",),
    "tokens_per_second": ("tokens_per_second", "total_token_throughput"),
    "elapsed_s": ("elapsed_time", "duration"),
    # serve's figures are its completed requests' (request_throughput = completed / duration): `num_prompts` counts
    # the failed too
    "num_requests": ("num_requests", "completed", "num_prompts"), "failed_requests": ("failed",),
    "ttft_mean_ms": ("mean_ttft_ms",), "ttft_median_ms": ("median_ttft_ms",), "ttft_p99_ms": ("p99_ttft_ms",),
    "tpot_mean_ms": ("mean_tpot_ms",), "tpot_p99_ms": ("p99_tpot_ms",),
    "itl_mean_ms": ("mean_itl_ms",), "itl_p99_ms": ("p99_itl_ms",),
    "max_concurrency": ("max_concurrency",), "request_rate": ("request_rate",),
    "peak_concurrent_requests": ("max_concurrent_requests",),
    "input_tokens": ("total_input_tokens",), "output_tokens": ("total_output_tokens",),
}


def parse_bench(data: dict[str, Any]) -> BenchResult:
    """The benchmark JSON's figures (finite numbers only; booleans and text are not figures, and every figure here is a
    count, a rate or a time: a negative one is not read)."""
    out = {}
    for name, candidates in KEYS.items():
        for c in candidates:
            value = data.get(c)
            if is_figure(value) and value >= 0:
                out[name] = float(value)
                break
    return BenchResult(**out)


def is_figure(value: Any) -> TypeGuard[int | float]:
    """A benchmark JSON value that is a figure: a finite number of a measurement's size (booleans and text are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(float(value)) and abs(float(value)) < 1e15
    except OverflowError:  # an int too large for a float
        return False


def read_bench(path: Path) -> BenchResult:
    data = read_json(Path(path), "benchmark JSON", bad="not a benchmark JSON")
    if not isinstance(data, dict):
        raise ProfkitError(f"{path}: not a benchmark JSON (expected an object, got a {type(data).__name__})")
    return parse_bench(data)
