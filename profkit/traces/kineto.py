"""torch.profiler / Kineto Chrome-trace JSON (plain or .gz) as a normalized `Trace`.

The JSON is streamed: Kineto's layout is cut into 4 MB chunks at event boundaries, and each chunk is
decoded by msgspec into small structs holding only the fields profkit reads (by worker processes when
there are more than a few chunks); any other layout goes through ijson one event object at a time.
Events become columns (int64 numpy arrays, NULL as `NULL_INT`; text only in the small relations), the
same layout the nsys reader's columns have: each chunk's rows are packed into arrays as they come, so
a trace of hundreds of MB never becomes a list of Python objects. Sorting by start, dropping duplicated
events and marking graph-replayed kernels are array operations over the merged columns; the result is
written once, in C through Arrow's ADBC driver for the large relations, to a SQLite file in the
temporary folder that the SQL-side analyses and the columnar reads share with nsys exports.
Timestamps: Kineto writes microseconds as floats on the trace's clock; they become integer
nanoseconds on the same clock (`baseTimeNanoseconds` is kept in `meta` to map them to wall time).
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import os
import re
import sqlite3
import tempfile
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import IO, Annotated, Any

import ijson
import msgspec
import numpy as np

from profkit.errors import TraceError
from profkit.resources import process_context
from profkit.traces.apis import GRAPH_LAUNCH_APIS
from profkit.traces.columns import NULL_INT, adbc_available, adbc_min_rows
from profkit.traces.model import DUPLICATE_KEYS, Trace

# Rows of one relation held as Python tuples before they are packed into arrays.
PACK_ROWS = 200_000
# "Memcpy HtoD (Pageable -> Device)" -> nsys's "[CUDA memcpy Host-to-Device]", src Pageable, dst Device
_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
_COPY_KINDS = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device",
               "HtoH": "Host-to-Host", "PtoP": "Peer-to-Peer", "DtoA": "Device-to-Array",
               "AtoD": "Array-to-Device", "HtoA": "Host-to-Array", "AtoH": "Array-to-Host"}
_MEMSET = re.compile(r"Memset \((\w+)\)")

# The columns each relation's events are decoded into, in the loader's tuple order.
LAYOUT = {
    "kernels": ("start", "end", "device", "stream", "correlation", "pid", "name_id"),
    "memops": ("start", "end", "device", "stream", "correlation", "pid", "operation", "bytes", "src_kind",
               "dst_kind"),
    "api": ("start", "end", "tid", "pid", "correlation", "name_id"),
    "sync": ("start", "end", "device", "stream", "correlation", "pid", "sync_type"),
    "nvtx": ("start", "end", "tid", "name", "style"),
    "cpu_ops": ("start", "end", "tid", "name_id"),
}
TEXT_COLUMNS = frozenset({"operation", "src_kind", "dst_kind", "sync_type", "name", "style"})
NAMED = ("kernels", "api", "cpu_ops")  # relations whose name_id refers to the loader's names

# The normalized relations as written: start-ordered, `seq` the row order of kernels and api.
SCHEMA = """
CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE kernels (seq INTEGER PRIMARY KEY, start INTEGER, end INTEGER, device INTEGER, stream INTEGER,
                      correlation INTEGER, pid INTEGER, name_id INTEGER, short_id INTEGER, graph_node INTEGER);
CREATE TABLE memops (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER, pid INTEGER,
                     operation TEXT, bytes INTEGER, src_kind TEXT, dst_kind TEXT, graph_node INTEGER);
CREATE TABLE api (seq INTEGER PRIMARY KEY, start INTEGER, end INTEGER, tid INTEGER, pid INTEGER,
                  correlation INTEGER, name_id INTEGER);
CREATE TABLE sync (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER, pid INTEGER,
                   sync_type TEXT);
