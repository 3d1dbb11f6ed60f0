"""Human units for times, sizes and shares (used by the text and Markdown renderers)."""

from __future__ import annotations


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
