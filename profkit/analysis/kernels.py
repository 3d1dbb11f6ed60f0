"""Per-kernel summary, like `nsys stats --report cuda_gpu_kern_sum` (demangled names)."""

from __future__ import annotations

from typing import Any

from profkit.analysis.categories import categorize
from profkit.analysis.scans import KERNEL_SCAN, KernelScan
from profkit.analysis.stats import columnar_histogram, id_histogram, summarize
from profkit.analysis.window import Window
from profkit.kernel_names import distinct_labels
from profkit.traces.schema import Trace

# Kernels shorter than this are dominated by launch cost (a launch takes ~2-5 us of host time).
SHORT_KERNEL_NS = 10_000


def kernel_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """One row per kernel name: stats, category, graph-replayed count (`graph`), short-kernel count (`short`);
    by total time, longest first."""
    scan = trace.cache.get(KERNEL_SCAN)  # the kernel table's one read, where it was made (analysis/scans.py)
    hist = scan.summary(window) if scan is not None else None
    if hist is None:
        hist = columnar_histogram(trace, "kernels", "name_id", "end - start", window.where("kernels"), window.params,
                                  extras={"graph": "graph_node IS NOT NULL"})
    if hist is None:
        hist = id_histogram(
            trace,
            f"SELECT name_id, end - start AS dur, graph_node IS NOT NULL AS graph FROM kernels "
            f"WHERE {window.where('kernels')}",
            key="name_id",
            params=window.params,
            extras={"graph": "graph"},
        )
    stats = summarize(hist, ["name_id"], extras=["graph"], below=SHORT_KERNEL_NS)
    if not stats:
        return []
    names = trace.strings(row["name_id"] for row in stats)
    short_names = _short_names(trace, window, scan)
    for row in stats:
        row["short"] = row.pop("below")
        name = names.get(row["name_id"])
        row["name"] = "<no name>" if name is None else name  # an id of another type: no name
        short = short_names.get(row["name_id"])
        row["short_name"] = row["name"] if short is None else short
        row["category"] = categorize(row["name"])
    labels = distinct_labels({row["name"]: row["short_name"] for row in stats})
    for row in stats:
        row["label"] = labels[row["name"]]
    return sorted(stats, key=lambda r: (-r["total"], r["count"], r["name"]))


def _short_names(trace: Trace, window: Window, scan: KernelScan | None = None) -> dict[int, str]:
    pairs = scan.short_pairs(window) if scan is not None else None
    if pairs is not None:  # from the one read: the same rows as the query below, where each name has one short name
        shorts = dict(trace.query(f"SELECT id, value FROM strings WHERE id IN ({','.join(str(s) for _, s in pairs)})"))\
            if pairs else {}
        found = {(n, shorts[s]) for n, s in pairs if s in shorts}
        if len({n for n, _ in found}) == len(found):
            return dict(found)
    # The (demangled -> short) mapping is one-to-one; DISTINCT over the ids is a cheap scan.
    rows = trace.query(
        f"SELECT DISTINCT k.name_id, s.value FROM (SELECT DISTINCT name_id, short_id FROM kernels "
        f"WHERE {window.where('kernels')}) k JOIN strings s ON s.id = k.short_id",
        window.params,
    )
    return dict(rows)