CREATE TABLE nvtx (start INTEGER, end INTEGER, tid INTEGER, name TEXT, style TEXT);
CREATE TABLE cpu_ops (start INTEGER, end INTEGER, tid INTEGER, name_id INTEGER);
"""

Columns = dict[str, Any]  # column name -> int64 array, or a list for a text column


# Microseconds whose nanoseconds, plus a duration as long, still fit an int64 (SQLite's INTEGER).
TS_LIMIT_US = 4.5e15


def _ns(us: Any) -> int | None:
    """Microseconds (a number) -> integer nanoseconds; None for anything else (a string, NaN, huge)."""
    if type(us) not in (int, float) or not math.isfinite(us) or abs(us) >= TS_LIMIT_US:
        return None
    return int(round(us * 1000))


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return i if -(1 << 62) < i < (1 << 62) else None


# Older torch (1.8-1.10) spelled the categories differently; HTA reads both. Anything else unknown is ignored.
CATEGORY_ALIASES = {
    "Kernel": "kernel", "Runtime": "cuda_runtime", "Driver": "cuda_driver", "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset", "Operator": "cpu_op", "Sync": "cuda_sync",
    "User_annotation": "user_annotation", "Gpu_user_annotation": "gpu_user_annotation",
}


@dataclass
class _Decoded:
    """What a decoding worker sends back for one chunk: its columns, with name ids into `names` (1-based)."""

    names: list[str]
    parts: dict[str, list[Columns]]
    seen: dict[str, int]
    skipped: int


class _Loader:
    """Turns a stream of Kineto events into the columns of the normalized relations."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {rel: [] for rel in LAYOUT}
        self.parts: dict[str, list[Columns]] = {rel: [] for rel in LAYOUT}  # packed rows, in file order
        self.seen: dict[str, int] = {rel: 0 for rel in LAYOUT}  # events decoded per relation
        self.skipped = 0  # events whose fields are not what Kineto writes (a string time, no device, ...)
        self.clipped = 0  # strings longer than MAX_STRING, clipped as they were read (`_Guard`)
        self.duplicated: dict[str, int] = {}  # events seen twice (same place, times and correlation id), kept once

    def name_id(self, name: str) -> int:
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names) + 1
        return nid

    def add(self, ph: Any, cat: Any, name: Any, pid: Any, tid: Any, ts: Any, dur: Any, device: Any = None,
            stream: Any = None, correlation: Any = None, nbytes: Any = None) -> None:
        """One event, with the four `args` fields profkit reads."""
        if ph != "X" or ts is None:
            return
        cat = CATEGORY_ALIASES.get(cat, cat) if isinstance(cat, str) else cat
        start, length = _ns(ts), _ns(dur or 0)
        if start is None or length is None or length < 0:
            self.skipped += 1
            return
        end = start + length
        name = str(name or "")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset") and _int(device) is None:
            self.skipped += 1  # a GPU event must say which GPU
            return
        if cat == "kernel":
            self._put("kernels", (start, end, _int(device), _int(stream), _int(correlation), None,
                                  self.name_id(name)))
        elif cat == "gpu_memcpy":
            m = _MEMCPY.match(name)
            op = f"[CUDA memcpy {_COPY_KINDS.get(m.group(1), m.group(1))}]" if m else f"[CUDA memcpy {name}]"
            self._put("memops", (start, end, _int(device), _int(stream), _int(correlation), None, op,
                                 _int(nbytes) or 0, m.group(2) if m else None, m.group(3) if m else None))
        elif cat == "gpu_memset":
            m = _MEMSET.match(name)
            self._put("memops", (start, end, _int(device), _int(stream), _int(correlation), None,
                                 "[CUDA memset]", _int(nbytes) or 0, None, m.group(1) if m else None))
        elif cat in ("cuda_runtime", "cuda_driver"):
            self._put("api", (start, end, _int(tid), _int(pid), _int(correlation), self.name_id(name)))
        elif cat == "cuda_sync":
            self._put("sync", (start, end, _int(device), _int(stream), _int(correlation), _int(pid), name))
        elif cat in ("user_annotation", "gpu_user_annotation"):
            self._put("nvtx", (start, end, _int(tid), name, "CPU" if cat == "user_annotation" else "GPU"))
        elif cat == "cpu_op":
            self._put("cpu_ops", (start, end, _int(tid), self.name_id(name)))

    def add_events(self, events: list[_Event]) -> None:
        """A decoded chunk: the frequent categories inline (msgspec already typed the fields), the rest
        through `add`. This loop is the reader's hot path: millions of events per trace."""
        kernels, api, cpu = self.rows["kernels"], self.rows["api"], self.rows["cpu_ops"]
        names = self.names
        for e in events:
            if e.ph != "X" or e.ts is None:  # flow arrows, metadata, instants: ~40 % of a trace
                continue
            cat = e.cat
            if cat == "cpu_op" or cat == "kernel" or cat == "cuda_runtime" or cat == "cuda_driver":
                ts, dur = e.ts, e.dur or 0.0
                if not (-TS_LIMIT_US < ts < TS_LIMIT_US and 0 <= dur < TS_LIMIT_US) or (
                        cat == "kernel" and (e.args is None or e.args.device is None)):
                    self.skipped += 1  # NaN fails the comparisons too
                    continue
                start = round(ts * 1000)
                end = start + round(dur * 1000)
                name = e.name or ""
                nid = names.get(name)
                if nid is None:
                    nid = names[name] = len(names) + 1
                a = e.args
                if cat == "cpu_op":
                    cpu.append((start, end, e.tid if type(e.tid) is int else _int(e.tid), nid))
                elif cat == "kernel":
                    kernels.append((start, end, a.device, a.stream, a.correlation, None, nid))
                else:
                    api.append((start, end, e.tid if type(e.tid) is int else _int(e.tid),
                                e.pid if type(e.pid) is int else _int(e.pid), a.correlation if a else None, nid))
            else:
                a = e.args
                if a is None:
                    self.add(e.ph, cat, e.name, e.pid, e.tid, e.ts, e.dur)
                else:
                    self.add(e.ph, cat, e.name, e.pid, e.tid, e.ts, e.dur, a.device, a.stream, a.correlation,
                             a.nbytes)
        if len(kernels) + len(api) + len(cpu) >= PACK_ROWS:
            self.pack()

    def _put(self, relation: str, row: tuple) -> None:
        rows = self.rows[relation]
        rows.append(row)
        if len(rows) >= PACK_ROWS:
            self.pack()

    def pack(self) -> None:
        """The rows decoded so far become columns."""
        for rel, rows in self.rows.items():
            if rows:
                self.parts[rel].append(_columns(rel, rows))
                self.seen[rel] += len(rows)
                rows.clear()

    def take(self) -> _Decoded:
        """Everything decoded, for the process that merges (a worker's loader is used for one chunk)."""
        self.pack()
        return _Decoded(names=list(self.names), parts=self.parts, seen=self.seen, skipped=self.skipped)

    def absorb(self, other: _Decoded) -> None:
        """Append a worker's columns, its name ids mapped to this loader's."""
        ids = np.array([0] + [self.name_id(name) for name in other.names], dtype=np.int64)
        for rel, parts in other.parts.items():
            for part in parts:
                if rel in NAMED:
                    part["name_id"] = ids[part["name_id"]]
                self.parts[rel].append(part)
            self.seen[rel] += other.seen[rel]
        self.skipped += other.skipped

    def finish(self) -> dict[str, Columns]:
        """The normalized relations' columns: start-ordered, each event once, graph-replayed kernels marked."""
        self.pack()
        tables = {rel: _concat(rel, self.parts.pop(rel)) for rel in LAYOUT}
        # A GPU is numbered from 0: a negative device id is no GPU (it halved the utilization, counted as a
        # second device); those events are left out and counted.
        for rel in ("kernels", "memops"):
            keep = tables[rel]["device"] >= 0
            if not keep.all():
                self.skipped += int(len(keep) - keep.sum())
                tables[rel] = _select(tables[rel], keep)
        for rel, table in tables.items():
            table = _select(table, np.argsort(table["start"], kind="stable"))
            tables[rel], self.duplicated[rel] = _drop_duplicates(table, DUPLICATE_KEYS[rel])
        kernels, api = tables["kernels"], tables["api"]
        n = len(kernels["start"])
        kernels["seq"] = np.arange(1, n + 1, dtype=np.int64)
        kernels["short_id"] = kernels["name_id"]
        # Kernels replayed from a CUDA (or HIP) graph were launched by a graph launch (joined by correlation id).
        launch_ids = [self.names[name] for name in GRAPH_LAUNCH_APIS if name in self.names]
        launches = api["correlation"][np.isin(api["name_id"], launch_ids)]
        replayed = np.isin(kernels["correlation"], launches[launches != NULL_INT])
        kernels["graph_node"] = np.where(replayed, 1, NULL_INT).astype(np.int64)
        api["seq"] = np.arange(1, len(api["start"]) + 1, dtype=np.int64)
        tables["memops"]["graph_node"] = np.full(len(tables["memops"]["start"]), NULL_INT, dtype=np.int64)
        return tables


