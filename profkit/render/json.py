"""`--format json`: a profkit document as JSON (reports, diffs, the history listing)."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """The document with every NaN or infinity as None: JSON has neither, a metric the trace cannot tell is
    null (the history stores its report JSON through here too). Tuples become lists, as in JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def render_json(doc: dict[str, Any]) -> str:
    return json.dumps(finite(doc), indent=2, ensure_ascii=False) + "\n"
