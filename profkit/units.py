"""Human units for times, sizes and shares, and the metric-name convention render and compare share.

At the bottom of the package: imports nothing of profkit (the text, Markdown and HTML renderers, the rule
templates and the comparison all read their numbers through here)."""

from __future__ import annotations

import re


def ns(value: float | int | None) -> str:
    """Nanoseconds as the largest unit that keeps the number >= 1: 1.23 ms, 456 us, 12.0 s."""
    if value is None:
        return "-"
    v = float(value)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}" if abs(v) / scale < 100 else f"{v / scale:.0f} {unit}"
    return f"{v:.0f} ns"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def size(value: float | int | None) -> str:
    if value is None:
        return "-"
    v = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} B"


def clip(text: str | None, width: int = 80) -> str:
    text = text or ""
    return text if len(text) <= width else text[: width - 1] + "…"


def clip_middle(text: str | None, width: int = 80) -> str:
    """A name clipped in its middle: kernels of one family differ at their end (`..._rms_norm_0` / `_1`), or in
    the template arguments a label ends with."""
    text = text or ""
    if len(text) <= width:
        return text
    tail = (width - 1) * 2 // 5
    return text[: width - 1 - tail] + "…" + text[len(text) - tail:]


def flag_value(value: object) -> str:
    """A flag's value as a person reads it: true/false, numbers as given, None as 'not set'."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def sourced_value(value: object, source: str | None) -> str:
    """A flag's value and where it came from unless the run gave it (`auto (vLLM 0.26 default)`, `300000000 (vLLM
    log)`, `not set (vLLM 0.26 default)`): the one wording of a setting in reports, predictions and diffs."""
    text = flag_value(value)
    return f"{text} ({source})" if source and source not in ("given", "unknown") else text


def change_from(change: dict) -> str:
    """A change's current value and where it came from (`300000000 (vLLM log)`, `true` when given)."""
    return sourced_value(change.get("from"), change.get("from_source"))


def change_to(change: dict) -> str:
    """A change's new value; None: the flag is taken out (vLLM's default applies, its value said where known)."""
    if change.get("to") is not None:
        return flag_value(change.get("to"))
    default = change.get("default")
    return "not set (vLLM's default" + ("" if default is None else f", {flag_value(default)}") + ")"


def is_share(name: str) -> bool:
    """A metric or fact that is a share of something (0..1), by its name: `...share`, `...utilization`,
    `...usage_max`."""
    return name.endswith(("share", "utilization", "usage_max"))


def better_when(name: str) -> str | None:
    """Which way a benchmark metric is better, by vLLM's naming: throughputs `higher`, latencies (`..._ms`) `lower`;
    None for any other name."""
    if name.endswith("throughput"):
        return "higher"
    if name.endswith("_ms"):
        return "lower"
    return None


# The word for a change's direction, the same in diffs and predictions (a regression shouts).
VERDICT_WORDS = {"better": "better", "worse": "WORSE", "within noise": "within noise", "same": "same",
                 "changed": "changed"}


def direction_word(name: str, before: float | None, after: float | None) -> str:
    """`better` or `WORSE` for a move from `before` to `after` of the metric `name` (by its sense); `same` where it
    did not move, '' where the metric has no better side or a value is missing."""
    sense = better_when(name)
    if sense is None or before is None or after is None:
        return ""
    if after == before:
        return VERDICT_WORDS["same"]
    return VERDICT_WORDS["better" if (after > before) == (sense == "higher") else "worse"]


def metric_value(name: str, value: float | None) -> str:
    """A metric as a person reads it: shares as %, nanoseconds as times, the rest as numbers."""
    if value is None:
        return "-"
    if is_share(name):
        return pct(value)
    if name.endswith("_ns"):
        return ns(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


GAP_CLASS_LABELS = {"lt_20us": "< 20 us", "20us_1ms": "20 us - 1 ms", "1ms_100ms": "1 - 100 ms",
                    "ge_100ms": ">= 100 ms"}


def gap_class(key: str) -> str:
    """A gap-size class as a reader says it (`lt_20us` -> `< 20 us`), the same in every format."""
    return GAP_CLASS_LABELS.get(key, key.replace("_", " "))


DURATION_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "min": 60_000_000_000,
                  "h": 3_600_000_000_000}
_DURATION = re.compile(r"\s*([0-9]{0,15}\.?[0-9]{1,15})\s*(ns|us|ms|s|min|h)?\s*")


def parse_duration(text: str) -> int:
    """'100us', '1.5ms', '2s', '2min', '1h', '500000ns' -> integer nanoseconds. A bare number is refused (ValueError,
    the message gives the spellings that work): 5 could mean 5 ns or 5 s."""
    m = _DURATION.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r}: expected a duration such as 100us, 2ms, 1s or 2min")
    if not m.group(2):
        raise ValueError(f"{text!r}: give a unit (ns, us, ms, s, min or h), e.g. {m.group(1)}s or {m.group(1)}ms")
    value = int(float(m.group(1)) * DURATION_UNITS[m.group(2)])
    if value >= 1 << 62:
        raise ValueError(f"{text!r}: longer than any trace (at most about 146 years)")
    return value


def figure(value: float | None) -> str:
    """A predicted or measured figure at the precision it deserves: 3 significant digits, thousands separated."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def number(value: float | int | None, decimals: int = 0) -> str:
    """A count or measurement the same way in every format: thousands separated, `decimals` places."""
    return "-" if value is None else f"{value:,.{decimals}f}"