def _columns(relation: str, rows: list[tuple]) -> Columns:
    values = list(zip(*rows, strict=True))
    return {name: list(col) if name in TEXT_COLUMNS else _int_array(col)
            for name, col in zip(LAYOUT[relation], values, strict=True)}


def _int_array(values: tuple) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except TypeError:  # NULLs (an event without a stream, correlation id, thread...)
        return np.fromiter((NULL_INT if v is None else v for v in values), dtype=np.int64, count=len(values))


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


# A JSON value nested deeper than this is no trace's (Kineto writes 6 levels at most). The parsers spend memory
# on depth before they fail: ijson's events carry a path that grows with it, ~2.5 bytes x depth^2 held per
# buffer (4 GB at 40,000 levels), and Python objects that deep overflow the interpreter's stack when printed.
MAX_DEPTH = 100
# A JSON string longer than this is clipped as the bytes stream by, with a marker saying how long it was: one
# 400 MB kernel name took ijson past 5 minutes, and would be copied several times as a Python string. The
# longest demangled kernel names (CUTLASS templates) run to a few KB.
MAX_STRING = 64 << 10
# Decompressed bytes a gzip'd trace may expand to: this many times the file, or GZIP_FLOOR if more. Real
# traces compress 15-30x; gzip's limit is ~1000x, reached by a "bomb" of repeated bytes.
GZIP_RATIO = 200
GZIP_FLOOR = 1 << 30
_ESCAPE = re.compile(rb"\\(?:u[0-9A-Fa-f]{4}|.)", re.DOTALL)
_HIGH_SURROGATE = re.compile(rb"\\u[dD][89abAB]")


