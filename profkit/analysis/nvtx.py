"""NVTX ranges, like `nsys stats --report nvtx_sum` (`domain:name`, PushPop/StartEnd)."""

from __future__ import annotations

from typing import Any

from profkit.analysis.stats import histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.schema import Trace

# vLLM names each engine step by its batch (`execute_context_N(T)_generation_M(G)`, or the detailed
# `execute_I_context_N(sq.. sk..)_generation_M(..)`): thousands of names each seen once. They are one row per kind of
# step, the domain kept, like the step view (profkit.analysis.steps) counts them; every other range keeps its name.
_STEP = "(name GLOB 'execute_*' OR name GLOB '*:execute_*')"
_STEP_NAME = f"""CASE WHEN {_STEP} AND (name GLOB '*execute_context_[0-9]*_generation_[0-9]*'
                                        OR name GLOB '*execute_[0-9]*_context_[0-9]*_generation_[0-9]*')
    THEN substr(name, 1, instr(name, 'execute_') - 1) ||
         CASE WHEN name GLOB '*execute_context_0(*' OR name GLOB '*execute_[0-9]*_context_0(*'
              THEN 'vLLM engine steps, decode only (execute_*_context_0_generation_*)'
              ELSE 'vLLM engine steps with prompt tokens (execute_*_context_N_generation_*)' END
    ELSE name END"""


def nvtx_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    stats = summarize(
        histogram(trace, f"SELECT {_STEP_NAME} AS name, style, end - start AS dur FROM nvtx WHERE {window.where()}",
                  ["name", "style"], window.params),
        ["name", "style"],
    )
    return sorted(stats, key=lambda r: -r["total"])
