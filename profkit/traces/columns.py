"""Columns of a normalized relation as numpy arrays: the large tables are read once, the analyses vectorised.

Reading a million rows through `sqlite3` builds a Python object per value (~2 s for 7 kernel columns x 1M
rows). Apache Arrow's ADBC SQLite driver fills Arrow buffers in C instead (0.6 s; half that on two threads,
as it releases the GIL), which numpy then views without a copy: `benchmarks/bench_extract.py` measures both.
ADBC is used where `adbc-driver-sqlite` is installed and the relation is a plain query over the trace's file;
otherwise (or when a column holds a value of another type, which only a broken export does) the same query
runs through `sqlite3`, with every value made an integer, and gives the same arrays.

Every column is an int64 array; NULL becomes `NULL_INT`.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.traces.schema import Trace

NULL_INT = -(1 << 62)  # stands for NULL in an int64 column: below every time, id and size a trace holds
# Below this many rows the driver's import (pyarrow: ~0.4 s) costs more than it saves. PROFKIT_ADBC_MIN_ROWS
# overrides it (0: Arrow for every relation; a huge number: never).
ADBC_MIN_ROWS = 400_000
# Threads reading one relation at once (each its own connection and seq range).
JOBS = max(1, min(8, os.cpu_count() or 1))


def relation_source(conn: sqlite3.Connection, relation: str) -> str | None:
    """SQL that a fresh connection to the file of `conn`'s main database can run to get `relation`'s rows, or
    None."""
    row = conn.execute("SELECT type, sql FROM sqlite_temp_master WHERE name = ?", (relation,)).fetchone()
    if row is None:  # a table of the file itself (torch traces are loaded into one)
        table = conn.execute("SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                             (relation,)).fetchone()
        return relation if table is not None else None
    if row[0] != "view" or "temp." in row[1]:  # a repaired TEMP copy, or a view over other TEMP objects
        return None
    return "(" + row[1].split(" AS ", 1)[1] + ")"


def database_file(conn: sqlite3.Connection) -> str:
    """The file of `conn`'s main database ("" for an in-memory one)."""
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main":
            return file or ""
    return ""


def read_columns(trace: Trace, relation: str, columns: Mapping[str, str], where: str = "1",
                 params: Mapping[str, int] | None = None, seq_span: tuple[int, int] | None = None,
                 jobs: int = JOBS, rows_hint: int = 0, arrow: bool = False) -> dict[str, np.ndarray]:
    """{name: int64 array} of `columns` ({name: SQL expression}) over `relation`'s rows matching `where`.

    `seq_span`: the relation's first and last seq (start-ordered relations): its size decides the reader, and
    the driver reads it in `jobs` ranges at once. `rows_hint`: the size of a relation without seq (one read).
    `arrow`: through Arrow whatever the size (where its driver is loaded already)."""
    if seq_span:
        rows_hint = seq_span[1] - seq_span[0] + 1
    # Named parameters are integers (window bounds): written into the text, the query runs on any connection.
    for key, value in (params or {}).items():
        where = where.replace(f":{key}", str(int(value)))
    source = relation_source(trace.conn, relation)
    if source is not None and (arrow or rows_hint >= adbc_min_rows()) and adbc_available():
        try:
            pool = trace.cache.setdefault("adbc", ConnectionPool(trace.database))
            return _read_adbc(pool, source, columns, where, jobs, seq_span, rows_hint)
        except Exception:  # noqa: BLE001 - any driver error (a value of another type...): read the safe way,
            pass  # and a real fault of the file surfaces from sqlite3 as the usual one-line error
    return _read_sqlite(trace.conn, relation, columns, where)


class ConnectionPool:
    """Open ADBC connections to one trace file, kept for the trace's life: opening one costs ~20 ms, and a
    report reads dozens of chunks on several threads. Closed with the Trace that made it."""

    def __init__(self, path: Path) -> None:
        self.uri = f"file:{quote(os.fsencode(Path(path).resolve()))}?mode=ro&immutable=1"
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        self.opened: list[Any] = []
        self.lock = threading.Lock()

    def get(self) -> Any:
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            # the driver manager's own objects, not its DB-API layer: that one imports pyarrow.dataset and
            # pandas (~0.5 s) for what a report never uses
            import adbc_driver_manager
            import adbc_driver_sqlite

            db = adbc_driver_sqlite.connect(self.uri)
            conn = adbc_driver_manager.AdbcConnection(db)
            with self.lock:
                self.opened.append((conn, db))
            return conn

    def put(self, conn: Any) -> None:
        self.idle.put(conn)

    def close(self) -> None:
        with self.lock:
            for conn, db in self.opened:
                conn.close()
                db.close()
            self.opened.clear()


