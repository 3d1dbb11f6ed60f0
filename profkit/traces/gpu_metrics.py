"""Nsight Systems GPU metrics (`nsys profile --gpu-metrics-devices=...`) from an nsys SQLite export.

The export holds one row per metric per sample: `GPU_METRICS(timestamp, typeId, metricId, value)`, named by
`TARGET_INFO_GPU_METRICS(typeId, metricId, metricName)` and joined on both ids (metricId alone is not unique
across GPUs). The GPU's index is `typeId & 0xFF`, as nsys's own recipes read it: `gpu_metric_util_sum
--per-kernel` matches it with `TARGET_INFO_CUDA_DEVICE.gpuId`, to which a process's CUDA device (`cudaId`, the
kernels' `deviceId`) maps (`gpu_ids_of_cuda_devices`). The GPU's name is taken from the TARGET_INFO_GPU row whose
`id` is that index (on the one-GPU H100 exports here `id`, `pwGpuId` and `cuDevice` are all 0; which of them the
index equals on a multi-GPU export is not verified here). Timestamps are nanoseconds on the session clock, the
clock of the CUPTI kernel table.

Only the five metrics profkit uses are read, each as two numpy columns per GPU (sample times, int64 ascending;
values, float64 percent), filtered to the time window inside SQLite. Names are matched as nsys's recipes match
them, in every spelling nsys has used ("SMs Active [Throughput %]" since 2024, "SM Active" before). Rows that
cannot be used (no time, a value that is not a number, a percentage outside 0..100, ids no metric is named by)
are left out and counted by why, never raised.

The reader needs no CUDA trace: a capture may sample the GPU with `nsys profile -t none --gpu-metrics-devices=all`
around a benchmark client, an export `open_nsys` refuses ("no CUDA kernels"). `open_gpu_metrics` opens any nsys
export read-only; `read_gpu_metrics` reads from a connection already open (a `Trace`'s, for instance).

Memory: 16 bytes per kept sample (twice that while reading, in chunks), e.g. 160 MB for 5 metrics x 2M samples;
no Python object per row.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

from profkit.errors import ProfkitError, TraceError
from profkit.escape import one_line
from profkit.inputs import require_file
from profkit.traces.columns import adbc_available
from profkit.traces.nsys import checkpointed_copy

# The metrics profkit reads, each with the base names nsys has given it (before " [<sub-metric>]"), preferred
# first. Spellings: nsys 2025.3 `GpuMetrics/gh100.config` and `gb*.config`; the older ones are those nsys's
# recipe `lib/gpu_metrics.py` still accepts ("SM Active"; "Tensor Active / FP16 Active" on TU10x).
METRICS: dict[str, tuple[str, ...]] = {
    "sm_active": ("SMs Active", "SM Active"),
    "tensor_active": ("Tensor Active", "Tensor Active / FP16 Active"),
    "dram_read": ("DRAM Read Bandwidth",),
    "dram_write": ("DRAM Write Bandwidth",),
    "gr_active": ("GR Active",),
}
PERCENT = "Throughput %"  # the only sub-metric of these five in every set; a percentage of the sample period

# Why rows were left out (keys of GpuMetrics.left_out).
NO_TIME = "no time"  # timestamp NULL, text or past +-2^53 ns
NOT_A_NUMBER = "value not a number"  # NULL, text, blob
OUT_OF_RANGE = "percentage outside 0..100"
UNKNOWN_METRIC = "ids naming no metric"  # (typeId, metricId) absent from TARGET_INFO_GPU_METRICS

# Times past 2^53 ns (104 days) are no session's; the bound also leaves out text and blobs, which SQLite sorts
# after every number, without a typeof() call per row. Timestamps may be negative: nsys can sample before
# the session's zero, and those samples are measurements like the others.
MAX_NS = 1 << 53
GPU_INDEX_MASK = 0xFF
SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK_ROWS = 1 << 16  # rows per fetch through sqlite3: bounds the Python objects alive at once
# Tables only an nsys export has: StringIds is in every one, the others name exports that may lack it.
NSYS_TABLES = {"StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_GPU_METRICS", "GPU_METRICS"}


@dataclass(frozen=True)
class MetricSeries:
    """One metric of one GPU: `name` as the export spells it; sample times (ns) ascending, values in %."""

    name: str
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.timestamps)


@dataclass
class GpuMetrics:
    """The GPU metrics of an export: `series[gpu][metric]` for the metrics in METRICS that were recorded."""

    series: dict[int, dict[str, MetricSeries]]
    gpu_names: dict[int, str] = field(default_factory=dict)  # from TARGET_INFO_GPU, where it names the GPU
    left_out: dict[str, int] = field(default_factory=dict)  # rows not used, by why (NO_TIME, ...)
    start_ns: int | None = None  # the window read (None: unbounded)
    end_ns: int | None = None

    @property
    def gpus(self) -> list[int]:
        return sorted(self.series)

    def get(self, gpu: int, metric: str) -> MetricSeries | None:
        return self.series.get(gpu, {}).get(metric)

    def said(self) -> str:
        """What was left out, for a report line ("" when nothing was)."""
        if not self.left_out:
            return ""
        return "GPU metric rows left out: " + ", ".join(f"{n} ({why})" for why, n in sorted(self.left_out.items()))


@dataclass(frozen=True)
class _Wanted:
    type_id: int
    metric_id: int
    gpu: int
    metric: str
    name: str


def metric_of(name: str) -> tuple[str, int] | None:
    """(metric key, rank of the spelling: 0 preferred) for a `metricName`, or None when profkit does not use it.

    A name is "<base>" or "<base> [<sub-metric>]"; the base must be one of METRICS' spellings exactly (a prefix
    match on the whole base, so "SM Active" never takes "SM Active Cycles") and the sub-metric the percentage."""
    base, bracket, rest = name.partition(" [")
    if bracket and rest != PERCENT + "]":
        return None
    for metric, spellings in METRICS.items():
        if base in spellings:
            return metric, spellings.index(base)
    return None


def read_gpu_metrics(conn: sqlite3.Connection, start_ns: int | None = None,
                     end_ns: int | None = None) -> GpuMetrics | None:
    """The GPU metrics in `conn`'s main database between `start_ns` and `end_ns` (inclusive; None: unbounded),
    or None when the export has no GPU metrics tables or none of profkit's metrics in them.

    Raises TraceError (one line) for an export whose GPU metric tables lack the columns nsys gives them."""
    return _read(conn, start_ns, end_ns, _database_file(conn) or "(in-memory database)")


def _read(conn: sqlite3.Connection, start_ns: int | None, end_ns: int | None, label: str) -> GpuMetrics | None:
    tables = {r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type IN ('table', 'view')")}
    if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= tables:
        return None
    for table, needed in (("GPU_METRICS", ("timestamp", "typeId", "metricId", "value")),
                          ("TARGET_INFO_GPU_METRICS", ("typeId", "metricId", "metricName"))):
        have = {r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")}
        missing = [c for c in needed if c not in have]
        if missing:
            raise TraceError(f"{label}: unsupported nsys export: {table} has no column {missing[0]!r}")
    known, wanted = _resolve_names(conn)
    if not wanted or conn.execute("SELECT 1 FROM main.GPU_METRICS LIMIT 1").fetchone() is None:
        return None
    lo = -MAX_NS if start_ns is None else max(-MAX_NS, int(start_ns))
    hi = MAX_NS if end_ns is None else min(MAX_NS, int(end_ns))
    series = _read_series(conn, wanted, lo, hi)
    left_out = _count_left_out(conn, known, wanted, lo, hi)
    gpu_names = _gpu_names(conn, tables, set(series))
    return GpuMetrics(series=series, gpu_names=gpu_names, left_out=left_out, start_ns=start_ns, end_ns=end_ns)


def open_gpu_metrics(path: str | Path, start_ns: int | None = None,
                     end_ns: int | None = None) -> GpuMetrics | None:
    """The GPU metrics of the nsys SQLite export at `path` (with or without a CUDA trace), read-only; None when
    it recorded none. A path that is not an nsys SQLite export raises TraceError with one line naming it.

    As `open_nsys` does, an export with a non-empty `-wal` file beside it (committed transactions immutable
    reads would skip) is read through a private checkpointed copy; the user's files are never written."""
    p = Path(path)
    try:
        size = require_file(p, "nsys export")
    except ProfkitError as exc:
        raise TraceError(str(exc)) from None
    try:
        with p.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise TraceError(f"{p}: {exc.strerror or exc}") from None
    if size == 0 or head != SQLITE_MAGIC:
        raise TraceError(f"{p}: not a SQLite file (expected an nsys export: nsys export --type sqlite)")
    wal = Path(f"{p}-wal")
    folder = None
    try:
        source = p
        if wal.is_file() and wal.stat().st_size > 0:
            folder = Path(tempfile.mkdtemp(prefix="profkit-gpu-metrics-"))
            source = checkpointed_copy(p, wal, folder)
        conn = sqlite3.connect(f"file:{quote(os.fsencode(source.resolve()))}?mode=ro&immutable=1", uri=True)
        # text is UTF-8 by contract; a name in other bytes becomes U+FFFD rather than failing the read (as open_nsys)
        conn.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}
            if not tables & NSYS_TABLES:
                raise TraceError(f"{p}: SQLite file is not an Nsight Systems export (no StringIds or GPU metrics)")
            metrics = _read(conn, start_ns, end_ns, str(p))  # errors name the user's file, not a private copy
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{p}: damaged or unreadable SQLite file ({one_line(exc, 120)})") from None
    except OSError as exc:  # copying an export with its -wal file: the disk, the permissions
        raise TraceError(f"{p}: {one_line(exc.strerror or exc, 120)}") from None
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return metrics


