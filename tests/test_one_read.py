"""Each large table read once (issue 41): the kernel and CUDA API tables' checks ride on their one read, and every
analysis takes its rows from it. Checked on the real fixtures against the SQL checks and per-analysis reads (the
path a small trace, or one without the Arrow driver, still takes), and on broken copies of a real export whose
fault the one read must notice."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from profkit.analysis import scans
from profkit.analysis.scans import KERNEL_SCAN
from profkit.report import ReportOptions, build_report
from profkit.traces import columns, nsys, open_trace
from profkit.traces.scan import Unverified, scan_table

KERNEL, RUNTIME = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
REAL_SCAN, REAL_READ = nsys.scan_table, columns.read_columns  # before any test wraps them


def _report(path: Path, window: str, monkeypatch, one_read: bool) -> tuple[dict, list[str], list[str]]:
    """The report through the one read (every relation through Arrow) or through the SQL checks and sqlite3 reads;
    the tables the one read took, and the kernel/API relations read again by an analysis."""
    scanned, again = [], []
    real_scan, real_read = REAL_SCAN, REAL_READ

    def scan_spy(trace, table, *args, **kwargs):
        scanned.append(table)
        return real_scan(trace, table, *args, **kwargs)

    def read_spy(trace, relation, *args, **kwargs):
        if relation in ("kernels", "api"):
            again.append(relation)
        return real_read(trace, relation, *args, **kwargs)

    monkeypatch.setattr(nsys, "scan_table", scan_spy)
    for module in ("gaps", "launch", "steps", "communication", "gpu_metrics"):
        monkeypatch.setattr(f"profkit.analysis.{module}.read_columns", read_spy)
    monkeypatch.setattr(columns, "read_columns", read_spy)
    monkeypatch.setattr(columns, "ADBC_MIN_ROWS", 0 if one_read else 1 << 62)
    doc = build_report(path, options=ReportOptions(window=window)).document()
    doc.pop("profkit_version")
    return doc, scanned, again


def _span(path: Path) -> tuple[int, int]:
    """The starts of the kernels a quarter and two thirds into the table: a window with work in it."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n = conn.execute(f"SELECT max(rowid) FROM {KERNEL}").fetchone()[0]
    lo, hi = (conn.execute(f"SELECT start FROM {KERNEL} WHERE rowid = ?", (n * k // 12,)).fetchone()[0] for k in (3, 8))
    conn.close()
    return lo, hi


@pytest.mark.parametrize("name", ["thr_graphs", "serve_frontend", "swap_b16", "chunked_prefill"])
def test_every_window_from_one_read_of_each_table(sqlite_path, monkeypatch, name: str) -> None:
    """`all`, `auto` (a phase: whole GPU-active segments) and an explicit window known before the read: the kernel
    and API tables are read once, no analysis reads their rows again, and the report is the per-analysis reads'."""
    path = sqlite_path(name)
    lo, hi = _span(path)
    for window in ("all", "auto", f"{lo}:{hi}"):
        one, scanned, again = _report(path, window, monkeypatch, one_read=True)
        reads, not_scanned, _ = _report(path, window, monkeypatch, one_read=False)
        assert scanned == [KERNEL, RUNTIME] and not not_scanned
        assert again == [], (window, again)
        assert one == reads, window
        assert one["kernels"] and one["api"]


def test_a_zero_length_kernel_at_the_windows_end(tmp_path: Path, sqlite_path, monkeypatch) -> None:
    """The window `auto` ends at the last operation's end and keeps the kernels that start before it: a last kernel
    of no length starting there is left out of `auto` and counted in `all`, on the one read as in SQL."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    conn = sqlite3.connect(trace)
    last = conn.execute(f"SELECT rowid, start FROM {KERNEL} ORDER BY rowid DESC LIMIT 1").fetchone()
    tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE name IN "
                                         "('CUPTI_ACTIVITY_KIND_MEMCPY', 'CUPTI_ACTIVITY_KIND_MEMSET')")]
    reach = max(conn.execute(f"SELECT max(end) FROM {t}").fetchone()[0] or 0 for t in tables)
    reach = max(reach, conn.execute(f"SELECT max(end) FROM {KERNEL} WHERE rowid < ?", (last[0],)).fetchone()[0])
    moved = max(reach, last[1])  # after every earlier start and every end: the window's end
    conn.execute(f"UPDATE {KERNEL} SET start = ?, end = ? WHERE rowid = ?", (moved, moved, last[0]))
    conn.commit()
    counts = {}
    for window in ("all", "auto"):
        one, scanned, _ = _report(trace, window, monkeypatch, one_read=True)
        reads, _, _ = _report(trace, window, monkeypatch, one_read=False)
        assert scanned == [KERNEL, RUNTIME] and one == reads
        counts[window] = sum(k["count"] for k in one["kernels"])
        if window == "auto":
            w0, w1 = one["window"]["start_ns"], one["window"]["end_ns"]
            assert w1 == moved
            assert counts[window] == conn.execute(f"SELECT count(*) FROM {KERNEL} WHERE start >= ? AND start < ?",
                                                  (w0, w1)).fetchone()[0]
    assert counts["all"] == conn.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0]
    conn.close()


BROKEN = {  # what a broken export holds, made from a real one: the SQL each case runs on the copy
    "text in a kernel's start": f"UPDATE {KERNEL} SET start = 'x' || start WHERE rowid = 7",
    "a real number in an API call's end": f"UPDATE {RUNTIME} SET end = end + 0.5 WHERE rowid = 11",
    "text for a kernel's name id": f"UPDATE {KERNEL} SET demangledName = 'gemm' WHERE rowid = 3",
    "a kernel on device -1": f"UPDATE {KERNEL} SET deviceId = -1 WHERE rowid = 5",
    "a kernel ending before it starts": f"UPDATE {KERNEL} SET end = start - 1 WHERE rowid = 9",
    "kernels out of start order": f"UPDATE {KERNEL} SET start = start + 1000000, end = end + 1000000 WHERE rowid = 20",
    "a hole in the API rows": f"DELETE FROM {RUNTIME} WHERE rowid = 30",
    "an API call repeated": f"INSERT INTO {RUNTIME} SELECT * FROM {RUNTIME} WHERE rowid = 40",
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_fault_the_one_read_must_notice(tmp_path: Path, sqlite_path, monkeypatch, case: str) -> None:
    """Each fault makes the one read refuse the table (Unverified), and the report is then the SQL checks': the
    same rows left out, repaired or said as without the one read."""
    monkeypatch.setattr(columns, "ADBC_MIN_ROWS", 0)
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    conn = sqlite3.connect(trace)
    conn.execute(BROKEN[case])
    conn.commit()
    conn.close()
    table = RUNTIME if "API" in case else KERNEL
    with open_trace(trace, defer=True) as opened:
        assert table in opened.deferred
        with pytest.raises(Unverified):
            for _ in scan_table(opened, table, nsys.scanned_columns(opened.conn, table),
                                tuple(opened.query(f"SELECT min(rowid), max(rowid) FROM {table}")[0])):
                pass
    one, scanned, _ = _report(trace, "all", monkeypatch, one_read=True)
    reads, _, _ = _report(trace, "all", monkeypatch, one_read=False)
    assert scanned and one == reads


def test_chunks_in_flight_and_the_launch_spill(sqlite_path, monkeypatch) -> None:
    """Read a chunk of a few rows at a time, the one read gives what one chunk gives; the eager launches spilled to
    a temporary file come back as the kernels' own rows."""
    monkeypatch.setattr(columns, "ADBC_MIN_ROWS", 0)
    path = sqlite_path("eager_b1")
    with open_trace(path, defer=True) as trace:
        span = tuple(trace.query(f"SELECT min(rowid), max(rowid) FROM {KERNEL}")[0])
        cols = nsys.scanned_columns(trace.conn, KERNEL)
        whole = list(scan_table(trace, KERNEL, cols, span, chunk_rows=1 << 20))
        small = list(scan_table(trace, KERNEL, cols, span, chunk_rows=97, jobs=3))
        assert len(whole) == 1 and len(small) == -(-len(whole[0]["start"]) // 97)
        for name in whole[0]:
            assert [int(x) for c in small for x in c[name]] == whole[0][name].tolist()
        scan = scans.kernel_scan(trace, None, [])
        assert trace.cache[KERNEL_SCAN] is scan
        from profkit.analysis.window import choose_window

        win = choose_window(trace, "all")
        got = scan.launch_kernels(win, 3)
        rows = trace.query("SELECT correlation, pid, start FROM kernels WHERE graph_node IS NULL AND correlation "
                           "IS NOT NULL AND correlation % 3 = 0 ORDER BY seq")
        assert list(zip(got["c"].tolist(), got["p"].tolist(), got["s"].tolist(), strict=True)) == rows
        assert len(rows) > 100


def test_the_index_of_starts_finds_what_the_binary_search_finds(sqlite_path, monkeypatch) -> None:
    """`seq.first_seq_at` through the one read's index of every SPARSE-th start (one query) gives the row the binary
    search over row ids gives, at, between, before and after the rows' starts."""
    from profkit.analysis import seq

    monkeypatch.setattr(columns, "ADBC_MIN_ROWS", 0)
    monkeypatch.setattr(seq, "SPARSE", 7)
    monkeypatch.setattr(scans, "SPARSE", 7)
    with open_trace(sqlite_path("eager_b1"), defer=True) as trace:
        scans.kernel_scan(trace, None, [])
        index = trace.cache.pop(seq.SEQ_INDEX.format("kernels"))
        assert len(index[0]) > 100
        bounds = seq.seq_bounds(trace, "kernels")
        starts = [s for (s,) in trace.query("SELECT start FROM kernels ORDER BY seq")]
        probes = [starts[0] - 5, *starts[::13], *(s + 1 for s in starts[::17]), starts[-1], starts[-1] + 1]
        plain = [seq.first_seq_at(trace, t, bounds, "kernels") for t in probes]
        trace.cache[seq.SEQ_INDEX.format("kernels")] = index
        assert [seq.first_seq_at(trace, t, bounds, "kernels") for t in probes] == plain
        assert plain[0] == bounds[0] and plain[-1] == bounds[1] + 1


def test_repeated_rows_counted_in_numpy_as_sql_counts_them(tmp_path: Path, sqlite_path, monkeypatch) -> None:
    """A relation that is not in strict start order is searched for repeated rows: through Arrow and a sort in
    numpy where it is large (a serve trace's memory operations), the number SQL's GROUP BY gives."""
    from profkit.traces import nsys
    from profkit.traces.schema import count_duplicates

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("serve_frontend"), trace)
    conn = sqlite3.connect(trace)
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", KERNEL):  # two rows each repeated, one of them twice
        for rowid in (3, 3, 50):
            conn.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE rowid = ?", (rowid,))
    conn.commit()
    conn.close()
    monkeypatch.setattr(columns, "ADBC_MIN_ROWS", 0)
    with open_trace(trace) as opened:
        assert opened.meta["inconsistent"].count("3 duplicated") == 2
    conn = nsys._connect_read_only(trace)  # the views before any repair: both counts
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    nsys._create_views(conn, tables, {t: nsys._columns(conn, t) for t in tables}, frozenset())
    for relation in ("memops", "kernels", "api"):
        assert nsys._count_duplicates_columnar(conn, relation, trace) == \
            count_duplicates(conn, relation, "", table=f"temp.{relation}") == (3 if relation != "api" else 0)
    conn.close()
    one, _, _ = _report(trace, "all", monkeypatch, one_read=True)
    reads, _, _ = _report(trace, "all", monkeypatch, one_read=False)
    assert one == reads
