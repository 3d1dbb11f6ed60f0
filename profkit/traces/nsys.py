"""Nsight Systems SQLite exports (`nsys export --type sqlite`) as a normalized `Trace`.

The file is opened read-only (`mode=ro`, `immutable=1`: no lock files, no journal, nothing
written next to the user's evidence). The normalized relations (traces/schema.py) are TEMP views, so every
aggregation runs inside SQLite over the original tables (the GPU metrics' are made by traces/nsys_gpu_metrics.py).
Column and table lookups are dynamic because the export schema changes between nsys versions. Every numeric
column the views read is checked once at open (`_left_out`): a row holding text, a blob or a real there (nsys
writes integers), or times or a device id out of bounds, is left out and counted in the report's notes; a
column with no usable value is one error line. A report opens with `defer`: the large kernel and CUDA API tables
are then checked by their one read (traces/scan.py) instead, and a fault found there opens the trace again with
these checks.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from profkit.errors import TraceError
from profkit.numbers import parse_int
from profkit.traces.columns import (
    NULL_INT,
    ConnectionPool,
    adbc_available,
    adbc_min_rows,
    arrow_query,
    database_file,
    relation_source,
    to_int64,
)
from profkit.traces.nsys_gpu_metrics import create_gpu_metric_views
from profkit.traces.scan import scan_table
from profkit.traces.schema import DUPLICATE_KEYS, OneRead, Trace, count_duplicates, empty_view_sql

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"

REQUIRED_KERNEL_COLUMNS = ("start", "end", "deviceId", "streamId", "demangledName", "shortName")

# Fallbacks for exports that lack the ENUM_* tables (labels as nsys prints them).
MEMCPY_KIND_LABELS = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array", 4: "Array-to-Host",
    5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array", 8: "Device-to-Device",
    9: "Host-to-Host", 10: "Peer-to-Peer", 11: "Unified Host-to-Device", 12: "Unified Device-to-Host",
    13: "Unified Device-to-Device",
}
MEM_KIND_LABELS = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}
SYNC_TYPE_LABELS = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}
NVTX_EVENT_TYPES = {
    "NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxtPushPopRange": 70,
    "NvtxtStartEndRange": 71, "NvtxDomainCreate": 75,
}

# The pid inside nsys's serialized GlobalId (bits 24..47), as nsys's own reports extract it.
PID_MASK = 16777215
PID_OF = "(({col} >> 24) & 16777215)"

SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class NsysTrace(Trace):
    """An nsys export: views over the user's (read-only) file, reopened with the same checks reused."""

    # An export read through a private checkpointed copy (its -wal file had transactions), removed on close.
    snapshot: Path | None = None
    # Relations the export had out of start order or with duplicated rows, read through a repaired copy.
    repaired: tuple[str, ...] = ()
    # Tables holding a value of the wrong type: their views check each row's type (see _left_out).
    strict: frozenset[str] = frozenset()

    @property
    def database(self) -> Path:
        return self.snapshot or self.path

    def reopen(self) -> NsysTrace:
        other = open_nsys(self.path, snapshot=self.snapshot, checked=self)
        other.cache, other.primary = self.cache, False
        return other

    def release(self) -> None:
        if self.snapshot is not None:
            shutil.rmtree(self.snapshot.parent, ignore_errors=True)

    def one_read(self, relation: str) -> OneRead | None:
        """The kernel or CUDA API table's one read (traces/scan.py), its columns under the relation's names: the
        process id decoded from nsys's global ids."""
        table = ONE_READ_TABLES.get(relation)
        if table is None or table not in self.deferred:
            return None
        columns = scanned_columns(self.conn, table)
        lo, hi = self.query(f"SELECT min(rowid), max(rowid) FROM main.{table}")[0]
        chunks = scan_table(self, table, columns, (lo, hi))
        names = frozenset("pid" if n in GLOBAL_IDS else n for n in ("seq", *columns))
        return OneRead(names, (_decoded(chunk) for chunk in chunks))


ONE_READ_TABLES = {"kernels": KERNEL, "api": RUNTIME}
GLOBAL_IDS = ("gpid", "gtid")  # nsys's global process and thread ids: the pid sits in bits 24-47


def _decoded(chunk: dict[str, Any]) -> dict[str, Any]:
    for key in GLOBAL_IDS:
        if key in chunk:
            gid = chunk.pop(key)
            chunk["pid"] = np.where(gid == NULL_INT, NULL_INT, (gid >> 24) & PID_MASK)
    return chunk