class _Guard:
    """A trace's JSON bytes as the parsers are given them, bounded before they spend memory: a string longer
    than MAX_STRING is clipped, a gzip'd trace may not expand past `max_bytes`, and with `depth` nesting deeper
    than MAX_DEPTH is refused (for ijson; msgspec stops at Python's recursion limit by itself). Where strings
    are (quotes not escaped by an odd run of backslashes), and the depth outside them, is found with numpy a
    block at a time (~800 MB/s, ~300 MB/s with the depth); the rare long string is cut in Python.

    A string still open at the end of a block is held back (at most MAX_STRING bytes) and scanned again with
    the next one, so every block starts outside a string; a string being clipped is skipped to its end."""

    def __init__(self, f: IO[bytes], path: Path, max_bytes: int | None = None, loader: _Loader | None = None,
                 depth: bool = False) -> None:
        self.f, self.path, self.max_bytes, self.loader, self.track = f, path, max_bytes, loader, depth
        self.total = 0  # bytes read from `f` (decompressed)
        self.depth = 0
        self.held = b""  # an open string from its opening quote
        self.clipping = 0  # bytes of the string being clipped so far (0: none)
        self.run = 0  # backslashes ending what was skipped of it: an odd run escapes the next quote
        self.done = False

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson asks whether the stream gives bytes
            return b""
        while not self.done:
            block = self.f.read(size if size > 0 else _CHUNK)
            if not block:
                self.done = True
                held, self.held = self.held, b""
                return held  # an unterminated string: the parser says the JSON is truncated
            self.total += len(block)
            if self.max_bytes is not None and self.total > self.max_bytes:
                raise TraceError(f"{self.path}: gzip data expanding past {self.max_bytes >> 20} MiB, more than "
                                 f"{GZIP_RATIO} times the file: a decompression bomb, not a trace")
            out = self._feed(self.held + block if self.held else block)
            if out:
                return out
        return b""

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> _Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _feed(self, data: bytes) -> bytes:
        self.held = b""
        a = np.frombuffer(data, dtype=np.uint8)
        out: list[bytes | memoryview] = []
        view = memoryview(data)
        start = scan = 0
        if self.clipping:  # inside a clipped string: skip to its closing quote
            quotes = _real_quotes(a, self.run)
            if not len(quotes):
                self.clipping += len(data)
                self.run = _trailing_backslashes(data, self.run)
                return b""
            start = int(quotes[0])  # the closing quote, kept
            scan = start + 1
            out.append(b"...[clipped by profkit: %d bytes]" % (self.clipping + start))
            self.clipping = 0
        quotes = _real_quotes(a[scan:]) + scan  # from `scan` on, outside a string
        if self.track:
            self._track_depth(a[scan:], quotes - scan)
        opened = quotes[::2]
        closed = quotes[1::2]
        ends = len(data) if len(quotes) % 2 else None
        long = np.flatnonzero(closed - opened[:len(closed)] - 1 > MAX_STRING).tolist()
        for i in long:
            o, c = int(opened[i]), int(closed[i])
            out.append(view[start:o + 1])
            out.append(data[o + 1:o + 1 + _safe_cut(data, o + 1)])
            out.append(b"...[clipped by profkit: %d bytes]" % (c - o - 1))
            start = c
            self._clipped()
        if ends is not None:  # a string open at the end of the block
            o = int(opened[-1])
            if ends - o - 1 > MAX_STRING + 12:  # the cut point and the escape that may straddle it are here
                out.append(view[start:o + 1])
                out.append(data[o + 1:o + 1 + _safe_cut(data, o + 1)])
                self.clipping = ends - o - 1
                self.run = _trailing_backslashes(data[o + 1:])
                self._clipped()
                start = ends
            else:
                self.held = data[o:]
                ends = o
        if not out and ends is None:
            return data
        out.append(view[start:ends])
        return b"".join(out)

    def _track_depth(self, a: np.ndarray, quotes: np.ndarray) -> None:
        folded = a | 0x20  # "[" and "{" differ in that bit only, as "]" and "}" do
        opens = folded == 0x7B
        at = np.flatnonzero(opens | (folded == 0x7D))
        if not len(at):
            return
        at = at[np.searchsorted(quotes, at) % 2 == 0]  # an even number of quotes before: not in a string
        level = self.depth + np.cumsum(np.where(opens[at], 1, -1), dtype=np.int64)
        if len(level):
            if level.max() > MAX_DEPTH:
                raise TraceError(f"{self.path}: JSON nested too deeply: not a torch.profiler trace")
            self.depth = int(level[-1])

    def _clipped(self) -> None:
        if self.loader is not None:
            self.loader.clipped += 1


