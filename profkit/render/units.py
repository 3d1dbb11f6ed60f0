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


def flag_value(value: object) -> str:
    """A flag's value as a person reads it: true/false, numbers as given, None as 'not set'."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def change_from(change: dict) -> str:
    """A change's current value and where it came from (`300000000 (vLLM log)`, `true (given)`)."""
    source = change.get("from_source")
    text = flag_value(change.get("from"))
    return f"{text} ({source})" if source and source != "given" else text


def change_to(change: dict) -> str:
    return "(remove the flag)" if change.get("to") is None else flag_value(change.get("to"))


_CONTROL = {c: None for c in range(32) if c not in (9, 10)} | {127: None} | {c: None for c in range(0x80, 0xA0)}


def terminal_safe(text: object) -> str:
    """Text from a trace or a user for a terminal: control characters (ESC, CR, NUL, ...) removed."""
    return str(text).translate(_CONTROL).replace("\n", " ")


_OUTPUT_CONTROL = {c: None for c in range(32) if c not in (9, 10)} | {127: None} | {c: None for c in range(0x80, 0xA0)}


def strip_controls(text: str) -> str:
    """A rendered document without control characters (terminal escapes, CR, NUL); newlines and tabs stay.
    Trace strings (kernel names, NVTX text) reach every format: this is the last line of defence."""
    return text.translate(_OUTPUT_CONTROL)
