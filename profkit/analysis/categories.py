"""Kernel categories for vLLM workloads, from the pattern table `kernel_categories.csv`.

The first row whose regular expression matches (case-insensitive search) names the category;
the order of the rows is the precedence (a fused MoE GEMM is `moe`, not `gemm`).
"""

from __future__ import annotations

import csv
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("kernel_categories.csv")
OTHER = "other"


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    with TABLE.open(newline="") as f:
        return [(row["category"], re.compile(row["pattern"], re.IGNORECASE)) for row in csv.DictReader(f)]


def categorize(name: str) -> str:
    """The category of one kernel name (demangled or short)."""
    for category, pattern in _patterns():
        if pattern.search(name or ""):
            return category
    return OTHER


def categories() -> list[str]:
    return [c for c, _ in _patterns()] + [OTHER]


def category_breakdown(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Total kernel time per category with its share (kernel rows have `category`, `count` and `total`)."""
    sums: dict[str, list[int]] = {}
    for k in kernels:
        entry = sums.setdefault(k["category"], [0, 0])
        entry[0] += k["count"]
        entry[1] += k["total"]
    grand = sum(total for _, total in sums.values())
    out = [{"category": c, "count": n, "total_ns": total, "share": total / grand if grand else None}
           for c, (n, total) in sorted(sums.items())]
    return sorted(out, key=lambda r: -r["total_ns"])
