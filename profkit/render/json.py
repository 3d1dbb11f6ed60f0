"""The `profkit.report/1` JSON document."""

from __future__ import annotations

import json
import math
from typing import Any


def _finite(value: Any) -> Any:
    # JSON has no NaN/Infinity: a metric the trace cannot tell becomes null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(_finite(report), indent=2, ensure_ascii=False) + "\n"
