"""torch.profiler / Kineto Chrome-trace JSON (plain or .gz) as a normalized `Trace`.

The JSON is streamed with ijson (its C backend): one event object at a time is turned into a row
and written in batches to a SQLite database in a temporary file, so a trace of hundreds of MB never
becomes a list of Python objects. The analyses then run on that database exactly as on an nsys
export. Timestamps: Kineto writes microseconds as floats on the trace's clock; they become integer
nanoseconds on the same clock (`baseTimeNanoseconds` is kept in `meta` to map them to wall time).
"""

from __future__ import annotations

import gzip
import io
import os
import re
import sqlite3
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import ijson

from profkit.errors import TraceError
from profkit.traces.model import Trace

BATCH = 20_000
# "Memcpy HtoD (Pageable -> Device)" -> nsys's "[CUDA memcpy Host-to-Device]", src Pageable, dst Device
_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
_COPY_KINDS = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device",
               "HtoH": "Host-to-Host", "PtoP": "Peer-to-Peer", "DtoA": "Device-to-Array",
               "AtoD": "Array-to-Device", "HtoA": "Host-to-Array", "AtoH": "Array-to-Host"}
_MEMSET = re.compile(r"Memset \((\w+)\)")

SCHEMA = """
CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE raw_kernels (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER,
                          pid INTEGER, name_id INTEGER);
CREATE TABLE raw_memops (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER,
                         pid INTEGER, operation TEXT, bytes INTEGER, src_kind TEXT, dst_kind TEXT);
CREATE TABLE raw_api (start INTEGER, end INTEGER, tid INTEGER, pid INTEGER, correlation INTEGER, name_id INTEGER);
CREATE TABLE raw_sync (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER,
                       pid INTEGER, sync_type TEXT);
CREATE TABLE nvtx (start INTEGER, end INTEGER, tid INTEGER, name TEXT, style TEXT);
CREATE TABLE cpu_ops (start INTEGER, end INTEGER, tid INTEGER, name_id INTEGER);
"""

# The normalized relations, start-ordered (`seq` is the row order), built once the stream is read.
FINISH = """
CREATE TABLE kernels AS SELECT row_number() OVER (ORDER BY start) AS seq, start, end, device, stream,
    correlation, pid, name_id, name_id AS short_id, NULL AS graph_node FROM raw_kernels ORDER BY start;
CREATE TABLE memops AS SELECT start, end, device, stream, correlation, pid, operation, bytes, src_kind,
    dst_kind, NULL AS graph_node FROM raw_memops ORDER BY start;
CREATE TABLE api AS SELECT row_number() OVER (ORDER BY start) AS seq, start, end, tid, pid, correlation, name_id
    FROM raw_api ORDER BY start;
CREATE TABLE sync AS SELECT * FROM raw_sync ORDER BY start;
DROP TABLE raw_kernels; DROP TABLE raw_memops; DROP TABLE raw_api; DROP TABLE raw_sync;
CREATE UNIQUE INDEX kernels_seq ON kernels (seq);
CREATE UNIQUE INDEX api_seq ON api (seq);
CREATE INDEX api_corr ON api (correlation);
"""