def gpu_ids_of_cuda_devices(conn: sqlite3.Connection) -> dict[tuple[int, int], int]:
    """{(pid, CUDA device id): GPU id} from TARGET_INFO_CUDA_DEVICE: a kernel's `deviceId` is its process's CUDA
    device, which CUDA_VISIBLE_DEVICES renumbers; the GPU metrics are keyed by the GPU id. Empty when the export
    has no such table (then the ids are taken to be equal, as on a machine without renumbering)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}
    if "TARGET_INFO_CUDA_DEVICE" not in tables:
        return {}
    rows = conn.execute("SELECT pid, cudaId, gpuId FROM main.TARGET_INFO_CUDA_DEVICE").fetchall()
    return {(pid, cuda): gpu for pid, cuda, gpu in rows if all(isinstance(v, int) for v in (pid, cuda, gpu))}


def _database_file(conn: sqlite3.Connection) -> str:
    """The file of `conn`'s main database ("" for an in-memory one)."""
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main":
            return file or ""
    return ""


def _resolve_names(conn: sqlite3.Connection) -> tuple[list[tuple[int, int]], list[_Wanted]]:
    """Every (typeId, metricId) pair the export names, and the pairs of profkit's metrics. Where a GPU has one
    metric under two spellings, the preferred one is read (two spellings would count its samples twice)."""
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


