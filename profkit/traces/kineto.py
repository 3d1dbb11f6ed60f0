"""torch.profiler / Kineto Chrome-trace JSON (plain or .gz) as a normalized `Trace`.

Every byte of the file is read through traces/kineto_guard.py (bounded nesting, clipped strings, a gzip cap),
and its events are decoded into columns by traces/kineto_decode.py (in worker processes for a long trace).
Here the columns become the normalized relations (traces/schema.py): sorting by start, dropping duplicated
events and marking graph-replayed kernels are array operations over the merged columns; the result is
written once, in C through Arrow's ADBC driver for the large relations, to a SQLite file in the
temporary folder that the SQL-side analyses and the columnar reads share with nsys exports.
Timestamps are integer nanoseconds on the trace's clock (`baseTimeNanoseconds` is kept in `meta` to map them
to wall time).
"""

from __future__ import annotations

import gzip
import os
import sqlite3
import tempfile
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from profkit.errors import TraceError
from profkit.traces.apis import GRAPH_LAUNCH_APIS
from profkit.traces.columns import NULL_INT, adbc_available, adbc_min_rows
from profkit.traces.kineto_decode import (
    LAYOUT,
    NAMED,
    TEXT_COLUMNS,
    Columns,
    EventColumns,
    as_int,
    decode,
    looks_like_trace,
    read_header,
)
from profkit.traces.kineto_guard import MAX_STRING
from profkit.traces.schema import DUPLICATE_KEYS, RELATIONS, Trace, table_sql

# Every normalized relation is a table of the file; those torch.profiler records nothing for (the scheduler's
# context switches, the GPU's counters) have no rows.
SCHEMA = "\n".join(table_sql(relation) for relation in RELATIONS)


@dataclass
class KinetoTrace(Trace):
    """A torch trace: its relations are tables of a SQLite file of profkit's own, deleted when the trace closes."""

    db_file: Path = field(kw_only=True)

    @property
    def database(self) -> Path:
        return self.db_file

    def reopen(self) -> KinetoTrace:
        conn = sqlite3.connect(f"file:{self.db_file}?mode=ro", uri=True, check_same_thread=False)
        return KinetoTrace(conn=conn, path=self.path, kind=self.kind, meta=self.meta, present=self.present,
                           db_file=self.db_file, cache=self.cache, primary=False)

    def release(self) -> None:
        self.db_file.unlink(missing_ok=True)


def _normalized(events: EventColumns) -> tuple[dict[str, Columns], dict[str, int]]:
    """The normalized relations' columns: start-ordered, each event once, graph-replayed kernels marked; and how
    many duplicated events each relation had. Events on no GPU are added to `events.skipped`."""
    events.pack()
    tables = {rel: _concat(rel, events.parts.pop(rel)) for rel in LAYOUT}
    # A GPU is numbered from 0: a negative device id is no GPU (it halved the utilization, counted as a
    # second device); those events are left out and counted.
    for rel in ("kernels", "memops"):
        keep = tables[rel]["device"] >= 0
        if not keep.all():
            events.skipped += int(len(keep) - keep.sum())
            tables[rel] = _select(tables[rel], keep)
    duplicated: dict[str, int] = {}  # events seen twice (same place, times and correlation id), kept once
    for rel, table in tables.items():
        table = _select(table, np.argsort(table["start"], kind="stable"))
        tables[rel], duplicated[rel] = _drop_duplicates(table, DUPLICATE_KEYS[rel])
    kernels, api = tables["kernels"], tables["api"]
    n = len(kernels["start"])
    kernels["seq"] = np.arange(1, n + 1, dtype=np.int64)
    kernels["short_id"] = kernels["name_id"]
    # Kernels replayed from a CUDA (or HIP) graph were launched by a graph launch (joined by correlation id).
    launch_ids = [events.names[name] for name in GRAPH_LAUNCH_APIS if name in events.names]
    launches = api["correlation"][np.isin(api["name_id"], launch_ids)]
    replayed = np.isin(kernels["correlation"], launches[launches != NULL_INT])
    kernels["graph_node"] = np.where(replayed, 1, NULL_INT).astype(np.int64)
    api["seq"] = np.arange(1, len(api["start"]) + 1, dtype=np.int64)
    tables["memops"]["graph_node"] = np.full(len(tables["memops"]["start"]), NULL_INT, dtype=np.int64)
    return tables, duplicated


