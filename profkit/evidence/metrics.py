"""Prometheus text from vLLM's /metrics -> `MetricsScrape` (samples summed over label sets)."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.inputs import read_text


class MetricsScrape(msgspec.Struct, frozen=True):
    """One scrape: `{'vllm:num_preemptions_total': 31.0, ...}`; histograms keep their `_sum` and `_count`."""

    values: dict[str, float]


def parse_metrics(text: str) -> MetricsScrape:
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
    return MetricsScrape(out)


def read_metrics(path: Path) -> MetricsScrape:
    text = read_text(Path(path), "metrics file")
    try:
        return parse_metrics(text)
    except ProfkitError as exc:
        raise ProfkitError(f"{path}: {exc}") from None


def counter_delta(before: MetricsScrape, after: MetricsScrape) -> dict[str, float]:
    """Counters over the benchmark: the second scrape less the first (a series new in the second counts whole)."""
    return {k: v - before.values.get(k, 0.0) for k, v in after.values.items()}