def _read_series(conn: sqlite3.Connection, wanted: list[_Wanted], lo: int,
                 hi: int) -> dict[int, dict[str, MetricSeries]]:
    """One scan of GPU_METRICS for the wanted pairs' usable rows in [lo, hi], split into series as it streams."""
    pairs = sorted({(w.type_id, w.metric_id) for w in wanted})
    # `BETWEEN` bounds leave out NULL, text and blob times and values in the scan itself (see MAX_NS)
    # every column CAST: one type per column whatever the file stores (Arrow's reader needs that). The ids are
    # tested one column at a time (a fifth cheaper than a row-value IN); the exact pairs are picked in numpy.
    sql = (f"SELECT CAST(typeId AS INTEGER), CAST(metricId AS INTEGER), CAST(timestamp AS INTEGER), "
           f"CAST(value AS REAL) FROM main.GPU_METRICS "
           f"WHERE value BETWEEN 0 AND 100 AND timestamp BETWEEN {lo} AND {hi} "
           f"AND {_one_of('typeId', {t for t, _ in pairs})} AND {_one_of('metricId', {m for _, m in pairs})}")
    type_ids = np.array([w.type_id for w in wanted], dtype=np.int64)
    metric_ids = np.array([w.metric_id for w in wanted], dtype=np.int64)
    parts: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []) for _ in wanted]
    for type_col, metric_col, times, values in _chunks(conn, sql):
        for i in range(len(wanted)):
            rows = (type_col == type_ids[i]) & (metric_col == metric_ids[i])
            if rows.any():
                parts[i][0].append(times[rows])
                parts[i][1].append(values[rows])
    series: dict[int, dict[str, MetricSeries]] = {}
    grouped: dict[tuple[int, str], tuple[str, list[np.ndarray], list[np.ndarray]]] = {}
    for w, (times_parts, value_parts) in zip(wanted, parts, strict=True):
        name, t_list, v_list = grouped.setdefault((w.gpu, w.metric), (w.name, [], []))
        t_list += times_parts
        v_list += value_parts
    for (gpu, metric), (name, t_list, v_list) in grouped.items():
        times = np.concatenate(t_list) if t_list else np.empty(0, dtype=np.int64)
        values = np.concatenate(v_list) if v_list else np.empty(0, dtype=np.float64)
        if len(times) > 1 and not bool(np.all(times[1:] >= times[:-1])):  # nsys writes in time order; others may not
            order = np.argsort(times, kind="stable")
            times, values = times[order], values[order]
        series.setdefault(gpu, {})[metric] = MetricSeries(name=name, timestamps=times, values=values)
    return series