def _real_quotes(a: np.ndarray, run: int = 0) -> np.ndarray:
    """Positions of the quotes in `a` that are not escaped (preceded by an odd run of backslashes; `run`:
    backslashes just before `a`)."""
    quotes = np.flatnonzero(a == 34)
    slashes = np.flatnonzero(a == 92)
    if not len(quotes) or not len(slashes) and not run:
        return quotes
    before = np.zeros(len(quotes), dtype=np.int64)  # the run of backslashes ending just before each quote
    if len(slashes):
        first = np.ones(len(slashes), dtype=bool)
        first[1:] = np.diff(slashes) != 1
        run_start = slashes[first][np.cumsum(first) - 1]
        j = np.minimum(np.searchsorted(slashes, quotes - 1), len(slashes) - 1)
        hit = slashes[j] == quotes - 1
        before = np.where(hit, quotes - run_start[j], 0)
        before += np.where(hit & (run_start[j] == 0), run, 0)
    before += np.where(quotes == 0, run, 0)
    return quotes[before % 2 == 0]


def _trailing_backslashes(data: bytes, run: int = 0) -> int:
    """Backslashes ending `data` (`run` more before it, where all of `data` is backslashes)."""
    k = len(data) - len(data.rstrip(b"\\"))
    return k + run if k == len(data) else k


