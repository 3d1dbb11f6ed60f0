"""Prometheus text from vLLM's /metrics -> `MetricsScrape` (samples summed over label sets)."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.inputs import read_text


class MetricsScrape(msgspec.Struct, frozen=True):
    """One scrape: `{'vllm:num_preemptions_total': 31.0, ...}`; histograms keep their `_sum` and `_count`; `t`:
    seconds since the first scrape of a series (`profkit attach`), None for a lone scrape."""

    values: dict[str, float]
    t: float | None = None
    # histograms' cumulative buckets, summed over label sets: {name: {le: count}} ("+Inf" the total)
    buckets: dict[str, dict[str, float]] = {}
    # vLLM's `*_info` gauges carry their content in labels (cache_config_info: the KV cache's size in tokens, the
    # memory share): {name: {label: value}}
    info: dict[str, dict[str, str]] = {}


# Series kept per label value as well as summed: `name{label="v"}` (speculative decoding's acceptance per position).
PER_LABEL = {"vllm:spec_decode_num_accepted_tokens_per_pos_total": "position"}
MAX_INFO_LABELS = 64


# The series `profkit attach` keeps between its first and last scrape, one JSON object a line:
# {"t": seconds since the first scrape, "values": {name: value}} with vLLM's own samples only.
SERIES_MAX_LINE = 1 << 20
SERIES_MAX_SCRAPES = 100_000


def read_series(path: Path) -> list[MetricsScrape]:
    """`metrics-series.jsonl`: the scrapes in time order; a line that is not such an object fails the file."""
    out: list[MetricsScrape] = []
    decoder = msgspec.json.Decoder(MetricsScrape)
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if number > SERIES_MAX_SCRAPES or len(line) > SERIES_MAX_LINE:
                raise ProfkitError(f"{path}: line {number}: more than a metrics series holds")
            if not line.strip():
                continue
            try:
                scrape = decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise ProfkitError(f"{path}: line {number}: not a scrape ({one_line(exc, 160)})") from None
            except msgspec.DecodeError:
                raise ProfkitError(f"{path}: line {number}: not JSON") from None
            if scrape.t is None or not math.isfinite(scrape.t) or (out and scrape.t < (out[-1].t or 0.0)):
                raise ProfkitError(f"{path}: line {number}: its time is missing or goes back")
            out.append(MetricsScrape({k: v for k, v in scrape.values.items() if math.isfinite(v)}, scrape.t))
    return out


def series_summary(scrapes: list[MetricsScrape]) -> dict[str, float | int] | None:
    """Over a series (3 scrapes or more): its span, and the max and mean of the scheduler's gauges (requests
    running and waiting, the KV cache's usage), time-weighted like the periodic stats lines are."""
    timed = [s for s in scrapes if s.t is not None]
    if len(timed) < 3:
        return None
    out: dict[str, float | int] = {"scrapes": len(timed), "seconds": (timed[-1].t or 0.0) - (timed[0].t or 0.0)}
    for key, names in (("running", ("vllm:num_requests_running",)), ("waiting", ("vllm:num_requests_waiting",)),
                       ("kv_cache_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))):
        found = [next((s.values[m] for m in names if m in s.values), None) for s in timed]
        values = [v for v in found if v is not None]
        if values:
            out[f"{key}_max"], out[f"{key}_mean"] = max(values), sum(values) / len(values)
    return out


def parse_metrics(text: str) -> MetricsScrape:
    from prometheus_client.parser import text_string_to_metric_families  # only runs that kept /metrics need it

    out: dict[str, float] = {}
    buckets: dict[str, dict[str, float]] = {}
    info: dict[str, dict[str, str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                if sample.name.startswith("vllm:") and sample.name.endswith("_info"):
                    info[sample.name] = {str(k)[:64]: str(v)[:256] for k, v in
                                         list(sample.labels.items())[:MAX_INFO_LABELS]}
                    continue
                if (label := PER_LABEL.get(sample.name)) and (key := sample.labels.get(label)) is not None:
                    name = f'{sample.name}{{{label}="{one_line(key, 16)}"}}'
                    out[name] = out.get(name, 0.0) + float(sample.value)
                value = float(sample.value)
                if not math.isfinite(value):  # NaN/Inf samples say nothing a rule could use
                    continue
                if sample.name.endswith("_bucket"):
                    le = sample.labels.get("le")
                    if le is not None and sample.name.startswith("vllm:"):
                        hist = buckets.setdefault(sample.name.removesuffix("_bucket"), {})
                        hist[le] = hist.get(le, 0.0) + value
                    continue
                out[sample.name] = out.get(sample.name, 0.0) + value
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ProfkitError(f"not Prometheus text format: {one_line(exc, 160)}") from None
    return MetricsScrape(out, buckets=buckets, info=info)


def bucket_delta(before: MetricsScrape, after: MetricsScrape, name: str) -> list[tuple[float, float]]:
    """A histogram's buckets over a window: (upper bound, cumulative count) in order, +Inf last."""
    now, then = after.buckets.get(name) or {}, before.buckets.get(name) or {}
    out = []
    for le, count in now.items():
        try:
            bound = float(le)
        except ValueError:
            continue
        out.append((bound, max(0.0, count - then.get(le, 0.0))))
    return sorted(out)


def read_metrics(path: Path) -> MetricsScrape:
    text = read_text(Path(path), "metrics file")
    try:
        return parse_metrics(text)
    except ProfkitError as exc:
        raise ProfkitError(f"{path}: {exc}") from None


def counter_delta(before: MetricsScrape, after: MetricsScrape) -> dict[str, float]:
    """Counters over the benchmark: the second scrape less the first (a series new in the second counts whole)."""
    return {k: v - before.values.get(k, 0.0) for k, v in after.values.items()}


class MetricsWindow(msgspec.Struct, frozen=True):
    """What the run's scrapes say over its window, read once: the last scrape's values, the counters' change and every
    histogram's buckets from the first scrape to the last (two or more), the span of a timed series (`profkit
    attach`) with its gauges' summary, and the last scrape's `*_info` labels."""

    last: dict[str, float]
    first: dict[str, float]
    delta: dict[str, float] | None  # counters over the window (None: a lone scrape)
    buckets: dict[str, list[tuple[float, float]]]  # histograms over the window: (upper bound, cumulative count)
    seconds: float | None  # the span of a timed series (None: scrapes without times)
    series: dict[str, float | int] | None  # series_summary
    info: dict[str, dict[str, str]]


def metrics_window(scrapes: list[MetricsScrape]) -> MetricsWindow | None:
    """The scrapes' window (None without a scrape)."""
    if not scrapes:
        return None
    first, last = scrapes[0], scrapes[-1]
    timed = [m for m in scrapes if m.t is not None]
    many = len(scrapes) > 1
    # the last scrape that kept the labels (a live series keeps only values between its first and last scrape)
    labelled = next((m for m in reversed(scrapes) if m.info), last)
    return MetricsWindow(
        last=last.values, first=first.values, delta=counter_delta(first, last) if many else None,
        buckets={name: bucket_delta(first, last, name) for name in last.buckets} if many else {},
        seconds=(timed[-1].t or 0.0) - (timed[0].t or 0.0) if len(timed) >= 2 else None,
        series=series_summary(scrapes), info=labelled.info)