def adbc_min_rows() -> int:
    """The size from which a relation is read through Arrow: PROFKIT_ADBC_MIN_ROWS, else ADBC_MIN_ROWS."""
    text = os.environ.get("PROFKIT_ADBC_MIN_ROWS")
    if text is None:
        return ADBC_MIN_ROWS
    if not text.strip().isdigit() or len(text.strip()) > 19:
        raise ProfkitError(f"PROFKIT_ADBC_MIN_ROWS={one_line(text, 40)!r}: expected a whole number of rows "
                           f"(default {ADBC_MIN_ROWS})")
    return int(text)


def adbc_available() -> bool:
    try:
        import adbc_driver_manager  # noqa: F401
        import adbc_driver_sqlite  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _read_sqlite(conn: sqlite3.Connection, relation: str, columns: Mapping[str, str],
                 where: str) -> dict[str, np.ndarray]:
    # CAST makes any stored value an integer (text and blobs of a broken export become 0), NULL stays NULL
    exprs = ", ".join(f"coalesce(CAST({expr} AS INTEGER), {NULL_INT})" for expr in columns.values())
    rows = conn.execute(f"SELECT {exprs} FROM {relation} WHERE {where}").fetchall()
    table = np.array(rows, dtype=np.int64).reshape(len(rows), len(columns))
    return {name: np.ascontiguousarray(table[:, i]) for i, name in enumerate(columns)}


def _read_adbc(pool: ConnectionPool, source: str, columns: Mapping[str, str], where: str, jobs: int,
               seq_span: tuple[int, int] | None, rows_hint: int = 0) -> dict[str, np.ndarray]:
    exprs = ", ".join(columns.values())
    rows = seq_span[1] - seq_span[0] + 1 if seq_span else rows_hint
    batch = max(1024, min(1 << 24, rows // (jobs if seq_span and jobs > 1 else 1) + 1))

    def part(clause: str) -> list[Any]:
        return arrow_query(pool, f"SELECT {exprs} FROM {source} WHERE ({where}) {clause}", batch).columns

    if seq_span is not None and jobs > 1:  # seq (row id) ranges, read on threads: the driver releases the GIL
        lo, hi = seq_span
        cuts = [lo + (hi - lo + 1) * k // jobs for k in range(jobs + 1)]
        with ThreadPoolExecutor(jobs) as threads:
            chunks = list(threads.map(part, [f"AND seq >= {a} AND seq < {b}" for a, b in pairwise(cuts)]))
    else:
        chunks = [part("")]
    out = {}
    for i, name in enumerate(columns):
        arrays = [to_int64(chunk[i]) for chunk in chunks]
        out[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    return out


def arrow_query(pool: ConnectionPool, sql: str, batch_rows: int) -> Any:
    """`sql`'s rows as an Arrow table, through a connection of `pool`, in batches of `batch_rows`: one batch a read
    where the rows are known (the driver's default is 1,024 rows), so that the columns are viewed in place, not
    concatenated from thousands of batches into copies."""
    import adbc_driver_manager
    import pyarrow as pa

    conn = pool.get()
    try:
        with adbc_driver_manager.AdbcStatement(conn) as stmt:
            stmt.set_sql_query(sql)
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(batch_rows)})
            stream, _ = stmt.execute_query()
            return pa.RecordBatchReader._import_from_c(stream.address).read_all()
    finally:
        pool.put(conn)


def to_int64(column: Any, strict: bool = False) -> np.ndarray:
    """An Arrow column as an int64 array (NULL as NULL_INT), viewed in place where it is one with no NULL (numpy
    over its buffers: pyarrow's own to_numpy imports pandas). `strict`: TypeError unless the column is int64 (or
    all NULL), as the driver gives a column only when every value is an integer or NULL; otherwise booleans and
    narrower integers are widened."""
    import pyarrow as pa

    if pa.types.is_null(column.type):
        return np.full(len(column), NULL_INT, dtype=np.int64)
    if strict and column.type != pa.int64():
        raise TypeError(f"column of type {column.type}")
    if pa.types.is_boolean(column.type) or pa.types.is_integer(column.type) and column.type != pa.int64():
        import pyarrow.compute as pc  # only here: its kernels cost ~10 MB and 0.1 s to import

        column = pc.cast(column, pa.int64())
    if not pa.types.is_integer(column.type):
        raise TypeError(f"column of type {column.type}")
    parts = []
    for c in column.chunks:
        if not len(c):
            continue
        validity, data = c.buffers()[:2]
        values = np.frombuffer(data, dtype=np.int64, count=len(c), offset=c.offset * 8)
        if c.null_count:  # NULL_INT where the validity bitmap says NULL (its bits little-endian, from c.offset)
            valid = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
            values = np.where(valid[c.offset:c.offset + len(c)].astype(bool), values, NULL_INT)
        parts.append(values)
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