def _safe_cut(data: bytes, at: int) -> int:
    """Bytes of the string starting at `at` to keep (MAX_STRING or a few less): never half an escape, a
    surrogate pair or a UTF-8 character."""
    cut = MAX_STRING
    before = None  # the escape just before the one looked at
    for m in _ESCAPE.finditer(data, at, at + cut + 12):
        s, e = m.start() - at, m.end() - at
        if s >= cut:
            break
        if e > cut or e == cut and _HIGH_SURROGATE.match(m.group()):
            cut = s
            if before is not None and before.end() == m.start() and _HIGH_SURROGATE.match(before.group()):
                cut = before.start() - at  # the low half straddled the cut: its high half goes too
            break
        before = m
    while cut > 0 and data[at + cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: back to its lead byte
        cut -= 1
    return cut


def _open_stream(path: Path, loader: _Loader | None = None, depth: bool = True) -> _Guard:
    """The trace's JSON bytes (gunzipped where the file is gzip), through a `_Guard`."""
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if gz:
        return _Guard(gzip.open(path, "rb"), path, max(GZIP_FLOOR, GZIP_RATIO * path.stat().st_size), loader,
                      depth)
    return _Guard(path.open("rb"), path, None, loader, depth)


# An integer SQLite can store (int64) with room to add: a bigger one fails the typed decode, and the chunk is read
# by the generic reader, which drops what does not fit (`_int`).
Int = Annotated[int, msgspec.Meta(gt=-(1 << 62), lt=1 << 62)]  # the same open bounds as `_int`


class _Args(msgspec.Struct):
    device: Int | None = None
    stream: Int | None = None
    correlation: Int | None = None
    nbytes: Int | None = msgspec.field(default=None, name="bytes")


class _Event(msgspec.Struct):
    """The fields profkit reads; msgspec skips every other key (Input Dims, call stacks...) unparsed."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Int | str | None = None
    tid: Int | str | None = None
    # An integer stays one: epoch microseconds (~1.7e15) times 1000 lose up to 256 ns as a float.
    ts: Int | float | None = None
    dur: Int | float | None = None
    args: _Args | None = None


class _Tail(msgspec.Struct):
    traceEvents: list[_Event]  # noqa: N815 - the JSON key


class _Trailer(msgspec.Struct):
    """Top-level keys a trace may carry after its events (written by tools that re-serialize a Kineto trace)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"[]")  # noqa: N815 - skipped, the events are decoded apart
    schemaVersion: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    cuda_driver_version: Any = None
    cuda_runtime_version: Any = None
    baseTimeNanoseconds: Any = None  # noqa: N815
    computeProperties: Any = None  # noqa: N815


def _trailer(data: bytes) -> dict[str, Any]:
    """The metadata keys in the part of the document after traceEvents (empty when there are none)."""
    try:
        t = msgspec.json.decode(data, type=_Trailer)
    except Exception:  # noqa: BLE001 - metadata is optional; a broken tail fails the event decode anyway
        return {}
    return {k: getattr(t, k) for k in t.__struct_fields__ if k != "traceEvents" and getattr(t, k) is not None}


# 4 MB of JSON decodes to ~25 MB of structs: small enough to keep each worker's memory low.
_CHUNK = 4 << 20
# Traces of up to this many chunks (12 MB of JSON) are decoded in this process.
IN_PROCESS_CHUNKS = 3
# Kineto writes one event per `{ ... }` block, separated by "},\n  {" at the top level of traceEvents. A
# raw newline never occurs inside a JSON string, so a split there is between two events or, in an
# unexpected layout, yields invalid JSON, which sends the whole file to the generic ijson path.
_SEPARATOR = b"},\n  {"


class _NotKinetoLayout(Exception):
    pass


class _Prefetch:
    """Reads (and gunzips) the next block in a thread while the caller decodes the current one:
    zlib releases the GIL, so decompression overlaps with decoding."""

    def __init__(self, f: _Guard) -> None:
        self.f = f
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.next = self.pool.submit(f.read, _CHUNK)

    def read(self, _size: int) -> bytes:
        block = self.next.result()
        self.next = self.pool.submit(self.f.read, _CHUNK) if block else self.next
        return block

    def __enter__(self) -> _Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        # Let a pending read finish before the caller closes the file under it.
        self.pool.shutdown(wait=True)


