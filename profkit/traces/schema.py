"""The normalized trace every analysis reads, written once here.

A `Trace` is a SQLite connection in which every relation of RELATIONS exists: TEMP views over the user's
export for an nsys trace (traces/nsys.py), tables of a file of profkit's own for a torch trace
(traces/kineto.py). A reader without the data of a relation gives it with no rows; `Trace.present` names the
relations that hold data. tests/test_trace_schema.py checks both readers against RELATIONS on real traces.
Timestamps are integer nanoseconds on one clock. The relations:

  strings  (id, value)                       -- kernel and API names, joined after aggregation
  kernels  (seq, start, end, device, stream, correlation, pid, name_id, short_id, graph_node)
  memops   (start, end, device, stream, correlation, pid, operation, bytes, src_kind, dst_kind, graph_node)
  api      (seq, start, end, tid, pid, correlation, name_id)    -- CUDA runtime and driver calls
  sync     (start, end, device, stream, correlation, pid, sync_type)
  nvtx     (start, end, tid, pid, name, style)                  -- annotated ranges (NVTX, torch's record_function)
  cpu_ops  (start, end, tid, name_id)                           -- CPU operators (aten::mm, ...)
  sched    (start, sched_in, tid, pid)                          -- the OS scheduler's context switches
  processes(pid, name)
  gpu_metrics          (timestamp, device, metric, value)      -- samples of the GPU's own counters
  gpu_metric_names     (device, metric, name, gpu_name)        -- how the source names each counter series
  gpu_metrics_left_out (timestamp, why)                         -- samples the reader could not use
  cuda_devices         (pid, cuda_device, gpu)                  -- a process's CUDA device -> GPU index

`seq` orders kernels and api rows by start (nsys writes its tables sorted by start), which lets an analysis find
the events around a timestamp by binary search instead of a scan. `device` of kernels, memops and sync is the
process's CUDA device; `gpu_metrics.device` is the GPU's index, which `cuda_devices` maps it to
(CUDA_VISIBLE_DEVICES renumbers). `operation` uses nsys's own labels (`[CUDA memcpy Host-to-Device]`,
`[CUDA memset]`) and the memory kinds are `Pageable`, `Pinned`, `Device`, ... so both readers give the same
rows. `nvtx.name` is `<domain>:<text>` in an nsys trace, as nsys's nvtx_sum names a range, and the annotation's
name in a torch trace; `style` is PushPop/StartEnd (nsys) or CPU/GPU (torch). `gpu_metrics.metric` is one of
GPU_COUNTERS and its value a percentage of the sample period, at a time within +-2^53 ns;
`gpu_metrics_left_out.timestamp` is NULL for a sample without a usable time. Analyses aggregate with SQL over
these names and never touch the source file again.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INTEGER, TEXT, REAL = "INTEGER", "TEXT", "REAL"


@dataclass(frozen=True)
class Column:
    """A column of a relation: the SQLite type of its values, and whether a value may be NULL."""

    name: str
    type: str
    nullable: bool = False


def _nullable(name: str, type_: str = INTEGER) -> Column:
    return Column(name, type_, nullable=True)


RELATIONS: dict[str, tuple[Column, ...]] = {
    "strings": (Column("id", INTEGER), Column("value", TEXT)),
    "kernels": (Column("seq", INTEGER), Column("start", INTEGER), Column("end", INTEGER), Column("device", INTEGER),
                _nullable("stream"), _nullable("correlation"), _nullable("pid"), Column("name_id", INTEGER),
                Column("short_id", INTEGER), _nullable("graph_node")),
    "memops": (Column("start", INTEGER), Column("end", INTEGER), Column("device", INTEGER), _nullable("stream"),
               _nullable("correlation"), _nullable("pid"), Column("operation", TEXT), Column("bytes", INTEGER),
               _nullable("src_kind", TEXT), _nullable("dst_kind", TEXT), _nullable("graph_node")),
    "api": (Column("seq", INTEGER), Column("start", INTEGER), Column("end", INTEGER), _nullable("tid"),
            _nullable("pid"), _nullable("correlation"), Column("name_id", INTEGER)),
    "sync": (Column("start", INTEGER), Column("end", INTEGER), _nullable("device"), _nullable("stream"),
             _nullable("correlation"), _nullable("pid"), _nullable("sync_type", TEXT)),
    "nvtx": (Column("start", INTEGER), Column("end", INTEGER), _nullable("tid"), _nullable("pid"),
             Column("name", TEXT), Column("style", TEXT)),
    "cpu_ops": (Column("start", INTEGER), Column("end", INTEGER), _nullable("tid"), Column("name_id", INTEGER)),
    "sched": (Column("start", INTEGER), _nullable("sched_in"), Column("tid", INTEGER), Column("pid", INTEGER)),
    "processes": (_nullable("pid"), _nullable("name", TEXT)),
    "gpu_metrics": (Column("timestamp", INTEGER), Column("device", INTEGER), Column("metric", TEXT),
                    Column("value", REAL)),
    "gpu_metric_names": (Column("device", INTEGER), Column("metric", TEXT), Column("name", TEXT),
                         _nullable("gpu_name", TEXT)),
    "gpu_metrics_left_out": (_nullable("timestamp"), Column("why", TEXT)),
    "cuda_devices": (Column("pid", INTEGER), Column("cuda_device", INTEGER), Column("gpu", INTEGER)),
}
# The columns that are their table's row id (INTEGER PRIMARY KEY where a reader writes a table).
ROW_IDS = {"strings": "id", "kernels": "seq", "api": "seq"}

# The GPU counters `gpu_metrics.metric` names, each a percentage of the sample period: SMs with a warp resident,
# tensor pipes active, DRAM read and write bandwidth of the peak, the graphics/compute engine active.
GPU_COUNTERS = ("sm_active", "tensor_active", "dram_read", "dram_write", "gr_active")

# What makes two rows one event recorded twice: the same place, times and correlation id. (A real nsys 2022 export,
# extrap_con_kernel, holds two kernels on one stream with equal times but their own correlation ids: nsys stats
# counts both, and so does profkit.) Both readers deduplicate by these keys.
DUPLICATE_KEYS = {"kernels": ("device", "stream", "start", "end", "correlation"),
                  "api": ("tid", "start", "end", "name_id", "correlation"),
                  "memops": ("device", "stream", "start", "end", "correlation"),
                  "sync": ("device", "stream", "start", "end", "correlation"),
                  "cpu_ops": ("tid", "start", "end", "name_id"), "nvtx": ("tid", "start", "end", "name", "style")}


def table_sql(relation: str, temp: bool = False) -> str:
    """CREATE TABLE (a TEMP one where `temp`) for `relation`, for a reader that writes its rows."""
    columns = ", ".join(f"{c.name} {c.type}{' PRIMARY KEY' if ROW_IDS.get(relation) == c.name else ''}"
                        f"{'' if c.nullable or ROW_IDS.get(relation) == c.name else ' NOT NULL'}"
                        for c in RELATIONS[relation])
    return f"CREATE {'TEMP ' if temp else ''}TABLE {relation} ({columns});"


def empty_view_sql(relation: str) -> str:
    """CREATE TEMP VIEW for `relation` without rows, for a reader whose source lacks its data."""
    blank = {INTEGER: "0", TEXT: "''", REAL: "0.0"}
    columns = ", ".join(f"{blank[c.type]} AS {c.name}" for c in RELATIONS[relation])
    return f"CREATE TEMP VIEW {relation} AS SELECT {columns} WHERE 0"


def count_duplicates(conn: sqlite3.Connection, relation: str, subset: str = "", table: str | None = None) -> int:
    """How many rows of `relation` (read from `table`, default the relation itself) repeat an earlier one by
    DUPLICATE_KEYS; `subset` a WHERE clause that narrows the rows looked at."""
    keys = ", ".join(DUPLICATE_KEYS[relation])
    return conn.execute(f"SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM {table or relation} "
                        f"{subset} GROUP BY {keys} HAVING n > 1)").fetchone()[0]


# The columns a one read gives, by relation: the relation's own names (a process id decoded, whatever the reader).
ONE_READ_COLUMNS = {
    "kernels": ("seq", "start", "end", "device", "stream", "correlation", "pid", "name_id", "short_id", "graph_node"),
    "api": ("seq", "start", "end", "pid", "correlation", "name_id"),
}


@dataclass(frozen=True)
class OneRead:
    """A relation's one checked read (`Trace.one_read`): the columns its chunks hold (of ONE_READ_COLUMNS, those the
    trace has) and the chunks, in start order, {column: int64 array} with NULL as `columns.NULL_INT`. A chunk that
    fails a check raises `traces.scan.Unverified` (the report is then made again with the SQL checks)."""

    columns: frozenset[str]
    chunks: Iterator[dict[str, Any]]


@dataclass
class Trace:
    """An opened trace: a read-only connection exposing the normalized relations. Each reader subclasses it with
    what it alone needs (`NsysTrace`, `KinetoTrace`)."""

    conn: sqlite3.Connection
    path: Path
    kind: str  # "nsys-sqlite" | "torch-trace": what the user gave, for the report's source
    meta: dict[str, Any] = field(default_factory=dict)
    # Relations that hold data in this trace (an nsys export may lack MEMCPY, NVTX_EVENTS, ...).
    present: frozenset[str] = frozenset()
    # Results computed once per trace and shared by its analyses (the GPU gaps), across `reopen`.
    cache: dict[str, Any] = field(default_factory=dict)
    primary: bool = True  # False for a `reopen`ed connection: the first one closes what the cache holds
    # Raw tables (an nsys export's kernel and CUDA API tables) whose checks ride on their one read (traces/scan.py)
    deferred: frozenset[str] = frozenset()

    @property
    def database(self) -> Path:
        """The SQLite file the relations are read from, for another connection to open read-only (Arrow's)."""
        return self.path

    def reopen(self) -> Trace:
        """Another connection to the same normalized trace (for analyses running in parallel)."""
        raise NotImplementedError(f"{self.kind}: no way to reopen")

    def has(self, relation: str) -> bool:
        return relation in self.present

    def one_read(self, relation: str) -> OneRead | None:
        """`relation`'s rows ("kernels" or "api") in one checked read, chunk by chunk, where the reader left the
        relation's checks to that read (`deferred`); None where it did not: the analyses read it through SQL."""
        return None

    def query(self, sql: str, params: dict[str, Any] | tuple = ()) -> list[tuple]:
        return self.conn.execute(sql, params).fetchall()

    def strings(self, ids: Iterable[int]) -> dict[int, str]:
        """Names for string ids (kernel and API names are joined after aggregation, not per event)."""
        clean = {int(i) for i in set(ids) if isinstance(i, int) or (isinstance(i, float) and math.isfinite(i))}
        if not clean:
            return {}
        found = dict(self.conn.execute(f"SELECT id, value FROM strings WHERE id IN ({','.join(map(str, clean))})"))
        # every id gets a name: a string table that lost rows (or holds numbers) must not fail the report
        return {i: found[i] if isinstance(found.get(i), str) else f"<string #{i} missing>" for i in clean}

    def close(self) -> None:
        self.conn.close()
        if self.primary:
            for value in self.cache.values():  # e.g. the pool of Arrow connections to the file
                if hasattr(value, "close"):
                    value.close()
            self.cache.clear()
            self.release()

    def release(self) -> None:
        """Remove what the reader made for this trace (a temporary file); run once, by the primary connection."""

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
