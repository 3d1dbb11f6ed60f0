"""The GPU's own counters (schema.GPU_COUNTERS) of a normalized trace as numpy series, per GPU and counter.

Read from the relations `gpu_metrics`, `gpu_metric_names` and `gpu_metrics_left_out` (traces/schema.py; an nsys
export's are made by traces/nsys_gpu_metrics.py): `read_gpu_metrics` from a connection holding them (a `Trace`'s,
for instance), `open_gpu_metrics` from an nsys export on its own. The reader needs no CUDA trace: a capture may
sample the GPU with `nsys profile -t none --gpu-metrics-devices=all` around a benchmark client, an export
`open_nsys` refuses ("no CUDA kernels").

Each series is two numpy columns (sample times, int64 ascending; values, float64 percent), filtered to the time
window inside SQLite, all series in one scan. Memory: 16 bytes per kept sample (twice that while reading, in
chunks), e.g. 160 MB for 5 counters x 2M samples; no Python object per row.
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
from profkit.traces.columns import adbc_available, database_file, relation_source
from profkit.traces.nsys import SQLITE_MAGIC, checkpointed_copy
from profkit.traces.nsys_gpu_metrics import create_gpu_metric_views
from profkit.traces.schema import GPU_COUNTERS

# Window bounds past every timestamp the relations hold, inside an SQLite integer.
TIME_LIMIT = 1 << 62
CHUNK_ROWS = 1 << 16  # rows per fetch through sqlite3: bounds the Python objects alive at once
# Tables only an nsys export has: StringIds is in every one, the others name exports that may lack it.
NSYS_TABLES = {"StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_GPU_METRICS", "GPU_METRICS"}


@dataclass(frozen=True)
class MetricSeries:
    """One counter of one GPU: `name` as the source spells it; sample times (ns) ascending, values in %."""

    name: str
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.timestamps)


@dataclass
class GpuMetrics:
    """The GPU metrics of a trace: `series[gpu][counter]` for the counters of GPU_COUNTERS that were recorded."""

    series: dict[int, dict[str, MetricSeries]]
    gpu_names: dict[int, str] = field(default_factory=dict)  # the GPU's name, where the source gives it
    left_out: dict[str, int] = field(default_factory=dict)  # rows not used, by why (gpu_metrics_left_out.why)
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


def read_gpu_metrics(conn: sqlite3.Connection, start_ns: int | None = None,
                     end_ns: int | None = None) -> GpuMetrics | None:
    """The GPU metrics of the normalized relations on `conn` between `start_ns` and `end_ns` (inclusive; None:
    unbounded), or None when the trace recorded none of profkit's counters."""
    names = conn.execute("SELECT device, metric, name, gpu_name FROM gpu_metric_names ORDER BY device, metric"
                         ).fetchall()
    if not names:
        return None
    lo = -TIME_LIMIT if start_ns is None else max(-TIME_LIMIT, int(start_ns))
    hi = TIME_LIMIT if end_ns is None else min(TIME_LIMIT, int(end_ns))
    series = _read_series(conn, [(device, metric, name) for device, metric, name, _ in names], lo, hi)
    rows = conn.execute("SELECT why, count(*) FROM gpu_metrics_left_out WHERE timestamp IS NULL "
                        f"OR timestamp BETWEEN {lo} AND {hi} GROUP BY 1").fetchall()
    gpu_names = {device: gpu_name for device, _, _, gpu_name in names if gpu_name is not None}
    return GpuMetrics(series=series, gpu_names=gpu_names, left_out={why: n for why, n in rows if n},
                      start_ns=start_ns, end_ns=end_ns)


def open_gpu_metrics(path: str | Path, start_ns: int | None = None,
                     end_ns: int | None = None) -> GpuMetrics | None:
    """The GPU metrics of the nsys SQLite export at `path` (with or without a CUDA trace), read-only; None when
    it recorded none. A path that is not an nsys SQLite export raises TraceError with one line naming it, as does
    an export whose GPU metric tables lack the columns nsys gives them.

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
            create_gpu_metric_views(conn, str(p))  # errors name the user's file, not a private copy
            metrics = read_gpu_metrics(conn, start_ns, end_ns)
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


def _read_series(conn: sqlite3.Connection, names: list[tuple[int, str, str]], lo: int,
                 hi: int) -> dict[int, dict[str, MetricSeries]]:
    """One scan of `gpu_metrics` for the window's samples, split into a series per (GPU, counter) of `names`."""
    # the counter as its index in GPU_COUNTERS (-1: none of them), so that every column read is a number
    code = "CASE metric " + " ".join(f"WHEN '{m}' THEN {i}" for i, m in enumerate(GPU_COUNTERS)) + " ELSE -1 END"
    # every column CAST: one type per column whatever the source stores (Arrow's reader needs that)
    columns = f"CAST(device AS INTEGER), {code}, CAST(timestamp AS INTEGER), CAST(value AS REAL)"
    where = f"timestamp BETWEEN {lo} AND {hi}"
    devices = np.array([device for device, _, _ in names], dtype=np.int64)
    codes = np.array([GPU_COUNTERS.index(metric) for _, metric, _ in names], dtype=np.int64)
    parts: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []) for _ in names]
    for device_col, code_col, times, values in _chunks(conn, columns, where):
        for i in range(len(names)):
            rows = (device_col == devices[i]) & (code_col == codes[i])
            if rows.any():
                parts[i][0].append(times[rows])
                parts[i][1].append(values[rows])
    series: dict[int, dict[str, MetricSeries]] = {}
    for (device, metric, name), (t_list, v_list) in zip(names, parts, strict=True):
        times = np.concatenate(t_list) if t_list else np.empty(0, dtype=np.int64)
        values = np.concatenate(v_list) if v_list else np.empty(0, dtype=np.float64)
        if len(times) > 1 and not bool(np.all(times[1:] >= times[:-1])):  # nsys writes in time order; others may not
            order = np.argsort(times, kind="stable")
            times, values = times[order], values[order]
        series.setdefault(device, {})[metric] = MetricSeries(name=name, timestamps=times, values=values)
    return series


def _chunks(conn: sqlite3.Connection, columns: str, where: str) -> Iterator[tuple[np.ndarray, ...]]:
    """Chunks of the four `columns` (integer, integer, integer, real) of the `gpu_metrics` rows matching `where`:
    through Arrow's SQLite driver where it is installed, the relation is a query over the file and the database
    is a file without pending WAL transactions (it fills the columns in C: 1.0 s against 1.4 s for 1M rows kept
    of 6.4M scanned), else through sqlite3 a chunk at a time."""
    file = database_file(conn)
    wal = Path(f"{file}-wal")
    source = relation_source(conn, "gpu_metrics")
    if source is not None and file and Path(file).is_file() and not (wal.is_file() and wal.stat().st_size > 0) \
            and adbc_available():
        chunks = _chunks_adbc(file, f"SELECT {columns} FROM {source} WHERE {where}")
        try:
            first = next(chunks, None)
        except Exception:  # noqa: BLE001 - any driver error: read the same rows through sqlite3
            pass
        else:
            if first is not None:
                yield first
                yield from chunks
            return
    cur = conn.execute(f"SELECT {columns} FROM gpu_metrics WHERE {where}")
    while rows := cur.fetchmany(CHUNK_ROWS):
        # float64 holds every id and time here exactly: the times lie within +-2^53 ns (traces/schema.py)
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