def _load_fast(path: Path, loader: _Loader, trailer: dict[str, Any] | None = None) -> int:
    """Chunked msgspec decoding (~3x faster than ijson); raises _NotKinetoLayout to fall back.

    A small trace is decoded here; a longer one by worker processes (decoding and the
    per-event loop hold the GIL, so threads would not help), each chunk's columns merged into
    `loader` in file order.
    """
    chunks = _kineto_chunks(path, trailer, loader)
    head = list(itertools.islice(chunks, IN_PROCESS_CHUNKS + 1))
    if len(head) <= IN_PROCESS_CHUNKS:  # small trace: starting workers would cost more than they save
        return sum(_decode_into(loader, data, tail) for data, tail in head)
    return _load_parallel(path, loader, itertools.chain(head, chunks))


_LIST_DECODER = msgspec.json.Decoder(list[_Event])
_TAIL_DECODER = msgspec.json.Decoder(_Tail)


def _decode_into(loader: _Loader, data: bytes, tail: bool) -> int:
    try:
        events = _TAIL_DECODER.decode(data).traceEvents if tail else _LIST_DECODER.decode(data)
    except msgspec.DecodeError:
        raise _NotKinetoLayout from None
    loader.add_events(events)
    return len(events)


def _kineto_chunks(path: Path, trailer: dict[str, Any] | None = None,
                   loader: _Loader | None = None) -> Iterator[tuple[bytes, bool]]:
    """traceEvents as ~16 MB JSON arrays cut at event boundaries: (array text, False), then the rest of
    the document as (object text, True); the metadata found after the events goes into `trailer`."""
    with _open_stream(path, loader, depth=False) as raw, _Prefetch(raw) as f:
        buf = bytearray()
        while True:  # skip the header up to the opening bracket of traceEvents
            block = f.read(_CHUNK)
            buf += block
            i = buf.find(b'"traceEvents"')
            j = buf.find(b"[", i) if i >= 0 else -1
            if j >= 0:
                del buf[:j]  # keep the "[" that opens traceEvents
                break
            if not block:
                raise _NotKinetoLayout
        while True:
            block = f.read(_CHUNK)
            if not block:
                last = b'{"traceEvents": ' + bytes(buf)
                if trailer is not None:
                    trailer.update(_trailer(last))
                yield last, True
                return
            buf += block
            cut = buf.rfind(_SEPARATOR)
            if cut < 0:
                if len(buf) > 4 * _CHUNK:  # no event boundary in 64 MB: not Kineto's layout, stream it
                    raise _NotKinetoLayout
                continue
            # The separator's comma becomes the closing bracket; its newline, the next chunk's "[".
            buf[cut + 1] = ord("]")
            chunk = bytes(buf[: cut + 2])
            del buf[: cut + 2]
            buf[0] = ord("[")
            yield chunk, False


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _load_parallel(path: Path, loader: _Loader, chunks: Iterator[tuple[bytes, bool]]) -> int:
    n_workers = _workers()
    ctx = process_context()  # not fork: this process already runs the gunzip prefetch thread
    n = 0
    try:
        try:
            pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx)
        except (OSError, NotImplementedError, ImportError):  # no working multiprocessing here: decode in turn
            return sum(_decode_into(loader, data, tail) for data, tail in chunks)
        with pool:
            pending: deque = deque()

            def collect() -> None:  # in submission order: the columns stay in file order
                nonlocal n
                events, decoded = pending.popleft().result()
                loader.absorb(decoded)
                n += events

            for data, tail in chunks:
                pending.append(pool.submit(_decode_in_worker, data, tail))
                while len(pending) > n_workers:  # bounded: a chunk queued per worker, flat memory
                    collect()
            while pending:
                collect()
    except BrokenProcessPool as exc:
        raise TraceError(f"{path}: a decoding worker process died ({exc or 'killed'}); out of memory?") from None
    return n


def _decode_in_worker(data: bytes, tail: bool) -> tuple[int, _Decoded]:
    """In a worker process: one chunk's events as columns (sent back as numpy arrays, compact to pickle)."""
    loader = _Loader()
    events = _decode_into(loader, data, tail)
    return events, loader.take()