def _concat(relation: str, parts: list[Columns]) -> Columns:
    if not parts:
        return {name: [] if name in TEXT_COLUMNS else np.zeros(0, dtype=np.int64) for name in LAYOUT[relation]}
    return {name: [v for part in parts for v in part[name]] if name in TEXT_COLUMNS
            else np.concatenate([part[name] for part in parts]) for name in LAYOUT[relation]}


def _select(table: Columns, index: np.ndarray) -> Columns:
    """The rows at `index` (positions, or a boolean mask)."""
    if index.dtype == bool:
        index = np.flatnonzero(index)
    return {name: [col[i] for i in index.tolist()] if isinstance(col, list) else col[index]
            for name, col in table.items()}


def _drop_duplicates(table: Columns, keys: tuple[str, ...]) -> tuple[Columns, int]:
    """The start-ordered `table` with each event recorded twice (same `keys`) kept once, the first in file
    order; and how many rows went. A trace written twice into one file, or events repeated by a merge, would
    double every count. Duplicates start together, so only a table where some row starts with its
    predecessor pays for the exact comparison."""
    start = table["start"]
    if len(start) < 2 or not (start[1:] == start[:-1]).any():
        return table, 0
    cols = [_codes(table[k]) for k in keys]
    order = np.lexsort(cols[::-1])  # stable: equal keys stay in row order, the first one leads
    same = np.ones(len(start) - 1, dtype=bool)
    for col in cols:
        ordered = col[order]
        same &= ordered[1:] == ordered[:-1]
    if not same.any():
        return table, 0
    keep = np.ones(len(start), dtype=bool)
    keep[order[1:][same]] = False
    return _select(table, keep), int(same.sum())


def _codes(col: Any) -> np.ndarray:
    """An int64 array standing for a column: itself, or for text each distinct value's number."""
    if not isinstance(col, list):
        return col
    seen: dict[Any, int] = {}
    return np.fromiter((seen.setdefault(v, len(seen)) for v in col), dtype=np.int64, count=len(col))


def _write(conn: sqlite3.Connection, db: str, names: dict[str, int], tables: dict[str, Columns]) -> None:
    """The relations into the (empty) database `db` that `conn` holds open."""
    conn.executemany("INSERT INTO strings VALUES (?, ?)", ((i, n) for n, i in names.items()))
    conn.commit()
    for rel, table in tables.items():
        columns = [d[1] for d in conn.execute(f"PRAGMA table_info({rel})")]
        n = len(table["start"])
        if not n:
            continue
        if rel in NAMED and n >= adbc_min_rows() and adbc_available():
            _ingest(db, rel, {c: table[c] for c in columns})  # ~4x faster than executemany for 1M rows
            continue
        values = [table[c] if isinstance(table[c], list) else _sql_values(table[c]) for c in columns]
        conn.executemany(f"INSERT INTO {rel} VALUES ({', '.join('?' * len(columns))})", zip(*values, strict=True))
        conn.commit()


def _sql_values(col: np.ndarray) -> list[int | None]:
    values = col.tolist()
    for i in np.flatnonzero(col == NULL_INT).tolist():
        values[i] = None
    return values


def _ingest(db: str, relation: str, table: Columns) -> None:
    import adbc_driver_sqlite.dbapi as adbc
    import pyarrow as pa

    arrow = pa.table({name: pa.array(col, mask=col == NULL_INT) for name, col in table.items()})
    with adbc.connect(db) as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest(relation, arrow, mode="append")
        conn.commit()