def _chunks(conn: sqlite3.Connection, sql: str) -> Iterator[tuple[np.ndarray, ...]]:
    """(typeId, metricId, timestamp, value) column chunks of `sql`'s rows: through Arrow's SQLite driver where it is
    installed and the database is a file without pending WAL transactions (it fills the columns in C: 1.0 s
    against 1.4 s for 1M rows kept of 6.4M scanned), else through sqlite3 a chunk at a time."""
    file = _database_file(conn)
    wal = Path(f"{file}-wal")
    if file and Path(file).is_file() and not (wal.is_file() and wal.stat().st_size > 0) and adbc_available():
        chunks = _chunks_adbc(file, sql)
        try:
            first = next(chunks, None)
        except Exception:  # noqa: BLE001 - any driver error: read the same rows through sqlite3
            first = None
            chunks = None
        if chunks is not None:
            if first is not None:
                yield first
                yield from chunks
            return
    cur = conn.execute(sql)
    while rows := cur.fetchmany(CHUNK_ROWS):
        # float64 holds every id and time here exactly: all are below 2^53 (MAX_NS bounds the times)
        table = np.array(rows, dtype=np.float64)
        yield (table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2].astype(np.int64),
               np.ascontiguousarray(table[:, 3]))


def _chunks_adbc(file: str, sql: str) -> Iterator[tuple[np.ndarray, ...]]:
    import adbc_driver_sqlite
    import adbc_driver_sqlite.dbapi as adbc

    uri = f"file:{quote(os.fsencode(Path(file).resolve()))}?mode=ro&immutable=1"
    with adbc.connect(uri) as conn, conn.cursor() as cur:
        # the driver's default batch (1024 rows) would make the per-batch numpy work dominate
        cur.adbc_statement.set_options(**{adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value: str(CHUNK_ROWS)})
        cur.execute(sql)
        for batch in cur.fetch_record_batch():
            columns = [batch.column(i).to_numpy(zero_copy_only=False) for i in range(4)]
            yield (columns[0].astype(np.int64, copy=False), columns[1].astype(np.int64, copy=False),
                   columns[2].astype(np.int64, copy=False), columns[3].astype(np.float64, copy=False))


def _count_left_out(conn: sqlite3.Connection, known: list[tuple[int, int]], wanted: list[_Wanted], lo: int,
                    hi: int) -> dict[str, int]:
    """Rows of profkit's metrics that could not be used, and rows whose ids name no metric, in the window (a row
    without a usable time counts wherever the window is): one counting scan, by why.

    The scan's first test lets through only rows that are out of range in some column: cheap comparisons that
    every row of a sound export fails (a clock in MHz passes, and is then found to be no metric of ours). The
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
    rows = conn.execute(
        f"""SELECT CASE WHEN NOT {named} THEN '{UNKNOWN_METRIC}' WHEN NOT {timed} THEN '{NO_TIME}'
                        WHEN NOT {numeric} THEN '{NOT_A_NUMBER}' ELSE '{OUT_OF_RANGE}' END, count(*)
            FROM main.GPU_METRICS
            WHERE (value BETWEEN 0 AND 100 AND timestamp BETWEEN {-MAX_NS} AND {MAX_NS} {ids_clear}) IS NOT 1
              AND ({mine} OR NOT {named})
              AND NOT coalesce({mine} AND {timed} AND value BETWEEN 0 AND 100, 0)
              AND CASE WHEN {timed} THEN timestamp BETWEEN {lo} AND {hi} ELSE 1 END
            GROUP BY 1""").fetchall()
    return {why: n for why, n in rows if n}


def _gpu_names(conn: sqlite3.Connection, tables: set[str], gpus: set[int]) -> dict[int, str]:
    if "TARGET_INFO_GPU" not in tables or not gpus:
        return {}
    columns = {r[1] for r in conn.execute("PRAGMA main.table_info(TARGET_INFO_GPU)")}
    key = "id" if "id" in columns else "deviceId" if "deviceId" in columns else None  # deviceId before nsys 2022
    if key is None or "name" not in columns:
        return {}
    rows = conn.execute(f"SELECT {key}, name FROM main.TARGET_INFO_GPU").fetchall()
    return {gpu: name for gpu, name in rows if gpu in gpus and isinstance(name, str)}