def _load_ijson(path: Path, loader: _Loader) -> int:
    """Any valid Chrome-trace JSON, one event object at a time: an object with traceEvents, or (the
    Chrome trace format's other form, written by torch 1.8's Kineto) a bare array of events."""
    n = 0
    prefix = "item" if _first_byte(path) == b"[" else "traceEvents.item"
    with _open_stream(path, loader) as f:
        for ev in ijson.items(f, prefix, use_float=True):
            if isinstance(ev, dict):
                a = ev.get("args") if isinstance(ev.get("args"), dict) else {}
                loader.add(ev.get("ph"), ev.get("cat"), ev.get("name"), ev.get("pid"), ev.get("tid"),
                           ev.get("ts"), ev.get("dur"), a.get("device"), a.get("stream"), a.get("correlation"),
                           a.get("bytes"))
                n += 1
    return n


def _header(path: Path) -> dict[str, Any]:
    """Top-level keys before `traceEvents` (Kineto writes its metadata first); stops at the events."""
    meta: dict[str, Any] = {}
    with _open_stream(path, depth=False) as f:
        head = _until_events(f)
    # Its nesting is bounded here, on the metadata alone: the events are the event reader's.
    for key, value in ijson.kvitems(_Guard(head, path, depth=True), ""):
        meta[key] = value
    return meta


def _until_events(f: _Guard) -> IO[bytes]:
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
    """Read a torch.profiler trace into columns, write them to a temporary SQLite file, expose it as a `Trace`."""
    loader = _Loader()
    try:
        header = _header(path)
        if not header and not _looks_like_trace(path):
            raise TraceError(f"{path}: JSON without traceEvents: not a torch.profiler trace")
        trailer: dict[str, Any] = {}
        try:
            n = _load_fast(path, loader, trailer)
        except _NotKinetoLayout:
            loader = _Loader()
            n = _load_ijson(path, loader)
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
    tables = loader.finish()
    if loader.seen["kernels"] == 0:
        raise TraceError(f"{path}: the trace has no GPU kernels (was the profiler run with CUDA activities?)")
    if not len(tables["kernels"]["start"]):
        raise TraceError(f"{path}: no usable kernel events: {loader.skipped} with malformed fields "
                         "(time, duration, device) left out")
    conn, db = _new_db()
    try:
        _write(conn, db, loader.names, tables)
    except BaseException:
        _discard(conn, db)  # no temporary database left behind, whatever stopped the write
        raise
    present = {"kernels", "strings"} | {rel for rel in ("memops", "api", "sync", "nvtx", "cpu_ops")
                                        if loader.seen[rel]}
    meta = _meta({**trailer, **header})  # the header's own keys first, then those written after the events
    said = [f"{loader.skipped} events with malformed fields (time, duration, device) left out"] if loader.skipped \
        else []
    if loader.clipped:
        said.append(f"{loader.clipped} strings longer than {MAX_STRING >> 10} KiB clipped (names end in "
                    "'...[clipped by profkit: N bytes]')")
    said += [f"{n} duplicated {what} events (same {', '.join(DUPLICATE_KEYS[rel])}) counted once"
             for rel, what in (("kernels", "kernel"), ("api", "CUDA API"), ("memops", "memory-operation"),
                               ("sync", "synchronization"), ("cpu_ops", "CPU operator"), ("nvtx", "annotation"))
             if (n := loader.duplicated.get(rel))]
    if said:
        meta["inconsistent"] = "; ".join(said)
    return Trace(conn=conn, path=path, kind="torch-trace", meta=meta, present=frozenset(present),
                 db_file=Path(db), owns_db=True)


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


def _looks_like_trace(path: Path) -> bool:
    with _open_stream(path) as f:
        head = f.read(1 << 20)
    return b'"traceEvents"' in head or (head.lstrip()[:1] == b"[" and b'"ph"' in head)


def _first_byte(path: Path) -> bytes:
    with _open_stream(path) as f:
        return f.read(4096).lstrip()[:1]


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
        "gpus": [{"id": _int(d.get("id")), "name": text(d.get("name")), "memory_bytes": _int(d.get("totalGlobalMem")),
                  "sm_count": _int(d.get("numSms"))} for d in devices],
        "base_time_ns": _int(header.get("baseTimeNanoseconds")),
    }
    v = _int(header.get("cuda_driver_version"))
    if v is not None and v >= 0:
        meta["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    dist = header.get("distributedInfo")
    if isinstance(dist, dict):
        meta["rank"] = _int(dist.get("rank"))
        meta["world_size"] = _int(dist.get("world_size"))
    return meta