def open_kineto(path: Path) -> KinetoTrace:
    """Read a torch.profiler trace into columns, write them to a temporary SQLite file, expose it as a `Trace`."""
    try:
        header = read_header(path)
        if not header and not looks_like_trace(path):
            raise TraceError(f"{path}: JSON without traceEvents: not a torch.profiler trace")
        events, n, trailer = decode(path)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    except (ijson.JSONError, UnicodeDecodeError) as exc:  # the latter: ijson's C backend on half a surrogate pair
        raise TraceError(f"{path}: broken JSON ({_printable(exc)})") from None
    except OSError as exc:
        raise TraceError(f"{path}: unreadable ({exc})") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply: not a torch.profiler trace") from None
    if n == 0:
        raise TraceError(f"{path}: JSON without trace events: not a torch.profiler trace")
    tables, duplicated = _normalized(events)
    if events.seen["kernels"] == 0:
        raise TraceError(f"{path}: the trace has no GPU kernels (was the profiler run with CUDA activities?)")
    if not len(tables["kernels"]["start"]):
        raise TraceError(f"{path}: no usable kernel events: {events.skipped} with malformed fields "
                         "(time, duration, device) left out")
    conn, db = _new_db()
    try:
        _write(conn, db, events.names, tables)
    except BaseException:
        _discard(conn, db)  # no temporary database left behind, whatever stopped the write
        raise
    present = {"kernels", "strings"} | {rel for rel in ("memops", "api", "sync", "nvtx", "cpu_ops")
                                        if events.seen[rel]}
    meta = _meta({**trailer, **header})  # the header's own keys first, then those written after the events
    said = [f"{events.skipped} events with malformed fields (time, duration, device) left out"] if events.skipped \
        else []
    if events.clipped:
        said.append(f"{events.clipped} strings longer than {MAX_STRING >> 10} KiB clipped (names end in "
                    "'...[clipped by profkit: N bytes]')")
    said += [f"{twice} duplicated {what} events (same {', '.join(DUPLICATE_KEYS[rel])}) counted once"
             for rel, what in (("kernels", "kernel"), ("api", "CUDA API"), ("memops", "memory-operation"),
                               ("sync", "synchronization"), ("cpu_ops", "CPU operator"), ("nvtx", "annotation"))
             if (twice := duplicated.get(rel))]
    if said:
        meta["inconsistent"] = "; ".join(said)
    return KinetoTrace(conn=conn, path=path, kind="torch-trace", meta=meta, present=frozenset(present),
                       db_file=Path(db))


def _printable(exc: Exception, limit: int = 120) -> str:
    """The JSON parser's message on one line of printable ASCII (it may quote raw bytes of the file)."""
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    first = str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__
    return "".join(ch if " " <= ch <= "~" else "?" for ch in first)[:limit]


def _new_db() -> tuple[sqlite3.Connection, str]:
    fd, db = tempfile.mkstemp(prefix="profkit-", suffix=".sqlite")
    os.close(fd)
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;" + SCHEMA)
    return conn, db


def _discard(conn: sqlite3.Connection, db: str) -> None:
    conn.close()
    Path(db).unlink(missing_ok=True)


def _meta(header: dict[str, Any]) -> dict[str, Any]:
    props = header.get("deviceProperties", header.get("computeProperties"))  # the latter: early Kineto
    devices = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    # The header is the file's: numbers arrive as Decimals (ijson), huge or of the wrong type; names as anything.
    def text(v: Any) -> str | None:  # a scalar: a nested value is no name (and printing one deep recurses)
        return str(v)[:200] if isinstance(v, (str, int, float, Decimal)) else None

    meta: dict[str, Any] = {
        "tool": "torch.profiler (Kineto)",
        "tool_version": f"schema {text(header.get('schemaVersion'))}" if "schemaVersion" in header else None,
        "gpu": text(devices[0].get("name")) if devices and devices[0].get("name") else None,
        "gpus": [{"id": as_int(d.get("id")), "name": text(d.get("name")),
                  "memory_bytes": as_int(d.get("totalGlobalMem")), "sm_count": as_int(d.get("numSms"))}
                 for d in devices],
        "base_time_ns": as_int(header.get("baseTimeNanoseconds")),
    }
    v = as_int(header.get("cuda_driver_version"))
    if v is not None and v >= 0:
        meta["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    dist = header.get("distributedInfo")
    if isinstance(dist, dict):
        meta["rank"] = as_int(dist.get("rank"))
        meta["world_size"] = as_int(dist.get("world_size"))
    return meta
