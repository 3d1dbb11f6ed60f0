"""Nsight Systems GPU metrics (`nsys profile --gpu-metrics-devices=...`) as the normalized trace's relations
`gpu_metrics`, `gpu_metric_names` and `gpu_metrics_left_out` (traces/schema.py).

The export holds one row per metric per sample: `GPU_METRICS(timestamp, typeId, metricId, value)`, named by
`TARGET_INFO_GPU_METRICS(typeId, metricId, metricName)` and joined on both ids (metricId alone is not unique
across GPUs). The GPU's index is `typeId & 0xFF`, as nsys's own recipes read it: `gpu_metric_util_sum
--per-kernel` matches it with `TARGET_INFO_CUDA_DEVICE.gpuId`, to which a process's CUDA device (`cudaId`, the
kernels' `deviceId`) maps (the `cuda_devices` relation, traces/nsys.py). The GPU's name is taken from the
TARGET_INFO_GPU row whose `id` is that index (on the one-GPU H100 exports here `id`, `pwGpuId` and `cuDevice` are
all 0; which of them the index equals on a multi-GPU export is not verified here). Timestamps are nanoseconds on
the session clock, the clock of the CUPTI kernel table.

Only the counters of schema.GPU_COUNTERS are exposed. Names are matched as nsys's recipes match them, in every
spelling nsys has used ("SMs Active [Throughput %]" since 2024, "SM Active" before). Rows that cannot be used (no
time, a value that is not a number, a percentage outside 0..100, ids no metric is named by) are
`gpu_metrics_left_out`, by why, never raised.

The relations are TEMP views over GPU_METRICS (and a TEMP table of a few rows for the names), made on any
connection to an export: a trace's (`open_nsys`), or `open_gpu_metrics`'s for an export without a CUDA trace.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from profkit.errors import TraceError
from profkit.traces.schema import empty_view_sql, table_sql

# The base names nsys has given each counter (before " [<sub-metric>]"), preferred first. Spellings: nsys 2025.3
# `GpuMetrics/gh100.config` and `gb*.config`; the older ones are those nsys's recipe `lib/gpu_metrics.py` still
# accepts ("SM Active"; "Tensor Active / FP16 Active" on TU10x).
SPELLINGS: dict[str, tuple[str, ...]] = {  # keyed by schema.GPU_COUNTERS
    "sm_active": ("SMs Active", "SM Active"),
    "tensor_active": ("Tensor Active", "Tensor Active / FP16 Active"),
    "dram_read": ("DRAM Read Bandwidth",),
    "dram_write": ("DRAM Write Bandwidth",),
    "gr_active": ("GR Active",),
}
PERCENT = "Throughput %"  # the only sub-metric of these five in every set; a percentage of the sample period

# Why rows were left out (`gpu_metrics_left_out.why`).
NO_TIME = "no time"  # timestamp NULL, text or past +-2^53 ns
NOT_A_NUMBER = "value not a number"  # NULL, text, blob
OUT_OF_RANGE = "percentage outside 0..100"
UNKNOWN_METRIC = "ids naming no metric"  # (typeId, metricId) absent from TARGET_INFO_GPU_METRICS

# Times past 2^53 ns (104 days) are no session's; the bound also leaves out text and blobs, which SQLite sorts
# after every number, without a typeof() call per row. Timestamps may be negative: nsys can sample before
# the session's zero, and those samples are measurements like the others.
MAX_NS = 1 << 53
GPU_INDEX_MASK = 0xFF


@dataclass(frozen=True)
class _Wanted:
    type_id: int
    metric_id: int
    gpu: int
    metric: str
    name: str


def metric_of(name: str) -> tuple[str, int] | None:
    """(counter, rank of the spelling: 0 preferred) for a `metricName`, or None when profkit does not use it.

    A name is "<base>" or "<base> [<sub-metric>]"; the base must be one of SPELLINGS' exactly (a prefix match
    on the whole base, so "SM Active" never takes "SM Active Cycles") and the sub-metric the percentage."""
    base, bracket, rest = name.partition(" [")
    if bracket and rest != PERCENT + "]":
        return None
    for metric, spellings in SPELLINGS.items():
        if base in spellings:
            return metric, spellings.index(base)
    return None


def create_gpu_metric_views(conn: sqlite3.Connection, label: str) -> bool:
    """Make the GPU-metric relations on `conn`, a connection to an nsys export: over its GPU metric tables, or
    without rows where it has none (or none of profkit's counters, or no sample). True when it has samples of
    profkit's counters (those may all be left out).

    Raises TraceError (one line naming `label`) for an export whose GPU metric tables lack the columns nsys gives
    them."""
    tables = {r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type IN ('table', 'view')")}
    wanted: list[_Wanted] = []
    if {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= tables:
        for table, needed in (("GPU_METRICS", ("timestamp", "typeId", "metricId", "value")),
                              ("TARGET_INFO_GPU_METRICS", ("typeId", "metricId", "metricName"))):
            have = {r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")}
            missing = [c for c in needed if c not in have]
            if missing:
                raise TraceError(f"{label}: unsupported nsys export: {table} has no column {missing[0]!r}")
        known, wanted = _resolve_names(conn)
        if wanted and conn.execute("SELECT 1 FROM main.GPU_METRICS LIMIT 1").fetchone() is None:
            wanted = []
    conn.execute(table_sql("gpu_metric_names", temp=True))
    if not wanted:
        conn.execute(empty_view_sql("gpu_metrics"))
        conn.execute(empty_view_sql("gpu_metrics_left_out"))
        return False
    _create_samples_view(conn, wanted)
    _create_left_out_view(conn, known, wanted)
    series: dict[tuple[int, str], str] = {}
    for w in wanted:  # a GPU's counter under two ids (the same spelling twice): named as the first
        series.setdefault((w.gpu, w.metric), w.name)
    gpu_names = _gpu_names(conn, tables, {gpu for gpu, _ in series})
    conn.executemany("INSERT INTO temp.gpu_metric_names VALUES (?, ?, ?, ?)",
                     [(gpu, metric, name, gpu_names.get(gpu)) for (gpu, metric), name in series.items()])
    return True


def _resolve_names(conn: sqlite3.Connection) -> tuple[list[tuple[int, int]], list[_Wanted]]:
    """Every (typeId, metricId) pair the export names, and the pairs of profkit's counters. Where a GPU has one
    counter under two spellings, the preferred one is read (two spellings would count its samples twice)."""
    rows = conn.execute("SELECT DISTINCT typeId, metricId, metricName FROM main.TARGET_INFO_GPU_METRICS").fetchall()
    names: dict[tuple[int, int], str] = {}
    for type_id, metric_id, name in rows:
        # ids must be SQLite integers in range (a text or real id, or a NULL, names nothing usable)
        if isinstance(type_id, int) and isinstance(metric_id, int) and 0 <= type_id < MAX_NS \
                and 0 <= metric_id < MAX_NS:
            pair = (type_id, metric_id)
            text = name if isinstance(name, str) else ""
            names[pair] = min(names.get(pair, text), text)  # a pair named twice: one name, whichever run
    candidates = []
    for (type_id, metric_id), name in names.items():
        if found := metric_of(name):
            metric, rank = found
            candidates.append((rank, _Wanted(type_id, metric_id, type_id & GPU_INDEX_MASK, metric, name)))
    best: dict[tuple[int, str], int] = {}
    for rank, w in candidates:
        best[(w.gpu, w.metric)] = min(rank, best.get((w.gpu, w.metric), rank))
    wanted = sorted((w for rank, w in candidates if rank == best[(w.gpu, w.metric)]),
                    key=lambda w: (w.gpu, w.metric, w.type_id, w.metric_id))
    return sorted(names), wanted


def _pairs_sql(pairs: list[tuple[int, int]]) -> str:
    # ids are Python ints from the export, written as literals: one row-value list SQLite indexes once per query
    return "(VALUES " + ", ".join(f"({int(t)}, {int(m)})" for t, m in pairs) + ")"


def _one_of(column: str, ids: set[int]) -> str:
    """SQL true when `column` is one of `ids`: a range test where they run without a hole (cheaper per row)."""
    low, high = min(ids), max(ids)
    if high - low + 1 == len(ids):
        return f"{column} BETWEEN {low} AND {high}"
    return f"{column} IN ({', '.join(str(i) for i in sorted(ids))})"


def _create_samples_view(conn: sqlite3.Connection, wanted: list[_Wanted]) -> None:
    """`gpu_metrics`: the usable samples of the wanted pairs, in one scan of GPU_METRICS.

    `BETWEEN` bounds leave out NULL, text and blob times and values in the scan itself (see MAX_NS); the ids are
    tested one column at a time (a fifth cheaper than a row-value IN). Each row's pair is then named by a CASE
    over its integer ids; where the wanted pairs are not every combination of their typeIds and metricIds, a
    row the column tests let through may be no wanted pair, and the CASE leaves it out too."""
    by_type: dict[int, dict[int, str]] = {}
    for w in wanted:
        by_type.setdefault(w.type_id, {})[w.metric_id] = w.metric
    type_ids = set(by_type)
    metric_ids = {m for metrics in by_type.values() for m in metrics}
    # A range test lets a real id through (2.5 between 2 and 3): such an id counts as its integer part.
    type_id = "typeId" if " IN " in _one_of("typeId", type_ids) or len(type_ids) == 1 else "CAST(typeId AS INTEGER)"
    metric_id = "metricId" if " IN " in _one_of("metricId", metric_ids) or len(metric_ids) == 1 \
        else "CAST(metricId AS INTEGER)"

    def named(metrics: dict[int, str]) -> str:
        return f"CASE {metric_id} " + " ".join(f"WHEN {m} THEN '{name}'" for m, name in sorted(metrics.items())) \
            + " END"

    # one GPU (one typeId, which the scan's test leaves no other value of): its metric ids alone name the pair
    metric = named(by_type[min(type_ids)]) if len(type_ids) == 1 else f"CASE {type_id} " + " ".join(
        f"WHEN {t} THEN {named(metrics)}" for t, metrics in sorted(by_type.items())) + " END"
    every_combination = sum(len(metrics) for metrics in by_type.values()) == len(type_ids) * len(metric_ids)
    conn.execute(
        f"""CREATE TEMP VIEW gpu_metrics AS SELECT timestamp, typeId & {GPU_INDEX_MASK} AS device, {metric} AS metric,
        CAST(value AS REAL) AS value FROM main.GPU_METRICS
        WHERE value BETWEEN 0 AND 100 AND timestamp BETWEEN {-MAX_NS} AND {MAX_NS}
        AND {_one_of('typeId', type_ids)} AND {_one_of('metricId', metric_ids)}
        {'' if every_combination else f'AND ({metric}) IS NOT NULL'}""")


def _create_left_out_view(conn: sqlite3.Connection, known: list[tuple[int, int]], wanted: list[_Wanted]) -> None:
    """`gpu_metrics_left_out`: rows of profkit's counters that cannot be used, and rows whose ids name no metric,
    by why; `timestamp` NULL for a row without a usable time (counted in every window).

    The view's first test lets through only rows that are out of range in some column: cheap comparisons that
    every row of a sound export fails (a clock in MHz passes, and is then found to be no counter of ours). The
    exact tests (row values against the pair lists) run on those few rows alone."""
    mine = f"coalesce((typeId, metricId) IN {_pairs_sql(sorted({(w.type_id, w.metric_id) for w in wanted}))}, 0)"
    named = f"coalesce((typeId, metricId) IN {_pairs_sql(known)}, 0)"
    timed = f"coalesce(timestamp BETWEEN {-MAX_NS} AND {MAX_NS}, 0)"
    numeric = "coalesce(value BETWEEN -1e308 AND 1e308, 0)"  # text, blob and NULL fail; so would an infinity
    type_ids, metric_ids = {t for t, _ in known}, {m for _, m in known}
    # Every pair of a known typeId and a known metricId is known when the export names each GPU's metrics alike
    # (as nsys does); else the ids alone cannot clear a row and every row takes the exact test.
    ids_clear = (f"AND {_one_of('typeId', type_ids)} AND {_one_of('metricId', metric_ids)}"
                 if len(known) == len(type_ids) * len(metric_ids) else "AND 0")
    conn.execute(
        f"""CREATE TEMP VIEW gpu_metrics_left_out AS SELECT CASE WHEN {timed} THEN timestamp END AS timestamp,
            CASE WHEN NOT {named} THEN '{UNKNOWN_METRIC}' WHEN NOT {timed} THEN '{NO_TIME}'
                 WHEN NOT {numeric} THEN '{NOT_A_NUMBER}' ELSE '{OUT_OF_RANGE}' END AS why
            FROM main.GPU_METRICS
            WHERE (value BETWEEN 0 AND 100 AND timestamp BETWEEN {-MAX_NS} AND {MAX_NS} {ids_clear}) IS NOT 1
              AND ({mine} OR NOT {named})
              AND NOT coalesce({mine} AND {timed} AND value BETWEEN 0 AND 100, 0)""")


def _gpu_names(conn: sqlite3.Connection, tables: set[str], gpus: set[int]) -> dict[int, str]:
    if "TARGET_INFO_GPU" not in tables or not gpus:
        return {}
    columns = {r[1] for r in conn.execute("PRAGMA main.table_info(TARGET_INFO_GPU)")}
    key = "id" if "id" in columns else "deviceId" if "deviceId" in columns else None  # deviceId before nsys 2022
    if key is None or "name" not in columns:
        return {}
    rows = conn.execute(f"SELECT {key}, name FROM main.TARGET_INFO_GPU").fetchall()
    return {gpu: name for gpu, name in rows if gpu in gpus and isinstance(name, str)}
