"""Kernel categories for vLLM workloads, from the pattern table `kernel_categories.csv`.

The first row whose regular expression matches (case-insensitive search) names the category;
the order of the rows is the precedence (a fused MoE GEMM is `moe`, not `gemm`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pandas as pd

TABLE = Path(__file__).with_name("kernel_categories.csv")
OTHER = "other"


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    table = pd.read_csv(TABLE)
    return [(row.category, re.compile(row.pattern, re.IGNORECASE)) for row in table.itertuples()]


def categorize(name: str) -> str:
    """The category of one kernel name (demangled or short)."""
    for category, pattern in _patterns():
        if pattern.search(name or ""):
            return category
    return OTHER


def categories() -> list[str]:
    return [c for c, _ in _patterns()] + [OTHER]


def category_breakdown(kernels: pd.DataFrame) -> pd.DataFrame:
    """Total kernel time per category with its share (kernels has `category` and `total`)."""
    if kernels.empty:
        return pd.DataFrame(columns=["category", "count", "total_ns", "share"])
    out = kernels.groupby("category", as_index=False).agg(count=("count", "sum"), total_ns=("total", "sum"))
    out["share"] = out["total_ns"] / out["total_ns"].sum()
    return out.sort_values("total_ns", ascending=False).reset_index(drop=True)
