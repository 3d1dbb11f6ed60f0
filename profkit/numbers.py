"""The one way text and JSON values become numbers, wherever profkit reads them (logs, JSON files, command lines,
export metadata): ASCII digits only, thousands separators only in well-formed groups, a bounded number of digits,
finite values. Anything else is not a number (None), never an exception: a 5,000-digit "integer" would raise in
Python's int() (its 4,300-digit limit), and no count, size or time a GPU run produces has more than a few dozen
digits.

At the bottom of the package: imports nothing of profkit."""

from __future__ import annotations

import math
import re
from typing import Any

MAX_DIGITS = 40  # int64 has 19 digits; a byte count of any real machine fewer still
_INT = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)")
_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,3})?"
                    r"|[+-]?\.[0-9]+(?:[eE][+-]?[0-9]{1,3})?")


def _plain(text: Any, pattern: re.Pattern[str]) -> str | None:
    """`text` stripped, where it is a string written as `pattern` with at most MAX_DIGITS digits; its separators
    dropped."""
    if not isinstance(text, str) or len(text) > 2 * MAX_DIGITS:
        return None
    text = text.strip()
    if not pattern.fullmatch(text) or sum(c.isdigit() for c in text) > MAX_DIGITS:
        return None
    return text.replace(",", "")


def parse_int(text: Any) -> int | None:
    """`"1,234"` -> 1234; None for anything that is not a plainly written integer of at most MAX_DIGITS digits."""
    plain = _plain(text, _INT)
    return None if plain is None else int(plain)


def parse_float(text: Any) -> float | None:
    """`"12.5"`, `"1,024.0"`, `"3e9"` -> a finite float; None for `"..."`, `"1..2"`, `"nan"`, `"1,2,,3"`, text."""
    plain = _plain(text, _FLOAT)
    value = None if plain is None else float(plain)
    return value if value is not None and math.isfinite(value) else None


def json_int(value: Any) -> int | None:
    """A JSON value that is an integer (not a bool, not a float), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_number(value: Any) -> float | int | None:
    """A JSON value that is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None


def json_int_literal(text: str) -> int | float:
    """The JSON decoder's integer literals: past MAX_DIGITS digits an infinity (of the literal's sign), which every
    reader's check for a finite number leaves out with the rest of what it cannot use. (Python's own int() would
    raise past 4,300 digits, and no measurement has that many.)"""
    if len(text) > MAX_DIGITS + 1:
        return -math.inf if text.startswith("-") else math.inf
    return int(text)
