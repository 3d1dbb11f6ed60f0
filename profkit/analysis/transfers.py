"""Memory operations, like `cuda_gpu_mem_time_sum` and `cuda_gpu_mem_size_sum`, plus memory kinds."""

from __future__ import annotations

from typing import Any

from profkit.analysis.stats import Rows, _pairs, histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.columns import NULL_INT, adbc_available, adbc_min_rows, read_columns
from profkit.traces.schema import Trace


def memop_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """One row per operation: time stats (ns), size stats (bytes_*) and achieved bandwidth; by total time."""
    src = f"SELECT operation, end - start AS dur, bytes FROM memops WHERE {window.where()}"
    found = _columnar_histograms(trace, window)
    by_time, by_size = found if found is not None else (
        histogram(trace, src, ["operation"], window.params),
        histogram(trace, src, ["operation"], window.params, value="bytes"))
    time = summarize(by_time, ["operation"])
    size = {row["operation"]: row for row in summarize(by_size, ["operation"])}
    out = []
    for row in time:
        sized = size.get(row["operation"], {})
        row.update({f"bytes_{k}": v for k, v in sized.items() if k not in ("operation", "count")})
        row["bandwidth_gbps"] = row["bytes_total"] / row["total"] if row["total"] > 0 and sized else None
        out.append(row)
    return sorted(out, key=lambda r: -r["total"])


def memory_kinds(trace: Trace, window: Window) -> list[dict[str, Any]]:
    """Copies by (operation, source kind, destination kind): pageable host memory shows up here."""
    rows = trace.query(
        f"""SELECT operation, coalesce(src_kind, '') AS src_kind, coalesce(dst_kind, '') AS dst_kind,
                   count(*) AS count, sum(end - start) AS total_ns, sum(bytes) AS bytes
            FROM memops WHERE {window.where()} AND operation != '[CUDA memset]'
            GROUP BY 1, 2, 3 ORDER BY total_ns DESC""", window.params)
    keys = ("operation", "src_kind", "dst_kind", "count", "total_ns", "bytes")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _columnar_histograms(trace: Trace, window: Window) -> tuple[Rows, Rows] | None:
    """The (operation, duration, count) and (operation, bytes, count) histograms from one columnar read of the
    window's memory operations (a serve trace holds hundreds of thousands: two SQL GROUP BYs over the labelled
    view and their rows as Python tuples cost ~2 s and ~40 MB); None where the SQL path should count them (few
    rows, or a label or value the packing cannot hold). Row for row the SQL histograms' result."""
    rows = trace.query(f"SELECT count(*) FROM memops WHERE {window.where()}", window.params)[0][0]
    # through Arrow where its driver is loaded for the trace's large tables already, or the rows are many
    if not rows or not (trace.deferred or rows >= adbc_min_rows()) or not adbc_available():
        return None
    labels = [label for (label,) in trace.query(f"SELECT DISTINCT operation FROM memops WHERE {window.where()}",
                                                 window.params)]
    if not all(isinstance(label, str) for label in labels):
        return None
    code = "CASE operation " + " ".join(f"WHEN '{label.replace(chr(39), chr(39) * 2)}' THEN {i}"
                                        for i, label in enumerate(labels)) + " END"
    cols = read_columns(trace, "memops", {"op": code, "dur": "end - start", "bytes": "bytes"}, window.where(),
                        window.params, rows_hint=rows, arrow=True)
    out = []
    for value in (cols["dur"], cols["bytes"]):
        known = value != NULL_INT  # a NULL value counts nowhere, as in summarize
        op, v = cols["op"][known], value[known]
        if len(op) and (op.min() < 0 or v.min() < 0):
            return None
        pairs = _pairs(op, v, [])
        if pairs is None:
            return None
        out.append([(labels[k], v, c) for k, v, c in zip(pairs[0].tolist(), pairs[1].tolist(), pairs[2].tolist(),
                                                         strict=True)])
    return out[0], out[1]