def _ns(us: Any) -> int:
    return int(round(float(us) * 1000))


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class _Loader:
    """Turns a stream of Kineto events into rows of the normalized tables."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.names: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {t: [] for t in ("raw_kernels", "raw_memops", "raw_api", "raw_sync",
                                                           "nvtx", "cpu_ops")}
        self.counts: dict[str, int] = {t: 0 for t in self.rows}

    def name_id(self, name: str) -> int:
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names) + 1
        return nid

    def add(self, ev: dict[str, Any]) -> None:
        if ev.get("ph") != "X" or "ts" not in ev:
            return
        cat = ev.get("cat")
        start = _ns(ev["ts"])
        end = start + _ns(ev.get("dur", 0))
        args = ev.get("args") or {}
        name = str(ev.get("name", ""))
        if cat == "kernel":
            self._put("raw_kernels", (start, end, _int(args.get("device")), _int(args.get("stream")),
                                      _int(args.get("correlation")), None, self.name_id(name)))
        elif cat == "gpu_memcpy":
            m = _MEMCPY.match(name)
            op = f"[CUDA memcpy {_COPY_KINDS.get(m.group(1), m.group(1))}]" if m else f"[CUDA memcpy {name}]"
            self._put("raw_memops", (start, end, _int(args.get("device")), _int(args.get("stream")),
                                     _int(args.get("correlation")), None, op, _int(args.get("bytes")) or 0,
                                     m.group(2) if m else None, m.group(3) if m else None))
        elif cat == "gpu_memset":
            m = _MEMSET.match(name)
            self._put("raw_memops", (start, end, _int(args.get("device")), _int(args.get("stream")),
                                     _int(args.get("correlation")), None, "[CUDA memset]",
                                     _int(args.get("bytes")) or 0, None, m.group(1) if m else None))
        elif cat in ("cuda_runtime", "cuda_driver"):
            self._put("raw_api", (start, end, _int(ev.get("tid")), _int(ev.get("pid")),
                                  _int(args.get("correlation")), self.name_id(name)))
        elif cat == "cuda_sync":
            self._put("raw_sync", (start, end, _int(args.get("device")), _int(args.get("stream")),
                                   _int(args.get("correlation")), _int(ev.get("pid")), name))
        elif cat in ("user_annotation", "gpu_user_annotation"):
            style = "CPU" if cat == "user_annotation" else "GPU"
            self._put("nvtx", (start, end, _int(ev.get("tid")), name, style))
        elif cat == "cpu_op":
            self._put("cpu_ops", (start, end, _int(ev.get("tid")), self.name_id(name)))

    def _put(self, table: str, row: tuple) -> None:
        rows = self.rows[table]
        rows.append(row)
        if len(rows) >= BATCH:
            self.flush(table)

    def flush(self, table: str | None = None) -> None:
        for t in [table] if table else list(self.rows):
            rows = self.rows[t]
            if rows:
                marks = ",".join("?" * len(rows[0]))
                self.conn.executemany(f"INSERT INTO {t} VALUES ({marks})", rows)
                self.counts[t] += len(rows)
                rows.clear()

    def finish(self) -> None:
        self.flush()
        self.conn.executemany("INSERT INTO strings VALUES (?, ?)", ((i, n) for n, i in self.names.items()))
        self.conn.executescript(FINISH)
        # Kernels replayed from a CUDA graph were launched by cudaGraphLaunch (joined by correlation id).
        self.conn.execute(
            """UPDATE kernels SET graph_node = 1 WHERE correlation IN (
                 SELECT a.correlation FROM api a JOIN strings s ON s.id = a.name_id
                 WHERE s.value IN ('cudaGraphLaunch', 'cuGraphLaunch'))"""
        )
        self.conn.commit()


def _open_stream(path: Path) -> IO[bytes]:
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else path.open("rb")


def _events(path: Path) -> Iterator[dict[str, Any]]:
    with _open_stream(path) as f:
        yield from ijson.items(f, "traceEvents.item", use_float=True)


def _header(path: Path) -> dict[str, Any]:
    """Top-level keys before `traceEvents` (Kineto writes its metadata first); stops at the events."""
    meta: dict[str, Any] = {}
    with _open_stream(path) as f:
        for key, value in ijson.kvitems(_until_events(f), ""):
            meta[key] = value
    return meta


def _until_events(f: IO[bytes]) -> IO[bytes]:
    """A file-like view that ends where `"traceEvents"` begins, closing the JSON object there."""
    head = bytearray()
    while chunk := f.read(1 << 16):
        head += chunk
        i = head.find(b'"traceEvents"')
        if i >= 0:
            head = head[:i].rstrip().rstrip(b",") + b"}"
            break
        if len(head) > 64 << 20:  # metadata is small; a huge header means it is not there
            break
    return io.BytesIO(bytes(head))


def open_kineto(path: Path) -> Trace:
    """Read a torch.profiler trace into a temporary SQLite database and expose it as a `Trace`."""
    fd, db = tempfile.mkstemp(prefix="profkit-", suffix=".sqlite")
    os.close(fd)
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;" + SCHEMA)
    loader = _Loader(conn)
    try:
        header = _header(path)
        if not header and not _looks_like_trace(path):
            raise TraceError(f"{path}: JSON without traceEvents: not a torch.profiler trace")
        n = 0
        for ev in _events(path):
            if isinstance(ev, dict):
                loader.add(ev)
                n += 1
        if n == 0:
            raise TraceError(f"{path}: JSON without trace events: not a torch.profiler trace")
        loader.finish()
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        _discard(conn, db)
        raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    except ijson.JSONError as exc:
        _discard(conn, db)
        raise TraceError(f"{path}: broken JSON ({str(exc).splitlines()[0][:120]})") from None
    except OSError as exc:
        _discard(conn, db)
        raise TraceError(f"{path}: unreadable ({exc})") from None
    except TraceError:
        _discard(conn, db)
        raise
    if loader.counts["raw_kernels"] == 0:
        _discard(conn, db)
        raise TraceError(f"{path}: the trace has no GPU kernels (was the profiler run with CUDA activities?)")
    present = {"kernels", "strings"} | {rel for rel, t in (("memops", "raw_memops"), ("api", "raw_api"),
                                                           ("sync", "raw_sync"), ("nvtx", "nvtx"),
                                                           ("cpu_ops", "cpu_ops")) if loader.counts[t]}
    return Trace(conn=conn, path=path, kind="torch-trace", meta=_meta(header), present=frozenset(present),
                 db_file=Path(db), owns_db=True)


def _looks_like_trace(path: Path) -> bool:
    with _open_stream(path) as f:
        return b'"traceEvents"' in f.read(1 << 20)


def _discard(conn: sqlite3.Connection, db: str) -> None:
    conn.close()
    Path(db).unlink(missing_ok=True)


def _meta(header: dict[str, Any]) -> dict[str, Any]:
    devices = header.get("deviceProperties") or []
    meta: dict[str, Any] = {
        "tool": "torch.profiler (Kineto)",
        "tool_version": f"schema {header.get('schemaVersion')}" if "schemaVersion" in header else None,
        "gpu": devices[0].get("name") if devices else None,
        "gpus": [{"id": d.get("id"), "name": d.get("name"), "memory_bytes": d.get("totalGlobalMem"),
                  "sm_count": d.get("numSms")} for d in devices],
        "base_time_ns": header.get("baseTimeNanoseconds"),
    }
    if "cuda_driver_version" in header:
        v = int(header["cuda_driver_version"])
        meta["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    dist = header.get("distributedInfo")
    if isinstance(dist, dict):
        meta["rank"] = dist.get("rank")
        meta["world_size"] = dist.get("world_size")
    return meta