def open_nsys(path: Path, snapshot: Path | None = None, checked: NsysTrace | None = None,
              defer: bool = False) -> NsysTrace:
    """Open an nsys SQLite export read-only and expose the normalized relations.

    A non-empty `-wal` file beside the export holds committed transactions that are part of the database;
    immutable reads would skip them. Then a private copy (export + WAL, checkpointed) is read instead, so
    the numbers are what SQLite sees and the user's files stay untouched. The copy goes with the Trace.
    `checked`: a Trace of the same file already opened; its findings (rows left out, repairs) are reused,
    so another connection costs no scan. `defer`: leave the checks of the kernel and CUDA API tables, where they
    are large enough to be read through Arrow, to their one read (traces/scan.py; `NsysTrace.deferred`)."""
    wal = Path(f"{path}-wal")
    if snapshot is None and checked is None and wal.is_file() and wal.stat().st_size > 0:
        return _open_with_wal(path, wal, defer)
    conn = _connect_read_only(snapshot or path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        _check_is_nsys_export(path, tables)
        meta = checked.meta if checked else _read_meta(conn, tables)
        columns = {t: _columns(conn, t) for t in (KERNEL, MEMCPY, MEMSET, RUNTIME, SYNC, NVTX, "SCHED_EVENTS",
                                                  "PROCESSES", "TARGET_INFO_CUDA_DEVICE") if t in tables}
        missing = [c for c in REQUIRED_KERNEL_COLUMNS if c not in columns[KERNEL]]
        if missing:
            raise TraceError(
                f"{path}: unsupported nsys export schema {meta.get('schema_version', '(unknown)')}: "
                f"{KERNEL} has no column {missing[0]!r}; re-export it with nsys 2021.2 or newer"
            )
        if checked:
            strict = checked.strict
            present = _create_views(conn, tables, columns, strict)
            for relation in checked.repaired:
                _repair(conn, relation)
            return _trace(conn, path, meta, present, snapshot, checked.repaired, strict, checked.deferred)
        if conn.execute(f"SELECT 1 FROM main.{KERNEL} LIMIT 1").fetchone() is None:
            raise TraceError(f"{path}: the trace has no CUDA kernels (was it recorded with `-t cuda`?)")
        deferred = _deferrable(conn, tables) if defer else frozenset()
        checked_columns = {t: c for t, c in _checks(conn, tables, columns).items() if t not in deferred}
        failing, suspect = _scan_tables(conn, snapshot or path, checked_columns, tables - deferred)
        said, strict = _left_out(conn, path, checked_columns, failing)
        present = _create_views(conn, tables, columns, strict)
        repaired = []
        for relation in ("kernels", "api", "memops"):
            if relation in present and (found := _sort_and_deduplicate(
                    conn, relation, any(suspect.get(t) for t in RAW[relation]), snapshot or path)) is not None:
                said += [found] if found else []
                repaired.append(relation)
        if said:
            meta["inconsistent"] = "; ".join(said)
            if conn.execute("SELECT 1 FROM kernels LIMIT 1").fetchone() is None:
                raise TraceError(f"{path}: no usable kernel rows: {said[0].removesuffix('; left out')}")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise TraceError(f"{path}: damaged or unreadable SQLite file ({exc})") from None
    except TraceError:
        conn.close()
        raise
    return _trace(conn, path, meta, present, snapshot, tuple(repaired), strict, deferred)


def _trace(conn: sqlite3.Connection, path: Path, meta: dict, present: set[str], snapshot: Path | None,
           repaired: tuple[str, ...], strict: frozenset[str], deferred: frozenset[str] = frozenset()) -> NsysTrace:
    return NsysTrace(conn=conn, path=path, kind="nsys-sqlite", meta=meta, present=frozenset(present),
                     snapshot=snapshot, repaired=repaired, strict=strict, deferred=deferred)


def _deferrable(conn: sqlite3.Connection, tables: set[str]) -> frozenset[str]:
    """The kernel and CUDA API tables whose checks can ride on their read (traces/scan.py): those the report reads
    through Arrow (the driver installed, and rows enough to be worth it)."""
    if not adbc_available():
        return frozenset()
    out = set()
    for table in (KERNEL, RUNTIME):
        if table in tables:
            first = conn.execute(f"SELECT rowid FROM main.{table} ORDER BY rowid LIMIT 1").fetchone()
            last = conn.execute(f"SELECT rowid FROM main.{table} ORDER BY rowid DESC LIMIT 1").fetchone()
            if first and last and last[0] - first[0] + 1 >= max(1, adbc_min_rows()):
                out.add(table)
    return frozenset(out)


# The numeric columns each table's view reads, all integers where nsys writes them, by what else bounds them:
# "start"/"end" times (0 <= start <= end <= 2^53), "device" (an id from 0), "id" (any integer); a trailing "?"
# allows NULL (nsys declares the column nullable). Columns an older export lacks are not read, so not checked.
CHECKED = {
    KERNEL: {"start": "start", "end": "end", "deviceId": "device", "streamId": "id", "correlationId": "id?",
             "globalPid": "id?", "demangledName": "id", "shortName": "id", "graphNodeId": "id?"},
    MEMCPY: {"start": "start", "end": "end", "deviceId": "device", "streamId": "id", "correlationId": "id?",
             "globalPid": "id?", "bytes": "id", "copyKind": "id", "srcKind": "id?", "dstKind": "id?",
             "graphNodeId": "id?"},
    MEMSET: {"start": "start", "end": "end", "deviceId": "device", "streamId": "id", "correlationId": "id?",
             "globalPid": "id?", "bytes": "id", "memKind": "id?", "graphNodeId": "id?"},
    RUNTIME: {"start": "start", "end": "end", "globalTid": "id?", "correlationId": "id?", "nameId": "id"},
    SYNC: {"start": "start", "end": "end", "deviceId": "device", "streamId": "id", "correlationId": "id?",
           "globalPid": "id?", "syncType": "id?"},
    NVTX: {"start": "start", "end": "end?", "eventType": "id", "globalTid": "id?", "textId": "id?",
           "domainId": "id?"},
}
# The columns the one read of a deferred table takes (traces/scan.py), by the name the analyses use: every CHECKED
# column, so that the read checks what the SQL checks at open would have.
SCANNED = {
    KERNEL: {"start": "start", "end": "end", "device": "deviceId", "stream": "streamId", "correlation": "correlationId",
             "gpid": "globalPid", "name_id": "demangledName", "short_id": "shortName", "graph_node": "graphNodeId"},
    RUNTIME: {"start": "start", "end": "end", "gtid": "globalTid", "correlation": "correlationId", "name_id": "nameId"},
}


def scanned_columns(conn: sqlite3.Connection, table: str) -> dict[str, tuple[str, str]]:
    """{name: (column, kind)} of `table`'s SCANNED columns that the export has (kinds as CHECKED)."""
    have = _columns(conn, table)
    return {name: (column, CHECKED[table][column]) for name, column in SCANNED[table].items() if column in have}


ROWS = {KERNEL: "kernel", MEMCPY: "memory-copy", MEMSET: "memset", RUNTIME: "CUDA API", SYNC: "synchronization",
        NVTX: "NVTX"}
WHY = {"end": "end before they start (or have no end)", "negative": "start before the session (negative time)",
       "device": "on a device id that is no GPU (negative or not a number)", "range": "with times past 2^53 ns"}
# typeof() of a value where nsys writes an integer: in a note ("rows with text in deviceId") and an error line
A_VALUE = {"text": "text", "blob": "a blob", "real": "a real number", "null": "no value"}
VALUES = {"text": "text", "blob": "blobs", "real": "real numbers", "null": "NULLs"}


def _left_out(conn: sqlite3.Connection, path: Path, checked: dict[str, tuple[dict[str, str], str]],
              failing: dict[str, int]) -> tuple[list[str], frozenset[str]]:
    """What the views leave out, said by table and why, and the tables whose views must check each row's types.

    `failing`: the rows of each table that fail the full check of `checked` (every numeric column an integer,
    times and device ids in bounds), counted by one scan per table (`_scan_tables`). A clean export (every
    real one) has none, and its views keep the plain bounds, as cheap per scan as before. Otherwise the few
    bad rows are classified, and the views of those tables check types too. A column with no usable value in
    any row is one error line: the file is not what nsys writes."""
    said, strict = [], set()
    for table, (checks, selected) in checked.items():
        if not failing.get(table):
            continue
        strict.add(table)
        rows = conn.execute(f"SELECT {_why(table, checks)}, count(*) FROM main.{table} WHERE {selected} AND "
                            f"({' AND '.join(checks.values())}) IS NOT 1 GROUP BY 1").fetchall()
        why = dict(rows)
        wrong: dict[str, list[str]] = {}  # column: the types found there
        for reason in why:
            if reason.startswith("type "):
                _, column, kind = reason.split(" ")
                wrong.setdefault(column, []).append(kind)
        for column, kinds in wrong.items():  # not one row with a usable value there?
            if not conn.execute(f"SELECT 1 FROM main.{table} WHERE {selected} AND ({checks[column]}) IS 1 "
                                "LIMIT 1").fetchone():
                held = " and ".join(VALUES.get(k, k) for k in sorted(kinds))
                raise TraceError(f"{path}: {table}.{column} holds {held} where nsys writes integers")
        parts = [f"{why[k]} {ROWS[table]} rows {w}" for k, w in WHY.items() if k in why]
        parts += [f"{why[r]} {ROWS[table]} rows with {A_VALUE.get(r.split(' ')[2], 'a value')} in {r.split(' ')[1]} "
                  "where nsys writes integers" for r in sorted(why) if r.startswith("type ")]
        said.append("; ".join(parts) + "; left out")
    return said, frozenset(strict)


# At open every row of the raw tables is read twice: for its types and bounds (`_left_out`: every numeric column,
# ~0.3 s per million kernels and 0.45 s per 3M CUDA API calls on one core) and for its order (`_sort_and_deduplicate`:
# 0.1 s per million rows). Tables of more rows than SPLIT_ROWS are read in row-id ranges, and all of it on up to
# JOBS threads, each with its own connection (sqlite3 lets go of the GIL while a query runs).
SPLIT_ROWS = 1 << 18
JOBS = max(1, min(8, os.cpu_count() or 1))  # as traces.columns.JOBS


def _scan_tables(conn: sqlite3.Connection, db: Path, checked: dict[str, tuple[dict[str, str], str]],
                 tables: set[str]) -> tuple[dict[str, int], dict[str, bool]]:
    """({table: rows failing its checks}, {table: whether its rows may be out of start order or repeated}).

    A row whose check is NULL (a NULL where nsys writes a value) fails. A table is in order when its rows run
    in strictly increasing start order with row ids that have no hole and no NULL start (see
    _sort_and_deduplicate)."""
    ordered = [t for ts in RAW.values() for t in ts if t in tables]
    queries: list[tuple[str, str, str]] = []  # (what, table, SQL giving one integer)
    spans: dict[str, tuple[int, int]] = {}
    split = False  # some table is read in ranges: worth the threads
    for table in [*checked, *(t for t in ordered if t not in checked)]:
        lo, hi = conn.execute(f"SELECT min(rowid), max(rowid) FROM main.{table}").fetchone()
        if lo is None:
            continue
        spans[table] = (lo, hi)
        parts = max(1, min(JOBS, (hi - lo + 1) // SPLIT_ROWS))
        split |= parts > 1
        ranges = list(pairwise(lo + (hi - lo + 1) * k // parts for k in range(parts + 1)))
        if table in checked:
            checks, selected = checked[table]
            nulls = "".join(f" OR {c} IS NULL" for c, kind in CHECKED[table].items()
                            if c in checks and not kind.endswith("?"))
            queries += [("failing", table, f"SELECT count(*) FROM main.{table} WHERE rowid >= {a} AND rowid < {b} "
                                           f"AND ({selected}) AND (NOT ({' AND '.join(checks.values())}){nulls})")
                        for a, b in ranges]
        if table in ordered:
            queries += [("rows", table, f"SELECT count(*) FROM main.{table} WHERE rowid >= {a} AND rowid < {b}")
                        for a, b in ranges]  # the row count in ranges too: on threads like the rest
            queries += [("disorder", table, f"SELECT count(*) FROM main.{table} a JOIN main.{table} b "
                                            f"ON b.rowid = a.rowid + 1 WHERE a.rowid >= {a} AND a.rowid < {b} "
                                            "AND (b.start <= a.start OR b.start IS NULL)")
                        for a, b in ranges]
    found: dict[tuple[str, str], int] = {}
    for (what, table, _), n in zip(queries, _integers(conn, db, [q for *_, q in queries], split), strict=True):
        found[what, table] = found.get((what, table), 0) + n
    failing = {t: found.get(("failing", t), 0) for t in spans}
    suspect = {t: bool(found.get(("disorder", t))) or found["rows", t] != spans[t][1] - spans[t][0] + 1
               for t in spans if ("rows", t) in found}
    return failing, suspect


def _integers(conn: sqlite3.Connection, db: Path, queries: list[str], threads: bool) -> list[int]:
    """Each query's integer: on up to JOBS threads where `threads`, else here one after another."""
    if not threads or JOBS == 1:
        return [conn.execute(q).fetchone()[0] for q in queries]
    local, opened, lock = threading.local(), [], threading.Lock()

    def run(query: str) -> int:
        if not hasattr(local, "conn"):
            local.conn = _connect_read_only(db)
            with lock:
                opened.append(local.conn)
        return local.conn.execute(query).fetchone()[0]

    try:
        with ThreadPoolExecutor(JOBS) as pool:
            return list(pool.map(run, queries))
    finally:
        for c in opened:
            c.close()


def _checks(conn: sqlite3.Connection, tables: set[str],
            columns: dict[str, set[str]]) -> dict[str, tuple[dict[str, str], str]]:
    """{table: ({column: SQL true when its value is an integer}, the rows its view can hold)} over the
    CHECKED columns the table has."""
    out = {}
    for table, kinds in CHECKED.items():
        if table not in tables:
            continue
        affinity = _affinities(conn, table)
        checks = {c: _is_integer(c, affinity[c], kind.endswith("?")) for c, kind in kinds.items()
                  if c in columns[table]}
        selected = "1"
        if table == NVTX:  # ranges only (marks and domain names are other rows); an odd type may hide one
            selected = f"(eventType IN ({','.join(map(str, _nvtx_range_types(conn, tables)))}) OR " \
                       f"({checks.get('eventType', '0')}) IS NOT 1)"
        checks["bounds"] = _bounds(table)
        out[table] = (checks, selected)
    return out


def _is_integer(column: str, affinity: str, nullable: bool, prefix: str = "") -> str:
    """SQL true when `column` holds an integer (or NULL where `nullable`)."""
    c = f"{prefix}{column}"
    if affinity in ("INTEGER", "NUMERIC"):
        # Here a real, text or blob never equals its bitwise AND with -1 (an integer): two operators, cheaper
        # than a typeof() call. Not in a column of another affinity: a TEXT one compares '5' = 5 as text.
        return f"{c} {'IS' if nullable else '='} ({c} & -1)"
    return f"typeof({c}) IN ('integer'{', ' + repr('null') if nullable else ''})"


def _affinities(conn: sqlite3.Connection, table: str) -> dict[str, str]:
    """Each column's type affinity, by SQLite's rules for the declared type."""
    out = {}
    for _, name, declared, *_ in conn.execute(f"PRAGMA main.table_info({table})"):
        t = (declared or "").upper()
        out[name] = ("INTEGER" if "INT" in t else "TEXT" if any(w in t for w in ("CHAR", "CLOB", "TEXT"))
                     else "BLOB" if "BLOB" in t or not t else "REAL" if any(w in t for w in ("REAL", "FLOA", "DOUB"))
                     else "NUMERIC")
    return out


def _bounds(table: str, prefix: str = "") -> str:
    """The bounds a row of `table` keeps: its view's filter, to which strict views add the type checks."""
    if table == NVTX:
        p = prefix
        return (f"{p}start >= 0 AND {p}start <= {MAX_NS} AND ({p}end IS NULL OR {p}end BETWEEN {p}start AND "
                f"{MAX_NS})")
    return TIMES_OK if table == RUNTIME else PLAUSIBLE


def _filter(conn: sqlite3.Connection, table: str, cols: set[str], strict: frozenset[str], prefix: str = "") -> str:
    """The WHERE of `table`'s view: the bounds, and where the table holds values of the wrong type, every
    CHECKED column's type. (The sync view's plain filter has never bounded its device: a clean export's
    sync rows are all on a GPU, so both filters keep the same rows there.)"""
    plain = TIMES_OK if table == SYNC else _bounds(table, prefix)
    if table not in strict:
        return plain
    affinity = _affinities(conn, table)
    types = [_is_integer(c, affinity[c], kind.endswith("?"), prefix) for c, kind in CHECKED[table].items()
             if c in cols]
    return " AND ".join([_bounds(table, prefix), *types])


def _why(table: str, checks: dict[str, str]) -> str:
    """SQL naming why a row failed `checks`: the first column of the wrong type, else the bound it breaks."""
    # (a missing time was said this way before types were checked; an NVTX range may have no end)
    whens = [] if table == NVTX else ["WHEN start IS NULL OR end IS NULL THEN 'end'"]
    whens += [f"WHEN ({check}) IS NOT 1 THEN 'type {c} ' || typeof({c})" for c, check in checks.items()
              if c != "bounds"]
    whens += ["WHEN NOT (coalesce(end, start) >= start) THEN 'end'", "WHEN start < 0 THEN 'negative'"]
    if table not in (RUNTIME, NVTX):
        whens.append(f"WHEN NOT (deviceId BETWEEN 0 AND {MAX_DEVICE}) THEN 'device'")
    return f"CASE {' '.join(whens)} ELSE 'range' END"


WHAT = {"kernels": "kernel", "api": "CUDA API", "memops": "memory-operation"}
RAW = {"kernels": (KERNEL,), "api": (RUNTIME,), "memops": (MEMCPY, MEMSET)}


def _sort_and_deduplicate(conn: sqlite3.Connection, relation: str, suspect: bool,
                          db: Path | None = None) -> str | None:
    """Check that `relation` is in start order without duplicated rows, else repair it: None when nothing was
    done, else what to tell the user ("" for a sort alone).

    The analyses find a window's rows by binary search over `seq` (row order) and count every row, so an
    export out of start order would give wrong numbers and a duplicated row would be counted twice. The fast
    path (`_scan_tables`, whose finding is `suspect`) compares each raw row with the next row id (a rowid
    seek: 0.10 s per million kernels, 0.26 s for 3.3M API rows on 2 cores): rows in strictly increasing start
    order, with row ids that run without a hole and no NULL start, are in order whichever rows the view leaves
    out. Otherwise every row of the view is compared with the one before it (`lag`, ~1 s per million rows:
    broken exports only). A repair is a sorted, deduplicated TEMP copy in place of the view."""
    if not suspect:
        return None
    keys = ", ".join(DUPLICATE_KEYS[relation])
    if relation == "memops":  # a union of two tables, in no order the analyses rely on: counted exactly
        unordered, subset = 0, ""
    else:
        ordered = f"(SELECT start, lag(start) OVER (ORDER BY seq) AS prev FROM temp.{relation})"
        unordered, ties = conn.execute(
            f"SELECT coalesce(sum(start < prev), 0), coalesce(sum(start = prev), 0) FROM {ordered}").fetchone()
        if not unordered and not ties:
            return None
        # With rows out of order a duplicate can sit anywhere; in order, only among rows that start together.
        subset = "" if unordered else f"WHERE start IN (SELECT start FROM {ordered} WHERE start = prev)"
    duplicated = _count_duplicates_columnar(conn, relation, db) if not subset and db is not None else None
    if duplicated is None:
        duplicated = count_duplicates(conn, relation, subset, table=f"temp.{relation}")
    if not unordered and not duplicated:
        return None
    _repair(conn, relation)
    # Rows out of start order are no inconsistency (nsys stats reads them as they are): sorted, not reported.
    return f"{duplicated} duplicated {WHAT[relation]} rows (same {keys}) counted once" if duplicated else ""


def _count_duplicates_columnar(conn: sqlite3.Connection, relation: str, db: Path) -> int | None:
    """`count_duplicates` from one Arrow read of the keys, sorted in numpy, where the relation is large (a serve
    trace's memory operations are rarely in strict start order: the SQL GROUP BY took 0.6 s of every open of
    one with 340k); None where SQL should count (few rows, no driver, or a key that is no integer, which SQL
    groups apart from an equal number)."""
    rows = conn.execute(f"SELECT count(*) FROM temp.{relation}").fetchone()[0]
    source = relation_source(conn, relation)
    if rows < max(1, adbc_min_rows()) // 4 or source is None or not adbc_available():
        return None
    pool = ConnectionPool(db)
    try:
        got = arrow_query(pool, f"SELECT {', '.join(DUPLICATE_KEYS[relation])} FROM {source}", rows + 1)
        columns = [to_int64(column, strict=True) for column in got.columns]
    except Exception:  # noqa: BLE001 - a value of another type, or any driver fault: SQL counts
        return None
    finally:
        pool.close()
    order = np.lexsort(columns[::-1])
    same = np.ones(max(0, len(order) - 1), dtype=bool)
    for column in columns:  # a row equal to the one before it in every key repeats it
        ordered = column[order]
        same &= ordered[1:] == ordered[:-1]
    return int(same.sum())


def _repair(conn: sqlite3.Connection, relation: str) -> None:
    """Replace the view `relation` by a TEMP table of its rows in start order, each event once."""
    body = conn.execute("SELECT sql FROM sqlite_temp_master WHERE type = 'view' AND name = ?",
                        (relation,)).fetchone()[0].split(" AS ", 1)[1]
    names = [d[0] for d in conn.execute(f"SELECT * FROM temp.{relation} LIMIT 0").description]
    rest = ", ".join(n for n in names if n != "seq")
    conn.execute(f"DROP VIEW temp.{relation}")
    # seq becomes the row id of the sorted copy; the bare columns of a group are one duplicate's (all equal)
    conn.execute(f"CREATE TEMP TABLE {relation} ({'seq INTEGER PRIMARY KEY, ' if 'seq' in names else ''}{rest})")
    conn.execute(f"INSERT INTO temp.{relation} ({rest}) SELECT {rest} FROM ({body}) "
                 f"GROUP BY {', '.join(DUPLICATE_KEYS[relation])} ORDER BY start")


def checkpointed_copy(path: Path, wal: Path, folder: Path) -> Path:
    """A private copy of an export and its `-wal` in `folder`, checkpointed: what SQLite sees, the user's files
    untouched (an immutable read would skip the WAL's committed transactions)."""
    copy = folder / "export.sqlite"
    shutil.copyfile(path, copy)
    shutil.copyfile(wal, f"{copy}-wal")
    conn = sqlite3.connect(copy)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
    finally:
        conn.close()
    return copy


def _open_with_wal(path: Path, wal: Path, defer: bool = False) -> NsysTrace:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="profkit-wal-"))
    try:
        copy = checkpointed_copy(path, wal, folder)
        trace = open_nsys(path, snapshot=copy, defer=defer)
    except sqlite3.DatabaseError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise TraceError(f"{path}: damaged or unreadable SQLite file with its -wal file ({exc})") from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return trace  # the snapshot's folder is removed when this Trace closes


def _connect_read_only(path: Path) -> sqlite3.Connection:
    # immutable=1: SQLite takes no locks and never creates -journal/-wal/-shm files beside the trace.
    uri = f"file:{quote(os.fsencode(path.resolve()))}?mode=ro&immutable=1"
    # SQLite's defaults sort faster here than temp_store=MEMORY with a big cache (measured: 2.3 s vs
    # 6.6 s for a 3.3M-row GROUP BY), and keep memory bounded.
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    # Text is UTF-8 by contract, yet real exports hold other bytes (nsys 2022.1 wrote a Latin-1 user name
    # into its metadata): undecodable bytes become U+FFFD rather than failing the whole report.
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    return conn


# A GPU operation the report can use: it ends after it starts, inside the session, on a GPU (ids from 0).
# Comparing with bounds (not typeof(), ~25 % slower per scan) also drops text, blobs and NULLs, which SQLite
# sorts after every number; 2^53 ns (104 days) keeps every duration exact in a float.
MAX_NS = 1 << 53
MAX_DEVICE = (1 << 20) - 1
TIMES_OK = f"end >= start AND start >= 0 AND end <= {MAX_NS}"
PLAUSIBLE = f"{TIMES_OK} AND deviceId BETWEEN 0 AND {MAX_DEVICE}"
BYTES = f"CASE WHEN bytes >= 0 AND bytes <= {MAX_NS} THEN bytes ELSE 0 END AS bytes"  # sizes, likewise


def _check_is_nsys_export(path: Path, tables: set[str]) -> None:
    if "StringIds" not in tables or not ({"META_DATA_EXPORT", "EXPORT_META_DATA", KERNEL, RUNTIME} & tables):
        raise TraceError(f"{path}: SQLite file is not an Nsight Systems export (no StringIds/CUPTI tables)")
    if KERNEL not in tables:
        raise TraceError(
            f"{path}: the nsys export has no CUDA kernel table (was it recorded with `-t cuda`?)"
        )


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")}


def _col(columns: set[str], name: str, alias: str, expr: str | None = None) -> str:
    return f"{expr or name} AS {alias}" if name in columns else f"NULL AS {alias}"


def _label_case(column: str, labels: dict[int, str], prefix: str = "", suffix: str = "") -> str:
    whens = " ".join(f"WHEN {k} THEN '{prefix}{v}{suffix}'" for k, v in labels.items())
    return f"CASE {column} {whens} ELSE '{prefix}Unknown{suffix}' END"


def _enum_labels(conn: sqlite3.Connection, tables: set[str], table: str, default: dict[int, str]) -> dict:
    if table not in tables:
        return default
    return {int(i): str(label).replace("'", "") for i, label in conn.execute(f"SELECT id, label FROM {table}")}


def _create_views(conn: sqlite3.Connection, tables: set[str], columns: dict[str, set[str]],
                  strict: frozenset[str]) -> set[str]:
    present = {"kernels", "strings"}
    k = columns[KERNEL]
    conn.execute("CREATE TEMP VIEW strings AS SELECT id, value FROM main.StringIds")
    conn.execute(
        f"""CREATE TEMP VIEW kernels AS SELECT rowid AS seq, start, end, deviceId AS device, streamId AS stream,
        {_col(k, 'correlationId', 'correlation')}, {_col(k, 'globalPid', 'pid', PID_OF.format(col='globalPid'))},
        demangledName AS name_id, shortName AS short_id, {_col(k, 'graphNodeId', 'graph_node')}
        FROM main.{KERNEL} WHERE {_filter(conn, KERNEL, k, strict)}"""
    )

    copy_kinds = _enum_labels(conn, tables, "ENUM_CUDA_MEMCPY_OPER", MEMCPY_KIND_LABELS)
    mem_kinds = _enum_labels(conn, tables, "ENUM_CUDA_MEM_KIND", MEM_KIND_LABELS)
    parts = []
    for table in (MEMCPY, MEMSET):
        if table not in tables:
            continue
        c = columns[table]
        common = (
            f"start, end, deviceId AS device, streamId AS stream, {_col(c, 'correlationId', 'correlation')}, "
            f"{_col(c, 'globalPid', 'pid', PID_OF.format(col='globalPid'))}"
        )
        if table == MEMCPY:
            parts.append(
                f"SELECT {common}, {_label_case('copyKind', copy_kinds, '[CUDA memcpy ', ']')} AS operation, "
                f"{BYTES}, {_col(c, 'srcKind', 'src_kind', _label_case('srcKind', mem_kinds))}, "
                f"{_col(c, 'dstKind', 'dst_kind', _label_case('dstKind', mem_kinds))}, "
                f"{_col(c, 'graphNodeId', 'graph_node')} FROM main.{MEMCPY} WHERE {_filter(conn, MEMCPY, c, strict)}"
            )
        else:
            parts.append(
                f"SELECT {common}, '[CUDA memset]' AS operation, {BYTES}, NULL AS src_kind, "
                f"{_col(c, 'memKind', 'dst_kind', _label_case('memKind', mem_kinds))}, "
                f"{_col(c, 'graphNodeId', 'graph_node')} FROM main.{MEMSET} WHERE {_filter(conn, MEMSET, c, strict)}"
            )
    if parts:
        conn.execute("CREATE TEMP VIEW memops AS " + " UNION ALL ".join(parts))
        present.add("memops")
    else:
        conn.execute(empty_view_sql("memops"))

    if RUNTIME in tables:
        r = columns[RUNTIME]
        conn.execute(
            f"""CREATE TEMP VIEW api AS SELECT rowid AS seq, start, end, {_col(r, 'globalTid', 'tid')},
            {_col(r, 'globalTid', 'pid', PID_OF.format(col='globalTid'))},
            {_col(r, 'correlationId', 'correlation')}, nameId AS name_id FROM main.{RUNTIME}
            WHERE {_filter(conn, RUNTIME, r, strict)}"""
        )
        present.add("api")
    else:
        conn.execute(empty_view_sql("api"))

    if SYNC in tables:
        s = columns[SYNC]
        sync_types = _enum_labels(conn, tables, "ENUM_CUPTI_SYNC_TYPE", SYNC_TYPE_LABELS)
        conn.execute(
            f"""CREATE TEMP VIEW sync AS SELECT start, end, deviceId AS device, streamId AS stream,
            {_col(s, 'correlationId', 'correlation')}, {_col(s, 'globalPid', 'pid', PID_OF.format(col='globalPid'))},
            {_col(s, 'syncType', 'sync_type', _label_case('syncType', sync_types))} FROM main.{SYNC}
            WHERE {_filter(conn, SYNC, s, strict)}"""
        )
        present.add("sync")
    else:
        conn.execute(empty_view_sql("sync"))

    if NVTX in tables:
        _create_nvtx_view(conn, tables, columns[NVTX], strict)
        present.add("nvtx")
    else:
        conn.execute(empty_view_sql("nvtx"))

    conn.execute(empty_view_sql("cpu_ops"))  # torch.profiler's CPU operators: nsys records none

    # The OS scheduler's context switches (nsys --cpuctxsw): each thread's time on a CPU, exactly.
    if "SCHED_EVENTS" in tables and {"start", "isSchedIn", "globalTid"} <= columns["SCHED_EVENTS"]:
        conn.execute(f"""CREATE TEMP VIEW sched AS SELECT start, isSchedIn != 0 AS sched_in, globalTid AS tid,
            {PID_OF.format(col='globalTid')} AS pid FROM main.SCHED_EVENTS
            WHERE globalTid IS NOT NULL AND start BETWEEN 0 AND {MAX_NS}""")
        present.add("sched")
    else:
        conn.execute(empty_view_sql("sched"))
    if {"pid", "name"} <= columns.get("PROCESSES", set()):
        conn.execute("CREATE TEMP VIEW processes AS SELECT pid, name FROM main.PROCESSES")
    else:
        conn.execute(empty_view_sql("processes"))

    # A process's CUDA device (the kernels' deviceId, which CUDA_VISIBLE_DEVICES renumbers) and the GPU's index.
    if {"pid", "cudaId", "gpuId"} <= columns.get("TARGET_INFO_CUDA_DEVICE", set()):
        conn.execute("CREATE TEMP VIEW cuda_devices AS SELECT pid, cudaId AS cuda_device, gpuId AS gpu "
                     "FROM main.TARGET_INFO_CUDA_DEVICE WHERE typeof(pid) = 'integer' AND typeof(cudaId) = 'integer' "
                     "AND typeof(gpuId) = 'integer'")
    else:
        conn.execute(empty_view_sql("cuda_devices"))

    # A table that exists but holds no rows is as good as absent for the report.
    present = {rel for rel in present if conn.execute(f"SELECT 1 FROM temp.{rel} LIMIT 1").fetchone()}
    # The GPU's own counters (nsys --gpu-metrics-devices): present when sampled, whether or not a sample is usable.
    if create_gpu_metric_views(conn, database_file(conn) or "(in-memory database)"):
        present.add("gpu_metrics")
    return present


def _nvtx_types(conn: sqlite3.Connection, tables: set[str]) -> dict[str, int]:
    types = dict(NVTX_EVENT_TYPES)
    if "ENUM_NSYS_EVENT_TYPE" in tables:
        names = ",".join(f"'{n}'" for n in NVTX_EVENT_TYPES)
        types.update(dict(conn.execute(f"SELECT name, id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ({names})")))
    return types


def _nvtx_range_types(conn: sqlite3.Connection, tables: set[str]) -> tuple[int, ...]:
    """The event types of NVTX ranges (push/pop, start/end), as this export numbers them."""
    types = _nvtx_types(conn, tables)
    return tuple(types[n] for n in ("NvtxPushPopRange", "NvtxtPushPopRange", "NvtxStartEndRange",
                                    "NvtxtStartEndRange"))


def _create_nvtx_view(conn: sqlite3.Connection, tables: set[str], cols: set[str], strict: frozenset[str]) -> None:
    types = _nvtx_types(conn, tables)
    pushpop = (types["NvtxPushPopRange"], types["NvtxtPushPopRange"])
    startend = (types["NvtxStartEndRange"], types["NvtxtStartEndRange"])
    text = "coalesce(sid.value, ne.text, '')" if "textId" in cols else "coalesce(ne.text, '')"
    domain_join = ""
    domain_name = "''"
    if "domainId" in cols and "textId" in cols:
        # Same rule as nsys's nvtx_sum: a range is named "<domain>:<text>", the domain matched per process.
        conn.execute(
            f"""CREATE TEMP TABLE nvtx_domains AS SELECT ne.domainId AS id, ne.globalTid & 281474959933440 AS gp,
            coalesce(sid.value, ne.text) AS name FROM main.{NVTX} ne LEFT JOIN main.StringIds sid
            ON ne.textId = sid.id WHERE ne.eventType = {types['NvtxDomainCreate']} GROUP BY 1, 2"""
        )
        domain_join = (
            "LEFT JOIN temp.nvtx_domains d ON ne.domainId = d.id "
            "AND (ne.globalTid & 281474959933440) = d.gp"
        )
        domain_name = "coalesce(d.name, '')"
    sid_join = "LEFT JOIN main.StringIds sid ON ne.textId = sid.id" if "textId" in cols else ""
    all_types = ",".join(str(t) for t in pushpop + startend)
    # an open range ends with the latest NVTX time; text would be the max of all if the table holds some
    latest = f" WHERE {_filter(conn, NVTX, cols, strict)}" if NVTX in strict else ""
    conn.execute(
        f"""CREATE TEMP VIEW nvtx AS SELECT ne.start AS start,
        coalesce(ne.end, (SELECT max(coalesce(max(start), 0), coalesce(max(end), 0)) FROM main.{NVTX}{latest})) AS end,
        ne.globalTid AS tid, {PID_OF.format(col='ne.globalTid')} AS pid, {domain_name} || ':' || {text} AS name,
        CASE WHEN ne.eventType IN ({pushpop[0]}, {pushpop[1]}) THEN 'PushPop' ELSE 'StartEnd' END AS style
        FROM main.{NVTX} ne {domain_join} {sid_join} WHERE ne.eventType IN ({all_types})
        AND {_filter(conn, NVTX, cols, strict, 'ne.')}"""
    )


def _pairs(conn: sqlite3.Connection, table: str, tables: set[str], where: str = "") -> list[tuple]:
    """A name/value metadata table's rows; none where the table or either column is missing (metadata is optional:
    an export without it still reports, its metadata unknown)."""
    if table not in tables or not {"name", "value"} <= _columns(conn, table):
        return []
    return conn.execute(f"SELECT name, value FROM {table} {where}").fetchall()


def _read_meta(conn: sqlite3.Connection, tables: set[str]) -> dict:
    meta: dict = {"tool": "Nsight Systems", "tool_version": None}  # before nsys 2022 exports had no metadata table
    # nsys 2024+ names the export's metadata table META_DATA_EXPORT; 2023.x called it EXPORT_META_DATA.
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables and {"name", "value"} <= _columns(conn, table):
            export = dict(_pairs(conn, table, tables))
            meta["tool_version"] = export.get("EXPORT_PRODUCT_VERSION")
            meta["schema_version"] = export.get("EXPORT_SCHEMA_VERSION")
            break
    if "TARGET_INFO_GPU" in tables:
        # before nsys 2022 the table had five columns, `deviceId` for `id` and no sizes
        c = _columns(conn, "TARGET_INFO_GPU")
        key = "id" if "id" in c else "deviceId" if "deviceId" in c else "rowid"
        gpus = conn.execute(
            f"SELECT {key}, {_col(c, 'name', 'name')}, {_col(c, 'totalMemory', 'mem')}, {_col(c, 'smCount', 'sms')}, "
            f"{_col(c, 'memoryBandwidth', 'bw')} FROM TARGET_INFO_GPU ORDER BY {key}"
        ).fetchall()
        meta["gpus"] = [
            {"id": g[0], "name": g[1], "memory_bytes": g[2], "sm_count": g[3], "memory_bandwidth": g[4]}
            for g in gpus
        ]
        # the GPU is the one that ran the kernels (the first kernel's device), not a row for an idle device
        ran = conn.execute(f"SELECT deviceId FROM {KERNEL} LIMIT 1").fetchone() \
            if KERNEL in tables and "deviceId" in _columns(conn, KERNEL) else None
        chosen = next((g for g in gpus if ran is not None and g[0] == ran[0]), gpus[0] if gpus else None)
        meta["gpu"] = chosen[1] if chosen else None
    env = dict(_pairs(conn, "TARGET_INFO_SYSTEM_ENV", tables, "WHERE name IN ('NvDriverVersion', "
                      "'CudaDriverVersion', 'OsDescription', 'Hostname')"))
    if env or ("TARGET_INFO_SYSTEM_ENV" in tables and {"name", "value"} <= _columns(conn, "TARGET_INFO_SYSTEM_ENV")):
        meta["driver"] = env.get("NvDriverVersion")
        v = parse_int(str(env.get("CudaDriverVersion")))  # ASCII digits of a plausible length, else unknown
        if v is not None and 0 <= v < 1_000_000:
            meta["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
        meta["os"] = env.get("OsDescription")
    rows = _pairs(conn, "META_DATA_CAPTURE", tables, "WHERE name LIKE 'PROCESS_0:COMMAND' "
                  "OR name LIKE 'PROCESS_0:ARGUMENT_%' ORDER BY rowid")
    if rows:
        meta["command"] = [v for _, v in rows]
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcTime" in _columns(conn, "TARGET_INFO_SESSION_START_TIME"):
        row = conn.execute("SELECT utcTime FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row:
            meta["session_start_utc"] = row[0]
    return json.loads(json.dumps(meta, default=str))
